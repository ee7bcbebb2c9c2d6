"""The device ops: each ONNX operator on computed tensors as nn.functional and the op table run it, with the
plans (broadcasting, transposes, reductions, pooling geometry) that load's checks share."""

import math

import numpy as np

from .. import autograd, ops
from ..nn import functional as F
from ..shapes import conv_shape
from ..tensor import Tensor
from .common import _is_host
from .host import HOST_OPS, _axes, _flatten_shape, _reshape_shape, _reshape_target, _squeezed_shape, _unsqueezed_shape


# ---- device ops ----------------------------------------------------------------------------------------------------

def _tensor_arg(m, n, v, i):
    """Input i as a device tensor (a host constant uploaded once)."""
    if _is_host(v):
        return m.device_constant((n.name, i), v)
    return v


def _as_2d(at):
    """A 1-D Conv's or pooling's attributes as those of a 2-D one over (N, C, 1, L)."""
    out = dict(at)
    for key, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if key in at:
            out[key] = [one] + list(at[key])
    if "pads" in at:
        out["pads"] = [0, at["pads"][0], 0, at["pads"][1]]
    return out


def _d_conv(m, n, a):
    x, w, b = a[0], a[1], (a[2] if len(a) > 2 else None)
    w, b = _tensor_arg(m, n, w, 1), (None if b is None else _tensor_arg(m, n, b, 2))
    at = n.attrs
    if x.ndim == 3 and w.ndim == 3:  # 1-D: a 2-D convolution of height 1
        y = _d_conv(m, _Node1d(n), [x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]),
                                    w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), b])[0]
        return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]
    if x.ndim != 4:
        raise ValueError(f"clnet convolves 4-D (N, C, H, W) inputs, got shape {x.shape}")
    kh, kw = w.shape[2:]
    stride = tuple(at.get("strides", (1, 1)))
    dilation = tuple(at.get("dilations", (1, 1)))
    begin, total = _padding(at, x.shape[2:], (kh, kw), stride, dilation)
    s = conv_shape(n.name, x.shape, w.shape, stride, begin, total, dilation, int(at.get("group", 1)))
    return [ops.Conv2d.apply(x, w, b, s=s, what=f"Conv {n.name}")]


