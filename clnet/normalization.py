"""Batch normalisation and local response normalisation: plain launches of cl_kernels/batchnorm.cl and lrn.cl.

No autograd here: the op table calls these, saves what they return, and calls the backward functions. Every tensor
is float32 and contiguous; x is (N, C, H, W), (N, C, L) or (N, C), viewed as (N, C, P) with P the product of the
trailing sizes (1 for (N, C)). Per-channel tensors are (C,).

Memory traffic per element of x (4 bytes each; per-channel records and partial sums are extra but tiny):

- batch_norm_train_forward: the statistics pass reads x (4 B), the normalising pass reads x and writes y (8 B):
  12 B, x read twice and y written once.
- batch_norm_eval_forward: reads x, writes y: 8 B.
- batch_norm_backward: the sums pass reads dy and x (8 B), the dx pass reads dy and x and writes dx (12 B): 20 B.
  Without need_dx only the sums pass runs (8 B); without dweight, dbias and need_dx nothing runs.
- batch_norm_eval_backward: the sums pass (only for dweight or dbias) reads dy and x (8 B); dx = dy * weight * invstd
  reads dy and writes dx (8 B).
- lrn_forward: reads x, writes y and scale: 12 B (each value is read `size` times, all but the first from cache).
- lrn_backward: reads x, y, scale and dy, writes dx: 20 B (the window's values again from cache).

Each op has two kernel shapes, chosen by tuning.cpu_shaped. GPU-shaped batch norm: the reductions run a work-group
of LSIZE per (channel, run), every channel's N*P values cut into tuning.reduction_runs runs so that a few channels
over many pixels still fill the device (64 channels of 401,408 values: 9 runs, 576 work-groups on the H200); the
pass that uses the statistics or gradient sums (apply, dx) merges each channel's records itself, in order, in every
work-group (a launch fewer each way); planes under SMALL_PLANE values are reduced plane-shaped instead (below), in
runs of whole images, and a second small pass merges their records. Element-wise passes take UNROLL elements per
work-item. CPU-shaped: a reduction's work-item takes whole planes of one channel (nb images), an element-wise pass's
whole planes of one image (cb channels), at least SPAN values either way, eight lanes at a time, without local memory
or barriers. LRN: an element per work-item on GPUs, whole planes of one image (at least SPAN values) per work-item on
CPUs; each window is summed down its few channels, P apart, so there is no long reduction to cut.
"""
import math

from . import kernels, tuning
from .tensor import chunks, empty

# The longest float32 running sum the batch-norm kernels make (their BLOCK); the CPU-shaped kernels give each
# work-item planes of at least SPAN values (a few whole planes when they are small), so that a plane of a few pixels
# (7x7, or 1 for (N, C) inputs) is not a work-item and a partial record of its own.
BLOCK = 64
SPAN = 8 * BLOCK
# Values a GPU-shaped batch-norm work-item loads together: with one load in flight per work-item the memory system
# idled. On the H200 at (128, 64, 56, 56), 4 took the statistics pass from 84 to 45 us (1.2 to 2.3 TB/s), the
# gradient sums from 97 to 61 us, and the normalising and dx passes from 103 and 110 to 93 and 99 us.
UNROLL = 4
# Planes smaller than this take the plane-shaped reductions on GPUs too: with a work-group per channel, a warp would
# read P-value fragments of 32 images (a word each for (N, C) inputs); plane-shaped, it reads 32 channels side by
# side. H200, (1024, 4096): statistics 21 us against 38, gradient sums 22 against 67.
SMALL_PLANE = 8
# The most (n, p) pairs a work-group of the merged passes (batchnorm_apply_runs, batchnorm_dx_runs) walks, 16 a
# work-item at LSIZE 256: on the statistics' own runs (long, about 4 work-groups a compute unit) those passes ran
# 17-31% slower than the spread element-wise passes on 64-256 channels of 56x56 and 112x112 (H100, bench/NOTES.md
# v44). Each work-group merges its channel's records itself, so the runs may be shorter than the statistics'.
MERGED_RUN = 4096

