"""Device operations: each function sizes its work, picks kernel and parameters (tuning.py) and launches it.

Layers (nn/) call these; nothing here talks to OpenCL discovery or copies to the host.
"""
from dataclasses import dataclass

import numpy as np

from . import kernels, tuning
from .tensor import empty

NO_SPLIT = 1 << 30  # a column divisor no index reaches


@dataclass(frozen=True)
class Mat:
    """How a matrix operand sits in its buffer: element (r, c) of batch b is at
    off + b*bs + r*rs + (c % cdiv)*cs + (c // cdiv)*cso."""
    off: int = 0
    bs: int = 0
    rs: int = 1
    cs: int = 1
    cdiv: int = NO_SPLIT
    cso: int = 0

    @property
    def split(self):
        return self.cdiv != NO_SPLIT

    def args(self):
        return (self.off, self.bs, self.rs, self.cs, self.cdiv, self.cso)


def gemm(M, N, K, A, a, B, b, C, c, alpha=1.0, beta=0.0, batch=1, bias=None, bias_mode=0, bias_bs=0, relu=False,
         what="matrix product"):
    """C = act(alpha * A @ B + beta * C + bias) for `batch` products laid out as the Mats a, b, c describe.

    The kernel, tile shape and split-K factor come from tuning.choose, keyed by the sizes and the operands' layouts."""
    dev = C.device
    alpha, beta = float(alpha), float(beta)  # float parameters: an int would be set as int32 bits
    key = gemm_key(M, N, K, batch, a, b, c)

    def run(choice):
        _gemm_choice(dev, choice, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_mode, bias_bs, relu,
                     what)

    choice = tuning.choose(dev, key, lambda: tuning.gemm_default(dev, M, N, K, batch),
                           lambda: tuning.gemm_candidates(dev, M, N, K, batch, _kfast_a(a),
                                                          _kfast_b(b) and not b.split), run,
                           lambda cached: tuning.valid_gemm(dev, cached, M, N, K, batch, b.split))
    run(choice)


def gemm_key(M, N, K, batch, a, b, c):
    """The tuning key of a product: its sizes and the operands' layout classes (which way k runs, splits)."""
    return (f"gemm {M}x{N}x{K}x{batch} A{'k' if _kfast_a(a) else 'm'}{'s' if a.split else ''} "
            f"B{'k' if _kfast_b(b) else 'n'}{'s' if b.split else ''} C{'s' if c.split else ''}")


def _kfast_a(a):
    # k contiguous (within each image's segment when split, as dy in a weight gradient): load along k to coalesce
    return a.cs == 1 and a.rs != 1


def _kfast_b(b):
    return b.rs == 1 and b.cs != 1


def _quads(*values):
    return all(v % 4 == 0 for v in values)


def _vec_along_rows(x):
    """Whether float4s of 4 consecutive columns of x (the layout `x` describes) are each contiguous and 16-byte
    aligned: columns contiguous, every other step a multiple of 4 elements, and with a column split, no float4
    crossing a segment."""
    return x.cs == 1 and _quads(x.off, x.bs, x.rs) and (not x.split or _quads(x.cdiv, x.cso))


def _vec_along_columns(x):
    """The same for float4s of 4 consecutive rows."""
    return x.rs == 1 and _quads(x.off, x.bs, x.cs) and (not x.split or _quads(x.cso))


def _vec_a(a):
    """Whether gemm_tiled may fetch A (m, k) as float4s along the axis its loads run: k when k-fast, else m."""
    return _vec_along_rows(a) if _kfast_a(a) else _vec_along_columns(a)


def _vec_b(b):
    """The same for B (k, n): along k when k-fast, else along n."""
    return _vec_along_columns(b) if _kfast_b(b) else _vec_along_rows(b)


def _vec_c(c):
    """Whether gemm_tiled may store C (m, n) as float4s along n."""
    return _vec_along_rows(c)


def _transposed(dev, X, x, R, CC, batch):
    """The operand X (laid out as x; R rows, CC columns, batch of them) copied to a dense (CC, R) buffer per batch."""
    tile = next(t for t in (32, 16, 8, 4, 2, 1) if t * t <= dev.max_work_group_size)
    T = empty((batch * R * CC,), dev)
    k = kernels.kernel(dev, "transpose.cl", "transpose", dict(TT=tile, SPLIT=x.split))
    kernels.launch(dev, k, (CC, R, batch), (tile, tile, 1), X, *x.args(), R, CC, T, what="operand transpose")
    return T