def _padding(at, size, kernel, stride, dilation):
    """(begin, total) padding per spatial axis from ONNX's pads or auto_pad."""
    mode = at.get("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        begin, total = [], []
        for i, k, s, d in zip(size, kernel, stride, dilation):
            t = max((-(-i // s) - 1) * s + d * (k - 1) + 1 - i, 0)
            total.append(t)
            begin.append(t // 2 if mode == "SAME_UPPER" else t - t // 2)
        return tuple(begin), tuple(total)
    if mode == "VALID":
        return (0, 0), (0, 0)
    pads = list(at.get("pads", (0, 0, 0, 0)))
    return (pads[0], pads[1]), (pads[0] + pads[2], pads[1] + pads[3])


def _pool_geometry(at, shape):
    """(kernel, strides, begin pads, (OH, OW)) of an ONNX MaxPool or AveragePool over a 4-D shape: pads may differ at
    the two ends (Caffe's ceil rounding exported as [0, 0, 1, 1], auto_pad SAME with an odd total); the kernels take
    the pads at the start and the output's size, and clip each window to the input."""
    k = tuple(int(i) for i in at["kernel_shape"])
    s = tuple(int(i) for i in at.get("strides", (1, 1)))
    begin, total = _padding(at, shape[2:], k, s, (1, 1))
    ceil = bool(at.get("ceil_mode", 0))
    out = []
    for size, ki, si, b, t in zip(shape[2:], k, s, begin, total):
        span = size + t - ki
        if span < 0:
            raise ValueError(f"the window {k} is larger than the padded input ({size + t}) of shape {tuple(shape)}")
        o = (-(-span // si) if ceil else span // si) + 1
        if ceil and (o - 1) * si >= size + b:  # a window that would start in the end padding is dropped
            o -= 1
        out.append(o)
    return k, s, tuple(begin), tuple(out)


class _Node1d:
    """A node seen as its 2-D counterpart (name, op and inputs kept; attributes from _as_2d)."""

    def __init__(self, n):
        self.name, self.op, self.inputs, self.attrs = n.name, n.op, n.inputs, _as_2d(n.attrs)


def _pool_1d(handler):
    def run(m, n, a):
        x = a[0]
        if x.ndim != 3:
            return handler(m, n, a)
        y = handler(m, _Node1d(n), [x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])])[0]
        return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]
    return run


def _d_maxpool(m, n, a):
    x = a[0]
    k, s, p, out = _pool_geometry(n.attrs, x.shape)
    return [ops.MaxPool2d.apply(x, out_shape=tuple(x.shape[:2]) + out, k=k, s=s, p=p)]


def _d_avgpool(m, n, a):
    x = a[0]
    k, s, p, out = _pool_geometry(n.attrs, x.shape)
    return [ops.AvgPool2d.apply(x, out_shape=tuple(x.shape[:2]) + out, k=k, s=s, p=p,
                                count_include_pad=bool(n.attrs.get("count_include_pad", 0)))]


def _d_global_maxpool(m, n, a):
    x = a[0]
    return [ops.MaxPool2d.apply(x, out_shape=tuple(x.shape[:2]) + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0))]


def _d_global_avgpool(m, n, a):
    x = a[0]
    if x.ndim != 4:
        raise ValueError(f"GlobalAveragePool: clnet pools 4-D inputs, got shape {x.shape}")
    if x.shape[2:] == (1, 1):
        return [x]
    return [ops.AvgPool2d.apply(x, out_shape=x.shape[:2] + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0),
                                count_include_pad=True)]


def _reduce_plan(rank, axes, noop):
    """The runs of adjacent axes [start, end) that a reduction over `axes` of a tensor of `rank` reduces (all axes
    when none are given, unless noop_with_empty_axes); None for no reduction. Raises ValueError for an axis out of
    range."""
    if not axes:
        if noop:
            return None
        axes = list(range(rank))
    for ax in axes:
        if not -rank <= ax < rank:
            raise ValueError(f"axis {ax} is out of range for a {rank}-D tensor")
    runs = []
    for ax in sorted({ax % rank for ax in axes}):
        if runs and runs[-1][1] == ax:
            runs[-1][1] = ax + 1
        else:
            runs.append([ax, ax + 1])
    return [tuple(r) for r in runs]


def _reduce_run(m, n, x, start, end, kind):
    """x reduced over axes [start, end), kept as size 1: with (L, K, T) the sizes before, in and after the run, a sum
    or mean is a product with a vector of ones (T = 1) or a 1x1 convolution of the (L, K, T, 1) image with a weight
    of ones (K channels into 1); a max a max pooling of the (L, 1, K, T) image with a (K, 1) window (of -x for a
    min). Each has its gradient through that op."""
    shape = tuple(x.shape)
    L, K, T = math.prod(shape[:start]), math.prod(shape[start:end]), math.prod(shape[end:])
    out = shape[:start] + (1,) * (end - start) + shape[end:]
    if K == 1:
        return x.reshape(out)
    if kind in ("sum", "mean"):
        scale = 1.0 / K if kind == "mean" else 1.0
        if T == 1:
            ones = m.device_constant(("reduce", K, scale), np.full((1, K), scale, np.float32))
            return F.linear(x.reshape(L, K), ones).reshape(out)
        w = m.device_constant(("reduce conv", K, scale), np.full((1, K, 1, 1), scale, np.float32))
        x4 = x.reshape(L, K, T, 1)
        s = conv_shape(n.name, x4.shape, w.shape, (1, 1), (0, 0), (0, 0), (1, 1), 1)
        return ops.Conv2d.apply(x4, w, None, s=s, what=f"{n.op} {n.name} (a sum over axes {start}..{end - 1})"
                                ).reshape(out)
    x4 = x.reshape(L, 1, K, T)
    if kind == "min":
        x4 = ops.Affine.apply(x4, alpha=-1.0, beta=0.0)
    y = ops.MaxPool2d.apply(x4, out_shape=(L, 1, 1, T), k=(K, 1), s=(K, 1), p=(0, 0))
    if kind == "min":
        y = ops.Affine.apply(y, alpha=-1.0, beta=0.0)
    return y.reshape(out)


def _d_reduce(kind):
    def run(m, n, a):
        x = a[0]
        keep = bool(n.attrs.get("keepdims", 1))
        runs = _reduce_plan(x.ndim, _axes(m, n, a, 1), n.attrs.get("noop_with_empty_axes", 0))
        if runs is None:
            return [x]
        axes = {i for s, e in runs for i in range(s, e)}
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i not in axes)
        if kind == "mean" and x.ndim == 4 and runs == [(2, 3 + 1)]:  # over H and W: global average pooling
            return [_d_global_avgpool(m, n, [x])[0].reshape(out_shape)]
        y = x
        for start, end in reversed(runs):
            y = _reduce_run(m, n, y, start, end, kind)
        return [y.reshape(out_shape)]
    return run


def _copy(t):
    with autograd.no_grad():
        return ops.Affine.apply(t, alpha=1.0, beta=0.0)


def _d_batchnorm(m, n, a):
    """ONNX's BatchNormalization. In train() the batch's statistics normalise and the running ones are updated as
    ONNX specifies (BatchNormalization-14/15, training_mode): running_var = momentum * running_var + (1 - momentum) *
    the batch's population variance. clnet's batch norm (PyTorch's) adds the unbiased variance (times n / (n - 1)), so
    the update is corrected here: with r0 the value before and r the unbiased update over n values per channel,
    ONNX's is ((n - 1) r + momentum r0) / n. Statistics that are module buffers (the file's initializers) are updated
    in place, as training does; others (graph inputs, constants) are copied first, as ONNX returns new ones."""
    x, scale, bias, mean, var = a[:5]
    scale, bias = _tensor_arg(m, n, scale, 1), _tensor_arg(m, n, bias, 2)
    mean, var = _tensor_arg(m, n, mean, 3), _tensor_arg(m, n, var, 4)
    eps = float(n.attrs.get("epsilon", 1e-5))
    keep = float(n.attrs.get("momentum", 0.9))  # ONNX weighs the running value; PyTorch the batch's
    shape = tuple(x.shape)
    if x.ndim == 3 or x.ndim > 4:  # (N, C, ...) normalises per channel over all else, as a 4-D (N, C, P, 1)
        x = x.reshape(shape[0], shape[1], math.prod(shape[2:]), 1)
    if not m.training:
        return [F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps).reshape(shape), mean, var]
    if n.inputs[3] not in m._buffers:
        mean = _copy(mean)
    if n.inputs[4] not in m._buffers:
        var = _copy(var)
    before = _copy(var)
    y = F.batch_norm(x, mean, var, scale, bias, training=True, momentum=1.0 - keep, eps=eps)
    count = x.size // x.shape[1]
    with autograd.no_grad():
        var.copy_from(ops.Axpby.apply(var, before, alpha=(count - 1) / count, beta=keep / count))
    return [y.reshape(shape), mean, var]


