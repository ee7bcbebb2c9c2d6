"""clnet.nn.functional: the ops as functions, with PyTorch's names, argument names and defaults.

Every function checks its arguments here, where the user passed them, and names itself, the shapes and the fix.
"""
from collections import OrderedDict

import numpy as np

from .. import kernels, ops, pointwise, products, reduce, rng, views
from ..creation import arange
from ..ops import _float
from ..shapes import conv_padding, conv_shape, pair, pool_geometry, pool_output
from ..tensor import Tensor
from ..tensor import tensor as _tensor  # (functions here name their argument `tensor`, as PyTorch's)


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


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The transposed convolution (a convolution's data gradient as a layer), as F.conv_transpose2d: weight
    (in_channels, out_channels/groups, kH, kW), output size (H - 1) stride - 2 padding + dilation (k - 1) +
    output_padding + 1."""
    what = "conv_transpose2d"
    _float(what, input)
    _float(what, weight)
    if weight.ndim != 4 or input.ndim != 4 or input.shape[1] != weight.shape[0]:
        raise ValueError(f"{what}: input {input.shape} and weight {weight.shape} do not fit: expected input (N, C, H, "
                         "W) and weight (C, out_channels/groups, kH, kW)")
    stride, dilation = pair(stride, "stride", what), pair(dilation, "dilation", what)
    padding, output_padding = pair(padding, "padding", what), pair(output_padding, "output_padding", what)
    if any(op >= max(st, dl) for op, st, dl in zip(output_padding, stride, dilation)) or min(output_padding) < 0:
        raise ValueError(f"{what}: output_padding {output_padding} must be smaller than the stride or the dilation")
    if groups < 1 or weight.shape[0] % groups:
        raise ValueError(f"{what}: in_channels ({weight.shape[0]}) must be divisible by groups ({groups})")
    N, _, H, W = input.shape
    out_c = weight.shape[1] * groups
    oh, ow = ((n - 1) * st - 2 * p + dl * (k - 1) + op + 1 for n, st, p, dl, k, op in
              zip((H, W), stride, padding, dilation, weight.shape[2:], output_padding))
    if oh < 1 or ow < 1:
        raise ValueError(f"{what}: the output size ({oh}, {ow}) for input {input.shape} is not positive")
    s = conv_shape(what, (N, out_c, oh, ow), weight.shape, stride, padding, (2 * padding[0], 2 * padding[1]),
                   dilation, int(groups))
    if (s.OH, s.OW) != (H, W):
        raise ValueError(f"{what}: internal: the convolution of ({oh}, {ow}) gives ({s.OH}, {s.OW}), not ({H}, {W})")
    _check_bias(what, bias, out_c)
    y = ops.ConvTranspose2d.apply(input, weight, s=s, what=what)
    return y if bias is None else pointwise.add(y, bias.reshape(1, out_c, 1, 1))


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
    if isinstance(input, Tensor) and input.dtype == np.int32:  # int32 kept, as PyTorch's
        return pointwise.relu(input)
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
    """(OH, OW) of an adaptive pooling; None keeps the input's size."""
    if len(input_shape) != 4:
        raise ValueError(f"{what}: expected input of shape (N, C, H, W), got shape {tuple(input_shape)}")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if len(sizes) != 2:
        raise ValueError(f"{what}: output_size must be an int or a pair, got {output_size!r}")
    out = tuple(int(i) if o is None else o for o, i in zip(sizes, input_shape[2:]))
    for o in out:
        if not isinstance(o, int) or o < 1:
            raise ValueError(f"{what}: output size {out} for input shape {tuple(input_shape)} must be positive ints")
    return out


def adaptive_avg_pool2d(input, output_size):
    what = "adaptive_avg_pool2d"
    _float(what, input)
    oh, ow = adaptive_output_size(what, input.shape, output_size)
    if input.shape[2] % oh or input.shape[3] % ow:  # windows of unequal sizes: PyTorch's, as two products
        return _adaptive_avg_any(input, oh, ow)
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


def flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "flatten",
           "linear", "local_response_norm", "log_softmax", "max_pool2d", "relu", "relu6", "sigmoid", "softmax",
           "tanh"]