def _gemm_choice(dev, choice, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_mode, bias_bs, relu, what):
    cfg, ksplit = choice["cfg"], choice["ksplit"]
    if choice.get("ta"):  # A(m, k) -> A^T stored (K, M): loads along m
        A, a = _transposed(dev, A, a, M, K, batch), Mat(bs=K * M, rs=1, cs=M)
    if choice.get("tb"):  # B(k, n), k fastest, seen as (N, K) -> stored (K, N): loads along n
        assert not b.split, "a transposed B copy needs an unsplit B (gemm_candidates never offers it otherwise)"
        B, b = _transposed(dev, B, Mat(off=b.off, bs=b.bs, rs=b.cs, cs=b.rs), N, K, batch), Mat(bs=K * N, rs=N, cs=1)
    epilogue = dict(BIAS=bias_mode if bias is not None else 0, RELU=relu)
    ksplit, kc = tuning.slices(cfg, K, ksplit)
    if ksplit > 1:
        partial = empty((batch * ksplit * M * N,), dev)
        _gemm(dev, cfg, M, N, K, A, a, B, b, partial, Mat(bs=M * N, rs=N, cs=1), 1.0, 0.0, batch * ksplit,
              None, 0, {}, ksplit, kc, what)
        k = kernels.kernel(dev, "gemm.cl", "gemm_reduce", dict(C_SPLIT=c.split, **epilogue))
        kernels.launch(dev, k, (N, M, batch), None, M, N, ksplit, alpha, beta, partial, C, *c.args(), bias, bias_bs,
                       what=what + " (split-K sum)")
        return
    _gemm(dev, cfg, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_bs, epilogue, 1, K, what)


GEMM_FILES = dict(gemm_tiled="gemm.cl", gemm_block="gemm_cpu.cl")