__all__ = ["batch_norm_stats", "batch_norm_train_forward", "batch_norm_eval_forward", "batch_norm_backward",
           "batch_norm_eval_backward", "lrn_forward", "lrn_backward"]


def _geometry(x, what):
    """(N, C, P) of x, checked."""
    if len(x.shape) < 2:
        raise ValueError(f"{what}: expected input of shape (N, C, H, W) or (N, C), got shape {tuple(x.shape)}")
    N, C = x.shape[0], x.shape[1]
    return N, C, math.prod(x.shape[2:])


def _check_channel(t, C, name, what):
    if t is not None and tuple(t.shape) != (C,):
        raise ValueError(f"{what}: expected {name} of shape ({C},), got shape {tuple(t.shape)}")


def _check_same(t, x, name, what):
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(f"{what}: expected {name} of shape {tuple(x.shape)} (the input's), got {tuple(t.shape)}")


def _lsize(dev):
    """Work-group size of the GPU-shaped reductions (a power of two, 1 on the CPU-shaped path)."""
    if tuning.cpu_shaped(dev):
        return 1
    return 256 if dev.max_work_group_size >= 256 else 1 << (dev.max_work_group_size.bit_length() - 1)


def _bn_kernel(dev, name, lsize, act=0):
    """A batchnorm.cl kernel built with the path's defines (a kernel that reads only some of them still shares the
    build of the file with its path's others); act: the activation its fused kernels apply (ACT, a build of its
    own)."""
    return kernels.kernel(dev, "batchnorm.cl", name, dict(LSIZE=lsize, BLOCK=BLOCK, UNROLL=UNROLL,
                                                          **({"ACT": act} if act else {})))


