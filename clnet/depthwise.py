"""Depthwise convolution (groups == in_channels, any channel multiplier M = out_channels / in_channels): forward,
data gradient and weight gradient, each reading its operands in place (cl_kernels/depthwise.cl).

A depthwise layer is G = C groups of one input channel each. Through im2col + GEMM that is C products of M rows by
KH*KW deep, each launch's tiles almost empty, after writing a column buffer KH*KW/(SH*SW) times the input; every pass
here instead reads its inputs once and writes its output once (caches serve the window's overlap).

Work and traffic per pass (2 flops a multiply-add; bytes as float32, each input read once, the output written once):
forward 2*KH*KW flops per output against 4 bytes of y and 4*(C/O)*SH*SW of x; data gradient the same; weight
gradient the same flops, reading x and dy. A 3x3 layer at stride 1 is 18 flops per 8 bytes, 2.25 flops a byte,
far below any device's ratio of arithmetic to bandwidth (the H200: 67 TFLOP/s over 4.2 TB/s, 16 flops a byte): every
pass is a memory-bound stream, and its time is its bytes over the device's bandwidth. bench/NOTES.md has
mobilenet_v2's layers counted, the prediction and the measurements.
"""
from . import kernels, tuning
from .tensor import empty

MAX_TAPS = 64  # the window's taps each weight-gradient work-item keeps in registers (depthwise.cl's limit)
# GPU shape: work-items per work-group of the element-wise passes, and of the weight gradient's (whose local memory
# holds KH*KW sums a work-item: 256 of them for windows up to 5x5, 128 beyond, within 48 KiB). The weight gradient's
# pixels are cut into runs until there are about WAVES work-groups per compute unit, each run at least MIN_RUN pixels
# a work-item. CPUs take a channel per work-item, every image in one run.
LS_GPU = 256
PY_GPU = 4  # GPU forward and stride-1 data gradient: outputs down a column per work-item (depthwise.cl's PY)
WEIGHT_WAVES = 4
MIN_RUN = 32
# CPU shape, small planes: a work-item takes a whole plane through a zero-bordered private tile of PLANE_TW floats a
# row (the smallest that holds the plane's columns) and at most that plus PLANE_ROWS_EXTRA rows (depthwise_cpu.cl)
PLANE_TW = (16, 32)
PLANE_ROWS_EXTRA = 8
PLANE_ITEMS = 16  # plane kernels' work-items a compute unit, each taking a run of planes


def supported(s):
    """Whether shape s (an shapes.ConvShape) is depthwise with a window these kernels hold: one input channel per
    group, any multiplier, stride, padding and dilation, at most MAX_TAPS taps."""
    return s.G == s.C and s.O % s.C == 0 and s.KH * s.KW <= MAX_TAPS and min(s.N, s.OH, s.OW) >= 1


def _check(s, what, **tensors):
    if not supported(s):
        raise ValueError(f"{what}: the depthwise kernels need groups == in_channels, out_channels a multiple of it "
                         f"and at most {MAX_TAPS} taps, got {s}; use conv.conv2d_forward, which picks an algorithm "
                         "that runs it")
    shapes = dict(x=(s.N, s.C, s.H, s.W), w=(s.O, 1, s.KH, s.KW), dy=(s.N, s.O, s.OH, s.OW))
    for name, t in tensors.items():
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"{what}: expected {name} of shape {shapes[name]}, got {tuple(t.shape)}")


def _args(s):
    return (s.N, s.C, s.H, s.W, s.O, s.SH, s.SW, s.PH, s.PW, s.DH, s.DW, s.OH, s.OW)


def _weight_ls(dev, s):
    """Work-items per work-group of the GPU weight gradient: its local memory holds KH*KW sums a work-item."""
    taps = s.KH * s.KW
    ls = LS_GPU if taps <= 25 else LS_GPU // 2
    while ls > 32 and taps * ls * 4 > dev.local_mem_size // 2:
        ls //= 2
    return ls


def _kernel(dev, name, s):
    """Kernel `name` of depthwise.cl for s's window: one build per window and device, every kernel in it."""
    return kernels.kernel(dev, "depthwise.cl", name, dict(KH=s.KH, KW=s.KW, PY=PY_GPU, LS=_weight_ls(dev, s)))


def planes_tile(dev, s, which):
    """(TW, TH) of depthwise_cpu.cl's plane kernels for pass `which` ("forward", "data", "weights") of s on dev, or
    None where they do not run it: a GPU-shaped device, a plane whose tile is too large (the row kernels are fast
    there), a row stride other than 1 or 2, a data gradient at a stride other than 1 (a scatter into a tile of dx was
    slower than the row kernel there: bench/NOTES.md, v20)."""
    if not tuning.cpu_shaped(dev):
        return None
    if s.SW not in (1, 2):
        return None
    rows, cols = (s.OH - 1) * s.SH + (s.KH - 1) * s.DH + 1, (s.OW - 1) * s.SW + (s.KW - 1) * s.DW + 1
    if which == "data":  # dy through the flipped window
        if (s.SH, s.SW) != (1, 1):
            return None
        rows, cols = s.H + (s.KH - 1) * s.DH, s.W + (s.KW - 1) * s.DW
    for tw in PLANE_TW:
        if cols <= tw and rows <= tw + PLANE_ROWS_EXTRA:
            return tw, tw + PLANE_ROWS_EXTRA
    return None


def _planes_kernel(dev, name, s, tile):
    return kernels.kernel(dev, "depthwise_cpu.cl", name, dict(KH=s.KH, KW=s.KW, TW=tile[0], TH=tile[1]))