def _transposed2d(m, x):
    """x (R, C) transposed, for a computed 2-D x: linear(I_C, x) = I_C x^T, with x's gradient through the product
    (clnet has no transpose kernel for computed matrices)."""
    eye = m.device_constant(("eye", x.shape[1]), np.eye(x.shape[1], dtype=np.float32))
    return F.linear(eye, x)


def _d_gemm(m, n, a):
    """Y = alpha op(A) op(B) + beta C. F.linear computes x w^T, so a B read as (in, out) (transB=0) is transposed
    first: a file's weight once, at load (held as (out, in)); a constant once, on upload; a computed B each call."""
    x, w = a[0], a[1]
    c = a[2] if len(a) > 2 else None
    at = n.attrs
    x = _tensor_arg(m, n, x, 0)
    if at.get("transA", 0):
        x = _transposed2d(m, x)
    if _is_host(w):
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w if at.get("transB", 0) else w.T))
    elif not at.get("transB", 0):
        w = _transposed2d(m, w)
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    N = w.shape[0]
    bias = None
    if c is not None:
        if tuple(c.shape) in ((N,), (1, N)) and beta == 1.0 and alpha == 1.0:
            bias = _tensor_arg(m, n, c, 2)
            bias = bias if bias.shape == (N,) else bias.reshape(N)
        elif beta != 1.0:
            c = c * beta
    y = F.linear(x, w, bias)
    if alpha != 1.0:
        y = ops.Affine.apply(y, alpha=alpha, beta=0.0)
    if c is not None and bias is None:
        y = _broadcast(m, n, "Add", y, c)
    return [y]


