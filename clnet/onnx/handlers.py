"""The import table: each ONNX operator on computed tensors, as clnet's tensor ops run it (pointwise, reduce, views,
products, nn.functional), with beside it what load must check of its node: the inputs that must be known on the host
(constants of the file, or values computed from shapes), the float initializers it trains (Parameters) or keeps
(buffers), and the refusals that depend on shapes and attributes (each a function of the node and what load knows
of its inputs, raising ValueError with the reason).

The elementwise operators come from the engine's own tables (pointwise.UNARY and pointwise.BINARY name each op's
ONNX counterpart); the attributes ONNX gives them are read here."""

import math
from typing import Callable, NamedTuple

import numpy as np

from .. import autograd, creation, ops, pointwise, products, reduce, views
from ..nn import functional as F
from ..shapes import conv_shape
from ..tensor import Tensor
from .common import _host_int_list, _is_host
from .host import HOST_OPS, _axes, _flatten_shape, _reshape_shape, _reshape_target, _squeezed_shape, _unsqueezed_shape


# ---- inputs ---------------------------------------------------------------------------------------------------------

def _tensor_arg(m, n, v, i):
    """Input i as a device tensor: a host value uploaded once under the node's name (floats as float32, integers as
    int32, booleans as bool)."""
    if _is_host(v):
        return m.device_constant((n.name, i), v)
    return v


def _operands(m, n, a, b, slots=(0, 1)):
    """Two operands of a broadcasting op (inputs `slots` of the node): a host value of one element that does not raise
    the other's rank is passed as a number (one cached constant, the engine's fast paths), another host value is
    uploaded."""
    out = []
    for i, v, other in ((slots[0], a, b), (slots[1], b, a)):
        if _is_host(v) and v.size == 1 and v.ndim <= getattr(other, "ndim", 0):
            x = v.reshape(-1)[0]
            out.append(bool(x) if v.dtype == np.bool_ else int(x) if v.dtype.kind in "iu" else float(x))
        else:
            out.append(_tensor_arg(m, n, v, i))
    if not isinstance(out[0], Tensor) and not isinstance(out[1], Tensor):  # two numbers: one of them a tensor
        out[0] = _tensor_arg(m, n, a, slots[0])
    return out


def _int(v):
    return isinstance(v, Tensor) and v.dtype.kind in "iu"


# ---- convolution, pooling, batch normalization --------------------------------------------------------------------

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
    """ONNX's Conv, 1-D and 2-D; n.act: the ReLU of the Relu node after it (module._fuse_relus), in its epilogue."""
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
    return [ops.Conv2d.apply(x, w, b, s=s, what=f"Conv {n.name}", relu=n.act == "relu")]


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
        self.name, self.op, self.inputs, self.attrs, self.act = n.name, n.op, n.inputs, _as_2d(n.attrs), n.act


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



def _copy(t):
    with autograd.no_grad():
        return ops.Affine.apply(t, alpha=1.0, beta=0.0)


def _d_batchnorm(m, n, a):
    """ONNX's BatchNormalization. In train() the batch's statistics normalise and the running ones are updated as
    ONNX specifies (BatchNormalization-14/15, training_mode): running_var = momentum * running_var + (1 - momentum) *
    the batch's population variance (PyTorch's batch norm adds the unbiased one; the statistics kernel takes which).
    Statistics that are module buffers (the file's initializers) are updated in place, as training does; others
    (graph inputs, constants) are copied first, as ONNX returns new ones. n.act: the activation of the Relu or ReLU6
    Clip node after it (module._fuse_relus), applied here."""
    x, scale, bias, mean, var = a[:5]
    scale, bias = _tensor_arg(m, n, scale, 1), _tensor_arg(m, n, bias, 2)
    mean, var = _tensor_arg(m, n, mean, 3), _tensor_arg(m, n, var, 4)
    eps = float(n.attrs.get("epsilon", 1e-5))
    keep = float(n.attrs.get("momentum", 0.9))  # ONNX weighs the running value; PyTorch the batch's
    shape = tuple(x.shape)
    if x.ndim == 3 or x.ndim > 4:  # (N, C, ...) normalises per channel over all else, as a 4-D (N, C, P, 1)
        x = x.reshape(shape[0], shape[1], math.prod(shape[2:]), 1)
    if not m.training:
        y = F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps)
        return [(ops.Activation.apply(y, kind=n.act) if n.act else y).reshape(shape), mean, var]
    if n.inputs[3] not in m._buffers:
        mean = _copy(mean)
    if n.inputs[4] not in m._buffers:
        var = _copy(var)
    y = ops.BatchNormTrain.apply(x, scale, bias, mean, var, momentum=1.0 - keep, eps=eps, unbiased=False, act=n.act)
    return [y.reshape(shape), mean, var]


def _d_global_pool(kind):
    def run(m, n, a):
        x = a[0]
        if x.ndim == 4 and x.shape[2:] == (1, 1):
            return [x]
        if x.ndim == 4 and kind == "max":
            return [ops.MaxPool2d.apply(x, out_shape=tuple(x.shape[:2]) + (1, 1), k=x.shape[2:], s=x.shape[2:],
                                        p=(0, 0))]
        if x.ndim == 4:
            return [ops.AvgPool2d.apply(x, out_shape=x.shape[:2] + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0),
                                        count_include_pad=True)]
        dims = tuple(range(2, x.ndim))
        return [reduce.amax(x, dims, keepdim=True) if kind == "max" else reduce.mean(x, dims, keepdim=True)]
    return run


# ---- elementwise: the engine's tables, with ONNX's attributes --------------------------------------------------------

_UNARY = {spec.onnx: name for name, spec in pointwise.UNARY.items() if spec.onnx}
# ONNX's Softplus is log(1 + e^x): the kernel's beta 1 and a linear tail past 20, within float32's eps of it
_FIXED_PARAMS = {"Softplus": (1.0, 20.0)}


def _d_unary(onnx_name):
    name = _UNARY[onnx_name]
    attrs, fixed = pointwise.UNARY[name].onnx_attrs, _FIXED_PARAMS.get(onnx_name, ())

    def params(at):  # the kernel's scalar parameters from ONNX's attributes (pointwise.UNARY's onnx_attrs)
        return tuple(float(at.get(a, default)) for a, default in attrs) or fixed

    def run(m, n, a):
        x = _tensor_arg(m, n, a[0], 0)
        if name in ("relu", "sigmoid", "tanh") and x.dtype == np.float32:
            return [ops.Activation.apply(x, kind=name)]
        return [pointwise.unary(name, x, *params(n.attrs))]
    return run


_relu = _d_unary("Relu")


def _d_selu(m, n, a):  # gamma * elu(x, alpha)
    at = n.attrs
    alpha, gamma = float(at.get("alpha", 1.67326319217681884765625)), float(at.get("gamma", 1.05070102214813232421875))
    return [pointwise.mul(pointwise.unary("elu", a[0], alpha), gamma)]


def _d_hard_sigmoid(m, n, a):  # max(0, min(1, alpha x + beta))
    at = n.attrs
    y = ops.Affine.apply(a[0], alpha=float(at.get("alpha", 0.2)), beta=float(at.get("beta", 0.5)))
    return [pointwise.clamp(y, 0.0, 1.0)]


def _d_gelu(m, n, a):
    return [pointwise.unary("gelu_tanh" if n.attrs.get("approximate", "none") == "tanh" else "gelu", a[0])]