def _planes_per_item(P, limit):
    """Planes of P values a CPU-shaped work-item takes: enough for SPAN values, at most `limit`."""
    return max(1, min(limit, -(-SPAN // P)))


def _runs(dev, N, C, P, lsize):
    """(runs, chunk): each channel's N*P (n, p) pairs cut into runs of chunk consecutive pairs, none empty."""
    runs = max(1, int(tuning.reduction_runs(dev, N * P, C, lsize)))
    chunk = -(-N * P // runs)
    return -(-N * P // chunk), chunk


def _cut(args, images, n0, nb):
    """args with each tensor of `images` (N, C, ...) cut to its images n0 .. n0 + nb - 1 (`Tensor.region`)."""
    return tuple(t.region(n0 * (t.size // t.shape[0]), (nb,) + t.shape[1:]) if any(t is i for i in images) else t
                 for t in args)


def _reduce(dev, gpu_kernel, planes_kernel, width, N, C, P, inputs, what, act=0):
    """Runs a first reduction pass over inputs ((N, C, ...) tensors, then per-channel (C,) ones) and returns
    (partial records of `width` floats, runs, lsize): one record per (run, channel). A GPU-shaped run is `chunk`
    consecutive (n, p) pairs; a plane-shaped one is nb consecutive images: about SPAN values on CPUs, and on GPUs
    (planes under SMALL_PLANE values) enough runs for 4 waves of LSIZE work-items per compute unit. Past
    kernels.INDEX_LIMIT, each run of images gets its own pass, their records gathered in order (the finishing
    passes merge records of any counts). act: the ACT build (_bn_kernel)."""
    if N * C * P > kernels.INDEX_LIMIT:
        parts = []
        for n0, nb in chunks(what, (N, C, P), N, [C * P]):
            part, _, lsize = _reduce(dev, gpu_kernel, planes_kernel, width, nb, C, P,
                                     _cut(inputs, [t for t in inputs if getattr(t, "ndim", 0) > 1], n0, nb), what,
                                     act)
            parts.append(part)
        runs = sum(part.shape[0] for part in parts)
        gathered, at = empty((runs, C, width), dev), 0
        for part in parts:
            gathered.region(at, part.shape).copy_from(part)
            at += part.size
        return gathered, runs, lsize
    lsize = _lsize(dev)
    if not _in_runs(dev, N, C, P):
        if lsize == 1:
            nb = _planes_per_item(P, N)
        else:
            nb = max(1, min(N, N * C // (4 * dev.compute_units * lsize)))
        runs = -(-N // nb)
        part = empty((runs, C, width), dev)
        kernels.launch(dev, _bn_kernel(dev, planes_kernel, lsize, act), (runs * C,), kernels.ANY_GROUP, *inputs, part,
                       N, C, P, nb, what=what)
        return part, runs, lsize
    runs, chunk = _runs(dev, N, C, P, lsize)
    part = empty((runs, C, width), dev)
    kernels.launch(dev, _bn_kernel(dev, gpu_kernel, lsize, act), (C * lsize, runs), (lsize, 1), *inputs, part, N, C,
                   P, chunk, what=what)
    return part, runs, lsize


def _elementwise(dev, name, N, C, P, *args, what, images, act=0):
    """An element-wise pass: UNROLL elements per work-item, or, CPU-shaped, cb channels' planes of one image per
    work-item. Past kernels.INDEX_LIMIT, a pass per run of images over regions of the (N, C, P) tensors, those
    in `images`. act: the ACT build (_bn_kernel)."""
    if N * C * P > kernels.INDEX_LIMIT:
        for n0, nb in chunks(what, (N, C, P), N, [C * P]):
            _elementwise(dev, name, nb, C, P, *_cut(args, images, n0, nb), what=what, images=(), act=act)
        return
    lsize = _lsize(dev)
    if lsize == 1:
        cb = _planes_per_item(P, C)
        kernels.launch(dev, _bn_kernel(dev, name + "_planes", 1, act), (N * -(-C // cb),), kernels.ANY_GROUP, *args, C,
                       P, N, cb, what=what)
    else:
        total = N * C * P
        kernels.launch(dev, _bn_kernel(dev, name, lsize, act), (-(-total // UNROLL),), (lsize,), *args, C, P, total,
                       what=what)


def _merged_runs(N, P, records):
    """(runs, chunk) of a pass that merges the records itself: runs of its own, no longer than the records' (about
    N*P / records pairs) nor MERGED_RUN."""
    chunk = min(-(-N * P // records), MERGED_RUN)
    return -(-N * P // chunk), chunk


def _in_runs(dev, N, C, P):
    """Whether the reductions cut each channel into runs (the GPU shape, planes of SMALL_PLANE values or more, within
    kernels.INDEX_LIMIT: past it they run per run of images); then the passes that use their records merge them
    (batchnorm_apply_runs, batchnorm_dx_runs), not a finishing launch of their own."""
    return P >= SMALL_PLANE and N * C * P <= kernels.INDEX_LIMIT and _lsize(dev) > 1


def _statistics(x, eps, running_mean, running_var, momentum, unbiased, what):
    """The statistics pass of x, checked: (lsize, the finishing kernels' arguments (the records, their count, C, the
    update's constants and the tensors they write), the new mean and invstd among them)."""
    dev = x.device
    N, C, P = _geometry(x, what)
    _check_channel(running_mean, C, "running_mean", what)
    _check_channel(running_var, C, "running_var", what)
    count = N * P
    if count <= 1:
        raise ValueError(f"{what}: expected more than 1 value per channel when training, got input of shape "
                         f"{tuple(x.shape)}")
    part, runs, lsize = _reduce(dev, "batchnorm_stats", "batchnorm_stats_planes", 3, N, C, P, (x,),
                                what=f"{what} {tuple(x.shape)}")
    mean, invstd = empty((C,), dev), empty((C,), dev)
    finish = (part, runs, C, float(count), float(eps), momentum if type(momentum) is kernels.Live else float(momentum),
              float(count - 1 if unbiased else count), mean, invstd, running_mean, running_var)
    return lsize, finish, mean, invstd


def batch_norm_stats(x, eps=1e-5, running_mean=None, running_var=None, momentum=0.1, unbiased=True):
    """Per-channel batch statistics of x over N and the pixels.

    Parameters
    ----------
    x : Tensor (N, C, ...)
    eps : float
        Added to the (biased) variance before the inverse square root.
    running_mean, running_var : Tensor (C,) or None
        Updated in place when given: ``r = (1 - momentum) * r + momentum * batch value``, with the unbiased variance
        (times n / (n - 1)) for running_var, as PyTorch's BatchNorm in training.
    momentum : float
    unbiased : bool
        False: running_var takes the batch's population variance instead, as ONNX's BatchNormalization in training.

    Returns
    -------
    mean, invstd : Tensor (C,)
        The batch mean and 1 / sqrt(biased variance + eps).
    """
    what = "batch norm statistics"
    lsize, finish, mean, invstd = _statistics(x, eps, running_mean, running_var, momentum, unbiased, what)
    dev, C, records = x.device, x.shape[1], finish[1]
    kernels.launch(dev, _bn_kernel(dev, "batchnorm_stats_finish", lsize), (C * lsize,), (lsize,), *finish,
                   what=f"{what} (merging {records} runs)")
    return mean, invstd


def batch_norm_train_forward(x, weight, bias, running_mean, running_var, momentum, eps, unbiased=True, act=0):
    """Batch normalisation in training: y = (x - mean) * invstd * weight + bias with the batch's statistics.

    Parameters
    ----------
    x : Tensor (N, C, ...)
    weight, bias : Tensor (C,) or None
        None means 1 and 0.
    running_mean, running_var : Tensor (C,) or None
        Updated in place as batch_norm_stats says (PyTorch's BatchNorm2d semantics; ONNX's with unbiased False).
    momentum, eps : float
    unbiased : bool
        As batch_norm_stats.
    act : int
        0, or the activation applied to y in the same pass (elementwise.ACTIVATIONS: 1 ReLU, 4 ReLU6)

    Returns
    -------
    y : Tensor, x's shape
    mean, invstd : Tensor (C,)
        Saved for batch_norm_backward.
    """
    dev = x.device
    N, C, P = _geometry(x, "batch norm")
    _check_channel(weight, C, "weight", "batch norm")
    _check_channel(bias, C, "bias", "batch norm")
    y = empty(x.shape, dev)
    what = f"batch norm {tuple(x.shape)}"
    if _in_runs(dev, N, C, P):
        lsize, finish, mean, invstd = _statistics(x, eps, running_mean, running_var, momentum, unbiased,
                                                  "batch norm statistics")
        runs, chunk = _merged_runs(N, P, finish[1])
        kernels.launch(dev, _bn_kernel(dev, "batchnorm_apply_runs", lsize, act), (C * lsize, runs), (lsize, 1),
                       *finish, x, weight, bias, y, N, P, chunk, what=what)
        return y, mean, invstd
    mean, invstd = batch_norm_stats(x, eps, running_mean, running_var, momentum, unbiased)
    _elementwise(dev, "batchnorm_apply", N, C, P, x, mean, invstd, weight, bias, y, -1.0, what=what, images=(x, y),
                 act=act)
    return y, mean, invstd


def _eval_invstd(running_var, eps, C):
    invstd = empty((C,), running_var.device)
    dev = running_var.device
    kernels.launch(dev, _bn_kernel(dev, "batchnorm_invstd", _lsize(dev)), (C,), kernels.ANY_GROUP, running_var,
                   float(eps), invstd, C, what="batch norm invstd")
    return invstd


def batch_norm_eval_forward(x, weight, bias, running_mean, running_var, eps):
    """Batch normalisation in evaluation: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias."""
    N, C, P = _geometry(x, "batch norm")
    for t, name in ((weight, "weight"), (bias, "bias"), (running_mean, "running_mean"), (running_var, "running_var")):
        _check_channel(t, C, name, "batch norm")
    y = empty(x.shape, x.device)  # 1/sqrt(running_var + eps) taken inside the pass
    _elementwise(x.device, "batchnorm_apply", N, C, P, x, running_mean, running_var, weight, bias, y, float(eps),
                 what=f"batch norm (evaluation) {tuple(x.shape)}", images=(x, y))
    return y


def _grad_sums(dy, x, mean, invstd, dweight, dbias, gmean, what, beta, y=None, act=0):
    """dbias += sum dy, dweight += sum dy * xhat (each when not None; beta 0: written, not added to); gmean (2, C),
    when not None, gets their means. act: dy is first taken through that activation's gradient from its output y."""
    dev = x.device
    N, C, P = _geometry(x, what)
    part, runs, lsize = _grad_records(dy, x, mean, y, act, what)
    kernels.launch(dev, _bn_kernel(dev, "batchnorm_grad_finish", lsize), (C * lsize,), (lsize,), part, runs, C,
                   float(N * P), invstd, dweight, dbias, gmean, int(beta != 0.0),
                   what=f"{what} sums (merging {runs} runs)")


def _grad_records(dy, x, mean, y, act, what):
    """The gradient sums' first pass: (records, their count, lsize)."""
    N, C, P = _geometry(x, what)
    return _reduce(x.device, "batchnorm_grad_sums", "batchnorm_grad_sums_planes", 2, N, C, P, (dy, x, mean, y),
                   act=act, what=f"{what} sums {tuple(x.shape)}")


def batch_norm_backward(dy, x, weight, mean, invstd, need_dx, dweight, dbias, beta=1.0, y=None, act=0):
    """Backward of batch_norm_train_forward (statistics of the batch, so they depend on x).

    Parameters
    ----------
    dy, x : Tensor, x's shape
    weight : Tensor (C,) or None
    mean, invstd : Tensor (C,)
        As batch_norm_train_forward returned them.
    need_dx : bool
    dweight, dbias : Tensor (C,) or None
        Parameter gradients, accumulated into: ``dbias += sum dy``, ``dweight += sum dy * xhat``.
    beta : 1.0 to add into dweight and dbias, 0.0 to overwrite them
    y, act : Tensor, x's shape, and int
        With act (1 ReLU, 4 ReLU6), dy is the gradient of that activation's output y (batch_norm_train_forward's with
        act), taken through the activation's gradient in these passes.

    Returns
    -------
    dx : Tensor or None
        ``weight * invstd / n * (n * dy - sum dy - xhat * sum dy * xhat)``, n = N * P, when need_dx.
    """
    what = "batch norm backward"
    N, C, P = _geometry(x, what)
    _check_same(dy, x, "dy", what)
    for t, name in ((weight, "weight"), (mean, "mean"), (invstd, "invstd"), (dweight, "dweight"), (dbias, "dbias")):
        _check_channel(t, C, name, what)
    if not need_dx and dweight is None and dbias is None:
        return None
    if act:
        _check_same(y, x, "y", what)
    dev = x.device
    if need_dx and _in_runs(dev, N, C, P):
        part, records, lsize = _grad_records(dy, x, mean, y, act, what)
        dx = empty(x.shape, dev)
        runs, chunk = _merged_runs(N, P, records)
        kernels.launch(dev, _bn_kernel(dev, "batchnorm_dx_runs", lsize, act), (C * lsize, runs), (lsize, 1), part,
                       records, C, float(N * P), invstd, dweight, dbias, int(beta != 0.0), dy, x, mean, weight, dx, y,
                       N, P, chunk, what=f"{what} {tuple(x.shape)}")
        return dx
    gmean = empty((2, C), dev) if need_dx else None
    _grad_sums(dy, x, mean, invstd, dweight, dbias, gmean, what, beta, y, act)
    if not need_dx:
        return None
    dx = empty(x.shape, dev)
    _elementwise(dev, "batchnorm_dx", N, C, P, dy, x, mean, invstd, weight, gmean, dx, y,
                 what=f"{what} {tuple(x.shape)}", images=(dy, x, dx) + ((y,) if act else ()), act=act)
    return dx


def batch_norm_eval_backward(dy, x, weight, running_mean, running_var, eps, need_dx, dweight, dbias, beta=1.0):
    """Backward of batch_norm_eval_forward: the statistics are constants, so dx = dy * weight * invstd, and
    ``dbias += sum dy``, ``dweight += sum dy * xhat`` with xhat from the running statistics (each when not None; beta
    0: written instead).
    Returns dx, or None unless need_dx."""
    what = "batch norm (evaluation) backward"
    N, C, P = _geometry(x, what)
    _check_same(dy, x, "dy", what)
    for t, name in ((weight, "weight"), (running_mean, "running_mean"), (running_var, "running_var"),
                    (dweight, "dweight"), (dbias, "dbias")):
        _check_channel(t, C, name, what)
    if not need_dx and dweight is None and dbias is None:
        return None
    invstd, eps_arg = running_var, float(eps)  # the data gradient's pass takes 1/sqrt(var + eps) itself
    if dweight is not None or dbias is not None:
        invstd, eps_arg = _eval_invstd(running_var, eps, C), -1.0
        _grad_sums(dy, x, running_mean, invstd, dweight, dbias, None, what, beta)
    if not need_dx:
        return None
    dx = empty(x.shape, x.device)
    _elementwise(x.device, "batchnorm_apply", N, C, P, dy, None, invstd, weight, None, dx, eps_arg,
                 what=f"{what} {tuple(x.shape)}", images=(dy, dx))
    return dx


def _lrn_launch(name, x, N, C, P, tensors, scalars, what):
    """An element per work-item, or, CPU-shaped, cb channels' planes of one image per work-item. Past
    kernels.INDEX_LIMIT, a launch per run of images."""
    dev = x.device
    if N * C * P > kernels.INDEX_LIMIT:
        for n0, nb in chunks(what, (N, C, P), N, [C * P]):
            _lrn_launch(name, x, nb, C, P, _cut(tensors, tensors, n0, nb), scalars, what)
        return
    if tuning.cpu_shaped(dev):
        cb = _planes_per_item(P, C)
        k = kernels.kernel(dev, "lrn.cl", name + "_planes")
        kernels.launch(dev, k, (N * -(-C // cb),), kernels.ANY_GROUP, *tensors, C, P, N, cb, *scalars, what=what)
    else:
        k = kernels.kernel(dev, "lrn.cl", name)
        kernels.launch(dev, k, (N * C * P,), (256,) if dev.max_work_group_size >= 256 else None, *tensors, C, P,
                       N * C * P, *scalars, what=what)


def _lrn_check(x, size, what):
    N, C, P = _geometry(x, what)
    if int(size) != size or size < 1:
        raise ValueError(f"{what}: expected a window size of at least 1 channel, got {size}")
    return N, C, P


def lrn_forward(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """Local response normalisation across channels, as torch.nn.functional.local_response_norm.

    Parameters
    ----------
    x : Tensor (N, C, ...)
    size : int
        Channels in the window: c - size // 2 .. c + (size - 1) // 2, zero padded.
    alpha, beta, k : float

    Returns
    -------
    y : Tensor, x's shape
        ``x * scale ** -beta``
    scale : Tensor, x's shape
        ``k + alpha / size * sum of x**2 over the window``, saved for lrn_backward.
    """
    what = f"local response norm {tuple(x.shape)}"
    N, C, P = _lrn_check(x, size, what)
    y, scale = empty(x.shape, x.device), empty(x.shape, x.device)
    _lrn_launch("lrn_fwd", x, N, C, P, (x, y, scale), (int(size), float(alpha) / size, float(beta), float(k)),
                what=what)
    return y, scale


def lrn_backward(x, y, scale, dy, size, alpha=1e-4, beta=0.75, k=1.0):
    """Backward of lrn_forward: ``dx = dy * scale**-beta - 2 * alpha * beta / size * x * sum over the windows that
    hold c of dy * y / scale``. k enters only through scale. Returns dx, x's shape."""
    what = f"local response norm backward {tuple(x.shape)}"
    N, C, P = _lrn_check(x, size, what)
    for t, name in ((y, "y"), (scale, "scale"), (dy, "dy")):
        _check_same(t, x, name, what)
    dx = empty(x.shape, x.device)
    _lrn_launch("lrn_bwd", x, N, C, P, (x, y, scale, dy, dx), (int(size), float(beta), 2.0 * alpha * beta / size),
                what=what)
    return dx
