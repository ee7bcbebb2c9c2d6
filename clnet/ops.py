"""The op table: every differentiable operation, its forward and backward side by side (autograd.Function).

Each op checks its arguments where the user passed them (naming the op, the shapes and the fix), launches its
kernels, saves only what its backward needs, and its backward returns the input gradients (or accumulates a leaf's
straight into its .grad). Layers (nn/) and nn.functional call these; the heavy lifting lives one level down
(conv.py: convolution and dense products, gemm.py, normalization.py), and nothing here talks to OpenCL discovery or copies
to the host.
"""
import math

import numpy as np

from . import autograd, conv, kernels, normalization, tuning
from .autograd import Function
from .chain import AFFINE, ChainStep
from .elementwise import ACTIVATIONS, VW, _activation_grad, _elementwise, _map, activation, axpby_step, fill, full, mul
from .elementwise import add, full_like, zeros  # noqa: F401  (ops.add, ops.zeros, ops.full_like: optim's and tests')
from .tensor import Tensor, chunks, empty, run_limit, tensor, too_large


def _flat_launch(dev, k, n, *args, what=""):
    kernels.launch(dev, k, (n,), kernels.ANY_GROUP, *args, what=what)


def _same_device(what, *tensors):
    """ValueError unless every tensor given (None skipped) is on one device: a buffer of another device's context
    crashes some drivers (PoCL's, given Intel's)."""
    tensors = [t for t in tensors if t is not None]
    for t in tensors[1:]:
        if t.device is not tensors[0].device:
            where = [getattr(d, "name", "the host (not placed yet)") for d in (t.device, tensors[0].device)]
            raise ValueError(f"{what}: a tensor of shape {t.shape} is on {where[0]}, another on {where[1]}; move "
                             "them to one device with .to(device)")


def _operands(what, *tensors):
    """A layer's tensors (None skipped): float32 (its kernels would read int32 or bool bits as floats), on one
    device."""
    for t in tensors:
        if t is not None:
            _float(what, t)
    _same_device(what, *tensors)


def _float(what, t):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a clnet tensor, got {type(t).__name__}; wrap host data with "
                        "clnet.tensor(array, device=...)")
    if t.dtype != np.float32:
        raise TypeError(f"{what}: expected a float32 tensor, got {t.dtype} (shape {t.shape}); convert it with "
                        ".float()")
    return t


# ---- shape and arithmetic ------------------------------------------------------------------------------------------

class Reshape(Function):
    __slots__ = ("in_shape",)

    def forward(self, x, shape):
        self.in_shape = x.shape
        return x._alias(shape)

    def backward(self, dy):
        return dy._alias(self.in_shape)


class Sum(Function):
    """scale * the sum of every element, as a one-element tensor (mean: scale 1/n)."""
    unit_grad = True
    __slots__ = ("scale", "in_shape")

    def forward(self, x, scale):
        _float("sum", x)
        self.scale, self.in_shape = scale, x.shape
        out = empty((), x.device)
        lsize = _pow2_group(x.device)
        k = _elementwise(x.device, "reduce_sum", dict(LSIZE=lsize))
        n = x.size
        if n > kernels.INDEX_LIMIT:  # a launch per chunk; those after the first add their sums to out
            adding = _elementwise(x.device, "reduce_sum", dict(LSIZE=lsize, ACCUMULATE=True))
            for i, (start, count) in enumerate(chunks("sum", x.shape, n, [1], unit="element")):
                kernels.launch(x.device, adding if i else k, (lsize,), (lsize,), x.region(start, (count,)), out,
                               float(scale), count, what="sum")
            return out
        kernels.launch(x.device, k, (lsize,), (lsize,), x, out, float(scale), n, what="sum")
        return out

    def backward(self, dy):
        if dy is None:
            return full(self.in_shape, self.out_device, self.scale)
        dx = empty(self.in_shape, self.out_device)
        _map(dx.device, _elementwise(dx.device, "fill_scaled"), dx.size, 1, dx, dy, float(self.scale), dx.size,
             what="sum backward")
        return dx


def _pow2_group(dev, limit=256):
    size = min(limit, dev.max_work_group_size)
    return 1 << (size.bit_length() - 1)


class Axpby(Function):
    """alpha * a + beta * b for tensors of one shape."""
    __slots__ = ("alpha", "beta")

    def forward(self, a, b, alpha, beta):
        self.alpha, self.beta = alpha, beta
        dev, n = a.device, a.size
        out = empty(a.shape, dev)
        _map(dev, _elementwise(dev, "axpby"), n, VW, a, b, out, alpha, beta, n, what="add",
             step=axpby_step(alpha, beta))
        return out

    def backward(self, dy):
        return tuple(None if not need else (dy if c == 1.0 else _affine(dy, c, 0.0))
                     for need, c in zip(self.needs, (self.alpha, self.beta)))


