"""Convolution and dense layers on the device: per pass (forward, data gradient, weight gradient) the algorithm
tuned or defaulted for the shape (im2col + GEMM, Winograd, direct, depthwise, 1x1), and the bias gradient they share."""
from . import conv1x1, depthwise, direct, kernels, tuning, winograd
from .elementwise import _activation_grad, fill
from .gemm import NO_SPLIT, Mat, dense_backward_one_row, gemm, skinny, takes_split_rows
from .tensor import TooLarge, chunks, empty


def _im2col(x, s, n0, nimg, col):
    rows = s.C * s.KH * s.KW
    if not tuning.cpu_shaped(x.device):
        k, size = kernels.kernel(x.device, "im2col.cl", "im2col"), (nimg * s.OH * s.OW, s.C)
    else:
        k, size = kernels.kernel(x.device, "im2col.cl", "im2col_rows"), (rows, nimg)
    kernels.launch(x.device, k, size, kernels.ANY_GROUP, x, n0 * s.C * s.H * s.W, *s.geometry(nimg), col, what="im2col")


def _col2im(col, s, n0, nimg, dx):
    if not tuning.cpu_shaped(dx.device):
        k, size = kernels.kernel(dx.device, "im2col.cl", "col2im"), (nimg * s.C * s.H * s.W,)
    else:
        k, size = kernels.kernel(dx.device, "im2col.cl", "col2im_planes"), (nimg, s.C)
    kernels.launch(dx.device, k, size, kernels.ANY_GROUP, col, *s.geometry(nimg), dx, n0 * s.C * s.H * s.W,
                   what="col2im")


# Convolution algorithms. im2col + GEMM runs every shape; Winograd (winograd.py) runs 3x3 and 5x5 stride-1 layers
# with 2.25-4x fewer multiply-adds, and wins where channels are many (its transforms cost traffic per pixel); direct
# (direct.py) reads x and w in place in the forward of layers of few input channels;
# depthwise (depthwise.py) runs layers of one input channel per group, all three passes, reading each operand in
# place; conv1x1 (conv1x1.py, CPUs) runs pointwise layers' three passes in place, a block of channels by a run of pixel
# vectors a work-item. Forward, data gradient and weight gradient are three separate choices; the defaults per device
# class are tuning.conv_default's.
WINOGRAD_TILE = {"winograd": 2, "winograd4": 4}  # algorithm name -> output tile side m of F(m x m, r x r)
LESS_ACCURATE = {"winograd4"}  # offered only with tuning.allow_less_accurate


def _conv_key(kind, s):
    return (f"{kind} {s.N}x{s.C}x{s.H}x{s.W} o{s.O} k{s.KH}x{s.KW} s{s.SH}x{s.SW} p{s.PH}x{s.PW} d{s.DH}x{s.DW} "
            f"g{s.G} out{s.OH}x{s.OW}")


_algorithms = tuning.choices()  # (device, pass, shape, allow_less_accurate) -> _conv_algorithm's answer


def _conv_algorithm(dev, kind, s, run):
    """The algorithm for one pass (kind: conv2d_fwd, conv2d_bwd_data, conv2d_bwd_weights) of a layer of shape s:
    tuned, else the default, from those that can run it. Memoised (the options and the key cost googlenet's eager
    step 1 ms of host time at batch 64; bench/NOTES.md v49) unless a tuner or a benchmark watches the choices."""
    memo_key = (dev, kind, s, tuning.allow_less_accurate)
    found = _algorithms.get(memo_key)
    if found is not None and not tuning.recording():
        return found
    options = ["im2col"] + [a for a, m in WINOGRAD_TILE.items() if winograd.supported(s, m)
                            and winograd.image_fits(s, m)
                            and (a not in LESS_ACCURATE or tuning.allow_less_accurate)]
    if kind == "conv2d_fwd" and direct.supported(s):
        options.append("direct")
    if depthwise.supported(s):
        options.append("depthwise")
    if tuning.cpu_shaped(dev) and conv1x1.supported(s):  # CPU-shaped kernels: not offered to GPUs' tuners
        options.append("conv1x1")
    # depthwise layers take their own kernels by default on every device class: each pass reads its operands once,
    # where im2col runs them as C products of M rows each (depthwise.py)
    default = "depthwise" if "depthwise" in options else tuning.conv_default(dev, s, options, kind)
    return _algorithms.keep(memo_key, tuning.choose(dev, _conv_key(kind, s), lambda: default,
                                                    lambda: [default] + [a for a in options if a != default], run,
                                                    lambda cached: cached in options))


