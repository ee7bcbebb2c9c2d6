"""Host (NumPy) evaluation: constants folded at load and the shape arithmetic each call runs on the host."""

import math

import numpy as np

from .common import OnnxImportError, _host_int_list, _is_host


# ---- host (NumPy) evaluation: constants and shape arithmetic -------------------------------------------------------

def _host_binary(fn):
    def run(m, n, a):
        x, y = a
        if x.dtype.kind in "iu" and y.dtype.kind in "iu" and fn is np.divide:
            return [np.trunc(x / y).astype(np.result_type(x, y))]
        return [fn(x, y)]
    return run


def _h_shape(m, n, a):
    shape = np.array(a[0].shape, np.int64)
    start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
    return [shape[start:end]]


def _h_gather(m, n, a):
    return [np.take(a[0], a[1].astype(np.int64), axis=n.attrs.get("axis", 0))]


def _axes(m, n, a, index):
    if "axes" in n.attrs:
        return _host_int_list(n.attrs["axes"])
    if len(a) > index and a[index] is not None:
        v = a[index]
        if not _is_host(v):
            raise OnnxImportError(f"{n.where(m)}: the axes must be constants")
        return _host_int_list(v)
    return None


def _unsqueezed_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    out = list(shape)
    for ax in axes:
        out.insert(ax, 1)
    return tuple(out)