# ---- the general tensor ops' functions (pointwise, reduce, views, matmul): PyTorch's names ---------------------------



def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")
    return pointwise.unary("gelu" if approximate == "none" else "gelu_tanh", _float("gelu", input))


def silu(input, inplace=False):
    return pointwise.unary("silu", _float("silu", input))


def mish(input, inplace=False):
    return pointwise.unary("mish", _float("mish", input))


def hardswish(input, inplace=False):
    return pointwise.unary("hardswish", _float("hardswish", input))


def hardsigmoid(input, inplace=False):
    return pointwise.unary("hardsigmoid", _float("hardsigmoid", input))


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return pointwise.unary("leaky_relu", _float("leaky_relu", input), float(negative_slope))


def elu(input, alpha=1.0, inplace=False):
    return pointwise.unary("elu", _float("elu", input), float(alpha))


def selu(input, inplace=False):
    return pointwise.unary("selu", _float("selu", input))


def celu(input, alpha=1.0, inplace=False):
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    return pointwise.unary("celu", _float("celu", input), float(alpha))


def softplus(input, beta=1.0, threshold=20.0):
    if beta <= 0:
        raise ValueError(f"softplus: beta must be positive, got {beta}")
    return pointwise.unary("softplus", _float("softplus", input), float(beta), float(threshold))


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    return pointwise.unary("hardtanh", _float("hardtanh", input), float(min_val), float(max_val))


def prelu(input, weight):
    """max(0, x) + weight * min(0, x), weight (C,) per channel (dimension 1) or one value."""
    _float("prelu", input)
    if weight.size != 1:
        if input.ndim < 2 or weight.shape != (input.shape[1],):
            raise ValueError(f"prelu: weight of shape {weight.shape} for input {input.shape}: expected ({1},) or "
                             f"(C,) with C the input's dimension 1")
        weight = weight.reshape((input.shape[1],) + (1,) * (input.ndim - 2))
    return pointwise.where(input > 0, input, input * weight)


pad = views.pad


def one_hot(tensor, num_classes=-1):
    """int32 one-hot rows of an integer tensor, as torch.nn.functional.one_hot (num_classes -1: max + 1)."""
    if not isinstance(tensor, Tensor) or tensor.dtype.kind not in "iu":
        raise TypeError("one_hot: expected an integer clnet tensor")
    if num_classes < 0:
        num_classes = int(reduce.max(tensor).item()) + 1
    classes = arange(num_classes, device=tensor.device)
    return pointwise.cast(tensor.reshape(tensor.shape + (1,)) == classes, np.int32)


