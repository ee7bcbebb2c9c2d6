"""Shapes, views and indexing, with PyTorch's names and semantics, forward and backward (cl_kernels/views.cl).

clnet's tensors are always contiguous. reshape, view, flatten, unflatten, squeeze and unsqueeze alias the input's
storage (no copy, no launch: `Tensor.reshape`, `ops.Reshape` for autograd). Every other view here (permute,
transpose, slicing and basic indexing, select, narrow, chunk, split, expand, repeat) materialises a contiguous result
in one launch of one strided-copy kernel, which reads the input through strides from a base element; a view that
turns out to be the input's own layout (x[:], permute(0, 1), expand to the same shape) is an alias, with no launch.
So a reshape-transpose-reshape chain (ShuffleNet's channel shuffle) and attention's head split
(reshape(B, T, h, d).permute(0, 2, 1, 3)) are one launch each. A view is therefore a copy: writing into it does not
write into the tensor it came from (writing into a reshape of a tensor does).

Backward of a view is the inverse copy into the input's gradient (zero-filled first where the view did not read
every element); expand and repeat sum the gradient over their broadcast dimensions in one launch. index_select and
gather sum repeated indices without atomics, deterministically (in order of the index). gather's backward loops,
for each input element, over the index's extent along `dim` (fine for label gathers). index_select's loops over all
K indices per input element where that is cheap (channel picks); for a large table (an embedding's) it first links
each index to the next equal one (K^2 comparisons of indices), and the first of each chain sums its rows: O(K) reads
per column in all instead of O(K) per element.

Every op takes tensors of any dtype (float32, int32, bool: elements are moved, never converted); gradients flow
through float32 ones. Index tensors are int32 (host integer data is converted); indices outside [-size, size) of
device tensors whose values clnet cannot know read as NaN (float) or 0 instead of memory outside the tensor.
"""
import math
import numbers

import numpy as np

from . import autograd, kernels, layout, ops
from .autograd import Function
from .errors import Error
from .layout import contiguous_strides, numel
from .tensor import Tensor, empty, note_in_place, too_large

__all__ = ["permute", "transpose", "swapaxes", "swapdims", "t", "movedim", "moveaxis", "contiguous", "squeeze",
           "unsqueeze", "flatten", "unflatten", "expand", "expand_as", "repeat", "tile", "channel_shuffle", "narrow",
           "select", "unbind", "chunk", "split", "index_select", "gather", "stack", "cat", "pad", "getitem",
           "setitem"]


class IndexingError(Error, IndexError):
    """An index that clnet's tensors do not take (a boolean mask, several index tensors at once)."""


# ---- launches ------------------------------------------------------------------------------------------------------

def _elem(t):
    """The type views.cl moves t's elements as: their bits, never converted."""
    if t.dtype.itemsize == 4:
        return "uint"
    if t.dtype.itemsize == 1:
        return "uchar"
    raise TypeError(f"clnet views move 1- or 4-byte elements, not {t.dtype}")


def _kernel(dev, name, NDIM=1, ELEM="uint", MODE=1):
    """Every views.cl kernel with all three defines given (the defaults where a kernel reads none), so that kernels
    of one (NDIM, ELEM, MODE) share one build of the file."""
    return kernels.kernel(dev, "views.cl", name, dict(NDIM=NDIM, ELEM=ELEM, MODE=MODE))


def _fits(what, *shapes):
    for shape in shapes:
        if numel(shape) > kernels.INDEX_LIMIT:
            raise too_large(what, shape, "index or view smaller parts of the tensor")


def _bits(value, dtype, what):
    """A Python number as the int32 whose bits the kernels store into an element of dtype."""
    if isinstance(value, Tensor):
        raise TypeError(f"{what}: expected a Python number, got a tensor")
    if not isinstance(value, (numbers.Number, np.bool_)):
        raise TypeError(f"{what}: expected a Python number, got {type(value).__name__}")
    if dtype == np.float32:
        return int(np.float32(value).view(np.int32))
    if dtype == np.bool_:
        return int(bool(value))
    if not -2**31 <= int(value) < 2**31:  # truncated toward zero, as PyTorch converts
        raise ValueError(f"{what}: the value {value} does not fit in int32")
    return int(value)


_NAN_BITS = int(np.float32(np.nan).view(np.int32))


def _oob(dtype):
    return _NAN_BITS if dtype == np.float32 else 0


def _pad_rank(ndim, shape, *strides):
    """shape and strides with size-1 dimensions (stride 0) put in front up to ndim dimensions."""
    lead = ndim - len(shape)
    return ((1,) * lead + shape,) + tuple((0,) * lead + s for s in strides)