def _squeezed_shape(shape, axes):
    if axes is None:
        return tuple(s for s in shape if s != 1)
    axes = {a % len(shape) for a in axes}
    for ax in axes:
        if shape[ax] != 1:
            raise ValueError(f"cannot squeeze axis {ax} of shape {tuple(shape)}")
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _h_unsqueeze(m, n, a):
    return [a[0].reshape(_unsqueezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _h_squeeze(m, n, a):
    return [a[0].reshape(_squeezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _h_concat(m, n, a):
    return [np.concatenate([x.reshape(-1) if x.ndim == 0 else x for x in a], axis=n.attrs["axis"])]


_ONNX_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
                10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _h_cast(m, n, a):
    to = n.attrs["to"]
    if to not in _ONNX_DTYPES:
        raise OnnxImportError(f"{n.where(m)}: Cast to ONNX type {to} is not supported")
    return [a[0].astype(_ONNX_DTYPES[to])]


def _h_slice(m, n, a):
    x = a[0]
    if "starts" in n.attrs:  # opset < 10
        starts, ends, axes, steps = n.attrs["starts"], n.attrs["ends"], n.attrs.get("axes"), None
    else:
        starts, ends = _host_int_list(a[1]), _host_int_list(a[2])
        axes = _host_int_list(a[3]) if len(a) > 3 and a[3] is not None else None
        steps = _host_int_list(a[4]) if len(a) > 4 and a[4] is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        index[ax % x.ndim] = slice(max(min(s, 2**62), -2**62), max(min(e, 2**62), -2**62), st)
    return [x[tuple(index)]]


def _h_constant(m, n, a):
    at = n.attrs
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in at:
            v = at[key]
            dtype = np.float32 if "float" in key else (np.int64 if "int" in key else None)
            return [np.array(v, dtype=dtype) if dtype is not None else np.asarray(v)]
    raise OnnxImportError(f"{n.where(m)}: a Constant of this kind ({', '.join(at)}) is not supported")


FOLD_LIMIT = 1 << 24  # elements the host materialises for one ConstantOfShape, Expand, Range or Tile (64 MiB of floats)


def _capped(n, shape):
    """`shape` where its size is within FOLD_LIMIT; a ValueError naming the sizes otherwise."""
    shape = tuple(int(d) for d in shape)
    size = math.prod(shape)
    if size > FOLD_LIMIT:
        raise ValueError(f"{n.op} would materialise {size} elements (shape {shape}) on the host, more than clnet "
                         f"folds ({FOLD_LIMIT}): a file whose constants are this large is refused rather than filling "
                         "the host's memory")
    if min(shape, default=1) < 0:
        raise ValueError(f"{n.op} of a negative size {shape}")
    return shape


def _h_constant_of_shape(m, n, a):
    value = n.attrs.get("value", np.zeros(1, np.float32))
    return [np.full(_capped(n, _host_int_list(a[0])), value.reshape(-1)[0], dtype=value.dtype)]


def _reshape_shape(n, a):
    """The target shape: the input (opset 5 on), or the attribute `shape` (opsets 1 to 4)."""
    return a[1] if len(a) > 1 and a[1] is not None else np.asarray(n.attrs["shape"], np.int64)


def _h_reshape(m, n, a):
    return [a[0].reshape(_reshape_target(a[0].shape, _reshape_shape(n, a), n.attrs.get("allowzero", 0)))]


def _reshape_target(shape, target, allowzero=0):
    target = _host_int_list(target)
    if not allowzero:
        target = [shape[i] if t == 0 else t for i, t in enumerate(target)]
    return tuple(target)


def _h_flatten(m, n, a):
    return [a[0].reshape(_flatten_shape(a[0].shape, n.attrs.get("axis", 1)))]


def _flatten_shape(shape, axis):
    axis = axis + len(shape) if axis < 0 else axis
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def _h_transpose(m, n, a):
    return [np.transpose(a[0], n.attrs.get("perm"))]


def _h_range(m, n, a):
    start, limit, delta = (v.item() for v in a[:3])
    if delta == 0:
        raise ValueError("Range with delta 0")
    _capped(n, (max(math.ceil((limit - start) / delta), 0),))
    return [np.arange(start, limit, delta).astype(a[0].dtype)]


def _h_where(m, n, a):
    return [np.where(a[0], a[1], a[2])]


def _h_expand(m, n, a):
    shape = _capped(n, np.broadcast_shapes(a[0].shape, tuple(_host_int_list(a[1]))))
    return [np.ascontiguousarray(np.broadcast_to(a[0], shape))]


def _h_tile(m, n, a):
    repeats = _host_int_list(a[1])
    _capped(n, [d * r for d, r in zip(a[0].shape, repeats)])
    return [np.tile(a[0], repeats)]


def _h_reduce(fn):
    def run(m, n, a):
        axes = _axes(m, n, a, 1)
        keep = bool(n.attrs.get("keepdims", 1))
        return [fn(a[0], axis=None if axes is None else tuple(axes), keepdims=keep)]
    return run


def _h_unary(fn):
    return lambda m, n, a: [fn(a[0])]


def _h_variadic(fn, mean=False):
    def run(m, n, a):
        y = a[0]
        for v in a[1:]:
            y = fn(y, v)
        return [y / len(a) if mean else y]
    return run


def _h_mod(m, n, a):
    return [(np.fmod if n.attrs.get("fmod", 0) else np.mod)(a[0], a[1])]


HOST_OPS = {
    "Shape": _h_shape, "Gather": _h_gather, "Unsqueeze": _h_unsqueeze, "Squeeze": _h_squeeze, "Concat": _h_concat,
    "Cast": _h_cast, "Slice": _h_slice, "Constant": _h_constant, "ConstantOfShape": _h_constant_of_shape,
    "Reshape": _h_reshape, "Flatten": _h_flatten, "Transpose": _h_transpose, "Range": _h_range, "Where": _h_where,
    "Expand": _h_expand, "Tile": _h_tile, "Identity": lambda m, n, a: [a[0]],
    "Add": _host_binary(np.add), "Sub": _host_binary(np.subtract), "Mul": _host_binary(np.multiply),
    "Div": _host_binary(np.divide), "Equal": _host_binary(np.equal), "Less": _host_binary(np.less),
    "Greater": _host_binary(np.greater), "LessOrEqual": _host_binary(np.less_equal),
    "GreaterOrEqual": _host_binary(np.greater_equal), "And": _host_binary(np.logical_and),
    "Or": _host_binary(np.logical_or), "Pow": _host_binary(np.power), "Min": _h_variadic(np.minimum),
    "Max": _h_variadic(np.maximum), "Sum": _h_variadic(np.add), "Mean": _h_variadic(np.add, mean=True),
    "Neg": _h_unary(np.negative), "Floor": _h_unary(np.floor), "Ceil": _h_unary(np.ceil), "Sqrt": _h_unary(np.sqrt),
    "Abs": _h_unary(np.abs), "Sign": _h_unary(np.sign), "Round": _h_unary(np.round), "Exp": _h_unary(np.exp),
    "Log": _h_unary(np.log), "Reciprocal": _h_unary(np.reciprocal), "Mod": _h_mod, "Not": _h_unary(np.logical_not),
    "Size": lambda m, n, a: [np.array(a[0].size, np.int64)],
    "ReduceProd": _h_reduce(np.prod), "ReduceSum": _h_reduce(np.sum), "ReduceMax": _h_reduce(np.max),
    "ReduceMin": _h_reduce(np.min),
}