def _d_matmul(m, n, a):
    """ONNX's (NumPy's) matmul, where B is 1-D or 2-D: a weight of the file (held as (out, in), transB set at load), a
    constant, or a computed matrix; A computed of any rank, or a 2-D constant when B is computed."""
    x, w = a
    if _is_host(x):  # A constant, B computed: A B = (B^T A^T)^T
        return [_transposed2d(m, F.linear(_transposed2d(m, w), m.device_constant((n.name, 0), x)))]
    vector = x.ndim == 1
    if vector:
        x = x.reshape(1, x.shape[0])
    if w.ndim == 1:  # (K,): the product drops the last axis
        wt = m.device_constant((n.name, 1), w.reshape(1, -1)) if _is_host(w) else w.reshape(1, w.shape[0])
        y = F.linear(x, wt)
        return [y.reshape(y.shape[:-1]) if not vector else y.reshape(())]
    if _is_host(w):
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w.T))
    elif not n.attrs.get("transB", 0):
        w = _transposed2d(m, w)
    y = F.linear(x, w)
    return [y.reshape(y.shape[1:]) if vector else y]


# Per-channel operands of Add, Sub, Mul, Div run as an evaluation-mode batch norm with mean 0, variance 1 and eps 0
# (y = x * weight + bias exactly): one elementwise pass with the gradients of x, weight and bias.

def _as_channels(m, n, v, C, key, transform=None):
    if _is_host(v):
        arr = v.reshape(C).astype(np.float32)
        return m.device_constant((n.name, key), transform(arr) if transform else arr)
    t = v.reshape(C)
    if transform is not None:
        t = transform(t)
    return t


def _per_channel(m, C, weight, bias, x):
    zeros = m.device_constant(("zeros", C), np.zeros(C, np.float32))
    ones = m.device_constant(("ones", C), np.ones(C, np.float32))
    return ops.BatchNormEval.apply(x, weight, bias, zeros, ones, eps=0.0)


def _dim_eq(x, y):
    """Whether two dimensions are equal: True or False where known, None where one is unknown at load (a free
    dimension's name, or None)."""
    if isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer)):
        return int(x) == int(y)
    if isinstance(x, str) and x == y:
        return True
    return None


def _all3(values):
    """False if any is False, else None if any is unknown (None), else True."""
    values = list(values)
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _fits(small, big):
    """Whether shape `small` broadcasts to exactly shape `big` (three-valued, as _dim_eq)."""
    if len(small) > len(big):
        return False
    full = (1,) * (len(big) - len(small)) + tuple(small)
    return _all3(True if s == 1 else _dim_eq(s, b) for s, b in zip(full, big))


def _channel_of(small, big):
    """Whether `small` broadcasts to `big` as a per-channel vector: (1, C, 1, ...) against a 4-D (N, C, H, W), or
    (C,) / (1, C) against (N, C) (three-valued)."""
    if len(big) not in (2, 4) or len(small) > len(big):
        return False
    full = (1,) * (len(big) - len(small)) + tuple(small)
    return _all3([_dim_eq(full[1], big[1])] + [_dim_eq(s, 1) for i, s in enumerate(full) if i != 1])


