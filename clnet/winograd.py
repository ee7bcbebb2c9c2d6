"""Winograd F(2x2, 3x3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015) for
3x3, stride-1, undilated, ungrouped layers: forward and the gradient with respect to the input.

The output is cut into 2x2 tiles, each computed from a 4x4 input tile (stride 2) as
Y = A^T [ sum over c of (G g G^T) .* (B^T d B) ] A. Summed over input channels, each of the 16 element-wise products is
a matrix product, so the work is three kernels (cl_kernels/winograd.cl) around one batched GEMM:

    U (16, O, C)  = G w G^T                      winograd_weights, every call (weights change every step)
    V (16, C, P)  = B^T x B, P = N * tiles       winograd_input
    M (16, O, P)  = U @ V                        ops.gemm, batch 16
    y (N, O, OH, OW) = A^T M A + bias (ReLU)     winograd_output

What it saves and what it costs, against im2col + GEMM (O x N*OH*OW x 9C):

- Multiplies. A 2x2 output tile needs 16 products per (o, c) instead of 4 * 9 = 36: the GEMM does 2.25x fewer
  multiply-adds (16 products of O x P x C with P ~ N*OH*OW/4, against one O x N*OH*OW x 9C).
- Memory. V holds 16 values per 4 input pixels: 4x the input's size (im2col's column buffer is 9x, so the lowered
  input is smaller). But M is 4x the output's size, written by the GEMM and read back by the output transform, where
  im2col's GEMM writes y directly; and U is 16/9 the weights' size. The transforms themselves are a few additions per
  element (about 8 per input pixel and channel, 6 per output pixel and channel) and are bandwidth-bound.
- Odd output sizes waste the clipped half tiles: ceil(OH/2)*ceil(OW/2)*4 / (OH*OW) of the GEMM work is real
  (0.77 of it for 7x7, 0.56 for 3x3, 0.25 for 1x1; all of it for even sizes).

When it should win: large C and O (say 64 and up) on sizes where the GEMM dominates, the body of VGG/ResNet-style
networks: the 2.25x saving is on O*C work, the extra traffic only on (O + C) * pixels. When it should lose: small C,
above all a first layer with C = 3 (the GEMM's depth is 3, the transforms and M traffic dominate), and tiny spatial
sizes (clipped tiles). On PoCL (2 cores, a busy machine), N=8, 28x28, padding 1, forward: C=O=64 11.7 ms against
im2col's 41.3 ms (its GEMM alone 12.7 against 48 ms); C=3, O=64 6.2 ms against 3.8 ms (the output transform alone
takes longer than im2col's whole GEMM). Precision: F(2, 3)'s transforms only add, subtract and halve; the float32
error stays within 2x of im2col's (measured in tests/test_winograd.py).

The backward-data pass is itself a Winograd convolution. From y[oy] = sum_ky w[ky] x[oy + ky - PH] (one axis shown;
the other is the same), dx[i] = sum_ky w[ky] dy[i + PH - ky] with dy zero outside [0, OH). Put ky' = 2 - ky:
dx[i] = sum_ky' w[2 - ky'] dy[i + ky' - (2 - PH)], a 3x3 stride-1 correlation of dy with the kernel rotated by 180
degrees and its channels swapped (O <-> C), top padding 2 - PH and output size H. Its bottom padding is implied by
that output size: it reads dy rows up to H - 1 + PH (zero past OH - 1), a bottom padding of H - OH + PH = 2 - PHb,
where PHb = OH + 2 - H - PH is the forward's bottom padding. Asymmetric padding therefore needs nothing special, and a
forward padding over 2 gives a negative top padding, which the input transform's bounds checks take as an offset.
"""
from . import kernels, tuning
from .ops import ConvShape, Mat, gemm
from .tensor import empty


def supported(s):
    """Whether a layer of shape s (an ops.ConvShape) can run here: a 3x3 kernel, stride 1, dilation 1, one group."""
    return (s.KH, s.KW, s.SH, s.SW, s.DH, s.DW, s.G) == (3, 3, 1, 1, 1, 1, 1)


