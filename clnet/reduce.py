"""The reduction family: sums, means, variances, extremes, norms, products and logsumexp over any dimensions,
softmax and log_softmax over any dimension, cumulative sums; forward and backward, PyTorch's names and arguments.

Every reduction is one launch (two when split) of a kernel of cl_kernels/reduce.cl whose combining rule (sum,
product, max, min, with or without the index) is a define and whose function of each element (x, |x|, x^2,
(x - mean)^2, ...) and finishing step (a scale, a square root, ...) are arguments, so a few builds serve them all.
The input is seen as (kept dimensions..., reduced dimensions...), each part coalesced on its own (layout.coalesce):
reducing (N, C, H, W) over (0, 2, 3) reads a rank-3 layout, reducing its last dimension a rank-1 one. `_plan` picks
the launch: on a GPU, lanes of a work-group share an output (reduce_tree, a tree in local memory) when its elements
lie contiguous in memory, else one work-item per output (reduce_loop; neighbouring outputs are neighbours in
memory); on a CPU, reduce_loop with a run of neighbouring outputs per work-item where they are neighbours in
memory. Few outputs over many elements split each reduction into parts, which a second launch combines. Gradients
are one element-wise launch of `reduce_bwd`, which reads each output's values through strided.h's broadcasting
layout.

`sum_to(x, shape)` (PyTorch's sum_to_size) is what broadcasting ops' backward uses; it records nothing.
"""
import builtins
import math
from typing import NamedTuple

import numpy as np

from . import kernels, layout, ops, tuning
from .autograd import Function
from .tensor import Tensor, empty, too_large

FLOAT, INT, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)
SUM, PROD, MAX, MIN = 1, 2, 3, 4  # reduce.cl's COMB
# reduce.cl's map: the function of each element that is combined
M_X, M_ABS, M_SQUARE, M_SQDEV, M_EXP, M_POWABS, M_EQ, M_ABSEQ, M_NONZERO, M_ISZERO, M_NOTZERO = range(11)
# reduce.cl's finishing step (fin) of reduce_tree and reduce_loop
F_SCALE, F_SQRT, F_LOGSHIFT, F_POW, F_ANY, F_ALL = range(6)
# reduce.cl's grad (reduce_bwd's formula)
G_SUM, G_VAR, G_STD, G_TIES, G_INFNORM, G_L1, G_L2, G_PNORM, G_LSE, G_PROD = range(10)

# Launch shapes (see _plan): a GPU wants some 64K work-items, each over at least 64 elements; a CPU's few cores want
# a few hundred runs of a few thousand elements each.
PARALLEL_ITEMS, PER_LANE = 1 << 16, 64
CPU_PARALLEL_ITEMS, CPU_PER_ITEM = 256, 4096
TREE_FROM = 32  # contiguous reduced elements from which a GPU's lanes share an output (a tree)
COLUMNS = 16    # neighbouring outputs a CPU's work-item reduces together (a 64-byte line of each row it reads)
BWD_RUN = 64    # neighbouring elements of a gradient a CPU's work-item writes (a vector loop)

class ValuesIndices(NamedTuple):
    """What max and min over a dimension return, as torch.return_types.max: the values and their int32 indices."""
    values: Tensor
    indices: Tensor


# ---- checks and shapes ---------------------------------------------------------------------------------------------

def _tensor(what, x, dtypes=(FLOAT,)):
    if not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a clnet tensor, got {type(x).__name__}; wrap host data with "
                        "clnet.tensor(array, device=...)")
    if x.dtype not in dtypes:
        raise TypeError(f"{what}: expected a {' or '.join(d.name for d in dtypes)} tensor, got {x.dtype}"
                        + ("; convert it with .float() first" if FLOAT in dtypes else ""))
    if x.size > kernels.INDEX_LIMIT:
        raise too_large(what, x.shape, "reduce slices of it (narrow or split it) and combine the results")
    return x


def _out_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in dims)


def _reduced_count(shape, dims):
    return math.prod(shape[d] for d in dims)