def _binary_plan(op, a_dev, a_shape, b_dev, b_shape):
    """How clnet runs `a op b` (Add, Sub, Mul, Div) under ONNX's broadcasting, from which operands are computed (on
    the device) and their shapes. Returns (plan, swapped): plan "host" (NumPy), "same" (equal shapes), "scalar" (a
    constant of one element) or "channel" (a per-channel vector), swapped when b sets the result's shape; None where
    load cannot tell (an unknown dimension: the call decides). Raises ValueError with what clnet lacks."""
    if not a_dev and not b_dev:
        return "host", False
    if a_shape is None or b_shape is None:
        return None
    shapes = f"shapes {tuple(a_shape)} and {tuple(b_shape)}"
    candidates = []
    for big_dev, big, small, swapped in ((a_dev, a_shape, b_shape, False), (b_dev, b_shape, a_shape, True)):
        if big_dev:
            candidates.append((_fits(small, big), swapped, big, small))
    fit = next((c for c in candidates if c[0]), None)
    if fit is None:
        if any(c[0] is None for c in candidates):
            return None
        raise ValueError(f"{op} of {shapes}: clnet broadcasts a scalar, a per-channel vector or a tensor of the "
                         "same shape against a computed tensor; this broadcast needs general broadcasting")
    known, swapped, big, small = fit
    small_dev = a_dev if swapped else b_dev
    if known is None:
        return None
    if _all3(_dim_eq(s, b) for s, b in zip(small, big)) and len(small) == len(big):
        if op == "Div" and (swapped or small_dev):
            raise ValueError(f"Div of {shapes} with a computed divisor: clnet has no elementwise division of "
                             "tensors (it divides by constants)")
        return "same", swapped
    if not small_dev and math.prod(s for s in small) == 1 and all(isinstance(s, (int, np.integer)) for s in small):
        if op == "Div" and swapped:
            raise ValueError(f"Div of {shapes}: clnet divides a computed tensor by a constant, not a constant by a "
                             "computed tensor")
        return "scalar", swapped
    channel = _channel_of(small, big)
    if channel is None:
        return None
    if op == "Div" and (swapped or small_dev):
        raise ValueError(f"Div of {shapes}: clnet divides a computed tensor by constants, not by a computed tensor "
                         "nor a constant by a computed tensor")
    if channel:
        return "channel", swapped
    if not small_dev:  # a constant broadcast on the host to the result's shape
        return "expand", swapped
    first, last = _block(small, len(big))
    block = _all3(_dim_eq(s, b) for s, b in zip(((1,) * (len(big) - len(small)) + tuple(small))[first:last],
                                                 big[first:last]))
    if block is None:
        return None
    if block:  # repeated along the axes before and after one block of its own: products with columns of ones
        return "expand", swapped
    raise ValueError(f"{op} of {shapes}: clnet repeats a computed tensor along the axes before and after one block "
                     "of its dimensions; this broadcast needs general broadcasting")


def _block(small, rank):
    """[first, last) of the axes where `small`, aligned to `rank` axes, is not 1 (a shape, its unknown dimensions
    counted as not 1)."""
    full = (1,) * (rank - len(small)) + tuple(small)
    inside = [i for i, s in enumerate(full) if s != 1]
    return (inside[0], inside[-1] + 1) if inside else (rank, rank)


def _expanded(m, n, small, shape, key):
    """`small` repeated to `shape` (ONNX's broadcasting): a constant on the host (uploaded once per shape); a
    computed tensor whose dimensions other than 1 form one block, as products with columns of ones (repeats after
    the block, then before it), so its gradient is the sum over the repeats."""
    shape = tuple(shape)
    if _is_host(small):
        wide = np.ascontiguousarray(np.broadcast_to(np.asarray(small, np.float32), shape))
        return m.device_constant((n.name, "expand", key, shape), wide)
    first, last = _block(small.shape, len(shape))
    K, T = small.size, math.prod(shape[last:])
    L = math.prod(shape) // (K * T)
    y = small.reshape(K, 1)
    if T > 1:  # each value repeated T times: (K, 1) (T, 1)^T
        y = F.linear(y, m.device_constant(("ones column", T), np.ones((T, 1), np.float32))).reshape(K * T, 1)
    if L > 1:  # the whole repeated L times: (L, 1) (K T, 1)^T
        y = F.linear(m.device_constant(("ones column", L), np.ones((L, 1), np.float32)), y)
    return y.reshape(shape)


