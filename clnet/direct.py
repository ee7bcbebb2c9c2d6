"""Direct convolution, forward, for layers with few input channels (first layers): x and w are read in place, with no
column buffer (cl_kernels/conv_direct.cl). Also both gradients of small layers, a launch each (conv2d_backward_data,
conv2d_backward_weights): im2col's backward takes four (im2col, two products, col2im), and at batch 1 launches are the
step's cost (lenet-wide's 31 launches a replayed step, 8 of them in its two 120-channel layers' backward).

im2col + GEMM lowers x into a (C*KH*KW, N*OH*OW) buffer, KH*KW/(SH*SW) times the input (25x for LeNet's conv1, 7.6x
for AlexNet's, 9x for VGG's), writes it and reads it back, then runs a GEMM only C*KH*KW deep (25, 363, 27). The direct
kernels do the same multiply-adds straight from x, which stays in cache (a row of output reads C*KH input rows).

Work and traffic (forward, multiply-adds counted as 2 FLOPs; bytes of x + w + y, then of im2col's column buffer):

    LeNet conv1   N=64, 1->20, 5x5, 28x28       37 MFLOP   x 0.2 MB, y 2.9 MB; column buffer 3.7 MB (w+r 7.4)
    AlexNet conv1 N=8, 3->64, 11x11/4 pad 2     1.12 GFLOP x 4.8 MB, y 6.2 MB; column buffer 35 MB  (w+r 70)
    VGG conv1     N=2, 3->64, 3x3 pad 1         0.35 GFLOP x 1.2 MB, y 25.7 MB; column buffer 10.8 MB (w+r 22)

Prediction, before measuring (PoCL, 2 cores, about 170 GFLOP/s for a large GEMM): LeNet and VGG are shallow GEMMs
(K = 25, 27) bound by writing y and by the column buffer's round trip; a direct kernel with a register block of output
channels times pixels should win by 1.5-2x there. AlexNet's GEMM is deep enough (K = 363) to run near peak, and a
vector over pixels gathers x at stride 4, so direct should be about even or lose.

Measured with a scratch script, not in bench/results (PoCL, 2 cores shared with other jobs; forward with bias and
ReLU, medians of 5 runs of 15, im2col + GEMM against direct, weight packing included): LeNet conv1 2.55 -> 1.38 ms
(1.9x), AlexNet conv1 N=8 25.9 -> 9.2 ms (2.9x, 122 GFLOP/s), VGG conv1 N=2 11.8 -> 5.5 ms (2.2x, near the time to
write y's 25.7 MB). The AlexNet miss: the first version did vectorise over pixels, and there it tied im2col (33-48 ms
against 28-45 in the same runs); with vectors over output channels and weights packed per tap (below) the stride costs
nothing. Direct also won, less, beyond first layers: 3->64 5x5 'same' on 32x32, N=32, 7.4 -> 5.2 ms; 16->64 and 64->64
3x3 on 28x28, N=8, 2.6 -> 2.0 and 7.0 -> 5.1 ms.
"""
from . import kernels, tuning
from .tensor import empty

def supported(s):
    """Whether a layer of shape s (an shapes.ConvShape) can run here: every kernel size, stride, padding, dilation and
    group count (depthwise included). It is meant for few input channels per group, where im2col's buffer is largest
    against the GEMM's work; on PoCL it still beat im2col at 64->64 3x3 on 28x28 (module docstring); on GPUs it is
    not measured yet."""
    return s.G >= 1 and s.C % s.G == 0 and s.O % s.G == 0 and min(s.N, s.C, s.O, s.OH, s.OW) >= 1