def _d_silu(m, n, a):
    """x * sigmoid(x) as one op: a Sigmoid and the Mul by its own input, as exporters spell SiLU (load._silus)."""
    return [pointwise.unary("silu", _tensor_arg(m, n, a[0], 0))]


def _c_gelu(n, ins, opset):
    if n.attrs.get("approximate", "none") not in ("none", "tanh"):
        raise ValueError(f"approximate={n.attrs['approximate']!r}: ONNX's Gelu takes 'none' or 'tanh'")


def _d_softsign(m, n, a):  # x / (1 + |x|)
    return [pointwise.div(a[0], pointwise.add(pointwise.abs(a[0]), 1.0))]


def _d_thresholded_relu(m, n, a):  # x where x > alpha, else 0
    return [pointwise.where(a[0] > float(n.attrs.get("alpha", 1.0)), a[0], 0.0)]


def _d_shrink(m, n, a):  # x + bias below -lambd, x - bias above lambd, 0 between
    x, lambd, bias = a[0], float(n.attrs.get("lambd", 0.5)), float(n.attrs.get("bias", 0.0))
    return [pointwise.where(x < -lambd, pointwise.add(x, bias), pointwise.where(x > lambd, pointwise.sub(x, bias),
                                                                                0.0))]


def _d_prelu(m, n, a):
    x, slope = a[0], _tensor_arg(m, n, a[1], 1)
    return [pointwise.where(x > 0.0, x, x * slope)]


_BINARY = {spec.onnx: name for name, spec in pointwise.BINARY.items() if spec.onnx and spec.onnx not in ("Max", "Min")}


def _d_binary(onnx_name):
    name = _BINARY[onnx_name]

    def run(m, n, a):
        x, y = _operands(m, n, a[0], a[1])
        if name == "add":
            if n.act is None:
                return [pointwise.add(x, y)]
            # the ReLU of the Relu node after it (module._fuse_relus): in the add's launch where both are float32
            # tensors of one shape, else as that node would run it
            if (isinstance(x, Tensor) and isinstance(y, Tensor) and x.dtype == y.dtype == np.float32 and
                    x.shape == y.shape and x.device is y.device):
                return [ops.AddRelu.apply(x, y)]
            return _relu(m, n, [pointwise.add(x, y)])
        if name == "sub":
            return [pointwise.sub(x, y)]
        if name == "mul":
            return [pointwise.mul(x, y)]
        if name == "div":
            if (_int(x) or isinstance(x, int)) and (_int(y) or isinstance(y, int)):  # ONNX's integer division truncates
                return [pointwise.cast(pointwise.div(x, y, rounding_mode="trunc"), np.int32)]
            return [pointwise.div(x, y)]
        if name == "pow":
            return [pointwise.pow(x, float(y) if isinstance(y, int) else y)]
        return [pointwise.binary(name, x, y)]
    return run


def _d_mod(m, n, a):
    """fmod=0: the remainder with the divisor's sign (the engine's remainder); fmod=1: C's fmod, the dividend's sign,
    a - b trunc(a / b)."""
    x, y = _operands(m, n, a[0], a[1])
    if not n.attrs.get("fmod", 0):
        return [pointwise.binary("remainder", x, y)]
    return [pointwise.sub(x, pointwise.mul(y, pointwise.div(x, y, rounding_mode="trunc")))]


def _d_not(m, n, a):
    return [pointwise.logical_not(_tensor_arg(m, n, a[0], 0))]


def _d_variadic(op):
    """Sum, Max, Min, Mean of any number of tensors, broadcast (a tie of Max or Min sends the gradient to the earlier
    input)."""
    def run(m, n, a):
        y = _tensor_arg(m, n, a[0], 0)
        for i, v in enumerate(a[1:], 1):
            y, t = _operands(m, n, y, v, (0, i))
            if op in ("Sum", "Mean"):
                y = pointwise.add(y, t)
            else:
                y = pointwise.binary("maximum" if op == "Max" else "minimum", y, t)
        if op == "Mean" and len(a) > 1:
            y = pointwise.mul(y, 1.0 / len(a))
        return [y]
    return run


def _clip_bound(m, n, a, i):
    if i >= len(a) or a[i] is None:
        return None
    v = a[i]
    if _is_host(v):
        x = v.reshape(-1)[0]
        return int(x) if v.dtype.kind in "iu" else float(x)
    return v.reshape(())


def _d_clip(m, n, a):
    x = a[0]
    if "min" in n.attrs or "max" in n.attrs:  # opset < 11
        lo, hi = n.attrs.get("min"), n.attrs.get("max")
    else:
        lo, hi = _clip_bound(m, n, a, 1), _clip_bound(m, n, a, 2)
    if lo is None and hi is None:
        return [x]
    if lo == 0.0 and hi == 6.0 and x.dtype == np.float32:
        return [pointwise.unary("relu6", x)]
    return [pointwise.clamp(x, lo, hi)]


def _c_clip(n, ins, opset):
    for s in (1, 2):
        if s < len(ins) and ins[s] is not None and ins[s][1] is not None and math.prod(
                d if isinstance(d, (int, np.integer)) else 2 for d in ins[s][1]) != 1:
            raise ValueError(f"a bound ({n.inputs[s]!r}) of shape {tuple(ins[s][1])}: ONNX's bounds are scalars")


def _d_where(m, n, a):
    cond = _tensor_arg(m, n, a[0], 0)
    x, y = _operands(m, n, a[1], a[2], (1, 2))
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        x = _tensor_arg(m, n, a[1], 1)
    return [pointwise.where(cond, x, y)]


_CASTS = {1: np.float32, 6: np.int32, 7: np.int32, 9: np.bool_}  # ONNX types a computed tensor is cast to


def _d_cast(m, n, a):
    return [pointwise.cast(a[0], _CASTS[n.attrs["to"]])]


def _c_cast(n, ins, opset):
    if n.attrs.get("to") not in _CASTS:
        raise ValueError(f"Cast of a computed tensor to ONNX type {n.attrs.get('to')}: clnet's tensors hold float32, "
                         "int32 (for int32 and int64) and bool")


def _d_trilu(m, n, a):
    x = a[0]
    k = int(np.asarray(a[1]).reshape(-1)[0]) if len(a) > 1 and a[1] is not None else 0
    rows, cols = x.shape[-2:]
    keep = np.triu(np.ones((rows, cols), bool), k) if n.attrs.get("upper", 1) else np.tril(np.ones((rows, cols),
                                                                                                  bool), k)
    mask = m.device_constant((n.name, "mask", rows, cols, k), keep)
    return [pointwise.where(mask, x, 0.0 if x.dtype == np.float32 else 0)]


def _c_trilu(n, ins, opset):
    _need_rank(n, ins, range(2, 9))



# ---- load-time checks shared by the entries ------------------------------------------------------------------------

def _need_rank(n, ins, ranks, what="input"):
    shape = ins[0][1]
    if shape is not None and len(shape) not in ranks:
        ranks = list(ranks)
        said = " or ".join(f"{r}-D" for r in ranks) if len(ranks) <= 3 else f"{ranks[0]}-D to {ranks[-1]}-D"
        raise ValueError(f"clnet runs {n.op} on {said} {what}s, got shape {tuple(shape)}")


def _known(shape):
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _const(ins, i):
    """Input i's value where load knows it (a constant of the file), else None."""
    return ins[i][2] if i < len(ins) and ins[i] is not None and ins[i][0] == "const" else None