def _broadcast(m, n, op, a, b):
    """a op b with ONNX's broadcasting, where clnet has a kernel for it (_binary_plan)."""
    a_dev, b_dev = isinstance(a, Tensor), isinstance(b, Tensor)
    plan, swapped = _binary_plan(op, a_dev, tuple(a.shape), b_dev, tuple(b.shape))
    if plan == "host":
        return HOST_OPS[op](m, n, [a, b])[0]
    big, small = (b, a) if swapped else (a, b)
    if plan == "same":
        if op == "Div":  # big / constant: times the constant's reciprocal
            return ops.product(big, m.device_constant((n.name, "1/"), 1.0 / small.astype(np.float64)))
        a, b = _tensor_arg(m, n, a, 0), _tensor_arg(m, n, b, 1)
        return a + b if op == "Add" else a - b if op == "Sub" else ops.product(a, b)
    if plan == "scalar":
        c = float(small.reshape(-1)[0])
        if op == "Add":
            return ops.Affine.apply(big, alpha=1.0, beta=c)
        if op == "Sub":
            return ops.Affine.apply(big, alpha=-1.0 if swapped else 1.0, beta=c if swapped else -c)
        if op == "Mul":
            return ops.Affine.apply(big, alpha=c, beta=0.0)
        return ops.Affine.apply(big, alpha=1.0 / c, beta=0.0)
    if plan == "expand":
        wide = _expanded(m, n, 1.0 / small.astype(np.float64) if op == "Div" else small, big.shape,
                         0 if swapped else 1)
        if op == "Add":
            return big + wide
        if op == "Sub":
            return wide - big if swapped else big - wide
        return ops.product(big, wide)
    C = big.shape[1]
    if op == "Add":
        return _per_channel(m, C, None, _as_channels(m, n, small, C, "bias"), big)
    if op == "Mul":
        return _per_channel(m, C, _as_channels(m, n, small, C, "weight"), None, big)
    if op == "Div":
        return _per_channel(m, C, _as_channels(m, n, small, C, "weight", lambda t: 1.0 / t), None, big)
    # Sub: big - small, or small - big
    if swapped:
        ones = m.device_constant(("-ones", C), -np.ones(C, np.float32))
        return _per_channel(m, C, ones, _as_channels(m, n, small, C, "bias"), big)
    neg = (lambda t: -t) if _is_host(small) else (lambda t: t * -1.0)
    return _per_channel(m, C, None, _as_channels(m, n, small, C, "-bias", neg), big)


def _d_binary(op):
    return lambda m, n, a: [_broadcast(m, n, op, a[0], a[1])]


def _activation(kind):
    return lambda m, n, a: [ops.Activation.apply(a[0], kind=kind)]


def _clip_bounds(m, n, a):
    if "min" in n.attrs or "max" in n.attrs:  # opset < 11
        return n.attrs.get("min"), n.attrs.get("max")
    lo = float(a[1].reshape(-1)[0]) if len(a) > 1 and a[1] is not None else None
    hi = float(a[2].reshape(-1)[0]) if len(a) > 2 and a[2] is not None else None
    return lo, hi


def _d_clip(m, n, a):
    x = a[0]
    if any(isinstance(v, Tensor) for v in a[1:3]):  # computed bounds: max(x, lo) = x + relu(lo - x), then
        y = x                                        # min(y, hi) = y - relu(y - hi) (min > max gives max, as ONNX)
        if len(a) > 1 and a[1] is not None:
            y = y + ops.Activation.apply(_expanded(m, n, a[1], x.shape, 1) - y, kind="relu")
        if len(a) > 2 and a[2] is not None:
            y = y - ops.Activation.apply(y - _expanded(m, n, a[2], x.shape, 2), kind="relu")
        return [y]
    lo, hi = _clip_bounds(m, n, a)
    if lo is None and hi is None:
        return [x]
    if lo == 0.0 and hi == 6.0:
        return [ops.Activation.apply(x, kind="relu6")]
    if hi is None:  # lo + relu(x - lo)
        return [ops.Affine.apply(ops.Activation.apply(ops.Affine.apply(x, alpha=1.0, beta=-lo), kind="relu"),
                                 alpha=1.0, beta=lo)]
    if lo is None:  # hi - relu(hi - x)
        return [ops.Affine.apply(ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=hi), kind="relu"),
                                 alpha=-1.0, beta=hi)]
    if hi <= lo:
        raise ValueError(f"Clip with min {lo} >= max {hi} is not supported")
    scale = 6.0 / (hi - lo)  # lo + relu6((x - lo) * scale) / scale
    inner = ops.Affine.apply(x, alpha=scale, beta=-lo * scale)
    return [ops.Affine.apply(ops.Activation.apply(inner, kind="relu6"), alpha=1.0 / scale, beta=lo)]


def _hard_sigmoid(x, alpha, beta):
    """max(0, min(1, alpha x + beta)) = relu6(6 alpha x + 6 beta) / 6."""
    inner = ops.Affine.apply(x, alpha=6.0 * alpha, beta=6.0 * beta)
    return ops.Affine.apply(ops.Activation.apply(inner, kind="relu6"), alpha=1.0 / 6.0, beta=0.0)


def _d_hard_sigmoid(m, n, a):
    return [_hard_sigmoid(a[0], float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5)))]


def _d_hard_swish(m, n, a):
    return [ops.product(a[0], _hard_sigmoid(a[0], 1.0 / 6.0, 0.5))]


