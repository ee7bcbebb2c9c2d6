"""Direct convolution, forward, for layers with few input channels (first layers): x and w are read in place, with no
column buffer (cl_kernels/conv_direct.cl).

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
