"""Winograd F(2x2, 3x3) convolution (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015) for
3x3, stride-1, undilated, ungrouped layers: forward and the gradients with respect to the input and the weights.

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
sizes (clipped tiles). On PoCL, with its tile-per-work-item transforms, Winograd lost to the row-per-work-item im2col
at the shapes measured (N=8, C=O=64, 28x28: 7 against 4 ms forward; scratch measurements), so it is the default on
GPUs only (ops._conv_algorithm); on the H200 the tuner picked it for every VGG 3x3 layer but the first
(bench/results/h200-v5). Precision: F(2, 3)'s transforms only add, subtract and halve; the float32
error stays within 2x of im2col's (measured in tests/test_winograd.py).

The backward-data pass is itself a Winograd convolution. From y[oy] = sum_ky w[ky] x[oy + ky - PH] (one axis shown;
the other is the same), dx[i] = sum_ky w[ky] dy[i + PH - ky] with dy zero outside [0, OH). Put ky' = 2 - ky:
dx[i] = sum_ky' w[2 - ky'] dy[i + ky' - (2 - PH)], a 3x3 stride-1 correlation of dy with the kernel rotated by 180
degrees and its channels swapped (O <-> C), top padding 2 - PH and output size H. Its bottom padding is implied by
that output size: it reads dy rows up to H - 1 + PH (zero past OH - 1), a bottom padding of H - OH + PH = 2 - PHb,
where PHb = OH + 2 - H - PH is the forward's bottom padding. Asymmetric padding therefore needs nothing special, and a
forward padding over 2 gives a negative top padding, which the input transform's bounds checks take as an offset.

The weight gradient differentiates the forward's three steps in reverse. Per tile p, y_p = A^T M_p A with
M_p[o] = sum over c of U[o, c] .* V[c, p], and U[o, c] = G w[o, c] G^T. The adjoint of M -> A^T M A is
dY -> A dY A^T, so d loss / d M_p[o] = Z_p[o] = A dY_p[o] A^T, where dY_p is the 2x2 tile of dy, zero where the tile
overhangs the output (the forward never wrote those outputs, so no loss depends on them). The element-wise product
gives d loss / d U[o, c] = Mhat[o, c] = sum over p of Z_p[o] .* V[c, p], and the adjoint of g -> G g G^T gives
dw[o, c] += G^T Mhat[o, c] G. Element xi of the 4x4 tiles again makes a matrix product per xi:

    V (16, P, C)  = B^T x B                      winograd_input, stored p-major (V_PC)
    Z (16, P, O)  = A dy A^T                     winograd_grad_output
    Mhat (16, O, C) += Z^T @ V                   ops.gemm, batch 16, K = P; chunks of images accumulate (beta = 1)
    dw (O, C, 3, 3) += G^T Mhat G                winograd_grad_weights, once after the last chunk

Both GEMM operands are stored with k (the tile index p) slowest, as the GEMM kernels load fastest. The GEMM does
16*O*C*P multiply-adds, P ~ N*OH*OW/4, against 9*O*C*N*OH*OW for im2col's (O x 9C x N*OH*OW): 2.25x fewer again,
with the same clipped-tile waste for odd sizes. The buffers are V and Z, 4x the input's and the output gradient's
sizes, against im2col's 9x column buffer; the transforms are bandwidth-bound as in the forward. The reduction runs
over P: its float32 sums are as long as im2col's over N*OH*OW, divided by 4 (split-K shortens both alike). On PoCL
(2 cores, quiet machine), N=8, C=O=64, 28x28, padding 1: 9.1 ms against im2col's 5.1 ms. The GEMM wins (1.3-1.7 ms
against 4.5), but the input and output-gradient transforms take about 3.4 and 3.0 ms, where im2col's whole lowering
takes 0.7: on a CPU the one-tile-per-work-item transforms decide, as they do in the forward.
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


def conv2d_backward_weights(x, dy, s, dw, what="Conv2d backward (weights)"):
    """Adds d loss / d w into dw, for the forward shape s (where supported(s) holds), by Winograd F(2x2, 3x3).

    Parameters
    ----------
    x : Tensor (N, C, H, W), the forward's input
    dy : Tensor (N, O, OH, OW), d loss / d y
    s : ops.ConvShape of the forward (s.PH, s.PW the top and left paddings; s.OH, s.OW imply the others)
    dw : Tensor (O, C, 3, 3); the gradient is added to what it holds (+= semantics, deterministic: no atomics)
    what : the name error messages give the operation
    """
    _check(s, what)
    for name, t, shape in (("x", x, (s.N, s.C, s.H, s.W)), ("dy", dy, (s.N, s.O, s.OH, s.OW)),
                           ("dw", dw, (s.O, s.C, 3, 3))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{what}: expected {name} of shape {shape}, got {tuple(t.shape)}")
    dev = x.device
    th, tw = tiles(s)
    n_chunk = chunk(s, dev)
    P_max = n_chunk * th * tw
    V = empty((16 * s.C * P_max,), dev)
    Z = empty((16 * s.O * P_max,), dev)
    Mhat = empty((16, s.O, s.C), dev)
    k_in = kernels.kernel(dev, "winograd.cl", "winograd_input", dict(V_PC=True))
    k_z = kernels.kernel(dev, "winograd.cl", "winograd_grad_output")
    for n0 in range(0, s.N, n_chunk):
        nimg = min(n_chunk, s.N - n0)
        P = nimg * th * tw
        kernels.launch(dev, k_in, (s.C, P), None, x, n0 * s.C * s.H * s.W, s.C, s.H, s.W, s.PH, s.PW, th, tw, nimg,
                       V, what=what + " (Winograd input transform)")
        kernels.launch(dev, k_z, (s.O, P), None, dy, n0 * s.O * s.OH * s.OW, s.O, s.OH, s.OW, th, tw, nimg, Z,
                       what=what + " (Winograd output-gradient transform)")
        # Mhat[xi] (O, C) (+)= Z[xi]^T (O, P) @ V[xi] (P, C); the first chunk overwrites whatever the pool handed out
        gemm(s.O, s.C, P, Z, Mat(bs=P * s.O, rs=1, cs=s.O), V, Mat(bs=P * s.C, rs=s.C, cs=1), Mhat,
             Mat(bs=s.O * s.C, rs=s.C, cs=1), beta=0.0 if n0 == 0 else 1.0, batch=16,
             what=what + " (Winograd products)")
    k_w = kernels.kernel(dev, "winograd.cl", "winograd_grad_weights")
    kernels.launch(dev, k_w, (s.O * s.C,), None, Mhat, s.O, s.C, dw, what=what + " (Winograd weight transform)")