def _d_leaky_relu(m, n, a):
    x, alpha = a[0], float(n.attrs.get("alpha", 0.01))  # relu(x) - alpha relu(-x)
    neg = ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=0.0), kind="relu")
    return [ops.Axpby.apply(ops.Activation.apply(x, kind="relu"), neg, alpha=1.0, beta=-alpha)]


def _d_lrn(m, n, a):
    at = n.attrs
    return [F.local_response_norm(a[0], int(at["size"]), float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)),
                                  float(at.get("bias", 1.0)))]


def _d_softmax(log):
    def run(m, n, a):
        x = a[0]
        default = -1 if m.opset >= 13 else 1
        axis = int(n.attrs.get("axis", default)) % x.ndim
        if m.opset < 13 and axis != x.ndim - 1:  # softmax over the flattened trailing dimensions
            y = ops.Softmax.apply(x.reshape(_flatten_shape(x.shape, axis)), dim=1, log=log)
            return [y.reshape(x.shape)]
        return [ops.Softmax.apply(x, dim=axis, log=log)]
    return run


def _d_dropout(m, n, a):
    x = a[0]
    ratio = n.attrs.get("ratio", 0.5)
    if len(a) > 1 and a[1] is not None:
        ratio = float(a[1].reshape(-1)[0])
    return [F.dropout(x, float(ratio), m.training), None]


def _d_reshape(m, n, a):
    x = a[0]
    return [x.reshape(_reshape_target(x.shape, _reshape_shape(n, a), n.attrs.get("allowzero", 0)))]


def _d_flatten(m, n, a):
    return [a[0].reshape(_flatten_shape(a[0].shape, n.attrs.get("axis", 1)))]