def _c_conv(n, ins, opset):
    w = ins[1][1] if len(ins) > 1 and ins[1] is not None else None
    _need_rank(n, ins, (3, 4) if w is None else (len(w),) if len(w) in (3, 4) else (4,))


def _c_pool(n, ins, opset):
    k = n.attrs.get("kernel_shape", ())
    _need_rank(n, ins, (len(k) + 2,))
    shape = ins[0][1]
    at = n.attrs
    if len(k) == 1:
        at = _as_2d(at)
        shape = None if shape is None else (shape[0], shape[1], 1, shape[2])
    if n.op == "AveragePool" and at.get("count_include_pad", 0) and at.get("auto_pad", "NOTSET") in (
            "SAME_UPPER", "SAME_LOWER"):
        if shape is None or not _known(shape[2:]):
            raise ValueError("an average counting the padding with auto_pad SAME over a size unknown at load: the "
                             "pads may differ at the two ends, which clnet's divisor does not take")
        begin, total = _padding(at, shape[2:], at["kernel_shape"], at.get("strides", (1, 1)), (1, 1))
        if any(2 * b != t for b, t in zip(begin, total)):
            raise ValueError(f"an average counting the padding with auto_pad SAME gives pads {begin} and "
                             f"{tuple(t - b for b, t in zip(begin, total))} at the two ends: clnet's divisor assumes "
                             "equal pads")
    if shape is not None and _known(shape[2:]):
        _pool_geometry(at, (1, 1) + tuple(shape[2:]))


def _c_batchnorm(n, ins, opset):
    shape = ins[0][1]
    if shape is not None and len(shape) < 2:
        raise ValueError(f"clnet normalises inputs of 2 dimensions or more (N, C, ...), got shape {tuple(shape)}")


def _c_concat(n, ins, opset):
    for i in ins:
        if i is not None and i[0] == "host":
            raise ValueError("it joins a computed tensor with a value computed from shapes on the host")


# ---- reductions ----------------------------------------------------------------------------------------------------

def _reduce_dims(rank, axes, noop):
    """The dimensions a reduction over `axes` reduces (all when none are given, unless noop_with_empty_axes: None,
    no reduction). Raises ValueError for an axis out of range."""
    if not axes:
        return None if noop else tuple(range(rank))
    for ax in axes:
        if not -rank <= ax < rank:
            raise ValueError(f"axis {ax} is out of range for a {rank}-D tensor")
    return tuple(sorted({ax % rank for ax in axes}))


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = reduce.prod(x, d, keepdim=keep)
    return x


_REDUCTIONS = {  # ONNX's reductions: (over dims, keepdim), and the map each applies alone where nothing is reduced
    "ReduceSum": (lambda x, d, k: reduce.sum(x, d, k), lambda x: x),
    "ReduceMean": (lambda x, d, k: reduce.mean(x, d, k), lambda x: x),
    "ReduceMax": (lambda x, d, k: reduce.amax(x, d, k), lambda x: x),
    "ReduceMin": (lambda x, d, k: reduce.amin(x, d, k), lambda x: x),
    "ReduceProd": (_prod, lambda x: x),
    "ReduceL1": (lambda x, d, k: reduce.sum(pointwise.abs(x), d, k), pointwise.abs),
    "ReduceL2": (lambda x, d, k: reduce.norm(x, 2, d, k), pointwise.abs),
    "ReduceSumSquare": (lambda x, d, k: reduce.sum(pointwise.mul(x, x), d, k), lambda x: pointwise.mul(x, x)),
    "ReduceLogSum": (lambda x, d, k: pointwise.log(reduce.sum(x, d, k)), pointwise.log),
    "ReduceLogSumExp": (lambda x, d, k: reduce.logsumexp(x, d, k), lambda x: x),
}


def _d_reduce(op):
    over, alone = _REDUCTIONS[op]

    def run(m, n, a):
        x = a[0]
        dims = _reduce_dims(x.ndim, _axes(m, n, a, 1), n.attrs.get("noop_with_empty_axes", 0))
        if dims is None:
            return [alone(x)]
        keep = bool(n.attrs.get("keepdims", 1))
        if op == "ReduceMean" and x.ndim == 4 and dims == (2, 3):  # over H and W: the global average pooling
            y = _d_global_pool("mean")(m, n, [x])[0]
            return [y if keep else y.reshape(x.shape[:2])]
        return [over(x, dims, keep)]
    return run


def _c_reduce(n, ins, opset):
    shape = ins[0][1]
    if shape is None:
        return
    if "axes" in n.attrs:
        axes = _host_int_list(n.attrs["axes"])
    elif len(ins) > 1 and ins[1] is not None:
        if ins[1][0] != "const":
            return  # computed from shapes: the call decides
        axes = _host_int_list(ins[1][2])
    else:
        axes = []
    _reduce_dims(len(shape), axes, n.attrs.get("noop_with_empty_axes", 0))


def _d_arg(kind):
    def run(m, n, a):
        x = a[0]
        fn = reduce.argmax if kind == "max" else reduce.argmin
        axis, keep = int(n.attrs.get("axis", 0)) % x.ndim, bool(n.attrs.get("keepdims", 1))
        if not n.attrs.get("select_last_index", 0):
            return [fn(x, axis, keep)]
        D = x.shape[axis]  # the last extreme: the first of x reversed along axis, counted from the end
        flipped = views.index_select(x, axis, m.device_constant(("reverse", D), np.arange(D - 1, -1, -1)))
        return [pointwise.sub(D - 1, fn(flipped, axis, keep))]
    return run


def _d_softmax(log):
    def run(m, n, a):
        x = a[0]
        fn = reduce.log_softmax if log else reduce.softmax
        axis = int(n.attrs.get("axis", -1 if m.opset >= 13 else 1)) % max(x.ndim, 1)
        if m.opset < 13:  # over the trailing dimensions from axis, flattened
            return [fn(x.reshape(_flatten_shape(x.shape, axis)), 1).reshape(x.shape)]
        return [fn(x, axis)]
    return run


# ---- normalisations ------------------------------------------------------------------------------------------------

def _normalised(x, dims, eps):
    """(x - mean) / sqrt(var + eps) over dims (the population variance), the mean and 1 / sqrt(var + eps)."""
    mean = reduce.mean(x, dims, keepdim=True)
    centred = pointwise.sub(x, mean)
    var = reduce.mean(pointwise.mul(centred, centred), dims, keepdim=True)
    inv = pointwise.rsqrt(pointwise.add(var, float(eps)))
    return pointwise.mul(centred, inv), mean, inv


def _d_lp_norm(m, n, a):
    """x / ||x||_p along axis (p 1 or 2); a vector of zeros stays zeros."""
    x = a[0]
    axis = int(n.attrs.get("axis", -1)) % x.ndim
    norm = reduce.norm(x, int(n.attrs.get("p", 2)), axis, keepdim=True)
    return [pointwise.div(x, pointwise.where(norm == 0.0, 1.0, norm))]


def _c_lp_norm(n, ins, opset):
    if int(n.attrs.get("p", 2)) not in (1, 2):
        raise ValueError(f"p={n.attrs['p']}: ONNX's LpNormalization takes p 1 or 2")