def _copy(dst, dst_base, dst_strides, src, src_base, src_strides, shape, what):
    """dst[dst_base + dst_strides . c] = src[src_base + src_strides . c] at every index c of shape: one launch."""
    n = numel(shape)
    if not n:
        return
    cshape, dst_st, src_st = layout.coalesce(tuple(shape), tuple(dst_strides), tuple(src_strides))
    # Each element is copied once, in any order: the launch runs along the dimension where the writes (else the
    # reads) are contiguous, moved last, so that a GPU's neighbouring work-items touch neighbouring memory and a
    # CPU's vectorised work-items load or store a vector at once
    fast = max(range(len(cshape)), key=lambda d: (cshape[d] >= ROW_LAUNCH, dst_st[d] == 1, src_st[d] == 1, cshape[d]))
    order = [d for d in range(len(cshape)) if d != fast] + [fast]
    cshape, dst_st, src_st = (tuple(t[d] for d in order) for t in (cshape, dst_st, src_st))
    m = layout.meta(dst.device, cshape, dst_st, src_st)
    if cshape[-1] >= ROW_LAUNCH:  # a 2-D launch along the last dimension: a row's divisions once, not per element
        k = _kernel(dst.device, "strided_copy_rows", NDIM=len(cshape), ELEM=_elem(dst))
        kernels.launch(dst.device, k, (cshape[-1], n // cshape[-1]), None, dst, int(dst_base), src, int(src_base), m,
                       what=what)
        return
    k = _kernel(dst.device, "strided_copy", NDIM=len(cshape), ELEM=_elem(dst))
    kernels.launch(dst.device, k, (n,), None, dst, int(dst_base), src, int(src_base), m, what=what)


ROW_LAUNCH = 16  # strided copies whose last (coalesced) dimension has at least this many elements launch by rows


def _fill(dst, base, strides, shape, value, what, bits=None):
    """dst[base + strides . c] = value (or the element whose bits are `bits`) at every index c of shape."""
    n = numel(shape)
    if not n:
        return
    cshape, st = layout.coalesce(tuple(shape), tuple(strides))
    m = layout.meta(dst.device, cshape, st)
    k = _kernel(dst.device, "strided_fill", NDIM=len(cshape), ELEM=_elem(dst))
    bits = _bits(value, dst.dtype, what) if bits is None else bits
    kernels.launch(dst.device, k, (n,), None, dst, int(base), m, bits, what=what)


def _identity(x, shape, strides, base):
    """Whether reading x through (shape, strides, base) gives x's own elements in order: then a view is an alias."""
    if base or numel(shape) != x.size:
        return False
    return x.size == 0 or layout.coalesce(shape, strides) == layout.coalesce(shape, contiguous_strides(shape))


class View(Function):
    """out = x read through (shape, strides, base): every non-zero-stride dimension reads distinct elements, and a
    stride-0 dimension (expand, repeat) reads the same ones again. One launch each way."""
    __slots__ = ("layout", "in_shape", "what")

    def forward(self, x, shape, strides, base, what):
        self.layout, self.in_shape, self.what = (shape, strides, base), x.shape, what
        out = empty(shape, x.device, x.dtype)
        _copy(out, 0, contiguous_strides(shape), x, base, strides, shape, what)
        return out

    def backward(self, dy):
        shape, strides, base = self.layout
        what = self.what + " backward"
        dx = empty(self.in_shape, dy.device)
        g_strides = contiguous_strides(shape)
        red = [d for d in range(len(shape)) if strides[d] == 0 and shape[d] > 1]
        keep = [d for d in range(len(shape)) if d not in red]
        kept = tuple(shape[d] for d in keep)
        if numel(kept) != dx.size:  # the view read only part of x: the rest of its gradient is 0
            ops.fill(dx, 0.0)
        if not red:
            _copy(dx, base, strides, dy, 0, g_strides, shape, what)
            return dx
        if not numel(kept):
            return dx
        ks, kd, kg = layout.coalesce(kept, tuple(strides[d] for d in keep), tuple(g_strides[d] for d in keep))
        rs, rg = layout.coalesce(tuple(shape[d] for d in red), tuple(g_strides[d] for d in red))
        rank = max(len(ks), len(rs))
        keep_meta = layout.meta(dy.device, *_pad_rank(rank, ks, kd, kg))
        red_meta = layout.meta(dy.device, *_pad_rank(rank, rs, rg))
        k = _kernel(dy.device, "strided_sum", NDIM=rank)
        kernels.launch(dy.device, k, (numel(ks),), None, dx, int(base), dy, keep_meta, red_meta, numel(rs),
                       what=what)
        return dx


def _view(x, shape, strides, base, what, copy=False):
    """x read through (shape, strides, base): x's own memory where that is x's layout, else a new tensor, marked as a
    copy standing for PyTorch's view (Tensor.copy_for_view) unless the op copies in PyTorch too (copy)."""
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if _identity(x, shape, strides, base):
        return x.clone().reshape(shape) if copy else x.reshape(shape)
    _fits(what, x.shape, shape)
    y = View.apply(x, shape=shape, strides=strides, base=int(base), what=what)
    if not copy:  # PyTorch's view, and whether it is contiguous (then its contiguous() and reshape are views too)
        y.copy_for_view = (what, all(st == c for n, st, c in zip(shape, strides, contiguous_strides(shape))
                                     if n > 1))
    return y


def refuse_write_to_copy(x, what):
    """An in-place write (`what`) to a tensor that stands for a view of another's memory: refused, since clnet's is
    a copy, and the write would not reach the original as PyTorch's does."""
    if x.copy_for_view is not None:
        raise RuntimeError(f"{what}: this tensor of shape {x.shape} is the result of {x.copy_for_view[0]}, a copy in "
                           f"clnet where PyTorch's is a view of the original's memory, so writing it in place would "
                           f"leave the original as it is; write through the original (x[...] = value), or write "
                           f".contiguous() or .clone() of this one")


def _tensor_arg(what, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a clnet tensor, got {type(x).__name__}; wrap host data with "
                        "clnet.tensor(array, device=...)")
    return x


def _sizes_arg(what, sizes):
    """*sizes given as ints or as one sequence (torch's expand(2, 3) and expand((2, 3)))."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    for s in sizes:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise TypeError(f"{what}: sizes must be ints, got {tuple(sizes)}")
    return tuple(int(s) for s in sizes)


# ---- permutations --------------------------------------------------------------------------------------------------

def permute(x, *dims):
    """x with its dimensions in the order `dims` (torch.permute); a contiguous copy, one launch."""
    what = "permute"
    _tensor_arg(what, x)
    dims = _sizes_arg(what, dims)
    if len(dims) != x.ndim:
        raise ValueError(f"{what}: dims {dims} name {len(dims)} dimensions, the tensor of shape {x.shape} has "
                         f"{x.ndim}; give each dimension once")
    order = [layout.normalize_dim(what, d, x.ndim) for d in dims]
    if len(set(order)) != len(order):
        raise ValueError(f"{what}: dims {dims} name a dimension twice; give each of the {x.ndim} once")
    st = contiguous_strides(x.shape)
    return _view(x, [x.shape[d] for d in order], [st[d] for d in order], 0, what)


def transpose(x, dim0, dim1):
    """x with dimensions dim0 and dim1 swapped (torch.transpose)."""
    what = "transpose"
    _tensor_arg(what, x)
    order = list(range(x.ndim))
    a, b = layout.normalize_dim(what, dim0, x.ndim), layout.normalize_dim(what, dim1, x.ndim)
    if x.ndim:
        order[a], order[b] = order[b], order[a]
    return permute(x, *order)


swapaxes = swapdims = transpose


def t(x):
    """The transpose of a matrix; a tensor of 0 or 1 dimensions as it is (torch.t)."""
    _tensor_arg("t", x)
    if x.ndim > 2:
        raise ValueError(f"t: expects a tensor of at most 2 dimensions, got shape {x.shape}; use transpose(d0, d1) "
                         "or permute")
    return transpose(x, 0, 1) if x.ndim == 2 else x


def movedim(x, source, destination):
    """x with the dimensions `source` (an int or a sequence) moved to `destination`, the others in their order
    (torch.movedim)."""
    what = "movedim"
    _tensor_arg(what, x)
    src = [source] if isinstance(source, (int, np.integer)) else list(source)
    dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
    if len(src) != len(dst):
        raise ValueError(f"{what}: source {source} and destination {destination} name different numbers of dims")
    src = [layout.normalize_dim(what, d, x.ndim) for d in src]
    dst = [layout.normalize_dim(what, d, x.ndim) for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"{what}: source {source} or destination {destination} names a dimension twice")
    rest = iter(d for d in range(x.ndim) if d not in src)
    placed = dict(zip(dst, src))
    return permute(x, *[placed[d] if d in placed else next(rest) for d in range(x.ndim)])


moveaxis = movedim


def contiguous(x):
    """x's memory: clnet's tensors are always contiguous. One that stands for a view that PyTorch's would not hold
    contiguous (x.t()) comes as an alias that may be written in place, as PyTorch's contiguous() of it is a copy of
    its own; one that PyTorch's would (x[0]) stays marked (Tensor.copy_for_view), its contiguous() being the view."""
    return x if x.copy_for_view is None or x.copy_for_view[1] else x._alias(x.shape, copy_for_view=None)


# ---- aliases: no copy, no launch -----------------------------------------------------------------------------------

def squeeze(x, dim=None):
    """x without its size-1 dimensions (only those of `dim`, an int or a tuple, when given); an alias of x."""
    what = "squeeze"
    _tensor_arg(what, x)
    dims = range(x.ndim) if dim is None else layout.normalize_dims(what, dim, x.ndim)
    drop = {d for d in dims if x.shape[d] == 1}
    return x.reshape(tuple(s for d, s in enumerate(x.shape) if d not in drop))


def unsqueeze(x, dim):
    """x with a size-1 dimension inserted at `dim` (in [-ndim - 1, ndim]); an alias of x."""
    what = "unsqueeze"
    _tensor_arg(what, x)
    d = layout.normalize_dim(what, dim, x.ndim + 1)
    return x.reshape(x.shape[:d] + (1,) + x.shape[d:])


def flatten(x, start_dim=0, end_dim=-1):
    """Dimensions start_dim..end_dim merged into one (torch.flatten); an alias of x."""
    return _tensor_arg("flatten", x).flatten(start_dim, end_dim)


def unflatten(x, dim, sizes):
    """Dimension `dim` split into `sizes` (one of them may be -1), as torch.unflatten; an alias of x."""
    what = "unflatten"
    _tensor_arg(what, x)
    d = layout.normalize_dim(what, dim, x.ndim)
    sizes = list(_sizes_arg(what, (sizes,)))
    if not x.ndim:
        raise ValueError(f"{what}: a 0-d tensor has no dimension to split")
    if sizes.count(-1) > 1 or not sizes:
        raise ValueError(f"{what}: sizes {tuple(sizes)} must be non-empty with at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known == 0 or x.shape[d] % known:
            raise ValueError(f"{what}: sizes {tuple(sizes)} do not divide dimension {dim} of shape {x.shape}")
        sizes[sizes.index(-1)] = x.shape[d] // known
    if math.prod(sizes) != x.shape[d] or min(sizes) < 0:
        raise ValueError(f"{what}: sizes {tuple(sizes)} multiply to {math.prod(sizes)}, dimension {dim} of shape "
                         f"{x.shape} has {x.shape[d]}")
    return x.reshape(x.shape[:d] + tuple(sizes) + x.shape[d + 1:])


# ---- expand, repeat ------------------------------------------------------------------------------------------------

def expand(x, *sizes):
    """x broadcast to `sizes` (-1 keeps a dimension; new dimensions go in front), as torch.expand; its gradient
    sums over the broadcast dimensions."""
    what = "expand"
    _tensor_arg(what, x)
    sizes = _sizes_arg(what, sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"{what}: sizes {sizes} have fewer dimensions than the tensor of shape {x.shape}; give at "
                         f"least {x.ndim}")
    own = contiguous_strides(x.shape)
    shape, strides = [], []
    for d, s in enumerate(sizes):
        if d < lead:
            if s < 0:
                raise ValueError(f"{what}: sizes {sizes}: a new leading dimension needs a size >= 0, got {s}")
            shape.append(s), strides.append(0)
            continue
        have = x.shape[d - lead]
        if s == -1 or s == have:
            shape.append(have), strides.append(own[d - lead])
        elif have == 1 and s >= 0:
            shape.append(s), strides.append(0)
        else:
            raise ValueError(f"{what}: cannot expand shape {x.shape} to {sizes}: dimension {d} has size {have}, "
                             "which only expands when it is 1")
    return _view(x, shape, strides, 0, what)


def expand_as(x, other):
    return expand(x, _tensor_arg("expand_as", other).shape)


def repeat(x, *sizes):
    """x tiled `sizes` times along each dimension (torch.repeat; extra sizes add leading dimensions)."""
    what = "repeat"
    _tensor_arg(what, x)
    sizes = _sizes_arg(what, sizes)
    if len(sizes) < x.ndim:
        raise ValueError(f"{what}: {len(sizes)} repeats {sizes} for a tensor of {x.ndim} dimensions (shape "
                         f"{x.shape}); give one per dimension at least")
    if min(sizes, default=0) < 0:
        raise ValueError(f"{what}: repeats {sizes} must be >= 0")
    have = (1,) * (len(sizes) - x.ndim) + x.shape
    own = contiguous_strides(have)
    # as (r0, s0, r1, s1, ...): each repeat a stride-0 dimension before the one it tiles
    shape = tuple(v for r, s in zip(sizes, have) for v in (r, s))
    strides = tuple(v for st in own for v in (0, st))
    return _view(x, shape, strides, 0, what, copy=True).reshape(tuple(r * s for r, s in zip(sizes, have)))


def tile(x, *dims):
    """x tiled `dims` times (torch.tile): as repeat, with ones put in front of dims shorter than x's rank."""
    dims = _sizes_arg("tile", dims)
    return repeat(x, *((1,) * (_tensor_arg("tile", x).ndim - len(dims)) + dims))


def channel_shuffle(x, groups):
    """ShuffleNet's channel shuffle of x (N, C, ...): (N, groups, C / groups, ...) transposed to (N, C / groups,
    groups, ...), as torch.nn.functional.channel_shuffle; one launch."""
    what = "channel_shuffle"
    _tensor_arg(what, x)
    if x.ndim < 3 or not isinstance(groups, (int, np.integer)) or groups <= 0 or x.shape[1] % groups:
        raise ValueError(f"{what}: expected a tensor of at least 3 dimensions (N, C, ...) whose C divides into "
                         f"groups, got shape {x.shape} and groups={groups!r}")
    N, C = x.shape[:2]
    return transpose(x.reshape((N, groups, C // groups) + x.shape[2:]), 1, 2).reshape(x.shape)


# ---- slices --------------------------------------------------------------------------------------------------------

def _cut_dim(what, x, dim, refusal):
    """dim as a non-negative index of tensor x, which `what` cuts along it; a 0-d tensor is refused with
    `refusal`."""
    _tensor_arg(what, x)
    d = layout.normalize_dim(what, dim, x.ndim)
    if not x.ndim:
        raise ValueError(f"{what}: a 0-d tensor {refusal}")
    return d


def narrow(x, dim, start, length):
    """Elements start..start+length-1 along dim (torch.narrow; a negative start counts from the end)."""
    what = "narrow"
    d = _cut_dim(what, x, dim, "cannot be narrowed")
    size = x.shape[d]
    if not -size <= start <= size:
        raise IndexError(f"{what}: start {start} is out of range for dimension {dim} of size {size} (shape {x.shape})")
    start = start % size if start < 0 else start
    if length < 0 or start + length > size:
        raise ValueError(f"{what}: start {start} + length {length} exceeds dimension {dim} of size {size} (shape "
                         f"{x.shape}); use a length in [0, {size - start}]")
    st = contiguous_strides(x.shape)
    return _view(x, x.shape[:d] + (length,) + x.shape[d + 1:], st, start * st[d], what)


def select(x, dim, index):
    """x at `index` along dim, that dimension removed (torch.select, x[..., index, ...])."""
    what = "select"
    _tensor_arg(what, x)
    if not x.ndim:
        raise IndexError(f"{what}: a 0-d tensor has no dimension to index")
    d = layout.normalize_dim(what, dim, x.ndim)
    size = x.shape[d]
    if not -size <= index < size:
        raise IndexError(f"{what}: index {index} is out of range for dimension {dim} of size {size} (shape "
                         f"{x.shape})")
    st = contiguous_strides(x.shape)
    return _view(x, x.shape[:d] + x.shape[d + 1:], st[:d] + st[d + 1:], (index % size) * st[d], what)


def split(x, split_size_or_sections, dim=0):
    """A tuple of pieces along dim: of split_size each (the last smaller), or of the sizes in a list (torch.split);
    one launch per piece (none for a piece that is all of x)."""
    what = "split"
    d = _cut_dim(what, x, dim, "cannot be split")
    size = x.shape[d]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0 and not (step == 0 and size == 0):
            raise ValueError(f"{what}: split_size must be positive, got {step}")
        sizes = [min(step, size - s) for s in range(0, size, step)] if size else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != size or min(sizes, default=0) < 0:
            raise ValueError(f"{what}: sections {tuple(sizes)} sum to {sum(sizes)}, dimension {dim} of shape "
                             f"{x.shape} has {size}; give non-negative sizes that sum to it")
    pieces, start = [], 0
    for n in sizes:
        pieces.append(narrow(x, d, start, n))
        start += n
    return tuple(pieces)


def unbind(x, dim=0):
    """The slices of x along dim, that dimension removed (torch.unbind); one launch each."""
    d = _cut_dim("unbind", x, dim, "has no dimension to unbind")
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def chunk(x, chunks, dim=0):
    """At most `chunks` pieces along dim, each ceil(size / chunks) long but the last (torch.chunk)."""
    what = "chunk"
    _tensor_arg(what, x)
    if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
        raise ValueError(f"{what}: chunks must be a positive int, got {chunks!r}")
    d = _cut_dim(what, x, dim, "cannot be chunked")
    size = x.shape[d]
    step = -(-size // int(chunks))
    if size == 0:
        return split(x, [0] * int(chunks), d)
    return split(x, step, d)


# ---- index_select, gather ------------------------------------------------------------------------------------------

def _index_tensor(what, index, dev):
    """An int32 device tensor of the indices (host integer data converted)."""
    if isinstance(index, Tensor):
        if index.dtype != np.int32:
            raise TypeError(f"{what}: the index must be an integer tensor (int32), got {index.dtype}")
        if index.device is not dev:
            raise ValueError(f"{what}: the index is on {index.device.name}, the tensor on {dev.name}; move one with "
                             ".to(device)")
        return index
    host = np.asarray(index)
    if host.size == 0:
        host = host.astype(np.int64)
    if host.dtype.kind not in "iu":
        raise TypeError(f"{what}: the index must hold integers, got {host.dtype}")
    if host.size and (host.min() < -2**31 or host.max() >= 2**31):
        raise ValueError(f"{what}: index values do not fit in int32")
    return Tensor(host.shape, np.int32, dev).write(host.astype(np.int32))


def _check_range(what, index, size, negative):
    """Indices whose values clnet knows (read from host data) must lie in [0, size), or [-size, size)."""
    r = index.value_range
    if r is None or not index.size:
        return
    low = -size if negative else 0
    if r[0] < low or r[1] >= size:
        raise IndexError(f"{what}: index values in [{r[0]}, {r[1]}] are out of range for a dimension of size "
                         f"{size}; use values in [{low}, {size - 1}]")


class _Indexed(Function):
    """An op that reads x through an index tensor (index_select, gather): forward keeps the index and x's shape, dim
    and name, and backward spreads dy back to x's shape through them (`take` and `spread`, the subclass's); the
    index takes no gradient."""
    __slots__ = ("geometry",)

    def forward(self, x, index, dim, what):
        self.geometry = (x.shape, dim, what)
        self.save(index)
        return self.take(x, index, dim, what)

    def backward(self, dy):
        shape, dim, what = self.geometry
        index, = self.saved
        return self.spread(dy, index, shape, dim, what), None


class IndexSelect(_Indexed):
    __slots__ = ()

    @staticmethod
    def take(x, index, dim, what):
        outer, D, inner = _outer_inner(x.shape, dim)
        K = index.size
        out = empty(x.shape[:dim] + (K,) + x.shape[dim + 1:], x.device, x.dtype)
        if out.size:
            k = _kernel(x.device, "index_select_fwd", ELEM=_elem(x))
            kernels.launch(x.device, k, (inner, outer * K), None, x, index, out, K, D, inner, _oob(x.dtype),
                           what=what)
        return out

    @staticmethod
    def spread(dy, index, shape, dim, what):
        outer, D, inner = _outer_inner(shape, dim)
        dx, K, dev = empty(shape, dy.device), index.size, dy.device
        if not dx.size:
            return dx
        if dx.size * K <= K * K + dy.size + dx.size + CHAIN_OVERHEAD:  # a scan of the K indices per element
            k = _kernel(dev, "index_select_bwd")
            kernels.launch(dev, k, (inner, outer * D), None, dy, index, dx, K, D, inner, what=what + " backward")
            return dx
        links = empty((2 * K,), dev, np.int32)
        kernels.launch(dev, _kernel(dev, "index_links"), (K,), None, index, links, K, D, what=what + " backward")
        ops.fill(dx, 0.0)
        k = _kernel(dev, "index_select_bwd_chain")
        kernels.launch(dev, k, (inner, outer * K), None, dy, index, links, dx, K, D, inner, what=what + " backward")
        return dx


# index_select's backward scans all K indices per input element while that costs less than linking the repeated
# indices (K^2 comparisons), the chains' reads and a zero fill, plus this many elements' worth for two more launches
CHAIN_OVERHEAD = 2**16


def _outer_inner(shape, dim):
    return numel(shape[:dim]), shape[dim], numel(shape[dim + 1:])


def index_select(x, dim, index, _negative=False, _what="index_select"):
    """The entries of x at `index` (1-D, int32 or host integers) along dim (torch.index_select). Backward sums the
    gradient of repeated indices, atomic-free (module docstring)."""
    what = _what
    _tensor_arg(what, x)
    if not x.ndim:
        raise ValueError(f"{what}: a 0-d tensor has no dimension to index; reshape it to (1,) first")
    d = layout.normalize_dim(what, dim, x.ndim)
    index = _index_tensor(what, index, x.device)
    if index.ndim > 1:
        raise ValueError(f"{what}: the index must be 1-D, got shape {index.shape}")
    _check_range(what, index, x.shape[d], _negative)
    K = index.size
    _fits(what, x.shape, x.shape[:d] + (K,) + x.shape[d + 1:])
    return IndexSelect.apply(x, index.reshape(K), dim=d, what=what)


class Gather(_Indexed):
    __slots__ = ()

    @staticmethod
    def take(x, index, dim, what):
        out = empty(index.shape, x.device, x.dtype)
        if out.size:
            st = list(contiguous_strides(x.shape))
            step = st[dim]
            st[dim] = 0
            cshape, cst = layout.coalesce(index.shape, tuple(st))
            m = layout.meta(x.device, cshape, cst)
            k = _kernel(x.device, "gather_fwd", NDIM=len(cshape), ELEM=_elem(x))
            kernels.launch(x.device, k, (out.size,), None, x, 0, index, out, m, step, x.shape[dim], _oob(x.dtype),
                           what=what)
        return out

    @staticmethod
    def spread(dy, index, shape, dim, what):
        dx = empty(shape, dy.device)
        if not index.size:
            return ops.fill(dx, 0.0)
        m = layout.meta(dy.device, shape, index.shape, contiguous_strides(index.shape))
        k = _kernel(dy.device, "gather_bwd", NDIM=len(shape))
        kernels.launch(dy.device, k, (dx.size,), None, dy, index, dx, m, dim, what=what + " backward")
        return dx


def gather(x, dim, index):
    """out[i][j][k] = x[index[i][j][k]][j][k] for dim 0, and so on (torch.gather): index has x's number of
    dimensions and at most x's size in each but dim; out has index's shape."""
    what = "gather"
    _tensor_arg(what, x)
    index = _index_tensor(what, index, x.device)
    if not x.ndim and index.ndim <= 1 and index.size == 1:  # a 0-d tensor: as one of shape (1,)
        return gather(x.reshape(1), 0, index.reshape(1)).reshape(index.shape)
    d = layout.normalize_dim(what, dim, x.ndim)
    if index.ndim != x.ndim:
        raise ValueError(f"{what}: the index of shape {index.shape} must have as many dimensions as the tensor of "
                         f"shape {x.shape}")
    for e, (i, s) in enumerate(zip(index.shape, x.shape)):
        if e != d and i > s:
            raise ValueError(f"{what}: the index of shape {index.shape} is larger than the tensor of shape {x.shape} "
                             f"in dimension {e}; only dimension {dim} may differ")
    _check_range(what, index, x.shape[d], True)
    _fits(what, x.shape, index.shape)
    return Gather.apply(x, index, dim=d, what=what)


# ---- cat, stack ----------------------------------------------------------------------------------------------------

def _tensors_arg(what, tensors):
    """The tensors of a non-empty sequence, as a list (cat's and stack's first argument)."""
    if isinstance(tensors, Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what}: expected a sequence of tensors, got {type(tensors).__name__}")
    tensors = [_tensor_arg(what, t) for t in tensors]
    if not tensors:
        raise ValueError(f"{what}: expected a non-empty sequence of tensors")
    return tensors


def cat(tensors, dim=0):
    """tensors joined along dim (torch.cat); all have one dtype and agree in every other dimension (1-D empty
    tensors are skipped, as PyTorch does). Float32 goes through ops.Cat (which also splits tensors past
    kernels.INDEX_LIMIT); other dtypes copy each input into its window of the output, a launch per input."""
    what = "cat"
    tensors = _tensors_arg(what, tensors)
    kept = [t for t in tensors if t.shape != (0,)] or tensors[:1]
    ref = kept[0]
    if not ref.ndim:
        raise ValueError(f"{what}: zero-dimensional tensors cannot be joined; use stack, or reshape them to (1,)")
    d = layout.normalize_dim(what, dim, ref.ndim)
    for i, t in enumerate(tensors):
        if t.dtype != ref.dtype:
            raise TypeError(f"{what}: tensor {i} is {t.dtype}, the others {ref.dtype}; convert them to one dtype")
        if t.device is not ref.device:
            raise ValueError(f"{what}: tensor {i} is on {t.device.name}, the others on {ref.device.name}; move them "
                             "to one with .to(device)")
    for i, t in enumerate(kept):
        if t.ndim != ref.ndim or t.shape[:d] + t.shape[d + 1:] != ref.shape[:d] + ref.shape[d + 1:]:
            raise ValueError(f"{what}: tensor {i} has shape {t.shape}, tensor 0 has {ref.shape}; all sizes but "
                             f"dimension {dim} must match")
    if len(kept) == 1:  # a new tensor, as PyTorch's (an in-place write to it must not reach the input)
        return kept[0].clone()
    shape = ref.shape[:d] + (sum(t.shape[d] for t in kept),) + ref.shape[d + 1:]
    if ref.dtype == np.float32:
        return ops.Cat.apply(*kept, dim=d)
    _fits(what, shape)
    out = empty(shape, ref.device, ref.dtype)
    st, offset = contiguous_strides(shape), 0
    for t in kept:
        _copy(out, offset * st[d], st, t, 0, contiguous_strides(t.shape), t.shape, what)
        offset += t.shape[d]
    return out


def stack(tensors, dim=0):
    """tensors of one shape joined along a new dimension dim (torch.stack)."""
    what = "stack"
    tensors = _tensors_arg(what, tensors)
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ValueError(f"{what}: tensor {i} has shape {t.shape}, tensor 0 has {tensors[0].shape}; stack takes "
                             "tensors of one shape")
    d = layout.normalize_dim(what, dim, tensors[0].ndim + 1)
    return cat([unsqueeze(t, d) for t in tensors], d)


# ---- pad -----------------------------------------------------------------------------------------------------------

_PAD_MODES = {"constant": 0, "reflect": 1, "replicate": 2}  # views.cl's MODE numbers (constant: copies)


class ConstantPad(Function):
    """x padded with `value` by begins[d] before each dimension d to out_shape (negative begins or ends crop)."""
    __slots__ = ("geometry",)

    def forward(self, x, out_shape, begins, value, what):
        self.geometry = (x.shape, begins, what)
        out = empty(out_shape, x.device, x.dtype)
        _place_box(x, out, begins, value, what)
        return out

    def backward(self, dy):
        shape, begins, what = self.geometry
        dx = empty(shape, dy.device)
        _place_box(dy, dx, tuple(-b for b in begins), 0.0, what + " backward")  # dy cropped back
        return dx


def _place_box(src, dst, begins, value, what):
    """dst = value, but src at offset begins[d] along each dimension d where they overlap: a fill where dst reaches
    past src, and one strided copy of the overlap."""
    box, dst_base, src_base = [], 0, 0
    for b, s, o, ds, ss in zip(begins, src.shape, dst.shape, contiguous_strides(dst.shape),
                               contiguous_strides(src.shape)):
        start, stop = max(0, b), min(o, b + s)  # the overlap, in dst's coordinates
        box.append(max(0, stop - start))
        dst_base += start * ds
        src_base += (start - b) * ss
    if numel(box) < dst.size:
        if dst.dtype == np.float32:
            ops.fill(dst, float(value))
        else:
            _fill(dst, 0, contiguous_strides(dst.shape), dst.shape, value, what)
    if numel(box):
        _copy(dst, dst_base, contiguous_strides(dst.shape), src, src_base, contiguous_strides(src.shape), box, what)


class Pad(Function):
    """Reflect (mode 1) or replicate (mode 2) padding of x (outer, a, b, c) by begins (pa, pb, pc) to (outer, A, B,
    C); the last three dimensions are the padded ones (size 1 and pad 0 where fewer are padded)."""
    __slots__ = ("geometry",)

    def forward(self, x, out_shape, inner, outer_shape, begins, mode, what):
        self.geometry = (x.shape, inner, outer_shape, begins, mode, what)
        out = empty(out_shape, x.device, x.dtype)
        if out.size:
            k = _kernel(x.device, "pad_fwd", MODE=mode, ELEM=_elem(x))
            kernels.launch(x.device, k, *_plane_grid(outer_shape[2], outer_shape[1],
                                                     out.size // (outer_shape[1] * outer_shape[2])),
                           x, out, *outer_shape, *inner, *begins, what=what)
        return out

    def backward(self, dy):
        shape, inner, outer_shape, begins, mode, what = self.geometry
        if not numel(shape):
            return empty(shape, dy.device)
        k = _kernel(dy.device, "pad_fold", MODE=mode)
        g = dy
        for d in (2, 1, 0):  # fold the padded dimensions one at a time, the last first
            if outer_shape[d] == inner[d]:
                continue
            after = numel(inner[d + 1:])  # the dimensions after d are folded already
            lead = g.size // (outer_shape[d] * after)
            folded = empty((lead, inner[d], after), dy.device)
            kernels.launch(dy.device, k, *_plane_grid(after, inner[d], lead), g, folded, outer_shape[d], inner[d],
                           begins[d], after, inner[d], what=what + " backward")
            g = folded
        return g.reshape(shape)


def _plane_grid(C, B, R):
    """(global, local) of a 3-D launch over (C, B, R) planes of rows: work-groups of whole short rows, several
    rows each (left to the driver, PoCL ran a work-group per 30-element row, 5x slower), the rows rounded up to the
    work-group (the kernels test their row against B)."""
    if C >= PLANE_ROW:
        return (C, B, R), None
    rows = min(B, max(1, PLANE_ROW // C))
    return (C, -(-B // rows) * rows, R), (C, rows, 1)


PLANE_ROW = 256  # work-items a pad work-group spans at least along its rows


def pad(x, pad, mode="constant", value=None):
    """x padded as torch.nn.functional.pad: `pad` = (left, right) of the last dimension, then of the one before, ...
    Modes "constant" (with `value`, 0 by default; negative pads crop; any number of dimensions: a fill and a strided
    copy each way, the fill left out where nothing is padded), "reflect" and "replicate" (the last 1-3 dimensions;
    reflect's pads smaller than the dimension; one launch each way)."""
    what = f"pad (mode={mode!r})"
    _tensor_arg(what, x)
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode {mode!r} is not supported; use one of {sorted(_PAD_MODES)}")
    pad = tuple(pad)
    if len(pad) % 2 or not all(_is_int(p) for p in pad):
        raise ValueError(f"{what}: pad {pad} must be an even number of ints (left, right, top, bottom, ...)")
    m = _PAD_MODES[mode]
    if m and value:
        raise ValueError(f"{what}: value={value} is for mode 'constant' only")
    pairs = [(int(pad[2 * i]), int(pad[2 * i + 1])) for i in range(len(pad) // 2)][::-1]  # first padded dim first
    if len(pairs) > x.ndim:
        raise ValueError(f"{what}: pad {pad} pads {len(pairs)} dimensions, the tensor of shape {x.shape} has "
                         f"{x.ndim}")
    if m and len(pairs) > 3:
        raise ValueError(f"{what}: pads the last 1-3 dimensions, not {len(pairs)}; pad {pad}")
    for j, ((b, e), s) in enumerate(zip(pairs, x.shape[x.ndim - len(pairs):]), x.ndim - len(pairs)):
        if m and (b < 0 or e < 0):
            raise ValueError(f"{what}: negative pads crop only in mode 'constant'; got pad {pad}")
        if m == 1 and (b >= s or e >= s):
            raise ValueError(f"{what}: reflect pads must be smaller than the dimension they pad: pad {pad} for "
                             f"shape {x.shape} (dimension {j} has size {s})")
        if m == 2 and s == 0 and (b or e):
            raise ValueError(f"{what}: replicate cannot pad dimension {j} of size 0 (shape {x.shape})")
        if s + b + e < 0:
            raise ValueError(f"{what}: pad {pad} crops more than dimension {j} of shape {x.shape} holds")
    _fits(what, x.shape, _padded_shape(x.shape, pairs))
    return _pad_dims(x, pairs, m, 0 if value is None else value, what)


def _pad_dims(x, pairs, mode, value, what):
    """x padded by pairs (of its last len(pairs) dimensions, first padded one first)."""
    k = len(pairs)
    if k == 0 or all(p == (0, 0) for p in pairs):
        return x.clone()  # a new tensor, as PyTorch's
    out_shape = _padded_shape(x.shape, pairs)
    if mode == 0:
        begins = (0,) * (x.ndim - k) + tuple(b for b, _ in pairs)
        return ConstantPad.apply(x, out_shape=out_shape, begins=begins, value=value, what=what)
    fill = 3 - k
    inner = (1,) * fill + x.shape[x.ndim - k:]
    outer_shape = (1,) * fill + out_shape[x.ndim - k:]
    begins = (0,) * fill + tuple(b for b, _ in pairs)
    return Pad.apply(x, out_shape=out_shape, inner=inner, outer_shape=outer_shape, begins=begins, mode=mode,
                     what=what)


def _padded_shape(shape, pairs):
    k = len(pairs)
    return tuple(shape[:len(shape) - k]) + tuple(s + b + e for s, (b, e) in zip(shape[len(shape) - k:], pairs))


# ---- indexing ------------------------------------------------------------------------------------------------------

def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _advanced(v):
    """Whether v is an index list/array/tensor (as opposed to an int, slice, None or Ellipsis)."""
    return isinstance(v, (list, tuple, np.ndarray, Tensor))


def _parse(x, key, what):
    """A basic index's layout in x: (shape, strides, base, advanced), where advanced is [(position in the result,
    index, dimension of x)] for the index lists/tensors (their dimension kept whole in the layout). Ints select (as
    PyTorch's, not NumPy's: an index tensor's dimensions stay where it stands even with ints apart from it)."""
    if not isinstance(key, tuple):
        key = (key,)
    for v in key:
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, Tensor) and v.dtype == np.bool_) or \
                (isinstance(v, (list, np.ndarray)) and np.asarray(v).dtype == np.bool_):
            raise IndexingError(f"{what}: boolean masks are not supported (the result's shape would depend on the "
                                "mask's values); use clnet.where(mask, x, 0) or masked_fill")
    consuming = sum(1 for v in key if v is not None and v is not Ellipsis)
    if sum(1 for v in key if v is Ellipsis) > 1:
        raise IndexingError(f"{what}: an index can only have one ellipsis (...)")
    if consuming > x.ndim:
        raise IndexingError(f"{what}: too many indices ({consuming}) for a tensor of {x.ndim} dimensions (shape "
                            f"{x.shape})")
    own = contiguous_strides(x.shape)
    shape, strides, base, advanced, d = [], [], 0, [], 0
    for v in key:
        if v is None:
            shape.append(1), strides.append(0)
        elif v is Ellipsis:
            for _ in range(x.ndim - consuming):
                shape.append(x.shape[d]), strides.append(own[d])
                d += 1
        elif _is_int(v):
            size = x.shape[d]
            if not -size <= v < size:
                raise IndexError(f"{what}: index {v} is out of range for dimension {d} of size {size} (shape "
                                 f"{x.shape})")
            base += (int(v) % size) * own[d]
            d += 1
        elif isinstance(v, slice):
            for part in (v.start, v.stop, v.step):
                if part is not None and not _is_int(part):
                    raise TypeError(f"{what}: slice bounds must be ints or None, got {v}")
            if v.step is not None and v.step <= 0:
                raise ValueError(f"{what}: slice {v} has step {v.step}: clnet's slices take positive steps only "
                                 "(flip is not supported); slice forward and index the result with a reversed "
                                 "index list (index_select)" if v.step < 0 else
                                 f"{what}: slice step cannot be 0 ({v})")
            start, stop, step = v.indices(x.shape[d])
            n = len(range(start, stop, step))
            base += start * own[d] if n else 0
            shape.append(n), strides.append(step * own[d])
            d += 1
        elif _advanced(v):
            advanced.append((len(shape), v, d))
            shape.append(x.shape[d]), strides.append(own[d])
            d += 1
        else:
            raise TypeError(f"{what}: indices must be ints, slices, None, Ellipsis or integer lists/tensors, got "
                            f"{type(v).__name__}")
    while d < x.ndim:
        shape.append(x.shape[d]), strides.append(own[d])
        d += 1
    return tuple(shape), tuple(strides), base, advanced


def getitem(x, key):
    """x[key] with PyTorch's semantics for ints (negative ones too), slices with positive steps, None, Ellipsis and
    one integer index (a list, NumPy array or int32 tensor, as index_select along its dimension). A contiguous copy in
    one launch (plus one for the index); no launch where the result is x's own layout (x[:], x[None])."""
    what = "x[...]"
    _tensor_arg(what, x)
    shape, strides, base, advanced = _parse(x, key, what)
    if len(advanced) > 1:
        raise IndexingError(f"{what}: more than one index list or tensor (dimensions "
                            f"{', '.join(str(a[2]) for a in advanced)}) is not supported; index one dimension with a "
                            "list and use gather or index_select for the rest")
    y = _view(x, shape, strides, base, what)  # (with an index, an intermediate: index_select makes the result)
    if not advanced:
        return y
    pos, index, _ = advanced[0]
    index = _index_tensor(what, index, x.device)
    y = index_select(y, pos, index.reshape(index.size), _negative=True, _what=what)
    return y.reshape(y.shape[:pos] + index.shape + y.shape[pos + 1:])


def setitem(x, key, value):
    """x[key] = value in place, for basic indices (ints, slices with positive steps, None, Ellipsis): a Python number,
    or a tensor of x's dtype that broadcasts to the indexed shape. One launch. Refused while autograd records for x
    or the value (clnet keeps no version counters, so an op that saved x for its backward would see the new values);
    inside clnet.no_grad() it writes a parameter's data."""
    what = "x[...] = value"
    _tensor_arg(what, x)
    refuse_write_to_copy(x, what)
    shape, strides, base, advanced = _parse(x, key, what)
    if advanced:
        raise IndexingError(f"{what}: assignment through an index list or tensor is not supported; assign through "
                            "slices, or build the tensor with cat or where")
    if autograd.is_grad_enabled() and (x.requires_grad or getattr(value, "requires_grad", False)):
        raise RuntimeError(f"{what}: in-place assignment where autograd records (the tensor or the value requires a "
                           "gradient) is not supported: ops that saved the tensor would see the new values; build "
                           "the result out of place (cat, where, pad), or assign under clnet.no_grad()")
    _fits(what, x.shape)
    if isinstance(value, (np.ndarray, list)):
        value = Tensor(np.shape(value), x.dtype, x.device).write(np.asarray(value))
    if not isinstance(value, Tensor):
        _bits(value, x.dtype, what)
        _fill(x, base, strides, shape, value, what)
        note_in_place(x)
        return x
    if value.dtype != x.dtype:
        raise TypeError(f"{what}: the value is {value.dtype}, the tensor {x.dtype}; convert the value first")
    if value.device is not x.device:
        raise ValueError(f"{what}: the value is on {value.device.name}, the tensor on {x.device.name}")
    vshape = value.shape
    while len(vshape) > len(shape) and vshape[0] == 1:
        vshape = vshape[1:]
    lead = len(shape) - len(vshape)
    if lead < 0 or any(v not in (1, s) for v, s in zip(vshape, shape[lead:])):
        raise ValueError(f"{what}: a value of shape {value.shape} does not broadcast to the indexed shape {shape}")
    if value.storage is x.storage:  # reading and writing one buffer in one launch: copy the value first
        value = Tensor(value.shape, value.dtype, value.device).copy_from(value)
    _copy(x, base, strides, value, 0, layout.broadcast_strides(vshape, shape), shape, what)
    note_in_place(x)
    return x


TENSOR_METHODS = {
    "permute": permute, "transpose": transpose, "swapaxes": swapaxes, "swapdims": swapdims, "t": t,
    "movedim": movedim, "moveaxis": moveaxis, "contiguous": contiguous, "squeeze": squeeze, "unsqueeze": unsqueeze,
    "unflatten": unflatten, "expand": expand, "expand_as": expand_as, "repeat": repeat, "tile": tile,
    "narrow": narrow, "select": select, "unbind": unbind, "chunk": chunk, "split": split,
    "index_select": index_select, "gather": gather,
    "__getitem__": getitem, "__setitem__": setitem,
}