class AddRelu(Function):
    """relu(a + b) for tensors of one shape in one launch (an ONNX Add whose one reader is a Relu: a residual block's
    end); the values of the add and then the ReLU, bit for bit. Its backward takes the ReLU's gradient from the saved
    output."""
    __slots__ = ()

    def forward(self, a, b):
        dev, n = a.device, a.size
        out = empty(a.shape, dev)
        _map(dev, _elementwise(dev, "axpby_relu"), n, VW, a, b, out, 1.0, 1.0, n, what="add and ReLU")
        self.save(out)
        return out

    def backward(self, dy):
        g = _activation_grad("relu", self.saved[0], dy, "add and ReLU backward")
        return tuple(g if need else None for need in self.needs)


def _affine(x, alpha, beta):
    out = empty(x.shape, x.device)
    alpha, beta = float(alpha), float(beta)
    _map(x.device, _elementwise(x.device, "affine"), x.size, 1, x, out, alpha, beta, x.size, what="scale",
         step=lambda: ChainStep(AFFINE, 0, 1, ((0, None),), None, alpha, beta))
    return out


class Affine(Function):
    """alpha * x + beta for Python numbers alpha, beta."""
    __slots__ = ("alpha",)

    def forward(self, x, alpha, beta):
        self.alpha = alpha
        return _affine(x, alpha, beta)

    def backward(self, dy):
        return _affine(dy, self.alpha, 0.0)


class Mul(Function):
    __slots__ = ()

    def forward(self, a, b):
        self.save(a, b)
        return mul(a, b)

    def backward(self, dy):
        a, b = self.saved
        return (mul(dy, b) if self.needs[0] else None), (mul(dy, a) if self.needs[1] else None)


def _operand_check(what, a, b):
    _float(what, a)
    if isinstance(b, Tensor):
        _float(what, b)
        if a.shape != b.shape:
            raise ValueError(f"{what}: the tensors have shapes {a.shape} and {b.shape}; clnet's {what} takes tensors "
                             "of one shape or a Python number (no broadcasting): reshape or expand one of them")
        _same_device(what, a, b)
        return True
    if not isinstance(b, (int, float, np.number)) or isinstance(b, bool):
        raise TypeError(f"{what}: expected a clnet tensor or a Python number, got {type(b).__name__}")
    return False


def binary(a, b, alpha, beta, symbol):
    """alpha * a + beta * b, b a tensor of a's shape or a number (a + b, a - b, b - a)."""
    if _operand_check(f"'{symbol}'", a, b):
        return Axpby.apply(a, b, alpha=float(alpha), beta=float(beta))
    return Affine.apply(a, alpha=float(alpha), beta=float(beta) * float(b))


def product(a, b):
    if _operand_check("'*'", a, b):
        return Mul.apply(a, b)
    return Affine.apply(a, alpha=float(b), beta=0.0)


class Cat(Function):
    """Tensors joined along one dimension: a block copy per input into its slice of the output (one pass over the
    activations; backward copies each slice of the gradient back out)."""
    __slots__ = ("dim", "sizes")
    adds_into_pending = True  # autograd passes each input's gradient so far: its slice is added in the same launch

    def forward(self, *xs, dim):
        ref = xs[0].shape
        self.dim, self.sizes = dim, [x.shape[dim] for x in xs]
        shape = ref[:dim] + (sum(self.sizes),) + ref[dim + 1:]
        out = empty(shape, xs[0].device)
        outer, inner = math.prod(ref[:dim]), math.prod(ref[dim + 1:])
        offset, ld = 0, shape[dim] * inner
        for x, n in zip(xs, self.sizes):
            _copy2d(x, 0, n * inner, out, offset, ld, outer, n * inner, what="cat")
            offset += n * inner
        return out

    def backward(self, dy, pending=None):
        """Each input's slice of dy, or, where `pending` holds what that input's gradient summed to so far from its
        other uses, that sum plus the slice (one launch, not a copy and then autograd's add: densenet joins each
        feature map into every later layer's input)."""
        dim, shape = self.dim, dy.shape
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
        grads, offset, ld = [], 0, shape[dim] * inner
        for i, (need, n) in enumerate(zip(self.needs, self.sizes)):
            if need:
                g = empty(shape[:dim] + (n,) + shape[dim + 1:], dy.device)
                _copy2d(dy, offset, ld, g, 0, n * inner, outer, n * inner, what="cat backward",
                        acc=pending[i] if pending is not None else None)
                grads.append(g)
            else:
                grads.append(None)
            offset += n * inner
        return tuple(grads)


