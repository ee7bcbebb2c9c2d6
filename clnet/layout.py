"""Shapes, strides and broadcasting for the general tensor ops (pointwise, reductions, views).

clnet's tensors are always contiguous (row-major). An op that reads an operand with another layout (a broadcast
operand, a permuted or sliced view being materialised) describes that read by strides in elements, 0 along a
broadcast dimension; `coalesce` merges the dimensions the operands traverse alike, so most ops index a rank of 1-3.
The layout reaches a kernel as a small int32 device tensor (`meta`), cached per layout: sizes first, then each
operand's strides (cl_kernels/strided.h reads it).
"""
import math
import threading
from collections import OrderedDict

import numpy as np

from . import kernels
from .tensor import Tensor

MAX_DIMS = 8  # the rank strided.h indexes (after coalescing)


def contiguous_strides(shape):
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


# Layouts are pure functions of small tuples, and an eager step asks for the same few again and again (every op of
# a network at one batch size): each of the three below answers a repeated question with one dictionary look-up.
_remembered = {}
REMEMBERED = 4096  # answers kept; past that the memory starts afresh


def _remember(key, value):
    if len(_remembered) >= REMEMBERED:
        _remembered.clear()
    _remembered[key] = value
    return value


def broadcast_shapes(what, *shapes):
    """NumPy's and PyTorch's broadcast of shapes (aligned at the right, size-1 dimensions stretch)."""
    first = shapes[0]
    for s in shapes:
        if s != first:
            break
    else:  # operands of one shape (most ops): that shape
        return tuple(first)
    key = ("broadcast_shapes",) + shapes
    try:
        return _remembered[key]
    except (KeyError, TypeError):
        pass
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError(f"{what}: shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                             f"(dimension {d - rank} has sizes {sorted(sizes)}); make them equal or 1 there")
        out.append(sizes.pop() if sizes else 1)
    return _remember(key, tuple(out)) if all(type(s) is tuple for s in shapes) else tuple(out)


def broadcast_strides(shape, out_shape):
    """Strides that read a contiguous tensor of `shape` at every index of `out_shape` (0 where it broadcasts)."""
    key = ("broadcast_strides", shape, out_shape)
    try:
        return _remembered[key]
    except (KeyError, TypeError):  # a new question, or one given in lists
        pass
    own = contiguous_strides(shape)
    lead = len(out_shape) - len(shape)
    out = tuple(0 if d < lead or shape[d - lead] == 1 else own[d - lead] for d in range(len(out_shape)))
    return _remember(key, out) if type(shape) is tuple and type(out_shape) is tuple else out


def coalesce(shape, *strides):
    """(shape, strides...) with size-1 dimensions dropped and neighbours merged where every operand steps through
    them as through one dimension. At least one dimension is kept."""
    key = ("coalesce", shape) + strides
    try:
        return _remembered[key]
    except (KeyError, TypeError):
        pass
    dims = [(s, [st[d] for st in strides]) for d, s in enumerate(shape) if s != 1]
    merged = []
    for size, st in dims:
        if merged:
            psize, pst = merged[-1]
            if all(p == q * size for p, q in zip(pst, st)):
                merged[-1] = (psize * size, st)
                continue
        merged.append((size, st))
    if not merged:
        merged = [(1, [0] * len(strides))]
    out_shape = tuple(m[0] for m in merged)
    out = (out_shape,) + tuple(tuple(m[1][i] for m in merged) for i in range(len(strides)))
    return _remember(key, out) if type(shape) is tuple and all(type(st) is tuple for st in strides) else out


_meta = OrderedDict()
META_CACHE = 4096  # layouts kept per process (a captured graph keeps the ones it uses alive itself)
_meta_lock = threading.RLock()  # threads share the cache (a hit moves its entry, a miss may let the oldest go)


def meta(dev, shape, *strides):
    """The int32 device tensor [sizes..., strides of operand 0..., operand 1..., ...] for strided.h; made once per
    layout (outside any capture's recording: its upload is set-up, not part of a step)."""
    if len(shape) > MAX_DIMS:
        raise ValueError(f"clnet: a layout of {len(shape)} dimensions that do not merge is more than the {MAX_DIMS} "
                         "the kernels index; reshape to fewer dimensions")
    key = (id(dev), shape) + strides
    with _meta_lock:
        t = _meta.get(key)
        if t is not None:
            _meta.move_to_end(key)
            return t
        values = np.array(shape + sum(strides, ()), np.int32)
        with kernels.set_up():
            t = Tensor(values.shape, np.int32, dev).write(values)
        _meta[key] = t
        if len(_meta) > META_CACHE:
            _meta.popitem(last=False)
    return t


def normalize_dim(what, dim, ndim):
    """dim in [-ndim, ndim) as a non-negative index (a 0-d tensor takes dims -1 and 0, as PyTorch's)."""
    n = max(ndim, 1)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{what}: dim must be an int, got {type(dim).__name__}")
    if not -n <= dim < n:
        raise IndexError(f"{what}: dim {dim} is out of range for a tensor of {ndim} dimensions "
                         f"(expected one in [{-n}, {n - 1}])")
    return int(dim) % n


def normalize_dims(what, dims, ndim):
    """A sorted tuple of distinct non-negative dims; None or () means every dim."""
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, (int, np.integer)):
        dims = (dims,)
    out = sorted({normalize_dim(what, d, ndim) for d in dims})
    if len(out) != len(dims):
        raise ValueError(f"{what}: dim {tuple(dims)} names a dimension twice")
    return tuple(out) if ndim else ()


def numel(shape):
    return math.prod(shape)
