"""Losses with PyTorch's names, arguments and defaults: a call returns a device tensor that `backward()`
differentiates (one element unless reduction='none'). Targets may be device tensors, NumPy arrays or lists."""
from .. import ops
from . import functional as F
from .module import Module


class _Loss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """Cross-entropy from logits (N, C) or (N, C, d1, ...) and class indices or probabilities, as
    torch.nn.CrossEntropyLoss (weight, ignore_index, reduction, label_smoothing).

    ``metrics`` holds, after each call of the plain case (integer labels, mean, no options: one fused launch), a
    device tensor (loss, correct predictions) for training loops: one 8-byte read per step gives both; None
    otherwise."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        self.weight, self.ignore_index, self.label_smoothing = weight, int(ignore_index), float(label_smoothing)
        self.metrics = None

    def forward(self, input, target):
        if (self.weight is None and self.reduction == "mean" and self.label_smoothing == 0
                and getattr(input, "ndim", 0) == 2 and not F._may_hold(target, self.ignore_index)
                and not F._float_target(target)):
            loss, self.metrics = ops.cross_entropy(input, target)
            return loss
        self.metrics = None
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight=None, ignore_index=-100, reduction="mean"):
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, int(ignore_index)

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction="mean", beta=1.0):
        super().__init__(reduction)
        self.beta = float(beta)

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.weight = weight

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)