def tiles(s):
    """(TH, TW): 2x2 output tiles per image, rows and columns."""
    return -(-s.OH // 2), -(-s.OW // 2)


def chunk(s, dev):
    """Images per chunk, so that V and M together stay within the im2col column budget (tuning.col_bytes)."""
    th, tw = tiles(s)
    per_image = 16 * (s.C + s.O) * th * tw * 4
    return max(1, min(s.N, tuning.col_bytes(dev) // per_image))


def transform_weights(w, O, C, flip=False):
    """U (16, O, C) = G w G^T for w (O, C, 3, 3); with flip the backward-data weights U (16, C, O) of rot180(w)."""
    dev = w.device
    U = empty((16, O, C), dev)
    k = kernels.kernel(dev, "winograd.cl", "winograd_weights", dict(FLIP=flip))
    kernels.launch(dev, k, (O * C,), None, w, O, C, U, what="Winograd weight transform")
    return U


def _convolve(x, U, bias, s, relu, what):
    """y (N, O, OH, OW) for transformed weights U (16, O, C); the shared body of forward and backward-data."""
    dev = x.device
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    th, tw = tiles(s)
    n_chunk = chunk(s, dev)
    P_max = n_chunk * th * tw
    V = empty((16 * s.C * P_max,), dev)
    M = empty((16 * s.O * P_max,), dev)
    k_in = kernels.kernel(dev, "winograd.cl", "winograd_input")
    k_out = kernels.kernel(dev, "winograd.cl", "winograd_output", dict(BIAS=bias is not None, RELU=relu))
    for n0 in range(0, s.N, n_chunk):
        nimg = min(n_chunk, s.N - n0)
        P = nimg * th * tw
        kernels.launch(dev, k_in, (P, s.C), None, x, n0 * s.C * s.H * s.W, s.C, s.H, s.W, s.PH, s.PW, th, tw, nimg,
                       V, what=what + " (Winograd input transform)")
        gemm(s.O, P, s.C, U, Mat(bs=s.O * s.C, rs=s.C, cs=1), V, Mat(bs=s.C * P, rs=P, cs=1), M,
             Mat(bs=s.O * P, rs=P, cs=1), batch=16, what=what + " (Winograd products)")
        kernels.launch(dev, k_out, (P, s.O), None, M, bias, s.O, s.OH, s.OW, th, tw, nimg, y, n0 * s.O * s.OH * s.OW,
                       what=what + " (Winograd output transform)")
    return y


def _check(s, what):
    if not supported(s):
        raise ValueError(f"{what}: Winograd F(2x2, 3x3) needs a 3x3 kernel, stride 1, dilation 1 and groups=1, got "
                         f"kernel {s.KH}x{s.KW}, stride ({s.SH}, {s.SW}), dilation ({s.DH}, {s.DW}), groups {s.G}")


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d"):
    """The same contract as ops.conv2d_forward, for shapes where supported(s) holds.

    Parameters
    ----------
    x : Tensor (N, C, H, W)
    w : Tensor (O, C, 3, 3)
    bias : Tensor (O,) or None
    s : ops.ConvShape; s.PH, s.PW are the top and left paddings, s.OH, s.OW the output size (which implies the
        bottom and right paddings)
    relu : apply max(0, .) after the bias

    Returns
    -------
    Tensor (N, O, OH, OW)
    """
    _check(s, what)
    return _convolve(x, transform_weights(w, s.O, s.C), bias, s, relu, what)


def backward_data_shape(s):
    """The ConvShape of the convolution that computes dx from dy (see the module docstring)."""
    return ConvShape(s.N, s.O, s.OH, s.OW, s.C, 3, 3, 1, 1, 2 - s.PH, 2 - s.PW, 1, 1, 1, s.H, s.W)


def conv2d_backward_data(w, dy, s, what="Conv2d backward"):
    """d loss / d x (N, C, H, W) from dy (N, O, OH, OW) and the weights w (O, C, 3, 3) of the forward shape s."""
    _check(s, what)
    return _convolve(dy, transform_weights(w, s.O, s.C, flip=True), None, backward_data_shape(s), False,
                     what + " (data)")