def _d_mvn(m, n, a):
    """(x - mean) / sqrt(var) over `axes` (default the batch and spatial ones), as ONNX's MeanVarianceNormalization
    (its function adds 1e-9 to the standard deviation)."""
    x = a[0]
    dims = tuple(sorted(ax % x.ndim for ax in n.attrs.get("axes", [0, 2, 3])))
    mean = reduce.mean(x, dims, keepdim=True)
    centred = pointwise.sub(x, mean)
    std = pointwise.sqrt(reduce.mean(pointwise.mul(centred, centred), dims, keepdim=True))
    return [pointwise.div(centred, pointwise.add(std, 1e-9))]


def _d_hardmax(m, n, a):
    """1 at the first maximum along axis (opset 13; before, over the flattened trailing dimensions), else 0."""
    x = a[0]
    axis = int(n.attrs.get("axis", -1 if m.opset >= 13 else 1)) % x.ndim
    y = x if m.opset >= 13 else x.reshape(_flatten_shape(x.shape, axis))
    d = axis if m.opset >= 13 else 1
    index = reduce.argmax(y, d, keepdim=True)
    positions = m.device_constant(("positions", y.shape[d], y.ndim, d),
                                  np.arange(y.shape[d]).reshape((-1,) + (1,) * (y.ndim - d - 1)))
    return [pointwise.cast(pointwise.binary("eq", index, positions), np.float32).reshape(x.shape)]


def _d_layer_norm(m, n, a):
    """ONNX's LayerNormalization: over the dimensions from `axis` on; Mean and InvStdDev (its optional outputs) keep
    the reduced dimensions as 1."""
    x = a[0]
    axis = int(n.attrs.get("axis", -1)) % x.ndim
    y, mean, inv = _normalised(x, tuple(range(axis, x.ndim)), n.attrs.get("epsilon", 1e-5))
    y = pointwise.mul(y, _tensor_arg(m, n, a[1], 1))
    if len(a) > 2 and a[2] is not None:
        y = pointwise.add(y, _tensor_arg(m, n, a[2], 2))
    return [y, mean, inv]


def _d_group_norm(m, n, a):
    """ONNX's GroupNormalization: scale and bias per channel (opset 21), or per group (opset 18)."""
    x, scale, bias = a[0], _tensor_arg(m, n, a[1], 1), _tensor_arg(m, n, a[2], 2)
    G = int(n.attrs["num_groups"])
    N, C = x.shape[:2]
    y, _, _ = _normalised(x.reshape(N, G, -1), (2,), n.attrs.get("epsilon", 1e-5))
    if m.opset < 21:
        y = pointwise.add(pointwise.mul(y, scale.reshape(1, G, 1)), bias.reshape(1, G, 1)).reshape(x.shape)
        return [y]
    per = (1, C) + (1,) * (x.ndim - 2)
    return [pointwise.add(pointwise.mul(y.reshape(x.shape), scale.reshape(per)), bias.reshape(per))]


def _c_group_norm(n, ins, opset):
    _need_rank(n, ins, range(3, 9))
    shape = ins[0][1]
    G = int(n.attrs.get("num_groups", 0))
    if shape is not None and isinstance(shape[1], (int, np.integer)) and (G < 1 or shape[1] % G):
        raise ValueError(f"num_groups={G} does not divide the {shape[1]} channels of shape {tuple(shape)}")


def _d_instance_norm(m, n, a):
    x = a[0]
    y, _, _ = _normalised(x, tuple(range(2, x.ndim)), n.attrs.get("epsilon", 1e-5))
    per = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return [pointwise.add(pointwise.mul(y, _tensor_arg(m, n, a[1], 1).reshape(per)),
                          _tensor_arg(m, n, a[2], 2).reshape(per))]


def _c_instance_norm(n, ins, opset):
    _need_rank(n, ins, range(3, 9))


def _d_lrn(m, n, a):
    at = n.attrs
    return [F.local_response_norm(a[0], int(at["size"]), float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)),
                                  float(at.get("bias", 1.0)))]


# ---- products ------------------------------------------------------------------------------------------------------

def _d_matmul(m, n, a):
    """ONNX's (NumPy's) matmul. A 2-D weight of the file is held as (out, in) (load sets transB) for the dense
    kernels, with the bias of the Add after it where load gave it one (load._linear_layers); every other pair, of any
    ranks, is the engine's batched matmul."""
    x, w = a[:2]
    if n.attrs.get("transB", 0):
        return [F.linear(_tensor_arg(m, n, x, 0), w, a[2] if len(a) > 2 else None)]
    return [products.matmul(_tensor_arg(m, n, x, 0), _tensor_arg(m, n, w, 1))]


def _d_gemm(m, n, a):
    """Y = alpha op(A) op(B) + beta C, C broadcast. A B read as (out, in) (transB=1, or a file's weight that load
    holds so) goes through the dense kernels with C as their bias where it is one; others are the engine's matmul."""
    at = n.attrs
    x, w = _tensor_arg(m, n, a[0], 0), _tensor_arg(m, n, a[1], 1)
    c = a[2] if len(a) > 2 and a[2] is not None else None
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    if at.get("transA", 0):
        x = views.t(x)
    if at.get("transB", 0):
        N = w.shape[0]
        if c is not None and tuple(c.shape) in ((N,), (1, N)) and alpha == 1.0 and beta == 1.0:
            return [F.linear(x, w, _tensor_arg(m, n, c, 2).reshape(N))]
        y = F.linear(x, w)
    else:
        y = products.matmul(x, w)
    if alpha != 1.0:
        y = pointwise.mul(y, alpha)
    if c is not None and beta != 0.0:
        c = m.device_constant((n.name, 2, beta), np.asarray(c, np.float32) * beta) if _is_host(c) else \
            (c if beta == 1.0 else pointwise.mul(c, beta))
        y = pointwise.add(y, c)
    return [y]


def _c_gemm(n, ins, opset):
    for s, what in ((0, "A"), (1, "B")):
        shape = ins[s][1]
        if shape is not None and len(shape) != 2:
            raise ValueError(f"its {what} ({n.inputs[s]!r}) has shape {tuple(shape)}; Gemm takes matrices")


def _c_matmul(n, ins, opset):
    for s in (0, 1):
        shape = ins[s][1]
        if shape is not None and len(shape) == 0:
            raise ValueError(f"{n.inputs[s]!r} is a scalar; MatMul takes tensors of one dimension or more")


