"""Losses: a call returns a one-element device tensor; ``backward()`` returns d loss / d input."""
import numpy as np

from .. import ops
from ..tensor import Tensor, tensor


class CrossEntropyLoss:
    """Mean cross-entropy from logits (N, C) and integer class labels (N,), as torch.nn.CrossEntropyLoss."""

    def __init__(self):
        self._grad = None
        self.metrics = None  # device tensor (loss, correct predictions) of the last call, for training loops

    def __call__(self, logits, labels):
        if not isinstance(logits, Tensor) or logits.ndim != 2:
            shape = getattr(logits, "shape", type(logits).__name__)
            raise ValueError(f"CrossEntropyLoss: expected logits of shape (N, C) on the device, got {shape}")
        N, C = logits.shape
        if isinstance(labels, Tensor):
            if labels.dtype != np.int32:
                raise TypeError(f"CrossEntropyLoss: labels must be an int32 tensor, got {labels.dtype}")
            known = labels.value_range
        else:
            host = np.asarray(labels)
            if host.dtype.kind not in "iu":
                raise TypeError(f"CrossEntropyLoss: labels must be integers, got dtype {host.dtype}")
            known = (int(host.min()), int(host.max())) if host.size else None
        if tuple(labels.shape) != (N,):
            raise ValueError(f"CrossEntropyLoss: labels of shape {tuple(labels.shape)} do not match logits of shape "
                             f"{logits.shape}; expected ({N},)")
        if known is not None and (known[0] < 0 or known[1] >= C):
            raise ValueError(f"CrossEntropyLoss: labels must lie in [0, {C - 1}] for {C} classes, got values in "
                             f"[{known[0]}, {known[1]}]")
        if not isinstance(labels, Tensor):
            labels = tensor(host.astype(np.int32), logits.device)
        loss, self._grad, self.metrics = ops.cross_entropy(logits, labels)
        return loss

    def backward(self):
        if self._grad is None:
            raise RuntimeError("CrossEntropyLoss.backward called before the loss was computed")
        return self._grad
