"""Losses: a call returns a one-element device tensor that `backward()` differentiates."""
from .. import ops
from .module import Module


class CrossEntropyLoss(Module):
    """Mean cross-entropy from logits (N, C) and integer class labels (N,), as torch.nn.CrossEntropyLoss.

    ``metrics`` holds, after each call, a device tensor (loss, correct predictions) for training loops: one 8-byte
    read per step gives both."""

    def __init__(self):
        super().__init__()
        self.metrics = None

    def forward(self, input, target):
        loss, self.metrics = ops.cross_entropy(input, target)
        return loss
