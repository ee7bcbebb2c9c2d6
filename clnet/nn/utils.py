"""Gradient clipping with torch.nn.utils' names and arguments, on the device.

`clip_grad_norm_` reads nothing back: the total norm stays a device tensor and the scale factor min(1, max_norm /
(norm + 1e-6)) is applied by a kernel that reads it from device memory, so a clipped step can be captured in a
clnet.Graph and replayed (only error_if_nonfinite=True reads the norm, and is refused inside a capture).
"""
import math

import numpy as np

from .. import autograd, optim, pointwise, reduce, views
from ..errors import Error
from ..graph import CaptureError, refuse_in_capture
from ..tensor import Tensor, tensor

__all__ = ["NonFiniteNorm", "clip_grad_norm_", "clip_grad_value_"]


class NonFiniteNorm(Error, RuntimeError):
    """clip_grad_norm_(..., error_if_nonfinite=True) found a total norm that is NaN or infinite."""


def _grads(what, parameters):
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: item {i} of parameters is a {type(p).__name__}, not a tensor (pass "
                            "model.parameters())")
    grads = [p.grad for p in params if p.grad is not None]
    devices = {id(g.device) for g in grads}
    if len(devices) > 1:
        raise ValueError(f"{what}: the gradients are on {len(devices)} devices; move the whole model with "
                         ".to(device)")
    return grads


def _norm_type(what, norm_type):
    if norm_type in ("inf", "Inf"):
        return math.inf
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float, np.number)) or not (
            norm_type > 0 or norm_type == -math.inf):
        raise ValueError(f"{what}: norm_type={norm_type!r} is not supported; use a positive number or inf")
    return float(norm_type)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients of `parameters` in place so that their total `norm_type`-norm (all gradients taken as
    one vector) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_.

    Parameters
    ----------
    parameters : Tensor or iterable of Tensor
        Parameters whose .grad is clipped; those without a gradient are skipped.
    max_norm : float
        The largest total norm kept.
    norm_type : float or "inf"
        The p of the p-norm.
    error_if_nonfinite : bool
        Raise NonFiniteNorm when the total norm is NaN or infinite (this reads the norm back to the host, so it is
        refused inside a Graph capture).
    foreach : None
        Accepted for PyTorch's signature; clnet has one implementation.

    Returns
    -------
    Tensor
        The total norm before clipping, a 0-d tensor on the gradients' device (0.0 on the host with no gradients).

    Notes
    -----
    Gradients laid out by a clnet optimizer (after its first zero_grad or step) are clipped in a fixed number of
    launches whatever their count; there an element that is exactly 0 stays 0 when the norm is NaN (PyTorch's gives
    NaN), so that the buffer's padding never turns NaN.
    """
    what = "clip_grad_norm_"
    p = _norm_type(what, norm_type)
    max_norm = float(max_norm)
    grads = _grads(what, parameters)
    if not grads:
        return tensor(np.float32(0.0))
    # an optimizer's gradients lie in one flat buffer: one norm and one scaling over their span (its padding is
    # zero, which adds nothing to a p-norm of p > 0 and must stay zero: a NaN factor leaves zeros alone there)
    span = optim.grad_span(grads) if len(grads) > 1 and p > 0 else None
    with autograd.no_grad():
        if span is not None:
            total = reduce.norm(span, p)
        else:
            norms = [reduce.norm(g, p) for g in grads]
            total = norms[0] if len(norms) == 1 else reduce.norm(views.stack(norms), p)
        if error_if_nonfinite:
            try:
                refuse_in_capture(f"{what}(error_if_nonfinite=True) reads the norm back")
            except CaptureError as e:
                raise CaptureError(f"{e}; or pass error_if_nonfinite=False") from None
            value = float(total.item())
            if not math.isfinite(value):
                raise NonFiniteNorm(f"{what}: the total norm of order {norm_type} of the gradients is {value}, so "
                                    "they cannot be clipped; find where the loss turned non-finite, or pass "
                                    "error_if_nonfinite=False")
        scale = pointwise.clamp(pointwise.div(max_norm, pointwise.add(total, 1e-6)), max=1.0)
        if span is not None:
            span.copy_from(pointwise.where(span != 0, pointwise.mul(span, scale), 0.0))
        else:
            for g in grads:
                g.mul_(scale)
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient of `parameters` in place to [-clip_value, clip_value], as
    torch.nn.utils.clip_grad_value_."""
    clip_value = float(clip_value)
    with autograd.no_grad():
        for g in _grads("clip_grad_value_", parameters):
            g.clamp_(-clip_value, clip_value)