def _d_squeeze(m, n, a):
    return [a[0].reshape(_squeezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_unsqueeze(m, n, a):
    return [a[0].reshape(_unsqueezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_concat(m, n, a):
    xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
    return [ops.cat(xs, dim=int(n.attrs["axis"]) % xs[0].ndim)]


def _transpose_plan(perm, shape):
    """How clnet transposes a computed tensor: "view" (only axes of size 1 move: the memory order is unchanged), "2d"
    (a matrix: a product with the identity), "channels" (the batch axis stays first and the permuted axes precede
    unmoved trailing ones: a 1x1 convolution with a permutation matrix), "small" (the batch axis moves too, in a
    tensor whose moved axes are known and small: the same convolution over the whole tensor as one image). Unknown
    dimensions count as larger than 1 (a negative number at load). Raises ValueError otherwise."""
    moved = [p for p in perm if shape[p] != 1]
    if moved == sorted(moved):
        return "view"
    if len(perm) == 2:
        return "2d"
    j = len(perm)
    while j > 1 and perm[j - 1] == j - 1:
        j -= 1
    if perm[0] == 0 and j >= 3:
        return "channels"
    moved = shape[:j]
    if all(isinstance(d, (int, np.integer)) and d > 0 for d in moved) and math.prod(moved) <= _SMALL_PERMUTATION:
        return "small"
    raise ValueError(f"Transpose with perm {list(perm)} of shape {tuple(shape)}: clnet transposes matrices, axes "
                     "before unmoved trailing ones where the batch axis stays first (a channel shuffle), and "
                     f"tensors of known size whose moved axes hold at most {_SMALL_PERMUTATION} elements; this one "
                     "needs the tensor ops' general transpose")


_SMALL_PERMUTATION = 1024  # elements a permutation matrix may permute (a 4 MiB matrix)


def _d_transpose(m, n, a):
    x = a[0]
    perm = list(n.attrs["perm"]) if "perm" in n.attrs else list(range(x.ndim))[::-1]
    out_shape = tuple(x.shape[p] for p in perm)
    plan = _transpose_plan(perm, x.shape)
    if plan == "view":
        return [x.reshape(out_shape)]
    if plan == "2d":
        return [_transposed2d(m, x)]
    j = len(perm)
    while j > 1 and perm[j - 1] == j - 1:
        j -= 1
    # a permutation of the axes first..j-1 (first 1: the batch stays; 0: a small tensor, batch and all, as one image)
    # of a 1x1 convolution with a permutation matrix
    first = 1 if plan == "channels" else 0
    lead = x.shape[0] if first else 1
    C, P = math.prod(x.shape[first:j]), math.prod(x.shape[j:])
    key = ("perm", tuple(perm), x.shape[first:j])
    w = m._device_constants.get((key, id(m.device)))
    w = None if w is None else w[0]
    if w is None:
        source = np.arange(C).reshape(x.shape[first:j]).transpose([p - first for p in perm[first:j]]).reshape(-1)
        eye = np.zeros((C, C, 1, 1), np.float32)
        eye[np.arange(C), source, 0, 0] = 1.0
        w = m.device_constant(key, eye)
    x4 = x.reshape(lead, C, P, 1)
    s = conv_shape(n.name, x4.shape, w.shape, (1, 1), (0, 0), (0, 0), (1, 1), 1)
    y = ops.Conv2d.apply(x4, w, None, s=s, what=f"Transpose {n.name} (channel permutation)")
    return [y.reshape(out_shape)]


def _d_neg(m, n, a):
    return [ops.Affine.apply(a[0], alpha=-1.0, beta=0.0)]


def _d_abs(m, n, a):  # relu(x) + relu(-x)
    x = a[0]
    return [ops.Activation.apply(x, kind="relu") + ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=0.0),
                                                                        kind="relu")]


def _d_variadic(op):
    """Sum, Max, Min, Mean of tensors of one shape (checked at load): max(a, b) = a + relu(b - a), min(a, b) =
    a - relu(a - b), each with its gradients through the ReLU (a tie sends the gradient to the earlier input)."""
    def run(m, n, a):
        xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
        y = xs[0]
        for t in xs[1:]:
            if op in ("Sum", "Mean"):
                y = y + t
            elif op == "Max":
                y = y + ops.Activation.apply(t - y, kind="relu")
            else:
                y = y - ops.Activation.apply(y - t, kind="relu")
        if op == "Mean" and len(xs) > 1:
            y = ops.Affine.apply(y, alpha=1.0 / len(xs), beta=0.0)
        return [y]
    return run


def _d_cast(m, n, a):
    if n.attrs["to"] != 1:
        raise ValueError("Cast of a computed tensor to a type other than float32 is not supported")
    return [a[0]]


DEVICE_OPS = {
    "Conv": _d_conv, "Gemm": _d_gemm, "MatMul": _d_matmul, "Add": _d_binary("Add"), "Sub": _d_binary("Sub"),
    "Mul": _d_binary("Mul"), "Div": _d_binary("Div"), "Relu": _activation("relu"), "Sigmoid": _activation("sigmoid"),
    "Tanh": _activation("tanh"), "Clip": _d_clip, "HardSigmoid": _d_hard_sigmoid, "HardSwish": _d_hard_swish,
    "LeakyRelu": _d_leaky_relu, "MaxPool": _pool_1d(_d_maxpool), "AveragePool": _pool_1d(_d_avgpool),
    "GlobalAveragePool": _d_global_avgpool, "GlobalMaxPool": _d_global_maxpool, "ReduceMean": _d_reduce("mean"),
    "ReduceSum": _d_reduce("sum"), "ReduceMax": _d_reduce("max"), "ReduceMin": _d_reduce("min"),
    "BatchNormalization": _d_batchnorm, "Sum": _d_variadic("Sum"),
    "Max": _d_variadic("Max"), "Min": _d_variadic("Min"), "Mean": _d_variadic("Mean"), "Neg": _d_neg, "Abs": _d_abs,
    "LRN": _d_lrn, "Concat": _d_concat, "Flatten": _d_flatten, "Reshape": _d_reshape, "Squeeze": _d_squeeze,
    "Unsqueeze": _d_unsqueeze, "Transpose": _d_transpose, "Softmax": _d_softmax(False),
    "LogSoftmax": _d_softmax(True), "Dropout": _d_dropout, "Identity": lambda m, n, a: [a[0]], "Cast": _d_cast,
}

# The inputs of each op that are trained (Parameters) or kept (buffers) when they are float initializers.
_PARAMETER_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "BatchNormalization": (1, 2),
                     "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1)}
_BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


def _dispatch(op):
    host, device = HOST_OPS.get(op), DEVICE_OPS.get(op)

    def run(m, n, a):
        if host is not None and all(v is None or _is_host(v) for v in a):
            return host(m, n, a)
        if op in ("Shape", "Size"):
            return host(m, n, a)
        if device is None:
            raise ValueError(f"{op} of a computed tensor is not supported (clnet evaluates it for constants and "
                             "shapes only)")
        return device(m, n, a)
    return run
