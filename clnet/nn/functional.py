"""clnet.nn.functional: the ops as functions, with PyTorch's names, argument names and defaults.

Every function checks its arguments here, where the user passed them, and names itself, the shapes and the fix.
"""
import numpy as np

from .. import kernels, ops, rng
from ..ops import _float
from ..shapes import conv_padding, conv_shape, pair, pool_geometry, pool_output


def _check_bias(what, bias, n):
    if bias is not None:
        _float(what, bias)
        if bias.shape != (n,):
            raise ValueError(f"{what}: bias has shape {bias.shape}, expected ({n},)")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    what = "conv2d"
    _float(what, input)
    _float(what, weight)
    if weight.ndim != 4:
        raise ValueError(f"{what}: weight must be (out_channels, in_channels/groups, kH, kW), got {weight.shape}")
    stride, dilation = pair(stride, "stride", what), pair(dilation, "dilation", what)
    if min(stride + dilation) < 1 or groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"{what}: stride and dilation must be positive and out_channels ({weight.shape[0]}) "
                         f"divisible by groups ({groups})")
    begin, total = conv_padding(padding, weight.shape[2:], stride, dilation, what)
    s = conv_shape(what, input.shape, weight.shape, stride, begin, total, dilation, int(groups))
    _check_bias(what, bias, weight.shape[0])
    return ops.Conv2d.apply(input, weight, bias, s=s, what=what)


def linear(input, weight, bias=None):
    what = "linear"
    _float(what, input)
    _float(what, weight)
    if weight.ndim != 2 or not input.shape or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"{what}: input of shape {input.shape} does not fit weight of shape {weight.shape}; the "
                         f"input's last dimension must be {weight.shape[-1]}")
    _check_bias(what, bias, weight.shape[0])
    lead = input.shape[:-1]
    x = input if len(lead) == 1 else input.reshape(-1, weight.shape[1])
    y = ops.Linear.apply(x, weight, bias, what=what)
    return y if len(lead) == 1 else y.reshape(lead + (weight.shape[0],))


def _activation(kind, input):
    return ops.Activation.apply(_float(kind, input), kind=kind)


def relu(input, inplace=False):
    return _activation("relu", input)


def relu6(input, inplace=False):
    return _activation("relu6", input)


def sigmoid(input):
    return _activation("sigmoid", input)


def tanh(input):
    return _activation("tanh", input)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    what = "max_pool2d"
    _float(what, input)
    if pair(dilation, "dilation", what) != (1, 1) or return_indices:
        raise ValueError(f"{what}: clnet pools without dilation and does not return indices")
    k, s, p = pool_geometry(kernel_size, stride, padding, what)
    out = pool_output(what, input.shape, k, s, p, bool(ceil_mode))
    return ops.MaxPool2d.apply(input, out_shape=out, k=k, s=s, p=p)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    what = "avg_pool2d"
    _float(what, input)
    if divisor_override is not None:
        raise ValueError(f"{what}: divisor_override is not supported")
    k, s, p = pool_geometry(kernel_size, stride, padding, what)
    out = pool_output(what, input.shape, k, s, p, bool(ceil_mode))
    return ops.AvgPool2d.apply(input, out_shape=out, k=k, s=s, p=p, count_include_pad=bool(count_include_pad))


def adaptive_output_size(what, input_shape, output_size):
    """(OH, OW) of an adaptive pooling; None keeps the input's size. clnet pools adaptively where the output size
    divides the input size (every window then has the same size, as PyTorch's windows do there)."""
    if len(input_shape) != 4:
        raise ValueError(f"{what}: expected input of shape (N, C, H, W), got shape {tuple(input_shape)}")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if len(sizes) != 2:
        raise ValueError(f"{what}: output_size must be an int or a pair, got {output_size!r}")
    out = tuple(int(i) if o is None else o for o, i in zip(sizes, input_shape[2:]))
    for o, i in zip(out, input_shape[2:]):
        if not isinstance(o, int) or o < 1 or i % o:
            raise ValueError(f"{what}: output size {out} for input shape {tuple(input_shape)}: clnet runs adaptive "
                             "average pooling where each output size divides the input size; resize the input or "
                             "choose a divisor")
    return out


def adaptive_avg_pool2d(input, output_size):
    what = "adaptive_avg_pool2d"
    _float(what, input)
    oh, ow = adaptive_output_size(what, input.shape, output_size)
    k = (input.shape[2] // oh, input.shape[3] // ow)
    if k == (1, 1):
        return input
    return ops.AvgPool2d.apply(input, out_shape=input.shape[:2] + (oh, ow), k=k, s=k, p=(0, 0),
                               count_include_pad=True)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    what = "batch_norm"
    _float(what, input)
    if input.ndim not in (2, 4):
        raise ValueError(f"{what}: expected input of shape (N, C) or (N, C, H, W), got {input.shape}")
    C = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None:
            _float(what, t)
            if t.shape != (C,):
                raise ValueError(f"{what}: {name} has shape {t.shape}, expected ({C},) for input {input.shape}")
    if training:
        if input.size // C <= 1:
            raise ValueError(f"{what}: expected more than 1 value per channel when training, got input of shape "
                             f"{input.shape} (as PyTorch: use a larger batch, or eval() for batch statistics)")
        return ops.BatchNormTrain.apply(input, weight, bias, running_mean, running_var,
                                       momentum=momentum if type(momentum) is kernels.Live else float(momentum),
                                        eps=float(eps))
    if running_mean is None or running_var is None:
        raise ValueError(f"{what}: evaluation needs running_mean and running_var (or training=True)")
    return ops.BatchNormEval.apply(input, weight, bias, running_mean, running_var, eps=float(eps))


def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    what = "local_response_norm"
    _float(what, input)
    if input.ndim < 2 or int(size) < 1:
        raise ValueError(f"{what}: expected input of at least 2 dimensions and size >= 1, got {input.shape}, "
                         f"size {size}")
    return ops.LocalResponseNorm.apply(input, size=int(size), alpha=float(alpha), beta=float(beta), k=float(k))


def dropout(input, p=0.5, training=True, inplace=False):
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return input
    seed = kernels.Live(None)

    def draw():  # a replayed graph draws each step's mask from the stream as an eager step would
        seed.value = np.uint32(rng.generator().integers(0, 2**32))
    kernels.per_step(draw)
    return ops.Dropout.apply(_float("dropout", input), p=float(p), seed=seed)


def _dim(what, input, dim):
    if dim is None:
        raise ValueError(f"{what}: name the dimension (dim=...), as PyTorch asks")
    if not -input.ndim <= dim < input.ndim:
        raise ValueError(f"{what}: dim {dim} is out of range for input shape {input.shape}")
    return dim % input.ndim


def softmax(input, dim=None):
    return ops.Softmax.apply(input, dim=_dim("softmax", _float("softmax", input), dim), log=False)


def log_softmax(input, dim=None):
    return ops.Softmax.apply(input, dim=_dim("log_softmax", _float("log_softmax", input), dim), log=True)


def cross_entropy(input, target, reduction="mean"):
    """Mean cross-entropy of logits (N, C) against integer class labels (N,), host or device."""
    if reduction != "mean":
        raise ValueError(f"cross_entropy: clnet computes reduction='mean', not {reduction!r}")
    return ops.cross_entropy(input, target)[0]


def flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "flatten",
           "linear", "local_response_norm", "log_softmax", "max_pool2d", "relu", "relu6", "sigmoid", "softmax",
           "tanh"]