def _nonempty(what, x, dims):
    """max, min and their kin have no identity: refuse an empty reduction, as PyTorch does."""
    for d in dims:
        if x.shape[d] == 0:
            raise IndexError(f"{what}: dimension {d} of the input, shape {x.shape}, is empty; a {what} over no "
                             "elements is undefined (reduce over a non-empty dimension)")
    if not dims and x.size == 0:
        raise IndexError(f"{what}: the input of shape {x.shape} is empty; a {what} over no elements is undefined")


def _layout(shape, dims):
    """(sizes, strides, kept rank, reduced rank) of x seen as (kept..., reduced...), each part coalesced."""
    strides = layout.contiguous_strides(shape)
    kept = [d for d in range(len(shape)) if d not in dims]
    ks, kst = layout.coalesce(tuple(shape[d] for d in kept), tuple(strides[d] for d in kept))
    rs, rst = layout.coalesce(tuple(shape[d] for d in dims), tuple(strides[d] for d in dims))
    return ks + rs, kst + rst, len(ks), len(rs)


def _plan(outputs, R, contiguous, columns, dev):
    """(lanes, parts, cols) of a reduction of R elements into each of `outputs`: on a GPU, lanes (a power of two) of
    a work-group share an output (reduce_tree) where its elements are contiguous (`contiguous`) and many, else a
    work-item reduces an output alone (reduce_loop), neighbours reading neighbours; on a CPU, a work-item reduces
    `cols` neighbouring outputs at once where they are neighbours in memory (`columns`), reading a line of each row
    (one output per work-item walked a column alone, a cache line per element: 0.3 GB/s on PoCL). Each output's
    elements are split into parts, combined by a second launch, where the launch would otherwise have few
    work-items for much work."""
    cpu = tuning.cpu_shaped(dev)
    lanes = 1
    if not cpu and contiguous and R >= TREE_FROM:
        lanes = builtins.min(_lsize(dev), 1 << (R.bit_length() - 1))
    cols = COLUMNS if cpu and columns and outputs > 1 else 1
    per, target = (CPU_PER_ITEM, CPU_PARALLEL_ITEMS) if cpu else (PER_LANE, PARALLEL_ITEMS)
    items = -(-outputs // cols) * lanes
    parts = 1
    if items < target and R > lanes * per:
        parts = builtins.min(-(-R // (lanes * per)), -(-target // items))
    return lanes, parts, cols


def _lsize(dev):
    """The work-group size of every reduce.cl launch (one per device: PoCL compiles a kernel again for each)."""
    size = builtins.min(256, dev.max_work_group_size)
    return 1 << (size.bit_length() - 1)


def _kernel(dev, name, **defines):
    return kernels.kernel(dev, "reduce.cl", name, defines)


# ---- the forward launch ----------------------------------------------------------------------------------------------

def _reduce(x, dims, comb, out_shape, mapping=M_X, arg=False, c=None, fin=F_SCALE, scale=1.0, p=0.0, what=""):
    """x reduced over dims (sorted, distinct) into a new tensor of out_shape (values; with arg, (values, int32
    indices)); no graph. Bools add up as int32; fin F_ANY and F_ALL give bools."""
    dev = x.device
    sizes, strides, kd, rd = _layout(x.shape, dims)
    outputs, R = math.prod(sizes[:kd]), math.prod(sizes[kd:])
    out = empty(out_shape, dev, BOOL if fin in (F_ANY, F_ALL) else _acc_dtype(x))
    idx = empty(out_shape, dev, INT) if arg else None
    if outputs == 0:
        return (out, idx) if arg else out
    _launch(x, None, sizes, strides, kd, rd, outputs, R, comb, mapping, arg, c, fin, scale, p, out, idx, what)
    return (out, idx) if arg else out


def _acc_dtype(x):
    """What reduce.cl combines x's values as: int32 for int32 and bool, float32 for float32."""
    return FLOAT if x.dtype == FLOAT else INT


def _launch(x, xi, sizes, strides, kd, rd, outputs, R, comb, mapping, arg, c, fin, scale, p, out, idx, what):
    dev = x.device
    lanes, parts, cols = _plan(outputs, R, strides[-1] == 1, kd > 0 and strides[kd - 1] == 1, dev)
    lsize = _lsize(dev)
    defines = dict(COMB=comb, LSIZE=lsize)
    if arg:
        defines["ARG"] = 1
    if x.dtype != FLOAT:
        defines["INTEGER"] = 1
    if x.dtype == BOOL:
        defines["BOOLS"] = 1
    meta = layout.meta(dev, sizes, strides)
    if parts == 1 and out.dtype == BOOL:
        defines["BOOL_OUT"] = 1
    chunk = -(-R // parts) if R else 1
    if parts > 1:
        parts = -(-R // chunk)
        # first pass: each part of an output's elements into its partial, unfinished; then the (outputs, parts)
        # partials, reduced over their last dimension with the indices they carry, into out
        target = empty((outputs, parts), dev, _acc_dtype(x))
        target_idx = empty((outputs, parts), dev, INT) if arg else None
        first = (F_SCALE, 1.0)
    else:
        target, target_idx, first = out, idx, (fin, scale)
    if lanes > 1:
        k = _kernel(dev, "reduce_tree", **defines)
        kernels.launch(dev, k, (lsize * parts, -(-outputs // (lsize // lanes))), (lsize, 1), x, xi,
                       int(xi is not None), c, target, target_idx, meta, kd, rd, R, outputs, lanes, chunk, mapping,
                       first[0], float(first[1]), float(p), what=what)
    else:
        if cols > 1:
            defines["COLS"] = cols
        k = _kernel(dev, "reduce_loop", **defines)
        kernels.launch(dev, k, (-(-outputs // cols) * parts,), (lsize,), x, xi, int(xi is not None), c, target,
                       target_idx, meta, kd, rd, R, outputs, parts, chunk, mapping, first[0], float(first[1]),
                       float(p), what=what)
    if parts > 1:
        _launch(target, target_idx, (outputs, parts), (parts, 1), 1, 1, outputs, parts, comb, M_X, arg, c, fin,
                scale, p, out, idx, what)


# ---- sum_to (inside backward: no graph) ----------------------------------------------------------------------------

def sum_to(x, shape):
    """x summed over the dimensions along which `shape` was broadcast to x.shape, as torch's sum_to_size: leading
    dimensions dropped, dimensions of size 1 in `shape` kept as 1. Returns x itself when the shapes match. Records
    no graph (broadcasting ops call it in their backward).

    Parameters
    ----------
    x : Tensor
        float32.
    shape : tuple of int
        A shape that broadcasts to x.shape.
    """
    shape = tuple(int(s) for s in shape)
    if x.shape == shape:
        return x
    dims = _sum_to_dims("sum_to", x.shape, shape)
    _tensor("sum_to", x, (FLOAT, INT))
    dims = tuple(d for d in dims if x.shape[d] != 1)
    if not dims:  # only size-1 dimensions go: the same elements
        return x._alias(shape)
    return _reduce(x, dims, SUM, shape, what="sum_to")


def _sum_to_dims(what, x_shape, shape):
    """The dimensions of x_shape that summing to `shape` reduces (those `shape` was broadcast along)."""
    lead = len(x_shape) - len(shape)
    if lead < 0 or builtins.any(s != 1 and s != x_shape[lead + i] for i, s in enumerate(shape)):
        raise ValueError(f"{what}: shape {shape} does not broadcast to the tensor's shape {x_shape}; pass a shape "
                         "whose sizes are 1 or x's, aligned at the right")
    return tuple(d for d in range(len(x_shape)) if d < lead or shape[d - lead] == 1)


# ---- the backward launch -------------------------------------------------------------------------------------------

def _spread(grad, x_shape, dims, dy, x=None, y=None, aux=None, scale=1.0, p=0.0, what=""):
    """dx of x_shape from per-output tensors (dy, y, aux: the keepdim shape's elements), reduce_bwd's `grad`."""
    dev = dy.device
    dx = empty(x_shape, dev)
    n = dx.size
    if n == 0:
        return dx
    kshape = _out_shape(x_shape, dims, True)
    sizes, ostrides = layout.coalesce(x_shape, layout.broadcast_strides(kshape, x_shape))
    k = _kernel(dev, "reduce_bwd", NDIM=len(sizes))
    run = BWD_RUN if tuning.cpu_shaped(dev) else 1
    items = n // sizes[-1] * -(-sizes[-1] // run)
    kernels.launch(dev, k, (items,), (_lsize(dev),), x, y, dy, aux, dx, layout.meta(dev, sizes, ostrides), n, run,
                   grad, float(scale), float(p), what=what)
    return dx


# ---- differentiable ops ----------------------------------------------------------------------------------------------

class Sum(Function):
    """scale * the sum over dims (mean: scale 1 / the count)."""
    unit_grad = True
    __slots__ = ("dims", "in_shape", "scale")

    def forward(self, x, dims, keepdim, scale):
        self.dims, self.in_shape, self.scale = dims, x.shape, scale
        return _reduce(x, dims, SUM, _out_shape(x.shape, dims, keepdim), scale=scale, what="sum")

    def backward(self, dy):
        if dy is None:
            dy = ops.full((), self.out_device, 1.0)
        return _spread(G_SUM, self.in_shape, self.dims, dy, scale=self.scale, what="sum backward")


class Var(Function):
    """Variance (std: its square root) over dims, with `correction` (Bessel's: 1) subtracted from the count."""
    __slots__ = ("dims", "divisor", "std")

    def forward(self, x, dims, keepdim, correction, std):
        R = _reduced_count(x.shape, dims)
        kshape = _out_shape(x.shape, dims, True)
        mean = _reduce(x, dims, SUM, kshape, scale=1.0 / R if R else math.nan, what="var (mean)")
        divisor = builtins.max(R - correction, 0)
        self.dims, self.divisor, self.std = dims, divisor, std
        inv = 1.0 / divisor if divisor else math.inf
        y = _reduce(x, dims, SUM, _out_shape(x.shape, dims, keepdim), mapping=M_SQDEV, c=mean,
                    fin=F_SQRT if std else F_SCALE, scale=inv, what="std" if std else "var")
        self.save(x, mean, y)
        return y

    def backward(self, dy):
        x, mean, y = self.saved
        inv = 1.0 / self.divisor if self.divisor else math.inf
        if self.std:
            return _spread(G_STD, x.shape, self.dims, dy, x, y, mean, inv, what="std backward")
        return _spread(G_VAR, x.shape, self.dims, dy, x, None, mean, 2.0 * inv, what="var backward")


class Extreme(Function):
    """amax / amin over dims; the gradient is split evenly among the elements equal to the result (PyTorch's)."""
    __slots__ = ("dims", "comb")

    def forward(self, x, dims, keepdim, comb):
        self.dims, self.comb = dims, comb
        y = _reduce(x, dims, comb, _out_shape(x.shape, dims, keepdim), what="amax" if comb == MAX else "amin")
        self.save(x, y)
        return y

    def backward(self, dy):
        x, y = self.saved
        count = _reduce(x, self.dims, SUM, y.shape, mapping=M_EQ, c=y, what="amax backward (ties)")
        return _spread(G_TIES, x.shape, self.dims, dy, x, y, count, what="amax backward")


class ExtremeDim(Function):
    """max / min over one dimension: (values, int32 indices), the first index on ties; the gradient goes to it."""
    __slots__ = ("dim", "in_shape")

    def forward(self, x, dim, keepdim, comb):
        self.dim, self.in_shape = dim, x.shape
        values, indices = _reduce(x, (dim,), comb, _out_shape(x.shape, (dim,), keepdim), arg=True,
                                  what="max" if comb == MAX else "min")
        self.save(indices)
        return values, indices

    def backward(self, dy):
        indices, = self.saved
        shape, dim = self.in_shape, self.dim
        dx = empty(shape, dy.device)
        if dx.size:
            inner = math.prod(shape[dim + 1:])
            k = _kernel(dy.device, "index_bwd")
            kernels.launch(dy.device, k, (dx.size,), (_lsize(dy.device),), indices, dy, dx, dx.size, shape[dim],
                           inner, what="max backward")
        return dx


class LogSumExp(Function):
    __slots__ = ("dims",)

    def forward(self, x, dims, keepdim):
        self.dims = dims
        m = _reduce(x, dims, MAX, _out_shape(x.shape, dims, True), what="logsumexp (max)")
        y = _reduce(x, dims, SUM, _out_shape(x.shape, dims, keepdim), mapping=M_EXP, c=m, fin=F_LOGSHIFT,
                    what="logsumexp")
        self.save(x, y)
        return y

    def backward(self, dy):
        x, y = self.saved
        return _spread(G_LSE, x.shape, self.dims, dy, x, y, what="logsumexp backward")


class Prod(Function):
    """The product over dims; its gradient, the product of the other elements, is right where some are zero."""
    __slots__ = ("dims",)

    def forward(self, x, dims, keepdim):
        self.dims = dims
        self.save(x)
        return _reduce(x, dims, PROD, _out_shape(x.shape, dims, keepdim), what="prod")

    def backward(self, dy):
        x, = self.saved
        kshape = _out_shape(x.shape, self.dims, True)
        zeros = _reduce(x, self.dims, SUM, kshape, mapping=M_ISZERO, what="prod backward (zeros)")
        nonzero = _reduce(x, self.dims, PROD, kshape, mapping=M_NONZERO, what="prod backward")
        return _spread(G_PROD, x.shape, self.dims, dy, x, nonzero, zeros, what="prod backward")


class Norm(Function):
    __slots__ = ("dims", "p")

    def forward(self, x, dims, keepdim, p):
        self.dims, self.p = dims, p
        shape = _out_shape(x.shape, dims, keepdim)
        if p == 2:
            y = _reduce(x, dims, SUM, shape, mapping=M_SQUARE, fin=F_SQRT, what="norm")
        elif p == 1:
            y = _reduce(x, dims, SUM, shape, mapping=M_ABS, what="norm")
        elif math.isinf(p):
            y = _reduce(x, dims, MAX if p > 0 else MIN, shape, mapping=M_ABS, what="norm")
        else:
            y = _reduce(x, dims, SUM, shape, mapping=M_POWABS, fin=F_POW, scale=1.0 / p, p=p, what="norm")
        self.save(x, y)
        return y

    def backward(self, dy):
        x, y = self.saved
        p, dims = self.p, self.dims
        if p == 2:
            return _spread(G_L2, x.shape, dims, dy, x, y, what="norm backward")
        if p == 1:
            return _spread(G_L1, x.shape, dims, dy, x, what="norm backward")
        if math.isinf(p):
            count = _reduce(x, dims, SUM, y.shape, mapping=M_ABSEQ, c=y, what="norm backward (ties)")
            return _spread(G_INFNORM, x.shape, dims, dy, x, y, count, what="norm backward")
        return _spread(G_PNORM, x.shape, dims, dy, x, y, p=p, what="norm backward")


class Cumsum(Function):
    __slots__ = ("dim",)

    def forward(self, x, dim):
        self.dim = dim
        return _cumsum(x, dim, False, "cumsum")

    def backward(self, dy):
        return _cumsum(dy, self.dim, True, "cumsum backward")


def _cumsum(x, dim, reverse, what):
    shape = x.shape or (1,)
    out = empty(x.shape, x.device, x.dtype)
    size, inner = shape[dim], math.prod(shape[dim + 1:])
    lines = x.size // size if size else 0
    if lines:
        k = _kernel(x.device, "cumsum", **({"INTEGER": 1} if x.dtype != FLOAT else {}))
        kernels.launch(x.device, k, (lines,), (_lsize(x.device),), x, out, lines, size, inner, int(reverse),
                       what=what)
    return out


# ---- public functions ----------------------------------------------------------------------------------------------

def _dims(what, x, dim):
    return layout.normalize_dims(what, dim, x.ndim)


def _copy(x):
    """A reduction over nothing (a 0-d tensor's): the values themselves, as a new tensor in the graph."""
    return Sum.apply(x, dims=(), keepdim=False, scale=1.0)


def sum(x, dim=None, keepdim=False):
    """The sum over `dim` (an int, a tuple of ints, or None: every dimension), as torch.sum; an empty reduction is 0.

    Parameters
    ----------
    x : Tensor
        float32, int32 or bool (an int32 or bool sum is int32, not PyTorch's int64; it records no gradient: a
        count of a mask, ``(pred == labels).sum()``, is one launch).
    dim : int or tuple of int, optional
    keepdim : bool
        Keep the reduced dimensions as size 1.
    """
    if dim is None and not keepdim and getattr(x, "dtype", None) == FLOAT and x.size > kernels.INDEX_LIMIT:
        return ops.Sum.apply(x, scale=1.0)  # every element of a tensor past the index limit: ops.Sum splits
    _tensor("sum", x, (FLOAT, INT, BOOL))
    dims = _dims("sum", x, dim)
    if x.dtype != FLOAT:
        return _reduce(x, dims, SUM, _out_shape(x.shape, dims, keepdim), what="sum")
    return Sum.apply(x, dims=dims, keepdim=keepdim, scale=1.0)


def mean(x, dim=None, keepdim=False):
    """The mean over `dim` (int, tuple or None), as torch.mean; an empty reduction is NaN."""
    if dim is None and not keepdim and getattr(x, "dtype", None) == FLOAT and x.size > kernels.INDEX_LIMIT:
        return ops.Sum.apply(x, scale=1.0 / x.size)  # as sum: ops.Sum splits its launches
    _tensor("mean", x)
    dims = _dims("mean", x, dim)
    R = _reduced_count(x.shape, dims)
    return Sum.apply(x, dims=dims, keepdim=keepdim, scale=1.0 / R if R else math.nan)


def _correction(what, unbiased, correction):
    if unbiased is not None and correction is not None:
        raise ValueError(f"{what}: pass unbiased or correction, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    if isinstance(correction, bool) or not isinstance(correction, (int, float, np.number)):
        raise TypeError(f"{what}: correction must be a number, got {type(correction).__name__}")
    return correction


def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The variance over `dim`, sum((x - mean)^2) / (count - correction), as torch.var: correction 1 (Bessel's,
    the default; unbiased=False means 0). A divisor at or below 0 gives inf or NaN, as PyTorch's."""
    return _var("var", x, dim, unbiased, keepdim, correction, False)


def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The standard deviation over `dim`, the square root of `var`'s (same arguments), as torch.std; its gradient
    is 0 where it is 0, as PyTorch's."""
    return _var("std", x, dim, unbiased, keepdim, correction, True)


def _var(what, x, dim, unbiased, keepdim, correction, is_std):
    _tensor(what, x)
    if isinstance(dim, bool):  # torch.var(x, False): the old unbiased-first form
        dim, unbiased = None, dim
    correction = _correction(what, unbiased, correction)
    dims = _dims(what, x, dim)
    return Var.apply(x, dims=dims, keepdim=keepdim, correction=correction, std=is_std)


def _extreme(what, x, dim, keepdim, comb):
    _tensor(what, x, (FLOAT, INT))
    if dim is None:
        if keepdim:
            raise TypeError(f"{what}: keepdim needs a dim; pass dim=... with keepdim=True, or use amax/amin")
        _nonempty(what, x, ())
        dims = tuple(range(x.ndim))
        if x.dtype != FLOAT:
            return _reduce(x, dims, comb, (), what=what)
        return Extreme.apply(x, dims=dims, keepdim=False, comb=comb)
    if isinstance(dim, Tensor):
        raise TypeError(f"{what}: to compare two tensors elementwise use clnet.maximum / clnet.minimum, not {what}")
    d = layout.normalize_dim(what, dim, x.ndim)
    dims = (d,) if x.ndim else ()
    _nonempty(what, x, dims)
    shape = _out_shape(x.shape, dims, keepdim)
    if x.dtype != FLOAT:
        return ValuesIndices(*_reduce(x, dims, comb, shape, arg=True, what=what))
    if not dims:  # a 0-d tensor: itself, index 0
        return ValuesIndices(_copy(x), _zero_index(x.device))
    return ValuesIndices(*ExtremeDim.apply(x, dim=d, keepdim=keepdim, comb=comb))


def _zero_index(dev):
    return Tensor((), INT, dev).write(np.zeros((), np.int32))


def max(x, dim=None, keepdim=False):
    """The maximum, as torch.max: without `dim` the largest element (a 0-d tensor; its gradient split evenly among
    ties); with an int `dim`, (values, indices) over that dimension, int32 indices of the first maximum (NaN counts
    as the largest, as PyTorch's), the gradient to that index."""
    return _extreme("max", x, dim, keepdim, MAX)


def min(x, dim=None, keepdim=False):
    """The minimum, as torch.min (see `max`)."""
    return _extreme("min", x, dim, keepdim, MIN)


def _amax(what, x, dim, keepdim, comb):
    _tensor(what, x, (FLOAT, INT))
    dims = _dims(what, x, dim)
    _nonempty(what, x, dims)
    if x.dtype != FLOAT:
        return _reduce(x, dims, comb, _out_shape(x.shape, dims, keepdim), what=what)
    return Extreme.apply(x, dims=dims, keepdim=keepdim, comb=comb)


def amax(x, dim=(), keepdim=False):
    """The maximum over `dim` (int, tuple; () or None: every dimension), as torch.amax; its gradient is split evenly
    among the elements equal to it."""
    return _amax("amax", x, dim, keepdim, MAX)


def amin(x, dim=(), keepdim=False):
    """The minimum over `dim`, as torch.amin (see `amax`)."""
    return _amax("amin", x, dim, keepdim, MIN)


def _argextreme(what, x, dim, keepdim, comb):
    _tensor(what, x, (FLOAT, INT))
    if dim is None:
        _nonempty(what, x, ())
        flat = x._alias((x.size,))
        shape = (1,) * x.ndim if keepdim else ()
        return _reduce(flat, (0,), comb, shape, arg=True, what=what)[1]
    d = layout.normalize_dim(what, dim, x.ndim)
    dims = (d,) if x.ndim else ()
    _nonempty(what, x, dims)
    if not dims:
        return _zero_index(x.device)
    return _reduce(x, dims, comb, _out_shape(x.shape, dims, keepdim), arg=True, what=what)[1]


def argmax(x, dim=None, keepdim=False):
    """int32 indices of the first maximum over `dim` (None: of the flattened tensor), as torch.argmax."""
    return _argextreme("argmax", x, dim, keepdim, MAX)


def argmin(x, dim=None, keepdim=False):
    """int32 indices of the first minimum over `dim` (None: of the flattened tensor), as torch.argmin."""
    return _argextreme("argmin", x, dim, keepdim, MIN)


def any(x, dim=None, keepdim=False):
    """Whether any element over `dim` (int, tuple or None) is nonzero (True, or a NaN), as torch.any: a bool
    tensor; an empty reduction is False."""
    return _truth("any", x, dim, keepdim, M_NOTZERO, F_ANY)


def all(x, dim=None, keepdim=False):
    """Whether every element over `dim` is nonzero, as torch.all: a bool tensor; an empty reduction is True."""
    return _truth("all", x, dim, keepdim, M_ISZERO, F_ALL)


def _truth(what, x, dim, keepdim, mapping, fin):
    """any and all count the nonzero (zero) elements and give whether the count is nonzero (zero)."""
    _tensor(what, x, (FLOAT, INT, BOOL))
    dims = _dims(what, x, dim)
    return _reduce(x, dims, SUM, _out_shape(x.shape, dims, keepdim), mapping=mapping, fin=fin, what=what)


def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) over `dim` (int or tuple), as torch.logsumexp, computed around the maximum (no overflow);
    an empty reduction is -inf."""
    _tensor("logsumexp", x)
    return LogSumExp.apply(x, dims=_dims("logsumexp", x, dim), keepdim=keepdim)


def prod(x, dim=None, keepdim=False):
    """The product over `dim` (an int or None: every dimension), as torch.prod; an empty product is 1. The gradient
    is the product of the other elements, right where some are zero."""
    _tensor("prod", x, (FLOAT, INT))
    if isinstance(dim, (tuple, list)):
        raise TypeError("prod: dim must be an int or None (as torch.prod); reduce one dimension at a time")
    dims = _dims("prod", x, dim)
    if x.dtype != FLOAT:
        return _reduce(x, dims, PROD, _out_shape(x.shape, dims, keepdim), what="prod")
    return Prod.apply(x, dims=dims, keepdim=keepdim)


def norm(x, p=2, dim=None, keepdim=False):
    """The p-norm over `dim` (int, tuple or None: every element), as torch.norm: p 2 (or "fro"), 1, inf, -inf or
    any positive number. The gradient at a zero norm is 0; the infinity norm's is split evenly among ties."""
    _tensor("norm", x)
    if p == "fro":
        p = 2
    if isinstance(p, bool) or not isinstance(p, (int, float, np.number)) or not (p > 0 or p == -math.inf):
        raise ValueError(f"norm: p={p!r} is not supported; use a positive number, inf, -inf or 'fro'")
    dims = _dims("norm", x, dim)
    if math.isinf(p):  # a maximum or minimum: no identity, as PyTorch's
        _nonempty("norm", x, dims)
    return Norm.apply(x, dims=dims, keepdim=keepdim, p=float(p))


def cumsum(x, dim):
    """Cumulative sums along `dim`, as torch.cumsum (int32 stays int32, without a gradient)."""
    _tensor("cumsum", x, (FLOAT, INT))
    d = layout.normalize_dim("cumsum", dim, x.ndim)
    if x.dtype != FLOAT:
        return _cumsum(x, d, False, "cumsum")
    return Cumsum.apply(x, dim=d)


class SoftmaxRows(Function):
    """Softmax or log-softmax over the last dimension, GPU-shaped: lanes of a work-group share each row."""
    __slots__ = ("log",)

    def forward(self, x, log):
        self.log = log
        y = empty(x.shape, x.device)
        _softmax_rows("softmax_rows_fwd", (x, y), x.shape[-1], log, "log_softmax" if log else "softmax")
        self.save(y)
        return y

    def backward(self, dy):
        y, = self.saved
        dx = empty(y.shape, y.device)
        _softmax_rows("softmax_rows_bwd", (y, dy, dx), y.shape[-1], self.log,
                      ("log_softmax" if self.log else "softmax") + " backward")
        return dx


def _softmax_rows(name, tensors, C, log, what):
    dev = tensors[0].device
    lsize = _lsize(dev)
    lanes = builtins.min(lsize, 1 << (C.bit_length() - 1))
    rows = tensors[0].size // C
    kernels.launch(dev, _kernel(dev, name, LSIZE=lsize), (-(-rows // (lsize // lanes)) * lsize,), (lsize,), *tensors,
                   rows, C, lanes, int(log), what=what)


def _softmax(what, x, dim, log):
    _tensor(what, x)
    if dim is None:
        raise TypeError(f"{what}: pass the dimension to normalise over (dim=-1 for the last), as PyTorch asks")
    d = layout.normalize_dim(what, dim, x.ndim)
    if not x.shape:
        return ops.Softmax.apply(x.reshape(1), dim=0, log=log).reshape(())
    if d == x.ndim - 1 and x.shape[-1] >= TREE_FROM and x.size and not tuning.cpu_shaped(x.device):
        # a GPU's rows: softmax.cl's work-item per row would read C apart from its neighbours'
        return SoftmaxRows.apply(x, log=log)
    return ops.Softmax.apply(x, dim=d, log=log)


def softmax(x, dim):
    """exp(x) / sum(exp(x)) along `dim`, as torch.softmax (computed around each line's maximum)."""
    return _softmax("softmax", x, dim, False)


def log_softmax(x, dim):
    """x - logsumexp(x) along `dim`, as torch.log_softmax."""
    return _softmax("log_softmax", x, dim, True)


def sum_to_size(x, *size):
    """x summed to `size` (sizes, or one tuple of them), as Tensor.sum_to_size: `sum_to`, recorded in the graph
    (its gradient spreads the output's back over x's shape)."""
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    _tensor("sum_to_size", x, (FLOAT, INT))
    dims = _sum_to_dims("sum_to_size", x.shape, shape)
    if x.dtype != FLOAT or x.shape == shape:
        return sum_to(x, shape)
    return Sum.apply(x, dims=dims, keepdim=True, scale=1.0).reshape(shape)


TENSOR_METHODS = {
    "sum": sum, "mean": mean, "var": var, "std": std, "max": max, "min": min, "amax": amax, "amin": amin,
    "argmax": argmax, "argmin": argmin, "logsumexp": logsumexp, "prod": prod, "norm": norm, "cumsum": cumsum,
    "softmax": softmax, "log_softmax": log_softmax, "any": any, "all": all, "sum_to_size": sum_to_size,
}