def _planes_grid(dev, n):
    """(global size, local size, planes a work-item) of a plane kernel over n planes: about PLANE_ITEMS work-items a
    core, each taking a run of consecutive planes, in work-groups of one. Left to choose the work-group itself, PoCL
    3.1 crashed its compiler at 3072 planes (stack smashing) and ran the 7x7 forward at 2.3 ms with groups of 16
    against 0.74 with groups of 1; runs of planes took 5-20% off the 7x7 and 14x14 passes (noisy; NOTES.md v20)."""
    per = max(1, n // (PLANE_ITEMS * dev.compute_units))
    return (-(-n // per),), (1,), per


def _planes_launch(dev, s, which, name, n):
    """(kernel, global size, local size, trailing arguments) of a plane kernel over n planes for pass `which`, or
    None where the plane kernels do not run it (planes_tile)."""
    tile = planes_tile(dev, s, which)
    if not tile:
        return None
    size, local, per = _planes_grid(dev, n)
    return _planes_kernel(dev, name, s, tile), size, local, (per,)


def weight_runs(dev, s):
    """(runs, chunk, LS) of the weight gradient of shape s on dev: chunk pixels a run on a GPU (images on a CPU), LS
    work-items a work-group (GPU)."""
    if tuning.cpu_shaped(dev):
        return 1, s.N, 1
    ls = _weight_ls(dev, s)
    pixels = s.N * s.OH * s.OW
    runs = max(1, min(-(-pixels // (MIN_RUN * ls)), -(-WEIGHT_WAVES * dev.compute_units // s.O)))
    chunk = -(-pixels // runs)
    return -(-pixels // chunk), chunk, ls


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d"):
    """y = conv(x, w) + bias (then ReLU): the contract of conv.conv2d_forward for a depthwise shape s."""
    _check(s, what, x=x, w=w)
    dev = x.device
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    flags = (1 if bias is not None else 0) | (2 if relu else 0)
    planes = _planes_launch(dev, s, "forward", "conv2d_fwd_depthwise_cpu_planes", s.N * s.O)
    tail = ()  # the plane kernels' planes a work-item
    if planes:
        k, size, local, tail = planes
    elif tuning.cpu_shaped(dev):
        k, size, local = _kernel(dev, "conv2d_fwd_depthwise_rows", s), (s.OH, s.N * s.O), None
    else:
        size = (s.N * s.O * -(-s.OH // PY_GPU) * s.OW,)
        k, local = _kernel(dev, "conv2d_fwd_depthwise", s), (LS_GPU,)
    kernels.launch(dev, k, size, local, x, w, bias, y, *_args(s), flags, *tail, what=what + " (depthwise)")
    return y


def conv2d_backward_data(w, dy, s, what="Conv2d backward (data)"):
    """d loss / d x of a depthwise layer of shape s, from its weights and output gradient."""
    _check(s, what, w=w, dy=dy)
    dev = dy.device
    dx = empty((s.N, s.C, s.H, s.W), dev)
    planes = _planes_launch(dev, s, "data", "conv2d_bwd_data_depthwise_cpu_planes", s.N * s.C)
    tail = ()
    if planes:
        k, size, local, tail = planes
    elif tuning.cpu_shaped(dev):
        k, size, local = _kernel(dev, "conv2d_bwd_data_depthwise_rows", s), (s.H, s.N * s.C), None
    elif (s.SH, s.SW) == (1, 1):
        size = (s.N * s.C * -(-s.H // PY_GPU) * s.W,)
        k, local = _kernel(dev, "conv2d_bwd_data_depthwise_s1", s), (LS_GPU,)
    else:
        k, size, local = (_kernel(dev, "conv2d_bwd_data_depthwise", s), (s.N * s.C * s.H * s.W,),
                          (LS_GPU,))
    kernels.launch(dev, k, size, local, w, dy, dx, *_args(s), *tail, what=what + " (depthwise)")
    return dx


def conv2d_backward_weights(x, dy, s, dw, beta=1.0, what="Conv2d backward (weights)"):
    """dw += d loss / d w (beta 0: dw = it, dw not read) for a depthwise layer of shape s. A sum runs over N*OH*OW
    pixels per weight: cut into runs where the output channels alone would leave the device idle, each run's sums
    kept apart and then added in order (weight_runs)."""
    _check(s, what, x=x, dy=dy)
    dev = x.device
    accumulate = int(beta != 0.0)
    tile = planes_tile(dev, s, "weights")
    if tile:
        k = _planes_kernel(dev, "conv2d_bwd_weights_depthwise_cpu_planes", s, tile)
        kernels.launch(dev, k, (s.O,), (1,), x, dy, dw, *_args(s), accumulate, what=what + " (depthwise)")
        return dw
    cpu = tuning.cpu_shaped(dev)
    runs, chunk, ls = weight_runs(dev, s)
    out = dw if runs == 1 else empty((runs, s.O, s.KH * s.KW), dev)
    tail = (chunk, int(runs > 1), accumulate)
    if cpu:
        k = _kernel(dev, "conv2d_bwd_weights_depthwise_planes", s)
        kernels.launch(dev, k, (s.O, runs), kernels.ANY_GROUP, x, dy, out, *_args(s), *tail, what=what + " (depthwise)")
    else:
        k = _kernel(dev, "conv2d_bwd_weights_depthwise", s)
        kernels.launch(dev, k, (s.O * ls, runs), (ls, 1), x, dy, out, *_args(s), *tail, what=what + " (depthwise)")
    if runs > 1:
        count = s.O * s.KH * s.KW
        k = _kernel(dev, "conv2d_depthwise_sum_runs", s)
        kernels.launch(dev, k, (count,), kernels.ANY_GROUP, out, dw, count, runs, accumulate,
                       what=what + " (depthwise runs)")
    return dw