def _gemm(dev, cfg, M, N, K, A, a, B, b, C, c, alpha, beta, zsize, bias, bias_bs, epilogue, ksplit, kc, what):
    name = cfg["kernel"]
    defines = {k: v for k, v in cfg.items() if k != "kernel"}
    defines.update(A_SPLIT=a.split, B_SPLIT=b.split, C_SPLIT=c.split, **epilogue)
    if name == "gemm_tiled":
        # float4 fetches where the operand's layout allows and each slice splits into float4s over the work-group
        float4s_per_round = 4 * (cfg["TM"] // cfg["WM"]) * (cfg["TN"] // cfg["WN"])
        defines.update(A_KFAST=_kfast_a(a), B_KFAST=_kfast_b(b),
                       A_VEC=_vec_a(a) and cfg["TM"] * cfg["TK"] % float4s_per_round == 0,
                       B_VEC=_vec_b(b) and cfg["TN"] * cfg["TK"] % float4s_per_round == 0, C_VEC=_vec_c(c))
        local = (cfg["TN"] // cfg["WN"], cfg["TM"] // cfg["WM"], 1)
        global_size = (-(-N // cfg["TN"]) * local[0], -(-M // cfg["TM"]) * local[1], zsize)
    else:
        defines.update(B_CONTIG=(b.cs == 1 and not b.split))
        local = (cfg["WG"], 1, 1) if cfg.get("WG") else None
        global_size = (-(-N // 16), -(-M // cfg["RM"]), zsize)
    k = kernels.kernel(dev, GEMM_FILES[name], name, defines)
    kernels.launch(dev, k, global_size, local, M, N, K, alpha, beta, A, *a.args(), B, *b.args(), C, *c.args(),
                   bias, bias_bs, ksplit, kc, what=what)


def _flat_launch(dev, k, n, *args, what=""):
    kernels.launch(dev, k, (n,), None, *args, what=what)


def fill(t, value):
    _flat_launch(t.device, kernels.kernel(t.device, "elementwise.cl", "fill"), t.size, t, float(value), t.size,
                 what="fill")
    return t


def zeros(shape, dev):
    return fill(empty(shape, dev), 0.0)


def mul(a, b):
    out = empty(a.shape, a.device)
    _flat_launch(a.device, kernels.kernel(a.device, "elementwise.cl", "mul"), a.size, a, b, out, a.size, what="mul")
    return out


ACTIVATIONS = {"relu": 1, "sigmoid": 2, "tanh": 3}


def activation_forward(name, x):
    y = empty(x.shape, x.device)
    k = kernels.kernel(x.device, "elementwise.cl", "act_fwd", dict(ACT=ACTIVATIONS[name]))
    _flat_launch(x.device, k, x.size, x, y, x.size, what=name)
    return y


def activation_backward(name, y, dy):
    dx = empty(y.shape, y.device)
    k = kernels.kernel(y.device, "elementwise.cl", "act_bwd", dict(ACT=ACTIVATIONS[name]))
    _flat_launch(y.device, k, y.size, y, dy, dx, y.size, what=name + " backward")
    return dx


def dropout_forward(x, p, seed):
    y, mask = empty(x.shape, x.device), empty(x.shape, x.device)
    k = kernels.kernel(x.device, "elementwise.cl", "dropout_fwd")
    _flat_launch(x.device, k, x.size, x, y, mask, x.size, float(p), np.uint32(seed & 0xFFFFFFFF), what="dropout")
    return y, mask


def bias_grad(dy, db, N, C, P):
    """db += sum of dy (N, C, P) over N and P. Few channels over many pixels (a first layer) would leave most of a GPU
    idle with a work-group per channel, so there each channel's sum is cut into runs first, then added in order. CPUs
    take a channel per work-item (bias_grad_planes)."""
    dev = dy.device
    if tuning.cpu_shaped(dev):
        k = kernels.kernel(dev, "elementwise.cl", "bias_grad_planes")
        kernels.launch(dev, k, (C,), None, dy, db, N, C, P, what="bias gradient")
        return
    lsize = 256 if dev.max_work_group_size >= 256 else 1 << (dev.max_work_group_size.bit_length() - 1)
    runs = tuning.reduction_runs(dev, N * P, C, lsize)
    if runs > 1:
        chunk = -(-N * P // runs)
        part = empty((runs, C), dev)
        k = kernels.kernel(dev, "elementwise.cl", "bias_grad", dict(LSIZE=lsize, PARTIAL=1))
        kernels.launch(dev, k, (C * lsize, runs), (lsize, 1), dy, part, N, C, P, chunk, what="bias gradient (runs)")
        dy, N, P = part, runs, 1
    k = kernels.kernel(dev, "elementwise.cl", "bias_grad", dict(LSIZE=lsize))
    kernels.launch(dev, k, (C * lsize,), (lsize,), dy, db, N, C, P, 0, what="bias gradient")


def softmax_forward(x, dim, log):
    outer = int(np.prod(x.shape[:dim], dtype=np.int64))
    inner = int(np.prod(x.shape[dim + 1:], dtype=np.int64))
    y = empty(x.shape, x.device)
    k = kernels.kernel(x.device, "softmax.cl", "softmax_fwd", dict(LOG=log))
    _flat_launch(x.device, k, outer * inner, x, y, outer, x.shape[dim], inner, what="softmax")
    return y


def softmax_backward(y, dy, dim, log):
    outer = int(np.prod(y.shape[:dim], dtype=np.int64))
    inner = int(np.prod(y.shape[dim + 1:], dtype=np.int64))
    dx = empty(y.shape, y.device)
    k = kernels.kernel(y.device, "softmax.cl", "softmax_bwd", dict(LOG=log))
    _flat_launch(y.device, k, outer * inner, y, dy, dx, outer, y.shape[dim], inner, what="softmax backward")
    return dx


def cross_entropy(logits, labels):
    """Mean cross-entropy of logits (N, C) and int32 labels (N,): (loss tensor of one element, d loss / d logits,
    metrics tensor (loss, number of rows whose prediction is the label))."""
    dev = logits.device
    N, C = logits.shape
    grad, loss, metrics = empty(logits.shape, dev), empty((), dev), empty((2,), dev)
    lsize = min(256, dev.max_work_group_size)
    lsize = 1 << (lsize.bit_length() - 1)
    k = kernels.kernel(dev, "softmax.cl", "cross_entropy", dict(LSIZE=lsize))
    kernels.launch(dev, k, (lsize,), (lsize,), logits, labels, N, C, grad, loss, metrics, what="cross-entropy")
    return loss, grad, metrics


def sgd_step(p, g, buf, lr, momentum, weight_decay, nesterov):
    k = kernels.kernel(p.device, "sgd.cl", "sgd_step", dict(MOMENTUM=momentum != 0, NESTEROV=nesterov))
    _flat_launch(p.device, k, p.size, p, g, buf, p.size, float(lr), float(momentum), float(weight_decay),
                 what="SGD step")


# ---- pooling -------------------------------------------------------------------------------------------------------

def _pool_args(x_shape, out_hw, k, s, p):
    N, C, H, W = x_shape
    return (N * C, H, W, k[0], k[1], s[0], s[1], p[0], p[1], out_hw[0], out_hw[1])


def maxpool_forward(x, out_hw, k, s, p):
    N, C = x.shape[:2]
    y = empty((N, C) + tuple(out_hw), x.device)
    idx = empty(y.shape, x.device, np.int32)
    if not tuning.cpu_shaped(x.device):
        kern, n = kernels.kernel(x.device, "pool.cl", "maxpool2d_fwd"), y.size
    else:  # one work-item per plane
        kern, n = kernels.kernel(x.device, "pool.cl", "maxpool2d_fwd_planes"), N * C
    _flat_launch(x.device, kern, n, x, *_pool_args(x.shape, out_hw, k, s, p), y, idx, what="max pooling")
    return y, idx


def maxpool_backward(dy, idx, x_shape, k, s, p):
    dx = empty(x_shape, dy.device)
    if not tuning.cpu_shaped(dy.device):
        kern, n = kernels.kernel(dy.device, "pool.cl", "maxpool2d_bwd"), dx.size
    else:  # one work-item per plane: scatter without a search per element
        kern, n = kernels.kernel(dy.device, "pool.cl", "maxpool2d_bwd_planes"), x_shape[0] * x_shape[1]
    _flat_launch(dy.device, kern, n, dy, idx, *_pool_args(x_shape, dy.shape[2:], k, s, p), dx,
                 what="max pooling backward")
    return dx


def avgpool_forward(x, out_hw, k, s, p, count_include_pad):
    N, C = x.shape[:2]
    y = empty((N, C) + tuple(out_hw), x.device)
    kern = kernels.kernel(x.device, "pool.cl", "avgpool2d_fwd", dict(COUNT_PAD=count_include_pad))
    _flat_launch(x.device, kern, y.size, x, *_pool_args(x.shape, out_hw, k, s, p), y, what="average pooling")
    return y


def avgpool_backward(dy, x_shape, k, s, p, count_include_pad):
    dx = empty(x_shape, dy.device)
    kern = kernels.kernel(dy.device, "pool.cl", "avgpool2d_bwd", dict(COUNT_PAD=count_include_pad))
    _flat_launch(dy.device, kern, dx.size, dy, *_pool_args(x_shape, dy.shape[2:], k, s, p), dx,
                 what="average pooling backward")
    return dx


# ---- convolution ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvShape:
    N: int
    C: int
    H: int
    W: int
    O: int
    KH: int
    KW: int
    SH: int
    SW: int
    PH: int  # top padding (bottom padding only changes OH)
    PW: int  # left padding
    DH: int
    DW: int
    G: int
    OH: int
    OW: int

    @property
    def pointwise(self):
        """1x1, stride 1, no padding: the input already is the lowered matrix."""
        return (self.KH, self.KW, self.SH, self.SW, self.PH, self.PW, self.OH, self.OW) == \
            (1, 1, 1, 1, 0, 0, self.H, self.W)

    def geometry(self, nimg):
        return (self.C, self.H, self.W, self.KH, self.KW, self.SH, self.SW, self.PH, self.PW, self.DH, self.DW,
                self.OH, self.OW, nimg)

    def chunk(self, dev):
        """Images per im2col chunk, so that the column buffer stays within the device's budget."""
        per_image = self.C * self.KH * self.KW * self.OH * self.OW * 4
        return max(1, min(self.N, tuning.col_bytes(dev) // max(per_image, 1)))


def _im2col(x, s, n0, nimg, col):
    rows = s.C * s.KH * s.KW
    if not tuning.cpu_shaped(x.device):
        k, size = kernels.kernel(x.device, "im2col.cl", "im2col"), (nimg * s.OH * s.OW, s.C)
    else:
        k, size = kernels.kernel(x.device, "im2col.cl", "im2col_rows"), (rows, nimg)
    kernels.launch(x.device, k, size, None, x, n0 * s.C * s.H * s.W, *s.geometry(nimg), col, what="im2col")


def _col2im(col, s, n0, nimg, dx):
    if not tuning.cpu_shaped(dx.device):
        k, size = kernels.kernel(dx.device, "im2col.cl", "col2im"), (nimg * s.C * s.H * s.W,)
    else:
        k, size = kernels.kernel(dx.device, "im2col.cl", "col2im_planes"), (s.C, nimg)
    kernels.launch(dx.device, k, size, None, col, *s.geometry(nimg), dx, n0 * s.C * s.H * s.W, what="col2im")


# Convolution algorithms. im2col + GEMM runs every shape; Winograd (winograd.py) runs 3x3 and 5x5 stride-1 layers
# with 2.25-4x fewer multiply-adds, and wins where channels are many (its transforms cost traffic per pixel); direct
# (direct.py, forward only) reads x and w in place, for few input channels. Forward, data gradient and weight
# gradient are three separate choices.
WINOGRAD_MIN_CHANNELS = 16
DIRECT_MAX_CHANNELS_CPU = 64  # input channels per group up to which direct is PoCL's default forward
WINOGRAD_TILE = {"winograd": 2, "winograd4": 4}  # algorithm name -> output tile side m of F(m x m, r x r)
LESS_ACCURATE = {"winograd4"}  # offered only with tuning.allow_less_accurate


def _conv_key(kind, s):
    return (f"{kind} {s.N}x{s.C}x{s.H}x{s.W} o{s.O} k{s.KH}x{s.KW} s{s.SH}x{s.SW} p{s.PH}x{s.PW} d{s.DH}x{s.DW} "
            f"g{s.G} out{s.OH}x{s.OW}")


def _conv_algorithm(dev, kind, s, run):
    """The algorithm for one pass (kind: conv2d_fwd, conv2d_bwd_data, conv2d_bwd_weights) of a layer of shape s:
    tuned, else the default, from those that can run it."""
    from . import direct, winograd  # both build on this module
    options = ["im2col"] + [a for a, m in WINOGRAD_TILE.items() if winograd.supported(s, m)
                            and (a not in LESS_ACCURATE or tuning.allow_less_accurate)]
    if kind == "conv2d_fwd" and direct.supported(s):
        options.append("direct")
    # Defaults from measurements. H200: the tuner picked F(2x2, 3x3)'s forward and data gradient for every VGG 3x3
    # layer. PoCL: direct beat im2col's forward 1.3-2.9x for 1 to 64 input channels per group (first layers,
    # LeNet, 3x3 64->64), and im2col's row-per-work-item lowering beats Winograd's transforms. Winograd's weight
    # gradient is slower on PoCL; on the H200 it took 0.36-0.45 of im2col's time at every VGG, AlexNet and OverFeat
    # 3x3 layer (bench/results/h200-v6). Direct on GPUs, and F(4x4, 3x3) where allowed: only the tuner picks them.
    if not dev.is_gpu and "direct" in options and s.C // s.G <= DIRECT_MAX_CHANNELS_CPU:
        default = "direct"
    elif dev.is_gpu and "winograd" in options and min(s.C, s.O) >= WINOGRAD_MIN_CHANNELS:
        default = "winograd"
    else:
        default = "im2col"
    return tuning.choose(dev, _conv_key(kind, s), lambda: default,
                         lambda: [default] + [a for a in options if a != default], run,
                         lambda cached: cached in options)


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d"):
    """y = conv(x, w) + bias (ReLU), by the algorithm tuned (or defaulted) for this shape."""
    from . import direct, winograd

    def run(algorithm):
        if algorithm in WINOGRAD_TILE:
            return winograd.conv2d_forward(x, w, bias, s, relu, what=what, m=WINOGRAD_TILE[algorithm])
        if algorithm == "direct":
            return direct.conv2d_forward(x, w, bias, s, relu, what=what)
        return _conv2d_forward_im2col(x, w, bias, s, relu, what)

    return run(_conv_algorithm(x.device, "conv2d_fwd", s, run))


def _conv2d_forward_im2col(x, w, bias, s, relu, what):
    dev = x.device
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    Og, Cg, KK, OHW = s.O // s.G, s.C // s.G, s.KH * s.KW, s.OH * s.OW
    chunk = s.chunk(dev)
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


def conv2d_backward(x, w, dy, s, dw, db, need_dx=True, what="Conv2d backward"):
    """Adds d loss / d w into dw (and d loss / d bias into db); returns d loss / d x (or None). Each gradient uses
    the algorithm tuned (or defaulted) for this shape; when both use im2col they share one lowering of x."""
    from . import winograd
    dev = x.device

    def weights(algorithm):
        if algorithm in WINOGRAD_TILE:
            winograd.conv2d_backward_weights(x, dy, s, dw, what=what + " (weights)", m=WINOGRAD_TILE[algorithm])
        else:
            _conv2d_backward_im2col(x, w, dy, s, dw, False, what)

    def data(algorithm):
        if algorithm in WINOGRAD_TILE:
            return winograd.conv2d_backward_data(w, dy, s, what=what + " (data)", m=WINOGRAD_TILE[algorithm])
        return _conv2d_backward_im2col(x, w, dy, s, None, True, what)

    w_alg = _conv_algorithm(dev, "conv2d_bwd_weights", s, weights)
    x_alg = _conv_algorithm(dev, "conv2d_bwd_data", s, data) if need_dx else None
    if db is not None:
        bias_grad(dy, db, s.N, s.O, s.OH * s.OW)
    if w_alg == "im2col" and x_alg in ("im2col", None):
        return _conv2d_backward_im2col(x, w, dy, s, dw, need_dx, what)
    weights(w_alg)
    return data(x_alg) if need_dx else None


def _conv2d_backward_im2col(x, w, dy, s, dw, need_dx, what):
    """dw += the weight gradient (unless dw is None); returns dx (if need_dx): im2col + GEMM, one lowering of x per
    chunk of images serving both."""
    dev = x.device
    Og, Cg, KK, OHW = s.O // s.G, s.C // s.G, s.KH * s.KW, s.OH * s.OW
    chunk = s.chunk(dev)
    col = empty((s.C * KK * chunk * OHW,), dev)
    dx = empty(x.shape, dev) if need_dx else None
    for n0 in range(0, s.N, chunk):
        nimg = min(chunk, s.N - n0)
        NP = nimg * OHW
        dy_cols = Mat(off=n0 * s.O * OHW, bs=Og * OHW, rs=OHW, cs=1, cdiv=OHW if nimg > 1 else NO_SPLIT,
                      cso=s.O * OHW if nimg > 1 else 0)
        if dw is not None:
            _im2col(x, s, n0, nimg, col)
            # dw_g (Og, Cg*KK) += dy_g (Og, NP) @ col_g^T (NP, Cg*KK)
            gemm(Og, Cg * KK, NP, dy, dy_cols, col, Mat(bs=Cg * KK * NP, rs=1, cs=NP), dw,
                 Mat(bs=Og * Cg * KK, rs=Cg * KK, cs=1), beta=1.0, batch=s.G, what=what + " (weights)")
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


# ---- dense ---------------------------------------------------------------------------------------------------------

def linear_forward(x, w, bias, relu=False, what="Linear"):
    N, I = x.shape
    O = w.shape[0]
    y = empty((N, O), x.device)
    gemm(N, O, I, x, Mat(rs=I, cs=1), w, Mat(rs=1, cs=I), y, Mat(rs=O, cs=1), bias=bias, bias_mode=2, relu=relu,
         what=what)
    return y


def linear_backward(x, w, dy, dw, db, need_dx=True, what="Linear backward"):
    N, I = x.shape
    O = w.shape[0]
    gemm(O, I, N, dy, Mat(rs=1, cs=O), x, Mat(rs=I, cs=1), dw, Mat(rs=I, cs=1), beta=1.0, what=what + " (weights)")
    if db is not None:
        bias_grad(dy, db, N, O, 1)
    if not need_dx:
        return None
    dx = empty((N, I), x.device)
    gemm(N, I, O, dy, Mat(rs=O, cs=1), w, Mat(rs=I, cs=1), dx, Mat(rs=I, cs=1), what=what + " (data)")
    return dx