def _copy2d(src, src_off, src_ld, dst, dst_off, dst_ld, rows, cols, what, acc=None):
    """dst[dst_off + r*dst_ld + c] = src[src_off + r*src_ld + c] for r < rows, c < cols; with acc (a tensor laid out as
    dst), acc's element plus that. Past kernels.INDEX_LIMIT, in blocks of rows (or, for rows longer than a run, pieces
    of one row), each over the regions from the block's first element to past its last."""
    if not rows or not cols:  # an empty input of cat: nothing to copy (a launch of no work-items is an error)
        return
    dev = dst.device
    name = "copy2d" if acc is None else "copy2d_add"
    tail = () if acc is None else (acc,)
    if max(src.size, dst.size) <= kernels.INDEX_LIMIT:
        v = 4 if (src_off | src_ld | dst_off | dst_ld | cols) % 4 == 0 else 1  # float4s: tensors start aligned
        kernels.launch(dev, _elementwise(dev, name + ("_x4" if v == 4 else "")), (cols // v, rows), kernels.ANY_GROUP,
                       src, src_off // v, src_ld // v, dst, dst_off // v, dst_ld // v, rows, cols // v, *tail,
                       what=what)
        return
    k = _elementwise(dev, name)
    span, ld = run_limit(), max(src_ld, dst_ld, 1)  # elements a block's region may cover
    step_r, step_c = (span // ld, cols) if ld <= span else (1, span)  # whole rows (cols <= ld), or pieces of one
    for r0 in range(0, rows, step_r):
        nr = min(step_r, rows - r0)
        for c0 in range(0, cols, step_c):
            nc = min(step_c, cols - c0)
            s, d, *a = (t.region(off + r0 * tld + c0, ((nr - 1) * tld + nc,))
                        for t, off, tld in ((src, src_off, src_ld), (dst, dst_off, dst_ld)) + (
                            () if acc is None else ((acc, dst_off, dst_ld),)))
            kernels.launch(dev, k, (nc, nr), kernels.ANY_GROUP, s, 0, src_ld, d, 0, dst_ld, nr, nc, *a, what=what)


# ---- activations, dropout, softmax, loss ---------------------------------------------------------------------------

class Activation(Function):
    """y = f(x); backward from the saved output y."""
    __slots__ = ("kind",)

    def forward(self, x, kind):
        _float(kind, x)
        self.kind = kind
        y = activation(kind, x)
        self.save(y)
        return y

    def backward(self, dy):
        return _activation_grad(self.kind, self.saved[0], dy, self.kind + " backward")


class Dropout(Function):
    def forward(self, x, p, seed):
        """seed: an int, or a kernels.Live of np.uint32 that a per-step action redraws (so a replayed graph draws
        a fresh mask each step)."""
        if x.size > kernels.INDEX_LIMIT:  # its random stream is indexed by the element's 32-bit index
            fits = kernels.INDEX_LIMIT // max(x.size // max(x.shape[0], 1) if x.shape else x.size, 1)
            raise too_large("dropout", x.shape, (f"use a batch of at most {fits}" if fits else "use smaller samples")
                            + ", or apply dropout to slices of the tensor")
        y, mask = empty(x.shape, x.device), empty(x.shape, x.device)
        k = _elementwise(x.device, "dropout_fwd")
        seed = seed if type(seed) is kernels.Live else np.uint32(seed & 0xFFFFFFFF)
        _flat_launch(x.device, k, x.size, x, y, mask, x.size, float(p), seed, what="dropout")
        self.save(mask)
        return y

    def backward(self, dy):
        return mul(dy, self.saved[0])


class Softmax(Function):
    """Softmax (or log-softmax) over one dimension, the tensor seen as (outer, C, inner)."""
    __slots__ = ("dim", "log")

    def forward(self, x, dim, log):
        self.dim, self.log = dim, log
        outer, inner = _outer_inner(x.shape, dim)
        y = empty(x.shape, x.device)
        k = kernels.kernel(x.device, "softmax.cl", "softmax_fwd", dict(LOG=log))
        _softmax_launch(k, (x, y), outer, x.shape[dim], inner, "log_softmax" if log else "softmax")
        self.save(y)
        return y

    def backward(self, dy):
        y, = self.saved
        outer, inner = _outer_inner(y.shape, self.dim)
        dx = empty(y.shape, y.device)
        k = kernels.kernel(y.device, "softmax.cl", "softmax_bwd", dict(LOG=self.log))
        _softmax_launch(k, (y, dy, dx), outer, y.shape[self.dim], inner,
                        ("log_softmax" if self.log else "softmax") + " backward")
        return dx


def _softmax_launch(k, tensors, outer, C, inner, what):
    """A work-item per (outer, inner) position; past kernels.INDEX_LIMIT, a launch per run of outer rows."""
    dev, row = tensors[0].device, C * inner
    if outer * row <= kernels.INDEX_LIMIT:
        _flat_launch(dev, k, outer * inner, *tensors, outer, C, inner, what=what)
        return
    for start, count in chunks(what, tensors[0].shape, outer, [row], unit="row before the softmax dimension"):
        part = tuple(t.region(start * row, (count * row,)) for t in tensors)
        _flat_launch(dev, k, count * inner, *part, count, C, inner, what=what)


def _outer_inner(shape, dim):
    return math.prod(shape[:dim]), math.prod(shape[dim + 1:])


def _row_lanes(lsize, rows, cols):
    """Work-items a row for the cross-entropy's one work-group: as many as keep all lsize busy on the batch's rows
    at once (fewer lanes, fewer combining steps), no more than the row's columns need. One work-item a row read
    its 1000 classes alone, 64 rows a batch: 0.23 ms of a squeezenet step on an H100; 16 lanes of 1024, 0.045 ms
    (bench/NOTES.md v53)."""
    lanes = max(1, lsize >> max(0, rows - 1).bit_length())
    return min(lanes, 1 << max(0, cols - 1).bit_length())


class CrossEntropy(Function):
    """Mean cross-entropy of logits (N, C) and int32 labels (N,). Returns (loss, metrics): metrics is a device tensor
    (loss, rows whose prediction is the label), so a training loop reads 8 bytes per step. The gradient is computed
    in the forward's launch; backward only scales it by an upstream gradient, if there is one."""
    unit_grad = True

    def forward(self, logits, labels):
        dev = logits.device
        N, C = logits.shape
        grad, loss, metrics = empty(logits.shape, dev), empty((), dev), empty((2,), dev)
        lsize = _pow2_group(dev, 256 if tuning.cpu_shaped(dev) else 1024)  # a GPU: one SM, as many warps as it takes
        if logits.size > kernels.INDEX_LIMIT:  # a launch per run of rows, each adding to loss and metrics
            k = kernels.kernel(dev, "softmax.cl", "cross_entropy_part", dict(LSIZE=lsize))
            for start, count in chunks("cross_entropy", logits.shape, N, [C, 1], unit="row"):
                kernels.launch(dev, k, (lsize,), (lsize,), logits.region(start * C, (count, C)),
                               labels.region(start, (count,)), count, C, _row_lanes(lsize, count, C), 1.0 / N,
                               int(start == 0), grad.region(start * C, (count, C)), loss, metrics,
                               what="cross-entropy")
            self.save(grad)
            return loss, metrics
        k = kernels.kernel(dev, "softmax.cl", "cross_entropy", dict(LSIZE=lsize))
        kernels.launch(dev, k, (lsize,), (lsize,), logits, labels, N, C, _row_lanes(lsize, N, C), grad, loss,
                       metrics, what="cross-entropy")
        self.save(grad)
        return loss, metrics

    def backward(self, dy):
        grad, = self.saved
        if dy is None:
            return grad, None
        out = empty(grad.shape, grad.device)
        _map(grad.device, _elementwise(grad.device, "scale_by"), grad.size, 1, grad, dy, out, grad.size,
             what="cross-entropy backward")
        return out, None


def cross_entropy(logits, labels):
    """(loss, metrics) for logits (N, C) on the device and integer labels (N,), host or device; checks the labels'
    range without reading device labels back (tensors made from host data remember it)."""
    what = "cross_entropy"
    if not isinstance(logits, Tensor) or logits.ndim != 2:
        shape = getattr(logits, "shape", type(logits).__name__)
        raise ValueError(f"{what}: expected logits of shape (N, C) on the device, got {shape}")
    _float(what, logits)
    N, C = logits.shape
    if isinstance(labels, Tensor):
        if labels.dtype != np.int32:
            raise TypeError(f"{what}: labels must be an int32 tensor, got {labels.dtype}")
        _same_device(what, logits, labels)
    else:
        host = np.asarray(labels)
        if host.dtype.kind not in "iu":
            raise TypeError(f"{what}: labels must be integers, got dtype {host.dtype}")
        known = (int(host.min()), int(host.max())) if host.size else None
    if tuple(labels.shape) != (N,):
        raise ValueError(f"{what}: labels of shape {tuple(labels.shape)} do not match logits of shape "
                         f"{logits.shape}; expected ({N},)")
    def check(known):
        if known is not None and (known[0] < 0 or known[1] >= C):
            raise ValueError(f"{what}: labels must lie in [0, {C - 1}] for {C} classes, got values in "
                             f"[{known[0]}, {known[1]}]")
    if isinstance(labels, Tensor):  # a replayed step checks the range of each batch copied into these labels
        kernels.per_step(lambda: check(labels.value_range))
    else:
        check(known)
        labels = tensor(host.astype(np.int32), logits.device)
    return CrossEntropy.apply(logits, labels)


# ---- pooling -------------------------------------------------------------------------------------------------------

def _pool_window(geometry, out_hw):
    """The pooling kernels' window arguments after NC, H, W (pool.cl POOL_GEOMETRY): KH, KW, SH, SW, PH, PW, OH, OW."""
    k, s, p = geometry
    return k[0], k[1], s[0], s[1], p[0], p[1], out_hw[0], out_hw[1]


GRID_PLANES = 65535  # planes a launch's third dimension holds (NVIDIA's grids: 65535 work-groups along it)
GRID_GROUP = (32, 4, 1)  # the GPU grid's work-group: rows of 32 along x


def grid_group(dev):
    """GRID_GROUP, narrowed for a device whose work-groups hold fewer work-items."""
    gx = min(GRID_GROUP[0], dev.max_work_group_size)
    return gx, max(1, min(GRID_GROUP[1], dev.max_work_group_size // gx)), 1


def _pool_launch(kern, per, head, tail, x_shape, out_hw, geometry, what):
    """A pooling kernel: its tensors `head`, the geometry, its tensors `tail`; a work-item per output element (per
    "out"; "grid": in a 3-D launch of (x, y, plane); "out-grid": the same padded to whole work-groups of grid_group),
    input element ("in"; "in-grid": in a 3-D launch of (x, y, plane) padded likewise) or plane ("plane"). Past
    kernels.INDEX_LIMIT, and past GRID_PLANES planes for a grid, a launch per run of planes."""
    N, C, H, W = x_shape
    planes, HW, OHW = N * C, H * W, out_hw[0] * out_hw[1]
    dev = head[0].device
    window = _pool_window(geometry, out_hw)
    def launch(count, head, tail):
        if per == "grid":
            kernels.launch(dev, kern, (out_hw[1], out_hw[0], count), kernels.ANY_GROUP, *head, count, H, W, *window,
                           *tail, what=what)
        elif per in ("in-grid", "out-grid"):
            gx, gy, _ = group = grid_group(dev)
            w, h = (W, H) if per == "in-grid" else (out_hw[1], out_hw[0])
            kernels.launch(dev, kern, (-(-w // gx) * gx, -(-h // gy) * gy, count), group, *head, count, H, W,
                           *window, *tail, what=what)
        else:
            n = count * (OHW if per == "out" else HW if per == "in" else 1)
            _flat_launch(dev, kern, n, *head, count, H, W, *window, *tail, what=what)
    runs = [(0, planes)] if planes * max(HW, OHW) <= kernels.INDEX_LIMIT else \
        chunks(what, x_shape, planes, [HW, OHW], unit="plane")
    if per in ("grid", "in-grid", "out-grid"):
        runs = [(s + i, min(GRID_PLANES, n - i)) for s, n in runs for i in range(0, n, GRID_PLANES)]
    if runs == [(0, planes)]:
        launch(planes, head, tail)
        return
    for start, count in runs:
        launch(count, *([t.region(start * (t.size // planes), (count * (t.size // planes),)) if t is not None else None
                         for t in ts] for ts in (head, tail)))


def _maxpool_forward(x, out_shape, geometry, relu):
    """(y, idx): the max pooling of x (with relu, of its ReLU: applied to the pooled output) and each output's argmax
    offset in its plane."""
    k, s, p = geometry
    y = empty(out_shape, x.device)
    idx = empty(out_shape, x.device, np.int32)
    defines = dict(RELU=1) if relu else {}
    if not tuning.cpu_shaped(x.device):
        kern, per = kernels.kernel(x.device, "pool.cl", "maxpool2d_fwd", defines or None), "out"
    else:  # windows all inside the input (no padding, none past the edge): their size fixed at build
        OH, OW = out_shape[2:]
        inside = (tuple(p) == (0, 0) and (OH - 1) * s[0] + k[0] <= x.shape[2]
                  and (OW - 1) * s[1] + k[1] <= x.shape[3])
        if inside:
            defines.update(WIN_KH=k[0], WIN_KW=k[1])
        kern = kernels.kernel(x.device, "pool.cl", "maxpool2d_fwd_grid", defines or None)
        per = "grid"
    _pool_launch(kern, per, (x,), (y, idx), x.shape, out_shape[2:], geometry, "max pooling")
    return y, idx


def _maxpool_backward(dy, saved, x_shape, geometry, relu, db=None, db_beta=1.0):
    """The max pooling's input gradient from dy and saved (idx, and y with relu). db: also d loss / d bias of the
    convolution whose output the pooling read, added into db (db_beta 0: written), in the same launch
    (pool_takes_bias_grad must hold)."""
    dev = dy.device
    dx = empty(x_shape, dev)
    defines = dict(RELU=1) if relu else {}
    saved = (saved[0], saved[1] if relu else None)  # (idx, y): the kernels always take y (NULL without relu)
    if db is not None:
        lsize = conv.bias_group(dev)
        N, C, H, W = x_shape
        kern = kernels.kernel(dev, "pool.cl", "maxpool2d_bwd_bias", dict(defines, LSIZE=lsize))
        kernels.launch(dev, kern, (C * lsize,), (lsize,), dy, *saved, N * C, H, W,
                       *_pool_window(geometry, dy.shape[2:]), dx, db, C, int(db_beta != 0.0),
                       what="max pooling backward (and the bias gradient)")
        return dx
    k, stride, pad = geometry
    OH, OW = dy.shape[2:]
    if tuning.cpu_shaped(dev):  # one work-item per plane: scatter without a search per element
        kern, per = kernels.kernel(dev, "pool.cl", "maxpool2d_bwd_planes", defines or None), "plane"
    elif tuple(k) == tuple(stride) and tuple(pad) == (0, 0) and OH * k[0] <= x_shape[2] and OW * k[1] <= x_shape[3]:
        # the windows tile the input: a work-item a window
        kern = kernels.kernel(dev, "pool.cl", "maxpool2d_bwd_tiles", dict(defines, TILE_KH=k[0], TILE_KW=k[1]))
        per = "out-grid"
    else:
        kern = kernels.kernel(dev, "pool.cl", "maxpool2d_bwd_grid", dict(defines, STRIDE_H=stride[0],
                                                                         STRIDE_W=stride[1]))
        per = "in-grid"
    _pool_launch(kern, per, (dy,) + tuple(saved), (dx,), x_shape, dy.shape[2:], geometry, "max pooling backward")
    return dx


POOL_BIAS_GRAD_MAX = 4096  # pixels a channel (N * OH * OW of the convolution) up to which its pooling sums its bias


def pool_takes_bias_grad(dev, s):
    """Whether the max pooling after a convolution of shape s takes its bias gradient in the pooling's backward
    (Conv2dMaxPool): on GPUs, for small layers, whose launches cost more than their work (one work-group a channel
    must still keep a GPU busy, so not past POOL_BIAS_GRAD_MAX pixels a channel)."""
    return not tuning.cpu_shaped(dev) and s.N * s.OH * s.OW <= POOL_BIAS_GRAD_MAX


class MaxPool2d(Function):
    """Max pooling; with relu, of a ReLU's output (nn.Sequential moves a ReLU before the pooling after it: ReLU is
    monotonic, so it commutes with the max exactly), the ReLU applied to the pooled output and its gradient taken in
    the pooling's backward: a pass over the larger input and a launch saved each way."""
    __slots__ = ("geometry", "in_shape", "relu")

    def forward(self, x, out_shape, k, s, p, relu=False):
        _operands("max pooling", x)
        self.geometry, self.in_shape, self.relu = (k, s, p), x.shape, relu
        y, idx = _maxpool_forward(x, out_shape, self.geometry, relu)
        self.save(*((idx, y) if relu else (idx,)))
        return y

    def backward(self, dy):
        return _maxpool_backward(dy, self.saved, self.in_shape, self.geometry, self.relu)


class AvgPool2d(Function):
    __slots__ = ("geometry", "count_pad", "in_shape")

    def forward(self, x, out_shape, k, s, p, count_include_pad):
        _operands("average pooling", x)
        self.geometry, self.count_pad, self.in_shape = (k, s, p), count_include_pad, x.shape
        y = empty(out_shape, x.device)
        kern = kernels.kernel(x.device, "pool.cl", "avgpool2d_fwd", dict(COUNT_PAD=count_include_pad))
        _pool_launch(kern, "out", (x,), (y,), x.shape, out_shape[2:], self.geometry, "average pooling")
        return y

    def backward(self, dy):
        x_shape = self.in_shape
        dx = empty(x_shape, dy.device)
        k, _, p = self.geometry
        if tuple(k) == x_shape[2:] and tuple(p) == (0, 0) and dx.size <= kernels.INDEX_LIMIT:  # a global pool
            P = x_shape[2] * x_shape[3]
            _flat_launch(dy.device, kernels.kernel(dy.device, "pool.cl", "avgpool2d_bwd_whole"), dx.size, dy, P,
                         dx.size, dx, what="average pooling backward")
            return dx
        kern = kernels.kernel(dy.device, "pool.cl", "avgpool2d_bwd", dict(COUNT_PAD=self.count_pad))
        _pool_launch(kern, "in", (dy,), (dx,), x_shape, dy.shape[2:], self.geometry, "average pooling backward")
        return dx


# ---- convolution and dense -----------------------------------------------------------------------------------------

def _param_grads(fn, *shapes):
    """Where backward writes the gradients of inputs 1, 2, ... (weights, bias; `shapes` theirs), and how: straight into
    a leaf's .grad, or into a new tensor that backward returns; None where none is wanted. Returns (targets, betas,
    returned) with returned aligned to those inputs: beta 1 adds to what the target holds, beta 0 overwrites it."""
    targets, betas, returned = [], [], []
    for i, shape in enumerate(shapes, 1):
        sink, beta = fn.grad_sink(i) if fn.needs[i] else (None, 1.0)
        own = empty(shape, fn.out_device) if fn.needs[i] and sink is None else None
        targets.append(sink if sink is not None else own)
        betas.append(0.0 if own is not None else beta)
        returned.append(own)
    return targets, betas, tuple(returned)


def _one_beta(targets, betas):
    """One beta for a kernel that writes every target the same way: 0 when each target present may be overwritten,
    else 1, the targets of beta 0 filled with zeros first (a new gradient beside one that adds)."""
    present = [(t, b) for t, b in zip(targets, betas) if t is not None]
    if all(b == 0.0 for _, b in present):
        return 0.0
    for t, b in present:
        if b == 0.0:
            fill(t, 0.0)
    return 1.0


class Conv2d(Function):
    """y = conv(x, w) + b for a shapes.ConvShape s, then ReLU if relu (fused: nn.Sequential asks for it); each pass
    by its tuned (or default) algorithm (conv.py)."""
    __slots__ = ("shape", "what", "relu")

    def forward(self, x, w, b, s, what, relu=False):
        _operands(what, x, w, b)
        self.shape, self.what, self.relu = s, what, relu
        y = conv.conv2d_forward(x, w, b, s, relu=relu, what=what)
        self.save(x, w, *((y,) if relu else ()))
        return y

    def backward(self, dy):
        x, w = self.saved[:2]
        (dw, db), betas, fresh = _param_grads(self, w.shape, (w.shape[0],))
        if self.relu and db is not None:  # the ReLU's gradient and the bias's in one pass
            s = self.shape
            dy = conv.bias_grad(dy, db, s.N, s.O, s.OH * s.OW, betas[1], relu_y=self.saved[2])
            db = None
        elif self.relu:
            dy = _activation_grad("relu", self.saved[2], dy, self.what + " backward (its ReLU)")
        dx = conv.conv2d_backward(x, w, dy, self.shape, dw, db, need_dx=self.needs[0],
                                  what=self.what + " backward", betas=betas)
        return (dx,) + fresh


class Conv2dMaxPool(Function):
    """Conv2d with a bias for a shapes.ConvShape s, then max pooling (with relu, of its ReLU): nn.Sequential's run of
    Conv2d, [ReLU,] MaxPool2d where pool_takes_bias_grad holds. The passes are the layers' own (conv.py, MaxPool2d's),
    except that the pooling's backward writes the bias gradient as well (pool.cl maxpool2d_bwd_bias): a launch
    saved."""
    __slots__ = ("shape", "what", "geometry", "relu")

    def forward(self, x, w, b, s, what, out_shape, k, st, p, relu):
        _operands(what, x, w, b)
        self.shape, self.what, self.geometry, self.relu = s, what, (k, st, p), relu
        y, idx = _maxpool_forward(conv.conv2d_forward(x, w, b, s, what=what), out_shape, self.geometry, relu)
        self.save(x, w, idx, *((y,) if relu else ()))
        return y

    def backward(self, dy):
        x, w = self.saved[:2]
        s = self.shape
        (dw, db), betas, fresh = _param_grads(self, w.shape, (w.shape[0],))
        dconv = _maxpool_backward(dy, self.saved[2:], (s.N, s.O, s.OH, s.OW), self.geometry, self.relu, db, betas[1])
        dx = conv.conv2d_backward(x, w, dconv, s, dw, None, need_dx=self.needs[0], what=self.what + " backward",
                                  betas=betas)
        return (dx,) + fresh


class _ShapeOnly:
    """What conv2d_backward reads of its input when only the data gradient is wanted: the shape and the device."""
    __slots__ = ("shape", "device")

    def __init__(self, shape, device):
        self.shape, self.device = shape, device


class ConvTranspose2d(Function):
    """y = the transposed convolution of x by w (in_channels, out_channels/groups, KH, KW): the data gradient of the
    convolution s from y's shape to x's (ConvShape s: input y, weights w, output x), so it runs on that pass's tuned
    algorithm; its backward is that convolution's forward (for x) and weight gradient (for w). The bias is added by
    nn.functional.conv_transpose2d."""
    __slots__ = ("shape", "what")

    def forward(self, x, w, s, what):
        _operands(what, x, w)
        self.shape, self.what = s, what
        self.save(x, w)
        return conv.conv2d_backward(_ShapeOnly((s.N, s.C, s.H, s.W), x.device), w, x, s, None, None, need_dx=True,
                                    what=what)

    def backward(self, dy):
        x, w = self.saved
        s = self.shape
        (dw,), betas, fresh = _param_grads(self, w.shape)
        dx = conv.conv2d_forward(dy, w, None, s, what=self.what + " backward (data)") if self.needs[0] else None
        if dw is not None:
            conv.conv2d_backward(dy, w, x, s, dw, None, need_dx=False, what=self.what + " backward (weights)",
                                 betas=(betas[0], 1.0))
        return (dx,) + fresh


class Linear(Function):
    """y = x w^T + b for x (N, I), w (O, I), then ReLU if relu (fused, as Conv2d's)."""
    __slots__ = ("what", "relu")

    def forward(self, x, w, b, what, relu=False):
        _operands(what, x, w, b)
        self.what, self.relu = what, relu
        y = conv.linear_forward(x, w, b, relu=relu, what=what)
        self.save(x, w, *((y,) if relu else ()))
        return y

    def backward(self, dy):
        x, w = self.saved[:2]
        (dw, db), betas, fresh = _param_grads(self, w.shape, (w.shape[0],))
        dx = conv.linear_backward(x, w, dy, dw, db, need_dx=self.needs[0], what=self.what + " backward", betas=betas,
                                  relu_y=self.saved[2] if self.relu else None,
                                  defer=autograd.deferral(self.inputs[1]) if fresh[0] is None else None)
        return (dx,) + fresh


# ---- normalisation -------------------------------------------------------------------------------------------------

class BatchNormTrain(Function):
    """Batch normalisation with the batch's statistics (training); updates the running statistics it is given (the
    variance unbiased, as PyTorch's, or with unbiased False the population's, as ONNX's). act ("relu", "relu6"): that
    activation of the result in the same pass, and its gradient, from the saved output, in the backward's passes (an
    ONNX BatchNormalization whose one reader is a Relu)."""
    __slots__ = ("act",)

    def forward(self, x, weight, bias, running_mean, running_var, momentum, eps, unbiased=True, act=None):
        if act not in (None, "relu", "relu6"):  # the kernels' vector path applies these two
            raise ValueError(f"batch norm: the activation applied in its pass is relu or relu6, not {act!r}")
        self.act = act
        _operands("batch norm", x, weight, bias, running_mean, running_var)
        y, mean, invstd = normalization.batch_norm_train_forward(x, weight, bias, running_mean, running_var, momentum,
                                                                 eps, unbiased, ACTIVATIONS[act] if act else 0)
        self.save(x, weight, mean, invstd, *((y,) if act else ()))  # the output only for its activation's gradient
        return y

    def backward(self, dy):
        x, weight, mean, invstd = self.saved[:4]
        C = x.shape[1]
        (dw, db), betas, fresh = _param_grads(self, (C,), (C,))
        act = self.act
        dx = normalization.batch_norm_backward(dy, x, weight, mean, invstd, self.needs[0], dw, db,
                                               _one_beta((dw, db), betas), self.saved[4] if act else None,
                                               ACTIVATIONS[act] if act else 0)
        return (dx,) + fresh


class BatchNormEval(BatchNormTrain):
    """Batch normalisation with fixed (running) statistics."""

    def forward(self, x, weight, bias, running_mean, running_var, eps):
        _operands("batch norm", x, weight, bias, running_mean, running_var)
        self.save(x, weight, running_mean, running_var, eps)
        return normalization.batch_norm_eval_forward(x, weight, bias, running_mean, running_var, eps)

    def backward(self, dy):
        x, weight, running_mean, running_var, eps = self.saved
        C = x.shape[1]
        (dw, db), betas, fresh = _param_grads(self, (C,), (C,))
        dx = normalization.batch_norm_eval_backward(dy, x, weight, running_mean, running_var, eps, self.needs[0], dw, db,
                                           _one_beta((dw, db), betas))
        return (dx,) + fresh


class LocalResponseNorm(Function):
    """Local response normalisation across channels, as torch.nn.functional.local_response_norm."""
    __slots__ = ("params",)

    def forward(self, x, size, alpha, beta, k):
        self.params = (size, alpha, beta, k)
        y, scale = normalization.lrn_forward(x, size, alpha, beta, k)
        self.save(x, y, scale)
        return y

    def backward(self, dy):
        x, y, scale = self.saved
        return normalization.lrn_backward(x, y, scale, dy, *self.params)


# ---- optimizer updates (no graph) ----------------------------------------------------------------------------------

def sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov):
    """lr and weight_decay: floats or kernels.Live (np.float32) that a per-step action sets."""
    lr, weight_decay = (a if type(a) is kernels.Live else float(a) for a in (lr, weight_decay))
    k = kernels.kernel(p.device, "sgd.cl", "sgd_step", dict(MOMENTUM=momentum != 0, NESTEROV=nesterov))
    _map(p.device, k, p.size, VW, p, g, buf, p.size, lr, float(momentum), weight_decay, what="SGD step")