def _einsum_terms(equation, ranks):
    """The letters of each operand and of the output, '...' spelt out as capital letters for the ranks given (None:
    unknown, only the letters are checked). Raises ValueError for what clnet does not run (a letter twice in one
    operand: a diagonal)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}")
    spelt, widest = [], 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = None if r is None else r - (len(t) - 3)
            widest = max(widest, k or 0)
            spelt.append((t, k))
        else:
            spelt.append((t, 0))
    fill = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:widest]
    letters = []
    for t, k in spelt:
        s = t.replace("...", fill[widest - k:] if k is not None else "") if "..." in t else t
        if len(set(s)) != len(s):
            raise ValueError(f"equation {equation!r}: a letter twice in one operand ({t!r}, a diagonal) is not "
                             "supported")
        letters.append(s)
    if arrow:
        result = out.replace("...", fill)
    else:
        once = [c for c in sorted(set("".join(letters))) if "".join(letters).count(c) == 1 and c not in fill]
        result = fill + "".join(once)
    return letters, result


def _einsum_pair(x, xs, y, ys, keep):
    """x (letters xs) times y (letters ys), summed over the letters they share that `keep` does not hold: (letters
    of the result, the result) through one batched matmul."""
    batch = [c for c in xs if c in ys and c in keep]
    inner = [c for c in xs if c in ys and c not in keep]
    left = [c for c in xs if c not in ys]
    right = [c for c in ys if c not in xs]
    size = dict(zip(xs, x.shape))
    size.update({c: max(size.get(c, 1), s) for c, s in zip(ys, y.shape)})
    a = views.permute(x, *[xs.index(c) for c in batch + left + inner])
    b = views.permute(y, *[ys.index(c) for c in batch + inner + right])
    lead_a, lead_b = a.shape[:len(batch)], b.shape[:len(batch)]
    k = math.prod(size[c] for c in inner)
    a = a.reshape(lead_a + (math.prod(size[c] for c in left), k))
    b = b.reshape(lead_b + (k, math.prod(size[c] for c in right)))
    z = products.matmul(a, b)
    z = z.reshape(z.shape[:len(batch)] + tuple(size[c] for c in left + right))
    return "".join(batch + left + right), z


def _d_einsum(m, n, a):
    xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
    letters, result = _einsum_terms(n.attrs["equation"], [x.ndim for x in xs])
    for i, (x, s) in enumerate(zip(xs, letters)):  # letters no other operand nor the result holds: summed first
        elsewhere = set(result).union(*[set(t) for j, t in enumerate(letters) if j != i])
        gone = [d for d, c in enumerate(s) if c not in elsewhere]
        if gone:
            xs[i] = reduce.sum(x, tuple(gone))
            letters[i] = "".join(c for c in s if c in elsewhere)
    s, z = letters[0], xs[0]
    for i in range(1, len(xs)):
        keep = set(result).union(*[set(t) for t in letters[i + 1:]])
        s, z = _einsum_pair(z, s, xs[i], letters[i], keep)
    if s != result:
        z = views.permute(z, *[s.index(c) for c in result]) if len(s) > 1 else z
    return [z]


def _c_einsum(n, ins, opset):
    _einsum_terms(n.attrs.get("equation", ""), [None if i[1] is None else len(i[1]) for i in ins])



# ---- shapes, views and indexing ------------------------------------------------------------------------------------

def _d_dropout(m, n, a):
    """Dropout in train() (with the file's ratio), the identity in eval(); a training_mode input of False keeps it
    the identity in train() too."""
    x = a[0]
    ratio = float(np.asarray(a[1]).reshape(-1)[0]) if len(a) > 1 and a[1] is not None else \
        float(n.attrs.get("ratio", 0.5))
    on = m.training and (bool(np.asarray(a[2]).reshape(-1)[0]) if len(a) > 2 and a[2] is not None else True)
    if len(n.outputs) < 2 or n.outputs[1] not in m._read:
        return [F.dropout(x, ratio, on) if on and ratio > 0.0 else x, None]
    # the mask asked for too: the kept elements (all of them where dropout is off), and x / (1 - ratio) there
    if not on or ratio == 0.0:
        return [x, m.device_constant(("all kept", x.shape), np.ones(x.shape, np.bool_))]
    keep = pointwise.binary("ge", creation.rand(*x.shape, device=x.device), ratio)
    return [pointwise.where(keep, pointwise.mul(x, 1.0 / (1.0 - ratio)), 0.0), keep]


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
    xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a) if not (_is_host(v) and v.size == 0)]
    if len(xs) == 1:
        return xs
    axis = int(n.attrs["axis"]) % xs[0].ndim
    return [views.cat(xs, dim=axis)]


def _d_transpose(m, n, a):
    x = a[0]
    perm = list(n.attrs["perm"]) if "perm" in n.attrs else list(range(x.ndim))[::-1]
    return [views.permute(x, *perm) if x.ndim > 1 else x]


def _slice_args(n, a, rank):
    """[(axis, start, stop, step)] of a Slice node (inputs from opset 10 on, attributes before)."""
    if "starts" in n.attrs:
        starts, ends, axes, steps = n.attrs["starts"], n.attrs["ends"], n.attrs.get("axes"), None
    else:
        starts, ends = _host_int_list(a[1]), _host_int_list(a[2])
        axes = _host_int_list(a[3]) if len(a) > 3 and a[3] is not None else None
        steps = _host_int_list(a[4]) if len(a) > 4 and a[4] is not None else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    return [(ax % rank, int(s), int(e), int(st)) for s, e, ax, st in zip(starts, ends, axes, steps)]


def _d_slice(m, n, a):
    """Positive steps as one strided copy; a negative step as a gather of the indices it visits."""
    x = a[0]
    key, backwards = [slice(None)] * x.ndim, []
    for ax, s, e, st in _slice_args(n, a, x.ndim):
        if st == 0:
            raise ValueError("a Slice step of 0")
        if st > 0:
            key[ax] = slice(s, e, st)
        else:
            backwards.append((ax, np.arange(*slice(s, e, st).indices(x.shape[ax])), s, e, st))
    y = views.getitem(x, tuple(key)) if any(k != slice(None) for k in key) else x
    for ax, index, s, e, st in backwards:
        y = views.index_select(y, ax, m.device_constant((n.name, "steps", ax, s, e, st, x.shape[ax]), index))
    return [y]


def _d_split(m, n, a):
    x = a[0]
    axis = int(n.attrs.get("axis", 0)) % x.ndim
    D = x.shape[axis]
    if len(a) > 1 and a[1] is not None:
        sizes = _host_int_list(a[1])
    elif "split" in n.attrs:
        sizes = _host_int_list(n.attrs["split"])
    else:
        k = int(n.attrs.get("num_outputs", len(n.outputs)))
        step = -(-D // k)
        sizes = [min(step, D - i * step) for i in range(k)]
    if sum(sizes) != D or len(sizes) != len(n.outputs) or min(sizes) < 0:
        raise ValueError(f"Split of dimension {axis} ({D}) into {sizes} for {len(n.outputs)} outputs")
    pieces = iter(views.split(x, [s for s in sizes if s], axis))
    # an empty piece (a RotaryEmbedding's part left unrotated, of length 0) as an empty host array: clnet holds no
    # empty tensors, and Concat leaves such pieces out
    return [next(pieces) if s else np.zeros(x.shape[:axis] + (0,) + x.shape[axis + 1:], np.float32) for s in sizes]


def _d_gather(m, n, a):
    """x's entries at `indices` along axis (negative indices from the end): one index_select of the flattened
    indices; the result has x's shape with that axis replaced by the indices' shape."""
    x, index = _tensor_arg(m, n, a[0], 0), a[1]
    axis = int(n.attrs.get("axis", 0)) % x.ndim
    D = x.shape[axis]
    if _is_host(index):
        flat = np.asarray(index).astype(np.int64).reshape(-1)
        if flat.size and (flat.min() < -D or flat.max() >= D):
            raise ValueError(f"Gather indices in [{flat.min()}, {flat.max()}] out of range for dimension {axis} of "
                             f"size {D}")
        flat = m.device_constant((n.name, 1, D), np.where(flat < 0, flat + D, flat).astype(np.int32))
    else:
        flat = pointwise.where(index < 0, pointwise.add(index, D), index).reshape(index.size)
    y = views.index_select(x, axis, flat)
    return [y.reshape(x.shape[:axis] + tuple(index.shape) + x.shape[axis + 1:])]


def _d_gather_elements(m, n, a):
    x, index = _tensor_arg(m, n, a[0], 0), a[1]
    axis = int(n.attrs.get("axis", 0)) % x.ndim
    D = x.shape[axis]
    if _is_host(index):
        i = np.asarray(index).astype(np.int64)
        index = m.device_constant((n.name, 1, D), np.where(i < 0, i + D, i).astype(np.int32))
    else:
        index = pointwise.where(index < 0, pointwise.add(index, D), index)
    return [views.gather(x, axis, index)]


def _d_expand(m, n, a):
    x = _tensor_arg(m, n, a[0], 0)
    shape = tuple(np.broadcast_shapes(tuple(x.shape), tuple(_host_int_list(a[1]))))
    return [pointwise.broadcast_to(x, shape)]


def _d_tile(m, n, a):
    return [views.tile(_tensor_arg(m, n, a[0], 0), *_host_int_list(a[1]))]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def _pad_pairs(n, a, rank):
    """[(before, after)] per dimension of a Pad node (pads and axes as inputs from opset 11, attributes before)."""
    at = n.attrs
    if "pads" in at or "paddings" in at:
        pads, axes = _host_int_list(at.get("pads", at.get("paddings"))), None
    else:
        pads = _host_int_list(a[1])
        axes = _host_int_list(a[3]) if len(a) > 3 and a[3] is not None else None
    axes = [ax % rank for ax in axes] if axes is not None else list(range(rank))
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValueError(f"Pad with {len(pads)} pads for {k} axes: ONNX gives a begin and an end for each")
    pairs = [(0, 0)] * rank
    for i, ax in enumerate(axes):
        pairs[ax] = (pads[i], pads[i + k])
    return pairs


def _pad_value(n, a):
    if "value" in n.attrs:
        return n.attrs["value"]
    if len(a) > 2 and a[2] is not None and np.asarray(a[2]).size:
        return np.asarray(a[2]).reshape(-1)[0].item()
    return 0


def _d_pad(m, n, a):
    x = a[0]
    mode = n.attrs.get("mode", "constant")
    pairs = _pad_pairs(n, a, x.ndim)
    padded = [d for d, p in enumerate(pairs) if p != (0, 0)]
    if not padded:
        return [x]
    first = padded[0]
    flat = [v for b, e in reversed(pairs[first:]) for v in (b, e)]
    value = _pad_value(n, a) if mode == "constant" else None
    return [views.pad(x, flat, mode=_PAD_MODES[mode], value=value)]


def _c_pad(n, ins, opset):
    mode = n.attrs.get("mode", "constant")
    if mode not in _PAD_MODES:
        raise ValueError(f"mode {mode!r}: clnet pads in modes constant, reflect and edge")
    shape = ins[0][1]
    if shape is None or mode == "constant":
        return
    pads = _const(ins, 1)
    if "pads" not in n.attrs and pads is None:
        return
    pairs = _pad_pairs(n, [None, pads, None, _const(ins, 3)], len(shape))
    padded = [d for d, p in enumerate(pairs) if p != (0, 0)]
    if padded and padded[0] < len(shape) - 3:
        raise ValueError(f"{mode} padding of dimension {padded[0]} of a {len(shape)}-D tensor: clnet pads the last "
                         "three dimensions in this mode")
    for d, (b, e) in enumerate(pairs):
        if b < 0 or e < 0:
            raise ValueError(f"negative pads {pairs[d]} in mode {mode}: clnet crops in mode constant only")
        if mode == "reflect" and isinstance(shape[d], (int, np.integer)) and max(b, e) >= shape[d]:
            raise ValueError(f"reflect pads {pairs[d]} of dimension {d} of size {shape[d]}: reflection pads must "
                             "be smaller than the dimension")



# ---- resampling and transposed convolution -------------------------------------------------------------------------

def _resize_axes(n, a, shape, opset):
    """[(axis, in size, out size, scale, roi start, roi end)] of a Resize node for an input of `shape`, as ONNX
    defines the output size (floor(in * scale) from scales; sizes as given, or scaled as keep_aspect_ratio_policy
    says)."""
    at = n.attrs
    rank = len(shape)
    axes = [ax % rank for ax in at["axes"]] if "axes" in at else list(range(rank))
    if opset < 11:
        scales, sizes, roi = a[1], None, None
    else:
        roi = a[1] if len(a) > 1 and a[1] is not None and np.asarray(a[1]).size else None
        scales = a[2] if len(a) > 2 and a[2] is not None and np.asarray(a[2]).size else None
        sizes = a[3] if len(a) > 3 and a[3] is not None and np.asarray(a[3]).size else None
    ins = [shape[ax] for ax in axes]
    if sizes is not None:
        sizes = _host_int_list(sizes)
        scale = [o / i for o, i in zip(sizes, ins)]
        policy = at.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            s = min(scale) if policy == "not_larger" else max(scale)
            scale = [s] * len(axes)
            sizes = [int(s * i + 0.5) for i in ins]
    else:
        scale = [float(v) for v in np.asarray(scales, np.float64).reshape(-1)]
        sizes = [int(s * i) for s, i in zip(scale, ins)]
    if len(scale) != len(axes):
        raise ValueError(f"Resize with {len(scale)} scales or sizes for {len(axes)} axes")
    roi = np.asarray(roi, np.float64).reshape(-1) if roi is not None else None
    k = len(axes)
    return [(ax, i, o, s, roi[j] if roi is not None else 0.0, roi[j + k] if roi is not None else 1.0)
            for j, (ax, i, o, s) in enumerate(zip(axes, ins, sizes, scale))]


def _source_coordinates(mode, o, scale, n_in, n_out, start, end):
    """Where each output position o (an array) samples the input, as ONNX's coordinate_transformation_mode says."""
    wide = scale * n_in  # the output's length before rounding
    if mode == "align_corners":
        return np.zeros_like(o) if wide == 1 else o * (n_in - 1) / (wide - 1)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_crop_and_resize":
        x = np.full_like(o, (end - start) * (n_in - 1) / 2) if wide == 1 else \
            o * (end - start) * (n_in - 1) / (wide - 1)
        return x + start * (n_in - 1)
    if mode == "pytorch_half_pixel":
        return np.full_like(o, -0.5) if wide == 1 else (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        return n_in / 2 * (1 - n_out / wide) + (o + 0.5) / scale - 0.5
    return (o + 0.5) / scale - 0.5  # half_pixel


def _cubic(t, A):
    """Keys' cubic convolution kernel at distances t."""
    t = np.abs(t)
    near = ((A + 2) * t - (A + 3)) * t * t + 1
    far = ((A * t - 5 * A) * t + 8 * A) * t - 4 * A
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _resize_matrix(at, n_in, n_out, scale, start, end):
    """(the (n_out, n_in) matrix of ONNX's 1-D resampling, the value added to each output row): nearest (by
    nearest_mode), linear or cubic weights of the neighbours of each source coordinate, indices past the ends
    clamped to them (exclude_outside: weighted 0 and the rest renormalised); antialias widens linear and cubic
    kernels by 1 / scale when shrinking; tf_crop_and_resize puts extrapolation_value where the source lies outside
    the input."""
    mode = at.get("mode", "nearest")
    o = np.arange(n_out, dtype=np.float64)
    x = _source_coordinates(at.get("coordinate_transformation_mode", "half_pixel"), o, scale, n_in, n_out,
                            start, end)
    M = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if mode == "nearest":
        how = at.get("nearest_mode", "round_prefer_floor")
        pick = {"round_prefer_floor": np.ceil(x - 0.5), "round_prefer_ceil": np.floor(x + 0.5), "floor": np.floor(x),
                "ceil": np.ceil(x)}[how]
        M[rows, np.clip(pick, 0, n_in - 1).astype(np.int64)] = 1.0
    else:
        base = np.ceil(x) - 1  # the neighbour at or left of x, strictly left at an integer x: ratio in (0, 1]
        ratio = x - base
        s = min(scale, 1.0) if at.get("antialias", 0) else 1.0
        reach = 1 if mode == "linear" else 2
        first = int(np.floor(-reach / s) + 1)
        offsets = np.arange(first, 2 - first)  # relative to base
        t = (offsets[None, :] - ratio[:, None]) * s
        w = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _cubic(t, float(at.get("cubic_coeff_a", -0.75)))
        if s != 1.0:
            w = w / w.sum(axis=1, keepdims=True)
        index = base[:, None].astype(np.int64) + offsets[None, :]
        if at.get("exclude_outside", 0):
            w = np.where((index < 0) | (index >= n_in), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
        np.add.at(M, (np.repeat(rows, len(offsets)), np.clip(index, 0, n_in - 1).reshape(-1)), w.reshape(-1))
    extra = np.zeros(n_out)
    if at.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        M[outside] = 0.0
        extra[outside] = float(at.get("extrapolation_value", 0.0))
    return M, extra


def _resize_attrs(n, opset):
    if opset < 11 or n.op == "Upsample":  # Resize-10 and Upsample sample at o / scale, the nearest by rounding down
        return dict(n.attrs, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return n.attrs


def _d_upsample(m, n, a):
    """Upsample (deprecated since opset 10; the Caffe-era zoo's files): Resize-10's sampling, scales as an input
    (opset 9) or an attribute (opset 7)."""
    scales = a[1] if len(a) > 1 and a[1] is not None else np.asarray(n.attrs["scales"], np.float32)
    return _d_resize(_Opset10(m), n, [a[0], scales])


class _Opset10:
    """A module seen at opset 10 (Upsample reads its scales where Resize-10 does)."""

    def __init__(self, m):
        self.m = m
        self.opset = 10

    def __getattr__(self, name):
        return getattr(self.m, name)


def _d_resize(m, n, a):
    """Resize as one product per resized axis with its resampling matrix (computed on the host, once per shape)."""
    x = a[0]
    y = x
    at = _resize_attrs(n, m.opset)
    for ax, n_in, n_out, scale, start, end in _resize_axes(n, a, x.shape, m.opset):
        key = (n.name, "resize", ax, n_in, n_out, scale, start, end)
        held = m._device_constants.get((key + ("M",), id(m.device)))
        if held is None:
            M, extra = _resize_matrix(at, n_in, n_out, scale, start, end)
            if n_out == n_in and np.array_equal(M, np.eye(n_in)) and not extra.any():
                continue
            mat = m.device_constant(key + ("M",), M)
            add = m.device_constant(key + ("extra",), extra) if extra.any() else None
        else:
            mat = held[0]
            add = m._device_constants.get((key + ("extra",), id(m.device)))
            add = None if add is None else add[0]
        shape = y.shape
        lead, inner = math.prod(shape[:ax]), math.prod(shape[ax + 1:])
        z = products.matmul(mat, y.reshape(lead, n_in, inner))
        if add is not None:
            z = pointwise.add(z, add.reshape(1, n_out, 1))
        y = z.reshape(shape[:ax] + (n_out,) + shape[ax + 1:])
    return [y]


def _c_resize(n, ins, opset):
    at = n.attrs
    mode = at.get("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"mode {mode!r}: ONNX resizes in modes nearest, linear and cubic")
    if mode == "nearest" and at.get("antialias", 0):
        raise ValueError("antialias with mode nearest (ONNX defines it for linear and cubic)")
    known = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_crop_and_resize")
    if at.get("coordinate_transformation_mode", "half_pixel") not in known:
        raise ValueError(f"coordinate_transformation_mode {at['coordinate_transformation_mode']!r} is not one of "
                         f"ONNX's ({', '.join(known)})")


def _d_conv_transpose(m, n, a):
    """ONNX's ConvTranspose (1-D and 2-D): the transposed convolution over the whole output ((in - 1) stride +
    dilation (k - 1) + 1 per axis), then cropped by the pads at each end (which may differ; total pads from
    output_shape or auto_pad as ONNX derives them) and extended by output_padding."""
    x, w = a[0], _tensor_arg(m, n, a[1], 1)
    b = _tensor_arg(m, n, a[2], 2) if len(a) > 2 and a[2] is not None else None
    one_d = x.ndim == 3
    if one_d:
        x, w = x.reshape(x.shape[:2] + (1, x.shape[2])), w.reshape(w.shape[:2] + (1, w.shape[2]))
    at = _as_2d(n.attrs) if one_d else n.attrs
    k = w.shape[2:]
    stride = tuple(at.get("strides", (1, 1)))
    dilation = tuple(at.get("dilations", (1, 1)))
    extra = list(at.get("output_padding", (0, 0)))
    if one_d and "output_padding" in n.attrs:
        extra = [0] + list(n.attrs["output_padding"])
    full = [(i - 1) * s + d * (kk - 1) + 1 for i, s, d, kk in zip(x.shape[2:], stride, dilation, k)]
    target = list(n.attrs["output_shape"]) if "output_shape" in n.attrs else None
    if one_d and target is not None:
        target = [1] + target
    mode = at.get("auto_pad", "NOTSET")
    if target is None and mode in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(x.shape[2:], stride)]
    if target is not None:
        total = [f + e - t for f, e, t in zip(full, extra, target)]
        begin = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    elif mode == "VALID":
        begin, end = [0, 0], [0, 0]
    else:
        pads = list(at.get("pads", (0, 0, 0, 0)))
        begin, end = pads[:2], pads[2:]
    y = F.conv_transpose2d(x, w, None, stride, 0, 0, int(n.attrs.get("group", 1)), dilation)
    crop = [-begin[1], -end[1] + extra[1], -begin[0], -end[0] + extra[0]]
    if any(crop):
        y = views.pad(y, crop)
    if b is not None:
        y = pointwise.add(y, b.reshape(1, b.shape[0], 1, 1))
    return [y.reshape(y.shape[:2] + (y.shape[3],)) if one_d else y]


def _c_conv_transpose(n, ins, opset):
    k = n.attrs.get("kernel_shape")
    w = ins[1][1] if len(ins) > 1 and ins[1] is not None else None
    rank = len(k) if k is not None else (len(w) - 2 if w is not None else None)
    if rank is not None and rank not in (1, 2):
        raise ValueError(f"clnet runs 1-D and 2-D transposed convolutions, this one is {rank}-D")



# ---- random draws (training-mode stochastic depth) -----------------------------------------------------------------

def _d_random_like(normal):
    """RandomUniformLike / RandomNormalLike: draws of the input's shape from clnet's generator (clnet.manual_seed;
    the file's seed attribute is not ONNX Runtime's stream either), without a gradient."""
    def run(m, n, a):
        at = n.attrs
        shape = tuple(a[0].shape)
        if normal:
            z = creation.randn(*shape, device=m.device)
            return [pointwise.add(pointwise.mul(z, float(at.get("scale", 1.0))), float(at.get("mean", 0.0)))]
        lo, hi = float(at.get("low", 0.0)), float(at.get("high", 1.0))
        return [pointwise.add(pointwise.mul(creation.rand(*shape, device=m.device), hi - lo), lo)]
    return run


def _d_bernoulli(m, n, a):
    p = _tensor_arg(m, n, a[0], 0)
    return [pointwise.cast(pointwise.binary("lt", creation.rand(*p.shape, device=m.device), p), np.float32)]


def _c_random(n, ins, opset):
    if n.attrs.get("dtype", 1) != 1:
        raise ValueError(f"draws of ONNX type {n.attrs['dtype']}: clnet draws float32")


# ---- the table -----------------------------------------------------------------------------------------------------

class OnnxOp(NamedTuple):
    """One ONNX operator on computed tensors."""
    run: Callable            # (module, node, inputs) -> outputs, host values among the inputs where load allows them
    check: Callable = None   # (node, [(kind, shape, value)] of its inputs, opset): raises ValueError with the reason
    host: tuple = ()         # input slots that must be constants of the file or computed from shapes
    params: tuple = ()       # input slots whose float initializers are trained (Parameters)
    buffers: tuple = ()      # input slots whose float initializers are kept (buffers)
    names: tuple = ()        # PyTorch's parameter names of its inputs ("" where none), for unnamed weights


_REDUCE_OPS = {op: OnnxOp(_d_reduce(op), _c_reduce, host=(1,)) for op in _REDUCTIONS}
_UNARY_OPS = {op: OnnxOp(_d_unary(op)) for op in _UNARY if op not in ("Clip",)}
_BINARY_OPS = {op: OnnxOp(_d_mod if op == "Mod" else _d_binary(op),
                          params=(0, 1) if op in ("Add", "Sub", "Mul") else ()) for op in _BINARY}

OPS = {
    **_UNARY_OPS, **_BINARY_OPS, **_REDUCE_OPS,
    "Conv": OnnxOp(_d_conv, _c_conv, params=(1, 2), names=("", "weight", "bias")),
    "ConvTranspose": OnnxOp(_d_conv_transpose, _c_conv_transpose, params=(1, 2), names=("", "weight", "bias")),
    "Gemm": OnnxOp(_d_gemm, _c_gemm, params=(1, 2), names=("", "weight", "bias")),
    "MatMul": OnnxOp(_d_matmul, _c_matmul, params=(0, 1), names=("", "weight")),
    "Einsum": OnnxOp(_d_einsum, _c_einsum),
    "MaxPool": OnnxOp(_pool_1d(_d_maxpool), _c_pool),
    "AveragePool": OnnxOp(_pool_1d(_d_avgpool), _c_pool),
    "GlobalAveragePool": OnnxOp(_d_global_pool("mean")),
    "GlobalMaxPool": OnnxOp(_d_global_pool("max")),
    "BatchNormalization": OnnxOp(_d_batchnorm, _c_batchnorm, params=(1, 2), buffers=(3, 4),
                                 names=("", "weight", "bias", "running_mean", "running_var")),
    "LayerNormalization": OnnxOp(_d_layer_norm, params=(1, 2), names=("", "weight", "bias")),
    "GroupNormalization": OnnxOp(_d_group_norm, _c_group_norm, params=(1, 2), names=("", "weight", "bias")),
    "InstanceNormalization": OnnxOp(_d_instance_norm, _c_instance_norm, params=(1, 2), names=("", "weight", "bias")),
    "LRN": OnnxOp(_d_lrn),
    "Selu": OnnxOp(_d_selu), "HardSigmoid": OnnxOp(_d_hard_sigmoid), "Gelu": OnnxOp(_d_gelu, _c_gelu),
    "PRelu": OnnxOp(_d_prelu, params=(1,), names=("", "weight")), "Not": OnnxOp(_d_not), "Where": OnnxOp(_d_where),
    "Clip": OnnxOp(_d_clip, _c_clip), "Cast": OnnxOp(_d_cast, _c_cast), "Trilu": OnnxOp(_d_trilu, _c_trilu, host=(1,)),
    "Sum": OnnxOp(_d_variadic("Sum")), "Max": OnnxOp(_d_variadic("Max")), "Min": OnnxOp(_d_variadic("Min")),
    "Mean": OnnxOp(_d_variadic("Mean")),
    "ArgMax": OnnxOp(_d_arg("max")), "ArgMin": OnnxOp(_d_arg("min")),
    "Softmax": OnnxOp(_d_softmax(False)), "LogSoftmax": OnnxOp(_d_softmax(True)),
    "Dropout": OnnxOp(_d_dropout, host=(1, 2)),
    "Identity": OnnxOp(lambda m, n, a: [a[0]]),
    # (a weight reshaped, transposed or joined before use, as ViT's class token, is trained as the file's weight)
    "Reshape": OnnxOp(_d_reshape, host=(1,), params=(0,)), "Flatten": OnnxOp(_d_flatten, params=(0,)),
    "Squeeze": OnnxOp(_d_squeeze, host=(1,), params=(0,)), "Unsqueeze": OnnxOp(_d_unsqueeze, host=(1,), params=(0,)),
    "Concat": OnnxOp(_d_concat, _c_concat, params=tuple(range(64))), "Transpose": OnnxOp(_d_transpose, params=(0,)),
    "Slice": OnnxOp(_d_slice, host=(1, 2, 3, 4), params=(0,)), "Split": OnnxOp(_d_split, host=(1,)),
    "Gather": OnnxOp(_d_gather, params=(0,)), "GatherElements": OnnxOp(_d_gather_elements),
    "Expand": OnnxOp(_d_expand, host=(1,), params=(0,)), "Tile": OnnxOp(_d_tile, host=(1,)),
    "Pad": OnnxOp(_d_pad, _c_pad, host=(1, 2, 3)),
    "Resize": OnnxOp(_d_resize, _c_resize, host=(1, 2, 3)),
    "Upsample": OnnxOp(_d_upsample, _c_resize, host=(1,)),
    "Softsign": OnnxOp(_d_softsign), "ThresholdedRelu": OnnxOp(_d_thresholded_relu), "Shrink": OnnxOp(_d_shrink),
    "LpNormalization": OnnxOp(_d_lp_norm, _c_lp_norm), "MeanVarianceNormalization": OnnxOp(_d_mvn),
    "Hardmax": OnnxOp(_d_hardmax),
    "RandomUniformLike": OnnxOp(_d_random_like(False), _c_random),
    "RandomNormalLike": OnnxOp(_d_random_like(True), _c_random), "Bernoulli": OnnxOp(_d_bernoulli, _c_random),
}

DEVICE_OPS = {op: entry.run for op, entry in OPS.items()}
_PARAMETER_INPUTS = {op: entry.params for op, entry in OPS.items() if entry.params}
_BUFFER_INPUTS = {op: entry.buffers for op, entry in OPS.items() if entry.buffers}


def _dispatch(op):
    host, entry = HOST_OPS.get(op), OPS.get(op)

    def run(m, n, a):
        if host is not None and (op in ("Shape", "Size") or entry is None or all(v is None or _is_host(v) for v in a)):
            return [None if v is None else np.asarray(v) for v in host(m, n, a)]  # (NumPy's scalars as arrays)
        if a and _is_host(a[0]):  # a constant where the entry takes a computed tensor (its data): uploaded once
            a = [_tensor_arg(m, n, a[0], 0)] + list(a[1:])
        return entry.run(m, n, a)
    return run