def _blocks(s, ob):
    """Channel blocks: ceil(Og/OB) per group, so that no block straddles two groups."""
    return s.G * -(-(s.O // s.G) // ob)


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d", cfg=None):
    """y = conv(x, w) + bias, then ReLU if relu: the contract of conv.conv2d_forward, computed directly.

    Parameters
    ----------
    x : Tensor (N, C, H, W)
    w : Tensor (O, C/G, KH, KW)
    bias : Tensor (O,) or None
    s : shapes.ConvShape; s.PH, s.PW are the top and left paddings, s.OH, s.OW the output size (which implies the
        bottom and right paddings)
    relu : apply max(0, .) after the bias
    what : the name error messages give the operation
    cfg : a kernel entry (DIRECT_CPU- or DIRECT_GPU-like) to use instead of the device class's default

    Returns
    -------
    Tensor (N, O, OH, OW)
    """
    if not supported(s):
        raise ValueError(f"{what}: direct convolution needs channels divisible by groups and a non-empty output, got "
                         f"{s}")
    for name, t, shape in (("x", x, (s.N, s.C, s.H, s.W)), ("w", w, (s.O, s.C // s.G, s.KH, s.KW))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{what}: expected {name} of shape {shape}, got {tuple(t.shape)}")
    dev = x.device
    cfg = cfg or tuning.direct_config(dev, s)
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    ob = cfg["OB"]
    defines = dict(OB=ob, BIAS=bias is not None, RELU=relu)
    args = (x, w, bias, y, s.C, s.H, s.W, s.O, s.G, s.KH, s.KW, s.SH, s.SW, s.PH, s.PW, s.DH, s.DW, s.OH, s.OW)
    blocks = _blocks(s, ob)
    if cfg["kernel"] == "conv2d_fwd_direct_rows":
        ckk = (s.C // s.G) * s.KH * s.KW
        wp = empty((blocks * ckk * ob,), dev)
        pack = kernels.kernel(dev, "conv_direct.cl", "conv2d_direct_pack", dict(OB=ob))
        kernels.launch(dev, pack, (ckk * ob, blocks), kernels.ANY_GROUP, w, wp, s.O, s.G, ckk,
                       what=what + " (direct, weights)")
        defines.update(PX=cfg["PX"])
        k = kernels.kernel(dev, "conv_direct.cl", cfg["kernel"], defines)
        local = (1, cfg["ROWS"], 1) if cfg["ROWS"] else None
        kernels.launch(dev, k, (blocks, s.OH, s.N), local, x, wp, *args[2:], what=what + " (direct)")
    else:
        ls = min(cfg["LS"], dev.max_work_group_size)
        need = ob * (s.C // s.G) * s.KH * s.KW
        wlocal = 0
        if need <= cfg["WLOCAL_MAX"]:
            wlocal = max(64, 1 << (need - 1).bit_length())  # a power of two: few builds across shapes
            wlocal = wlocal if wlocal * 4 <= dev.local_mem_size // 2 else 0
        defines.update(WLOCAL=wlocal)
        k = kernels.kernel(dev, "conv_direct.cl", cfg["kernel"], defines)
        kernels.launch(dev, k, (s.OH * s.OW, blocks, s.N), (ls, 1, 1), *args, what=what + " (direct)")
    return y


# The gradients' kernels are GPU-shaped (a work-item an output element): on PoCL they ran 10-15x slower than im2col's
# (bench/direct_backward.py), so conv._conv_algorithm offers them to GPU-shaped devices' tuners alone, and for small
# layers alone: the weight gradient sums N*OH*OW terms in one running sum a weight, at most this many (as long as an
# unsplit product over a 64x64 plane's pixels; longer sums are the products' split-K work), and the data gradient's
# serial loops grow with the same batch and planes.
TERMS_MAX = 4096
DATA_BLOCK = 4  # input channels a work-item of the data gradient takes (sharing each load of dy)


def backward_supported(s):
    """Whether the direct gradients take layer s: supported(s), at most TERMS_MAX terms in a weight's sum."""
    return supported(s) and s.N * s.OH * s.OW <= TERMS_MAX


def conv2d_backward_data(w, dy, s, what="Conv2d backward (data)"):
    """dx (N, C, H, W) of a layer of shape s from its weights and output gradient, in one launch."""
    dx = empty((s.N, s.C, s.H, s.W), dy.device)
    blocks = s.G * -(-(s.C // s.G) // DATA_BLOCK)
    k = kernels.kernel(dy.device, "conv_direct.cl", "conv2d_bwd_data_direct", dict(OB=DATA_BLOCK))
    kernels.launch(dy.device, k, (s.H * s.W, blocks, s.N), (min(128, dy.device.max_work_group_size), 1, 1), dy, w, dx,
                   s.C, s.H, s.W, s.O, s.G, s.KH, s.KW, s.SH, s.SW, s.PH, s.PW, s.DH, s.DW, s.OH, s.OW,
                   what=what + " (direct)")
    return dx


def conv2d_backward_weights(x, dy, s, dw, beta=1.0, what="Conv2d backward (weights)"):
    """dw = beta * dw + the weight gradient of a layer of shape s (beta 0: dw not read), in one launch."""
    if not backward_supported(s):
        raise ValueError(f"{what}: the direct weight gradient sums at most {TERMS_MAX} terms a weight; a batch "
                         f"of {s.N} over {s.OH}x{s.OW} outputs needs {s.N * s.OH * s.OW}")
    k = kernels.kernel(x.device, "conv_direct.cl", "conv2d_bwd_weights_direct", dict(OB=DATA_BLOCK))
    kernels.launch(x.device, k, (s.O * (s.C // s.G) * s.KH * s.KW,), kernels.ANY_GROUP, x, dy, dw, float(beta),
                   int(beta != 0.0), s.N, s.C, s.H, s.W, s.O, s.G, s.KH, s.KW, s.SH, s.SW, s.PH, s.PW, s.DH, s.DW,
                   s.OH, s.OW, what=what + " (direct)")
    return dw