def embedding(input, weight, padding_idx=None):
    """Rows of weight (num_embeddings, dim) at the integer indices `input` (any shape), as F.embedding; the
    padding_idx row gets no gradient."""
    if not isinstance(input, Tensor):
        input = _tensor(np.asarray(input), weight.device)
    if input.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {input.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got {weight.shape}")
    rows = views.index_select(weight, 0, input.reshape(-1))
    if padding_idx is not None:
        keep = input.reshape(-1, 1) != int(padding_idx) % weight.shape[0]
        rows = pointwise.where(keep, rows, rows.detach())  # the padding row's values, without their gradient
    return rows.reshape(input.shape + (weight.shape[1],))


# ---- normalisation over other dimensions: composed from reductions and pointwise ops -----------------------------

def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the last len(normalized_shape) dimensions (biased variance), then scale and shift."""
    what = "layer_norm"
    _float(what, input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[input.ndim - len(shape):]) != shape or len(shape) > input.ndim:
        raise ValueError(f"{what}: normalized_shape {shape} does not match the last dimensions of input "
                         f"{input.shape}")
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    mean = reduce.mean(input, dims, keepdim=True)
    centred = input - mean
    var = reduce.mean(centred * centred, dims, keepdim=True)
    out = centred * pointwise.unary("rsqrt", var + float(eps))
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != shape:
            raise ValueError(f"{what}: {name} has shape {t.shape}, expected {shape}")
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _per_channel(t, ndim):
    return t.reshape((t.shape[0],) + (1,) * (ndim - 2))


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each of num_groups groups of channels of every sample over its channels and positions."""
    what = "group_norm"
    _float(what, input)
    if input.ndim < 2 or input.shape[1] % num_groups:
        raise ValueError(f"{what}: {num_groups} groups do not divide the channels of input {input.shape}")
    N, C = input.shape[:2]
    x = input.reshape(N, num_groups, -1)
    mean = reduce.mean(x, 2, keepdim=True)
    centred = x - mean
    var = reduce.mean(centred * centred, 2, keepdim=True)
    out = (centred * pointwise.unary("rsqrt", var + float(eps))).reshape(input.shape)
    if weight is not None:
        out = out * _per_channel(weight, input.ndim)
    if bias is not None:
        out = out + _per_channel(bias, input.ndim)
    return out


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Normalise each channel of each sample over its positions (InstanceNorm's default: no running statistics)."""
    if not use_input_stats or running_mean is not None:
        raise ValueError("instance_norm: clnet normalises with each instance's own statistics "
                         "(track_running_stats=False, PyTorch's default)")
    _float("instance_norm", input)
    return group_norm(input, input.shape[1], weight, bias, eps)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    """x / max(||x||_p over dim, eps), as F.normalize."""
    n = reduce.norm(_float("normalize", input), p, dim, keepdim=True)
    return input / pointwise.clamp(n, min=float(eps))


# ---- resizing and adaptive pooling: separable products with constant interpolation matrices ----------------------

_matrices = OrderedDict()


def _constant_matrix(dev, key, make):
    """A cached device matrix (made once, outside any capture's recording)."""
    return pointwise.cached_constant(_matrices, 1024, (id(dev),) + key, dev,
                                     lambda: np.ascontiguousarray(make(), np.float32))


def _resize_matrix(n_in, n_out, mode, align_corners, scale):
    """(n_out, n_in) weights of PyTorch's 1-D nearest or linear resampling."""
    m = np.zeros((n_out, n_in))
    if mode == "nearest":
        step = (1.0 / scale) if scale else n_in / n_out
        for o in range(n_out):
            m[o, min(int(np.floor(o * step)), n_in - 1)] = 1.0
        return m
    for o in range(n_out):
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            src = max((o + 0.5) * ((1.0 / scale) if scale else n_in / n_out) - 0.5, 0.0)
        i0 = min(int(np.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        w1 = src - i0
        m[o, i0] += 1.0 - w1
        m[o, i1] += w1
    return m


def _adaptive_matrix(n_in, n_out):
    """(n_out, n_in) averaging weights of PyTorch's adaptive windows [floor(o n / m), ceil((o + 1) n / m))."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        start, end = (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)
        m[o, start:end] = 1.0 / (end - start)
    return m


def _separable(x, mh, mw):
    """mh @ x @ mw^T over the last two dimensions of x (N, C, H, W)."""
    return products.matmul(products.matmul(mh, x), views.transpose(mw, 0, 1))


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Resize (N, C, H, W) by nearest or bilinear sampling, as F.interpolate (the output size from `size` or
    floor(input size * scale_factor)); nearest and bilinear with align_corners True or False."""
    what = f"interpolate (mode={mode!r})"
    _float(what, input)
    if input.ndim != 4:
        raise ValueError(f"{what}: clnet resizes (N, C, H, W) tensors, got shape {input.shape}")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"{what}: clnet supports mode 'nearest' and 'bilinear'")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"{what}: align_corners is for the linear modes only")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{what}: give exactly one of size and scale_factor")
    H, W = input.shape[2:]
    if size is not None:
        oh, ow = pair(size, "size", what)
        scales = (None, None)
    else:
        sh, sw = (scale_factor, scale_factor) if not isinstance(scale_factor, (tuple, list)) else scale_factor
        oh, ow = int(np.floor(H * sh)), int(np.floor(W * sw))
        scales = (float(sh), float(sw))
    if oh < 1 or ow < 1:
        raise ValueError(f"{what}: output size ({oh}, {ow}) must be positive")
    ac = bool(align_corners)
    mh = _constant_matrix(input.device, ("resize", H, oh, mode, ac, scales[0]),
                          lambda: _resize_matrix(H, oh, mode, ac, scales[0]))
    mw = _constant_matrix(input.device, ("resize", W, ow, mode, ac, scales[1]),
                          lambda: _resize_matrix(W, ow, mode, ac, scales[1]))
    return _separable(input, mh, mw)


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    return interpolate(input, size, scale_factor, mode, align_corners)


def _adaptive_avg_any(input, oh, ow):
    H, W = input.shape[2:]
    mh = _constant_matrix(input.device, ("adaptive", H, oh), lambda: _adaptive_matrix(H, oh))
    mw = _constant_matrix(input.device, ("adaptive", W, ow), lambda: _adaptive_matrix(W, ow))
    return _separable(input, mh, mw)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Maximum over PyTorch's adaptive windows: a max pooling where the output size divides the input size, else a
    maximum over each window's rows and columns in turn (windows of adjacent outputs may overlap by one)."""
    what = "adaptive_max_pool2d"
    _float(what, input)
    if return_indices:
        raise ValueError(f"{what}: return_indices is not supported")
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    H, W = input.shape[2:]
    oh, ow = (H if sizes[0] is None else int(sizes[0])), (W if sizes[1] is None else int(sizes[1]))
    if H % oh == 0 and W % ow == 0:
        return max_pool2d(input, (H // oh, W // ow))
    rows = [reduce.amax(views.narrow(input, 2, (o * H) // oh, -(-((o + 1) * H) // oh) - (o * H) // oh), 2,
                        keepdim=True) for o in range(oh)]
    x = views.cat(rows, 2)
    cols = [reduce.amax(views.narrow(x, 3, (o * W) // ow, -(-((o + 1) * W) // ow) - (o * W) // ow), 3, keepdim=True)
            for o in range(ow)]
    return views.cat(cols, 3)


# ---- attention ---------------------------------------------------------------------------------------------------

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v over the last two dimensions, as F.scaled_dot_product_attention: a bool mask
    keeps where True, a float mask is added; is_causal masks the upper triangle; dropout on the weights."""
    what = "scaled_dot_product_attention"
    for t in (query, key, value):
        _float(what, t)
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ValueError(f"{what}: query {query.shape}, key {key.shape} and value {value.shape} do not fit: "
                         "expected (..., L, E), (..., S, E) and (..., S, Ev)")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{what}: give attn_mask or is_causal, not both")
    L, S = query.shape[-2], key.shape[-2]
    s = (1.0 / np.sqrt(query.shape[-1])) if scale is None else float(scale)
    scores = products.matmul(query, views.transpose(key, -2, -1)) * s
    if is_causal:
        causal = _constant_matrix(query.device, ("causal", L, S), lambda: np.tril(np.ones((L, S))))
        scores = pointwise.where(causal > 0.5, scores, -np.inf)
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            scores = pointwise.where(attn_mask, scores, -np.inf)
        else:
            scores = scores + attn_mask
    weights = reduce.softmax(scores, -1)
    if dropout_p > 0:
        weights = dropout(weights, dropout_p, True)
    return products.matmul(weights, value)


# ---- losses ------------------------------------------------------------------------------------------------------

def _reduced(what, loss, reduction, weight_sum=None):
    if reduction == "mean":
        return reduce.sum(loss) / weight_sum if weight_sum is not None else reduce.mean(loss)
    if reduction == "sum":
        return reduce.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")


def _target(what, input, target, dtype=np.float32):
    """A target as a device tensor (host lists and arrays are copied up), checked against the input's shape."""
    if not isinstance(target, Tensor):
        target = _tensor(np.asarray(target, dtype=dtype), input.device)
    return target


def _class_weight(what, input, weight):
    """A per-class weight as a device tensor of C floats (host lists and arrays, and torch's CPU tensors, copied up),
    or None."""
    if weight is None:
        return None
    if not isinstance(weight, Tensor):
        weight = _tensor(np.asarray(weight.detach().cpu().numpy() if hasattr(weight, "detach") else weight,
                                    np.float32), input.device)
    C = input.shape[1] if input.ndim >= 2 else 0
    if tuple(weight.shape) != (C,):
        raise ValueError(f"{what}: weight has shape {tuple(weight.shape)}, expected ({C},): one per class of the "
                         f"input's {C}")
    return _float(what, weight)


def _same_shape(what, input, target):
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"{what}: target of shape {target.shape} does not match input of shape {input.shape}")


def mse_loss(input, target, reduction="mean"):
    what = "mse_loss"
    target = _target(what, _float(what, input), target)
    _same_shape(what, input, target)
    d = input - target
    return _reduced(what, d * d, reduction)


def l1_loss(input, target, reduction="mean"):
    what = "l1_loss"
    target = _target(what, _float(what, input), target)
    _same_shape(what, input, target)
    return _reduced(what, pointwise.unary("abs", input - target), reduction)


def smooth_l1_loss(input, target, reduction="mean", beta=1.0):
    what = "smooth_l1_loss"
    target = _target(what, _float(what, input), target)
    _same_shape(what, input, target)
    d = pointwise.unary("abs", input - target)
    if beta == 0:
        return _reduced(what, d, reduction)
    loss = pointwise.where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduced(what, loss, reduction)


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """-(y log p + (1 - y) log(1 - p)), each log clamped at -100 as PyTorch's."""
    what = "binary_cross_entropy"
    target = _target(what, _float(what, input), target)
    _same_shape(what, input, target)
    log_p = pointwise.clamp(pointwise.unary("log", input), min=-100.0)
    log_q = pointwise.clamp(pointwise.unary("log1p", -input), min=-100.0)
    loss = -(target * log_p + (1 - target) * log_q)
    if weight is not None:
        loss = loss * weight
    return _reduced(what, loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """The binary cross-entropy of sigmoid(input), computed stably: (1 - y) x + (1 + (w - 1) y) softplus(-x)."""
    what = "binary_cross_entropy_with_logits"
    target = _target(what, _float(what, input), target)
    _same_shape(what, input, target)
    sp = pointwise.unary("softplus", -input, 1.0, 20.0)
    if pos_weight is not None:
        loss = (1 - target) * input + (1 + (pos_weight - 1) * target) * sp
    else:
        loss = (1 - target) * input + sp
    if weight is not None:
        loss = loss * weight
    return _reduced(what, loss, reduction)


def _class_targets(what, input, target):
    """Integer class targets on the device: (N,) for input (N, C) or (N, d1, ...) for (N, C, d1, ...)."""
    if not isinstance(target, Tensor):
        host = np.asarray(target)
        if host.dtype.kind not in "iu":
            raise TypeError(f"{what}: class targets must be integers, got {host.dtype}")
        target = _tensor(host.astype(np.int32), input.device)
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(f"{what}: target of shape {target.shape} does not fit input of shape {input.shape}; "
                         f"expected {expected}")
    return target


def _class_last(x):
    """(N, C, d1, ...) as (N * d1 * ..., C)."""
    if x.ndim == 2:
        return x
    return views.permute(x, 0, *range(2, x.ndim), 1).reshape(-1, x.shape[1])


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """-input[n, target[n]] (log-probabilities in), weighted per class, targets equal to ignore_index left out;
    the mean divides by the summed weights of the targets kept, as PyTorch's."""
    what = "nll_loss"
    _float(what, input)
    weight = _class_weight(what, input, weight)
    if input.ndim < 2:
        raise ValueError(f"{what}: expected input of shape (N, C) or (N, C, d1, ...), got {input.shape}")
    target = _class_targets(what, input, target)
    logp = _class_last(input)
    t = target.reshape(-1)
    C = input.shape[1]
    keep = t != int(ignore_index)
    safe = pointwise.where(keep, t, 0)
    if target.value_range is not None:
        lo, hi = target.value_range
        bad = [v for v in (lo, hi) if v != ignore_index and not 0 <= v < C]
        if bad:
            raise ValueError(f"{what}: targets must lie in [0, {C - 1}] for {C} classes (or be ignore_index "
                             f"{ignore_index}), got values in [{lo}, {hi}]")
    picked = views.gather(logp, 1, safe.reshape(-1, 1)).reshape(-1)
    w = pointwise.cast(keep, np.float32)
    if weight is not None:
        w = w * views.index_select(weight, 0, safe)
    loss = -(picked * w)
    if reduction == "none":
        return loss.reshape(target.shape)
    return _reduced(what, loss, reduction, weight_sum=reduce.sum(w) if reduction == "mean" else None)


def _float_target(target):
    """Whether cross-entropy targets are class probabilities (floats) rather than class indices."""
    if isinstance(target, Tensor):
        return target.dtype == np.float32
    return np.asarray(target).dtype.kind == "f"


def _may_hold(target, value):
    """Whether integer class targets may hold `value` (ignore_index): from the host data, or the range a device
    tensor made from host data remembers. A computed one (a slice, an index_select, arithmetic) has no known range and
    may: the fused cross-entropy, which has no ignore_index, would poison its rows with NaN."""
    if isinstance(target, Tensor):
        r = target.value_range
        return r is None or r[0] <= value <= r[1]
    host = np.asarray(target)
    return bool(host.size) and bool((host == value).any())


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits (N, C) or (N, C, d1, ...) against class indices or class probabilities (a float
    target of the input's shape), with PyTorch's weight, ignore_index, reduction and label_smoothing. The plain case
    (mean over (N, C) logits, integer classes, no options) runs as one fused launch."""
    what = "cross_entropy"
    _float(what, input)
    weight = _class_weight(what, input, weight)
    probabilities = _float_target(target)
    if (not probabilities and reduction == "mean" and weight is None and label_smoothing == 0 and input.ndim == 2
            and not _may_hold(target, ignore_index)):
        return ops.cross_entropy(input, target)[0]
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{what}: label_smoothing must lie in [0, 1], got {label_smoothing}")
    C = input.shape[1] if input.ndim >= 2 else 0
    logp = reduce.log_softmax(input, 1)
    if probabilities:
        target = _target(what, input, target)
        _same_shape(what, input, target)
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / C
        per = logp * target
        if weight is not None:
            per = per * _per_channel(weight, input.ndim) if input.ndim > 2 else per * weight
        loss = -reduce.sum(per, 1)
        if reduction == "mean":
            return reduce.sum(loss) / (loss.size or 1)
        return _reduced(what, loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return nll
    target = _class_targets(what, input, target)
    keep = pointwise.cast(target.reshape(-1) != int(ignore_index), np.float32)
    flat = _class_last(logp)
    if weight is not None:
        smooth = -reduce.sum(flat * weight, 1) * keep
        denominator = reduce.sum(views.index_select(weight, 0, pointwise.where(target.reshape(-1) !=
                                                                               int(ignore_index),
                                                                               target.reshape(-1), 0)) * keep)
    else:
        smooth = -reduce.sum(flat, 1) * keep
        denominator = reduce.sum(keep)
    if reduction == "none":
        smooth = smooth.reshape(target.shape)
    elif reduction == "mean":
        smooth = reduce.sum(smooth) / denominator
    else:
        smooth = reduce.sum(smooth)
    return nll * (1 - label_smoothing) + smooth * (label_smoothing / C)


__all__ += ["adaptive_max_pool2d", "conv_transpose2d", "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu", "elu",
            "embedding", "gelu", "group_norm", "hardsigmoid", "hardswish", "hardtanh", "instance_norm",
            "interpolate", "l1_loss", "layer_norm", "leaky_relu", "mish", "mse_loss", "nll_loss", "normalize",
            "one_hot", "pad", "prelu", "scaled_dot_product_attention", "selu", "silu", "smooth_l1_loss", "softplus",
            "upsample"]