def _image_runs(s, what):
    """Runs of images [(n0, nimg)] of a layer whose input or output passes kernels.INDEX_LIMIT elements, each run's
    x and y within it (a run is a layer of batch nimg, run as any other: its own algorithm choice, its own im2col
    chunks), or [] when the whole batch fits one pass. TooLarge when not even one image's column buffer fits."""
    x_image, y_image = s.C * s.H * s.W, s.O * s.OH * s.OW
    limit = kernels.INDEX_LIMIT
    col_image = 0 if s.pointwise else s.C * s.KH * s.KW * s.OH * s.OW
    if max(col_image, s.O * s.C // s.G * s.KH * s.KW) > limit:  # checked before the common case returns: a single
        # image's columns, or the weights, would overflow the kernels' 32-bit indices, whatever the batch
        raise TooLarge(f"{what}: a layer of weights {(s.O, s.C // s.G, s.KH, s.KW)} on images of shape "
                       f"{(s.C, s.H, s.W)} needs a column buffer of {col_image} elements per image (C*KH*KW x OH*OW) "
                       f"and {s.O * s.C // s.G * s.KH * s.KW} weights; one launch indexes at most {limit} with 32-bit "
                       "integers (kernels.INDEX_LIMIT): use smaller images or fewer channels")
    if s.N * max(x_image, y_image) <= limit:
        return []
    return chunks(what, (s.N, s.C, s.H, s.W), s.N, [x_image, y_image])


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d"):
    """y = conv(x, w) + bias (ReLU), by the algorithm tuned (or defaulted) for this shape."""
    runs = _image_runs(s, what)
    if runs:
        return _by_images_forward(x, w, bias, s, relu, what, runs)

    def run(algorithm):
        if algorithm in WINOGRAD_TILE:
            return winograd.conv2d_forward(x, w, bias, s, relu, what=what, m=WINOGRAD_TILE[algorithm])
        if algorithm == "direct":
            return direct.conv2d_forward(x, w, bias, s, relu, what=what)
        if algorithm == "depthwise":
            return depthwise.conv2d_forward(x, w, bias, s, relu, what=what)
        if algorithm == "conv1x1":
            return conv1x1.conv2d_forward(x, w, bias, s, relu, what=what)
        return _conv2d_forward_im2col(x, w, bias, s, relu, what)

    return run(_conv_algorithm(x.device, "conv2d_fwd", s, run))


def _by_images_forward(x, w, bias, s, relu, what, runs):
    """conv2d_forward of each run of images, into its slice of y."""
    y = empty((s.N, s.O, s.OH, s.OW), x.device)
    x_image, y_image = s.C * s.H * s.W, s.O * s.OH * s.OW
    for n0, nimg in runs:
        part = conv2d_forward(x.region(n0 * x_image, (nimg,) + x.shape[1:]), w, bias, s._replace(N=nimg),
                              relu, what)
        y.region(n0 * y_image, part.shape).copy_from(part)
    return y


def _by_images_backward(x, w, dy, s, dw, db, need_dx, what, runs, betas):
    """conv2d_backward of each run of images: dw and db gather every run's share (the first run with betas, the rest
    adding), dx is written a slice a run."""
    dx = empty(x.shape, x.device) if need_dx else None
    x_image, y_image = s.C * s.H * s.W, s.O * s.OH * s.OW
    for n0, nimg in runs:
        shape = (nimg,) + x.shape[1:]
        part = conv2d_backward(x.region(n0 * x_image, shape), w, dy.region(n0 * y_image, (nimg,) + dy.shape[1:]),
                               s._replace(N=nimg), dw, db, need_dx, what, betas)
        betas = (1.0, 1.0)  # the later runs add to the first's
        if need_dx:
            dx.region(n0 * x_image, shape).copy_from(part)
    return dx


def _col_chunk(s, dev):
    """Images per im2col chunk: the column budget's, and no more than the index limit allows (one image at least:
    _image_runs refuses a layer whose single image's columns pass it)."""
    return max(1, min(s.chunk(dev), kernels.INDEX_LIMIT // (s.C * s.KH * s.KW * s.OH * s.OW or 1)))


def _conv2d_forward_im2col(x, w, bias, s, relu, what):
    dev = x.device
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    Og, Cg, KK, OHW = s.O // s.G, s.C // s.G, s.KH * s.KW, s.OH * s.OW
    chunk = _col_chunk(s, dev)
    col = None if s.pointwise else empty((s.C * KK * chunk * OHW,), dev)
    for n0 in range(0, s.N, chunk):
        nimg = min(chunk, s.N - n0)
        NP = nimg * OHW
        if s.pointwise:
            B, b = x, Mat(off=n0 * s.C * OHW, bs=Cg * OHW, rs=OHW, cs=1, cdiv=OHW if nimg > 1 else NO_SPLIT,
                          cso=s.C * OHW if nimg > 1 else 0)
        else:
            _im2col(x, s, n0, nimg, col)
            B, b = col, Mat(bs=Cg * KK * NP, rs=NP, cs=1)
        c = Mat(off=n0 * s.O * OHW, bs=Og * OHW, rs=OHW, cs=1, cdiv=OHW if nimg > 1 else NO_SPLIT,
                cso=s.O * OHW if nimg > 1 else 0)
        gemm(Og, NP, Cg * KK, w, Mat(bs=Og * Cg * KK, rs=Cg * KK, cs=1), B, b, y, c, batch=s.G,
             bias=bias, bias_mode=1, bias_bs=Og, relu=relu, what=what)
    return y


def _no_terms(dw, db, betas, x_shape, dev, need_dx):
    """A layer's backward over a batch of none: the weight and bias gradients are sums of no terms, zeros (written
    where beta 0 overwrites; added, they change nothing); dx has no elements."""
    for g, beta in ((dw, betas[0]), (db, betas[1])):
        if g is not None and beta == 0.0:
            fill(g, 0.0)
    return empty(x_shape, dev) if need_dx else None


def conv2d_backward(x, w, dy, s, dw, db, need_dx=True, what="Conv2d backward", betas=(1.0, 1.0)):
    """Adds d loss / d w into dw (and d loss / d bias into db), each unless None, or overwrites it where its beta
    (betas: dw's, db's) is 0; returns d loss / d x (or None). Each gradient uses the algorithm tuned (or defaulted)
    for this shape; when both use im2col they share one lowering of x."""
    dev = x.device
    if s.N == 0:  # no algorithm shapes a launch over no images
        return _no_terms(dw, db, betas, x.shape, dev, need_dx)
    runs = _image_runs(s, what)
    if runs:
        return _by_images_backward(x, w, dy, s, dw, db, need_dx, what, runs, betas)
    dw_beta, db_beta = betas

    def weights(algorithm):  # returns dw, for the autotuner to check each candidate against the default
        if algorithm in WINOGRAD_TILE:
            winograd.conv2d_backward_weights(x, dy, s, dw, what=what + " (weights)", m=WINOGRAD_TILE[algorithm],
                                             beta=dw_beta)
        elif algorithm == "depthwise":
            depthwise.conv2d_backward_weights(x, dy, s, dw, beta=dw_beta, what=what + " (weights)")
        elif algorithm == "conv1x1":
            conv1x1.conv2d_backward_weights(x, dy, s, dw, beta=dw_beta, what=what + " (weights)")
        else:
            _conv2d_backward_im2col(x, w, dy, s, dw, False, what, dw_beta)
        return dw

    def data(algorithm):
        if algorithm in WINOGRAD_TILE:
            return winograd.conv2d_backward_data(w, dy, s, what=what + " (data)", m=WINOGRAD_TILE[algorithm])
        if algorithm == "depthwise":
            return depthwise.conv2d_backward_data(w, dy, s, what=what + " (data)")
        if algorithm == "conv1x1":
            return conv1x1.conv2d_backward_data(w, dy, s, what=what + " (data)")
        return _conv2d_backward_im2col(x, w, dy, s, None, True, what)

    w_alg = _conv_algorithm(dev, "conv2d_bwd_weights", s, weights) if dw is not None else None
    x_alg = _conv_algorithm(dev, "conv2d_bwd_data", s, data) if need_dx else None
    if db is not None:
        bias_grad(dy, db, s.N, s.O, s.OH * s.OW, db_beta)
    if w_alg in ("im2col", None) and x_alg in ("im2col", None):
        return _conv2d_backward_im2col(x, w, dy, s, dw, need_dx, what, dw_beta) if w_alg or x_alg else None
    if w_alg is not None:
        weights(w_alg)
    return data(x_alg) if need_dx else None


def _conv2d_backward_im2col(x, w, dy, s, dw, need_dx, what, dw_beta=1.0):
    """dw += the weight gradient (unless dw is None; dw_beta 0: dw = it); returns dx (if need_dx): im2col + GEMM, one
    lowering of x per chunk of images serving both."""
    dev = x.device
    Og, Cg, KK, OHW = s.O // s.G, s.C // s.G, s.KH * s.KW, s.OH * s.OW
    chunk = _col_chunk(s, dev)
    # a pointwise layer's x^T is the weight gradient's B as it lies, its rows (image, pixel) split, where the device's
    # products take a row split (GPUs); elsewhere x is lowered into col, as other layers' are
    x_as_b = s.pointwise and takes_split_rows(dev)
    col = None if x_as_b or (s.pointwise and dw is None) else empty((s.C * KK * chunk * OHW,), dev)
    dx = empty(x.shape, dev) if need_dx else None
    for n0 in range(0, s.N, chunk):
        nimg = min(chunk, s.N - n0)
        NP = nimg * OHW
        dy_cols = Mat(off=n0 * s.O * OHW, bs=Og * OHW, rs=OHW, cs=1, cdiv=OHW if nimg > 1 else NO_SPLIT,
                      cso=s.O * OHW if nimg > 1 else 0)
        if dw is not None:
            if x_as_b:
                B, b = x, Mat(off=n0 * s.C * OHW, bs=Cg * OHW, rs=1, cs=OHW, cdiv=OHW if nimg > 1 else NO_SPLIT,
                              cso=s.C * OHW if nimg > 1 else 0, split_rows=nimg > 1)
            else:
                _im2col(x, s, n0, nimg, col)
                B, b = col, Mat(bs=Cg * KK * NP, rs=1, cs=NP)
            # dw_g (Og, Cg*KK) += dy_g (Og, NP) @ col_g^T (NP, Cg*KK)
            gemm(Og, Cg * KK, NP, dy, dy_cols, B, b, dw, Mat(bs=Og * Cg * KK, rs=Cg * KK, cs=1),
                 beta=dw_beta if n0 == 0 else 1.0, batch=s.G, what=what + " (weights)")
        if not need_dx:
            continue
        w_t = Mat(bs=Og * Cg * KK, rs=1, cs=Cg * KK)  # w_g^T: (Cg*KK, Og)
        if s.pointwise:
            # dx_g (Cg, NP) = w_g^T @ dy_g, written straight into NCHW
            c = Mat(off=n0 * s.C * OHW, bs=Cg * OHW, rs=OHW, cs=1, cdiv=OHW if nimg > 1 else NO_SPLIT,
                    cso=s.C * OHW if nimg > 1 else 0)
            gemm(Cg, NP, Og, w, w_t, dy, dy_cols, dx, c, batch=s.G, what=what + " (data)")
        else:
            gemm(Cg * KK, NP, Og, w, w_t, dy, dy_cols, col, Mat(bs=Cg * KK * NP, rs=NP, cs=1), batch=s.G,
                 what=what + " (data)")
            _col2im(col, s, n0, nimg, dx)
    return dx


def bias_group(dev):
    """The work-group size of a GPU's bias gradient: a work-group a channel (bias_grad; ops' maxpool2d_bwd_bias)."""
    return 256 if dev.max_work_group_size >= 256 else 1 << (dev.max_work_group_size.bit_length() - 1)


def bias_grad(dy, db, N, C, P, beta=1.0, relu_y=None):
    """db += sum of dy (N, C, P) over N and P (beta 0: db = that sum, db not read). Few channels over many pixels (a
    first layer) would leave most of a GPU idle with a work-group per channel, so there each channel's sum is cut into
    runs first, then added in order. CPUs take a channel per work-item (bias_grad_planes).

    relu_y: the output of a ReLU the layer applied to its own output (a fused ReLU); dy is then first taken through
    the ReLU's gradient, in the same pass (one launch and one read fewer than act_bwd, then this), and that gradient
    is returned; db is the same bits either way. (elementwise.cl's ACT defaults to ReLU: no build of its own.)"""
    dev = dy.device
    dx = empty(dy.shape, dev) if relu_y is not None else None
    if tuning.cpu_shaped(dev):
        k = kernels.kernel(dev, "elementwise.cl", "bias_grad_planes")
        kernels.launch(dev, k, (C,), kernels.ANY_GROUP, relu_y, dy, dx, db, N, C, P, int(beta != 0.0),
                       what="bias gradient")
        return dx
    lsize = bias_group(dev)
    runs = tuning.reduction_runs(dev, N * P, C, lsize)
    reads = (relu_y, dy, dx)  # the pass over dy (with the ReLU's output, and its gradient written, when fused)
    if runs > 1:
        chunk = -(-N * P // runs)
        part = empty((runs, C), dev)
        k = kernels.kernel(dev, "elementwise.cl", "bias_grad", dict(LSIZE=lsize, PARTIAL=1))
        kernels.launch(dev, k, (C * lsize, runs), (lsize, 1), *reads, part, N, C, P, chunk, 1,
                       what="bias gradient (runs)")
        reads, N, P = (None, part, None), runs, 1
    k = kernels.kernel(dev, "elementwise.cl", "bias_grad", dict(LSIZE=lsize))
    kernels.launch(dev, k, (C * lsize,), (lsize,), *reads, db, N, C, P, 0, int(beta != 0.0), what="bias gradient")
    return dx


# ---- dense ---------------------------------------------------------------------------------------------------------

def _row_runs(x, O, what):
    """Runs of rows [(n0, rows)] of a dense layer whose input (N, I) or output (N, O) passes kernels.INDEX_LIMIT
    elements, or [] when one pass fits."""
    N, I = x.shape
    if I * O > kernels.INDEX_LIMIT:  # the weights (and their gradient) are never split
        raise TooLarge(f"{what}: a weight of shape {(O, I)} has {I * O} elements, more than the {kernels.INDEX_LIMIT} "
                       "one launch indexes with 32-bit integers (kernels.INDEX_LIMIT): use fewer features")
    if N * max(I, O) <= kernels.INDEX_LIMIT:
        return []
    return chunks(what, x.shape, N, [I, O], unit="row")


def linear_forward(x, w, bias, relu=False, what="Linear"):
    N, I = x.shape
    O = w.shape[0]
    runs = _row_runs(x, O, what)
    if runs:
        y = empty((N, O), x.device)
        for n0, rows in runs:
            part = linear_forward(x.region(n0 * I, (rows, I)), w, bias, relu, what)
            y.region(n0 * O, part.shape).copy_from(part)
        return y
    y = empty((N, O), x.device)
    gemm(N, O, I, x, Mat(rs=I, cs=1), w, Mat(rs=1, cs=I), y, Mat(rs=O, cs=1), bias=bias, bias_mode=2, relu=relu,
         what=what)
    return y


# A batch-1 weight gradient that an SGD step in the weight's post-accumulate-grad hook may take in one pass over the
# weight (DeferredWeightGrad): weights of at least this many elements (1 MB). Deferring costs launches of their own
# for the bias gradient and a fused ReLU's gradient (about 50 us each on PoCL), which a small weight's saved pass does
# not repay; the threshold is chosen from that count, not measured (bench/NOTES.md v26).
DEFER_MIN = 1 << 18


class DeferredWeightGrad:
    """A dense layer's batch-1 weight gradient on a CPU, dw = dy^T x (rank 1), not yet written: the weight's
    `_grad_pending` while its post-accumulate-grad hooks run (autograd.deferral). An SGD step in such a hook, as in
    PyTorch's optimizer-in-backward pattern, takes it through `sgd_step`: one pass over the weight and its momentum,
    the gradient never stored (lenet-wide's 2048 x 2048 layer on PoCL: 67 MB a step instead of 101, and 1.76 ms of
    kernel time against 5.0 for the rank-1 product and the flat update, bench/NOTES.md v26). Otherwise
    `write` writes it into the .grad, as linear_backward would have."""
    __slots__ = ("dy", "x", "what")

    def __init__(self, dy, x, what):
        self.dy, self.x, self.what = dy, x, what

    def write(self, grad):
        O, I = grad.shape
        gemm(O, I, 1, self.dy, Mat(rs=1, cs=O), self.x, Mat(rs=I, cs=1), grad, Mat(rs=I, cs=1), beta=0.0,
             what=self.what)

    def sgd_step(self, p, buf, lr, momentum, weight_decay, nesterov):
        """p (the weight, O x I) and buf (its momentum buffer, or None for none) take SGD's step with this gradient
        (optim.SGD's arithmetic, sgd.cl). lr, momentum, weight_decay: kernels.Live (np.float32) or floats."""
        O, I = p.shape
        k = kernels.kernel(p.device, "sgd.cl", "rank1_sgd_rows", dict(MOMENTUM=buf is not None, NESTEROV=nesterov))
        kernels.launch(p.device, k, (O,), (1,), O, I, 1.0, self.dy, 0, 1, self.x, 0, p, p if buf is None else buf,
                       lr, momentum, weight_decay, what=self.what + " and SGD step")


# The largest weight (elements) whose batch-1 backward takes one launch on a GPU (dense_backward_one_row). Its grid is
# the input gradient's, a work-group per 32 inputs: on the H200 lenet's 500 x 800 layer gained with it, and
# lenet-wide's 2048 x 2048 lost (64 work-groups then write its 16.8 MB gradient, which the rank-1 launch writes from
# 4 M work-items); sizes between were not measured (bench/NOTES.md v28).
FUSED_BACKWARD_MAX = 1 << 19


def linear_backward(x, w, dy, dw, db, need_dx=True, what="Linear backward", betas=(1.0, 1.0), relu_y=None,
                    defer=None):
    """Adds d loss / d w into dw and d loss / d b into db (each unless None; overwrites it where its beta in betas is
    0); returns d loss / d x when need_dx. relu_y: the forward's output where it ended in a fused ReLU, whose
    gradient dy is first taken through: inside the products at batch 1 where gemm.skinny runs them (gemv.cl on a GPU,
    gemv_cpu.cl on a CPU: each reads dy once; not when only the bias gradient is wanted), else by a pass of its own.
    defer: None, or a function that takes a DeferredWeightGrad in place of writing dw, where dw would be overwritten
    by a CPU's rank-1 product of at least DEFER_MIN elements."""
    N, I = x.shape
    O = w.shape[0]
    if N == 0:  # a product of depth 0 is no launch gemm can shape
        return _no_terms(dw, db, betas, x.shape, x.device, need_dx)
    a, b, c = Mat(rs=1, cs=O), Mat(rs=I, cs=1), Mat(rs=I, cs=1)  # the weight gradient's operands
    rank1 = N == 1 and skinny(x.device, O, N, 1, a, b, c)  # (then the data gradient's one row is skinny too)
    deferred = (defer is not None and rank1 and dw is not None and betas[0] == 0.0 and O * I >= DEFER_MIN
                and tuning.cpu_shaped(x.device))
    mask_inside = relu_y is not None and rank1 and not deferred and (dw is not None or db is None)
    if relu_y is not None and not mask_inside:
        dy, relu_y = _activation_grad("relu", relu_y, dy, what + " (its ReLU)"), None
    runs = _row_runs(x, O, what)
    if runs:
        dx = empty((N, I), x.device) if need_dx else None
        for n0, rows in runs:
            part = linear_backward(x.region(n0 * I, (rows, I)), w, dy.region(n0 * O, (rows, O)), dw, db, need_dx,
                                   what, betas)
            betas = (1.0, 1.0)  # the later runs add to the first's
            if need_dx:
                dx.region(n0 * I, part.shape).copy_from(part)
        return dx
    if deferred:
        defer(DeferredWeightGrad(dy, x, what + " (weights)"))
        dw = None
    # at batch 1 the weight gradient is a rank-1 launch, which writes the bias gradient (dy itself) too; on a GPU a
    # small layer's input-gradient launch takes both (a launch of about 9 us fewer, bench/NOTES.md v28)
    db_in_dw = dw is not None and db is not None and rank1
    if dw is not None and rank1 and need_dx and not tuning.cpu_shaped(x.device) and O * I <= FUSED_BACKWARD_MAX:
        dx = empty((N, I), x.device)
        dense_backward_one_row(x.device, O, I, dy, w, x, dx, dw, betas[0], db, betas[1], relu_y, what)
        return dx
    if dw is not None:
        gemm(O, I, N, dy, a, x, b, dw, c, beta=betas[0], what=what + " (weights)",
             rowsum=db if db_in_dw else None, rowsum_beta=betas[1], a_mask=relu_y)
    if db is not None and not db_in_dw:
        bias_grad(dy, db, N, O, 1, betas[1])
    if not need_dx:
        return None
    dx = empty((N, I), x.device)
    gemm(N, I, O, dy, Mat(rs=O, cs=1), w, Mat(rs=I, cs=1), dx, Mat(rs=I, cs=1), what=what + " (data)",
         a_mask=relu_y)
    return dx
