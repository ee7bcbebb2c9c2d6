"""Winograd convolution F(m x m, r x r) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015)
for r x r, stride-1, undilated, ungrouped layers: forward and the gradients with respect to the input and the weights.
Three variants: F(2x2, 3x3) and F(4x4, 3x3) for 3x3 kernels, F(2x2, 5x5) for 5x5 ones (VARIANTS).

The output is cut into m x m tiles, each computed from an a x a input tile (a = m + r - 1, stride m) as
Y = A^T [ sum over c of (G g G^T) .* (B^T d B) ] A. Summed over input channels, each of the a*a element-wise products
is a matrix product, so the work is three kernels (cl_kernels/winograd.cl, which also gives the matrices) around one
batched GEMM:

    U (a*a, O, C)  = G w G^T                     winograd_weights, every call (weights change every step)
    V (a*a, C, P)  = B^T x B, P = N * tiles      winograd_input
    M (a*a, O, P)  = U @ V                       gemm.gemm, batch a*a
    y (N, O, OH, OW) = A^T M A + bias (ReLU)     winograd_output

What it saves and what it costs, against im2col + GEMM (O x N*OH*OW x r*r*C):

- Multiplies. An m x m output tile needs a*a products per (o, c) instead of m*m*r*r: the GEMM does 2.25x fewer
  multiply-adds for F(2, 3) (16 against 36), 2.78x for F(2, 5) (36 against 100) and 4x for F(4, 3) (36 against 144).
- Memory. V holds a*a values per m*m input pixels: 4x the input's size for F(2, 3), 9x for F(2, 5), 2.25x for
  F(4, 3) (im2col's column buffer is r*r times: 9x, 25x). But M is as many times the output's size, written by the
  GEMM and read back by the output transform, where im2col's GEMM writes y directly. The transforms are small matrix
  products per tile and are bandwidth-bound on a GPU.
- Clipped tiles. ceil(OH/m)*ceil(OW/m)*m*m / (OH*OW) of the GEMM work is real (F(2, .): 0.77 of it for 7x7;
  F(4, 3): 0.49 for 7x7, 0.77 for 14x14; all of it when m divides the sizes).
- Precision. F(2, 3)'s transforms only add, subtract and halve; its float32 error stays within 2x of im2col's
  (tests/test_winograd.py). The a = 6 variants interpolate at 0, 1, -1, 2, -1/2 and lose more: simulated over 64
  channels, 1.4e-6 (F(2, 5)) and 2.1e-6 (F(4, 3)) of the largest output against im2col's 3.7e-7 and 3.3e-7.

When it should win: large C and O (say 64 and up) on sizes where the GEMM dominates, the body of VGG/ResNet-style
networks: the saving is on O*C work, the extra traffic only on (O + C) * pixels. When it should lose: small C, above
all a first layer with C = 3 (the GEMM's depth is 3, the transforms and M traffic dominate), and tiny spatial sizes
(clipped tiles). On PoCL, with its tile-per-work-item transforms, F(2, 3) lost to the row-per-work-item im2col at the
shapes measured (N=8, C=O=64, 28x28: 7 against 4 ms forward; scratch measurements), so Winograd is the default on
GPUs only (conv._conv_algorithm); on the H200 the tuner picked F(2, 3) for every VGG 3x3 layer but the first
(bench/results/h200-v5).

The backward-data pass is itself a Winograd convolution. From y[oy] = sum_ky w[ky] x[oy + ky - PH] (one axis shown;
the other is the same), dx[i] = sum_ky w[ky] dy[i + PH - ky] with dy zero outside [0, OH). Put ky' = r - 1 - ky:
dx[i] = sum_ky' w[r - 1 - ky'] dy[i + ky' - (r - 1 - PH)], an r x r stride-1 correlation of dy with the kernel rotated
by 180 degrees and its channels swapped (O <-> C), top padding r - 1 - PH and output size H. Its bottom padding is
implied by that output size: it reads dy rows up to H - 1 + PH (zero past OH - 1), a bottom padding of
H - OH + PH = r - 1 - PHb, where PHb = OH + r - 1 - H - PH is the forward's bottom padding. Asymmetric padding
therefore needs nothing special, and a forward padding over r - 1 gives a negative top padding, which the input
transform's bounds checks take as an offset.

The weight gradient differentiates the forward's three steps in reverse. Per tile p, y_p = A^T M_p A with
M_p[o] = sum over c of U[o, c] .* V[c, p], and U[o, c] = G w[o, c] G^T. The adjoint of M -> A^T M A is
dY -> A dY A^T, so d loss / d M_p[o] = Z_p[o] = A dY_p[o] A^T, where dY_p is the m x m tile of dy, zero where the tile
overhangs the output (the forward never wrote those outputs, so no loss depends on them). The element-wise product
gives d loss / d U[o, c] = Mhat[o, c] = sum over p of Z_p[o] .* V[c, p], and the adjoint of g -> G g G^T gives
dw[o, c] += G^T Mhat[o, c] G. Element xi of the a x a tiles again makes a matrix product per xi:

    V (a*a, P, C)  = B^T x B                     winograd_input_pc, stored p-major
    Z (a*a, P, O)  = A dy A^T                    winograd_grad_output
    Mhat (a*a, O, C) += Z^T @ V                  gemm.gemm, batch a*a, K = P; chunks of images accumulate (beta = 1)
    dw (O, C, r, r) += G^T Mhat G                winograd_grad_weights, once after the last chunk

Both GEMM operands are stored with k (the tile index p) slowest, as the GEMM kernels load fastest. The GEMM saves what
the forward's does, with the same clipped-tile waste. The reduction runs over P: its float32 sums are as long as
im2col's over N*OH*OW, divided by m*m (split-K shortens both alike). On PoCL (2 cores, quiet machine), F(2, 3),
N=8, C=O=64, 28x28, padding 1: 9.1 ms against im2col's 5.1 ms. The GEMM wins (1.3-1.7 ms against 4.5), but the input
and output-gradient transforms take about 3.4 and 3.0 ms, where im2col's whole lowering takes 0.7: on a CPU the
one-tile-per-work-item transforms decide, as they do in the forward.
"""
from . import kernels, tuning
from .gemm import Mat, gemm
from .shapes import ConvShape
from .tensor import empty

VARIANTS = ((2, 3), (4, 3), (2, 5))  # (m, r) of F(m x m, r x r), as cl_kernels/winograd.cl defines them


def supported(s, m=2):
    """Whether a layer of shape s (an shapes.ConvShape) can run as F(m x m, r x r): a square r x r kernel with (m, r) in
    VARIANTS, stride 1, dilation 1, one group."""
    return s.KH == s.KW and (m, s.KH) in VARIANTS and (s.SH, s.SW, s.DH, s.DW, s.G) == (1, 1, 1, 1, 1)


def tiles(s, m=2):
    """(TH, TW): m x m output tiles per image, rows and columns."""
    return -(-s.OH // m), -(-s.OW // m)


def _transformed(s, m):
    """Elements per image of the transformed input V and output M: (V's, M's)."""
    th, tw = tiles(s, m)
    a = m + s.KH - 1
    return a * a * s.C * th * tw, a * a * s.O * th * tw


def image_fits(s, m=2):
    """Whether one image's V and M each stay within kernels.INDEX_LIMIT elements: chunks are whole images, so a layer
    whose single image passes it cannot run as Winograd (im2col then runs it)."""
    return max(_transformed(s, m)) <= kernels.INDEX_LIMIT


def chunk(s, dev, m=2):
    """Images per chunk, so that V and M together stay within the im2col column budget (tuning.col_bytes), and
    each within the index limit (kernels.INDEX_LIMIT)."""
    v, mm = _transformed(s, m)
    return max(1, min(s.N, tuning.col_bytes(dev) // ((v + mm) * 4), kernels.INDEX_LIMIT // max(v, mm)))


def _kernel(dev, name, m, r, **defines):
    # Every build names the store block that fits dev: Oclgrind counts winograd_input_pc's local array against each
    # kernel of the program (F(2x2,5x5)'s 16-wide block, 38 KiB, refused winograd_input on its 32 KiB).
    return kernels.kernel(dev, "winograd.cl", name, dict(WINO_M=m, WINO_R=r, TPC=store_block(dev, m + r - 1),
                                                         **defines))


def store_block(dev, a):
    """Side of winograd_input_pc's square work-group: 16, or less where the device's work-groups or local memory
    (a*a x side x (side + 1) floats) are too small for that."""
    side = 16
    while side > 1 and (side * side > dev.max_work_group_size or a * a * side * (side + 1) * 4 > dev.local_mem_size):
        side //= 2
    return side


def transform_weights(w, O, C, m=2, flip=False):
    """U (a*a, O, C) = G w G^T for w (O, C, r, r); with flip the backward-data weights U (a*a, C, O) of rot180(w)."""
    dev, r = w.device, w.shape[-1]
    a = m + r - 1
    U = empty((a * a, O, C), dev)
    kernels.launch(dev, _kernel(dev, "winograd_weights", m, r, FLIP=flip), (O * C,), kernels.ANY_GROUP, w, O, C, U,
                   what="Winograd weight transform")
    return U


def _convolve(x, U, bias, s, m, relu, what):
    """y (N, O, OH, OW) for transformed weights U (a*a, O, C); the shared body of forward and backward-data."""
    dev = x.device
    y = empty((s.N, s.O, s.OH, s.OW), dev)
    th, tw = tiles(s, m)
    a = m + s.KH - 1
    n_chunk = chunk(s, dev, m)
    P_max = n_chunk * th * tw
    V = empty((a * a * s.C * P_max,), dev)
    M = empty((a * a * s.O * P_max,), dev)
    k_in = _kernel(dev, "winograd_input", m, s.KH)
    k_out = _kernel(dev, "winograd_output", m, s.KH, BIAS=bias is not None, RELU=relu)
    for n0 in range(0, s.N, n_chunk):
        nimg = min(n_chunk, s.N - n0)
        P = nimg * th * tw
        kernels.launch(dev, k_in, (P, s.C), kernels.ANY_GROUP, x, n0 * s.C * s.H * s.W, s.C, s.H, s.W, s.PH, s.PW, th,
                       tw, nimg, V, what=what + " (Winograd input transform)")
        gemm(s.O, P, s.C, U, Mat(bs=s.O * s.C, rs=s.C, cs=1), V, Mat(bs=s.C * P, rs=P, cs=1), M,
             Mat(bs=s.O * P, rs=P, cs=1), batch=a * a, what=what + " (Winograd products)")
        kernels.launch(dev, k_out, (P, s.O), kernels.ANY_GROUP, M, bias, s.O, s.OH, s.OW, th, tw, nimg, y,
                       n0 * s.O * s.OH * s.OW, what=what + " (Winograd output transform)")
    return y


def _check(s, m, what):
    if not supported(s, m):
        raise ValueError(f"{what}: Winograd F({m}x{m}, rxr) runs r x r kernels with (m, r) in {VARIANTS}, stride 1, "
                         f"dilation 1 and groups=1, got kernel {s.KH}x{s.KW}, stride ({s.SH}, {s.SW}), dilation "
                         f"({s.DH}, {s.DW}), groups {s.G}")


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d", m=2):
    """The same contract as conv.conv2d_forward, for shapes where supported(s, m) holds.

    Parameters
    ----------
    x : Tensor (N, C, H, W)
    w : Tensor (O, C, r, r)
    bias : Tensor (O,) or None
    s : shapes.ConvShape; s.PH, s.PW are the top and left paddings, s.OH, s.OW the output size (which implies the
        bottom and right paddings)
    relu : apply max(0, .) after the bias
    m : the output tile side: F(m x m, r x r)

    Returns
    -------
    Tensor (N, O, OH, OW)
    """
    _check(s, m, what)
    return _convolve(x, transform_weights(w, s.O, s.C, m), bias, s, m, relu, what)


def backward_data_shape(s):
    """The ConvShape of the convolution that computes dx from dy (see the module docstring)."""
    r = s.KH
    return ConvShape(s.N, s.O, s.OH, s.OW, s.C, r, r, 1, 1, r - 1 - s.PH, r - 1 - s.PW, 1, 1, 1, s.H, s.W)


def conv2d_backward_data(w, dy, s, what="Conv2d backward", m=2):
    """d loss / d x (N, C, H, W) from dy (N, O, OH, OW) and the weights w (O, C, r, r) of the forward shape s."""
    _check(s, m, what)
    return _convolve(dy, transform_weights(w, s.O, s.C, m, flip=True), None, backward_data_shape(s), m, False,
                     what + " (data)")


def conv2d_backward_weights(x, dy, s, dw, what="Conv2d backward (weights)", m=2, beta=1.0):
    """Adds d loss / d w into dw (beta 1) or writes it there (beta 0), for the forward shape s (where supported(s, m)
    holds), by Winograd F(m x m, r x r).

    Parameters
    ----------
    x : Tensor (N, C, H, W), the forward's input
    dy : Tensor (N, O, OH, OW), d loss / d y
    s : shapes.ConvShape of the forward (s.PH, s.PW the top and left paddings; s.OH, s.OW imply the others)
    dw : Tensor (O, C, r, r); the gradient is added to what it holds, or overwrites it (deterministic: no atomics)
    what : the name error messages give the operation
    m : the output tile side
    beta : 1.0 adds into dw, 0.0 overwrites it
    """
    _check(s, m, what)
    r = s.KH
    for name, t, shape in (("x", x, (s.N, s.C, s.H, s.W)), ("dy", dy, (s.N, s.O, s.OH, s.OW)),
                           ("dw", dw, (s.O, s.C, r, r))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{what}: expected {name} of shape {shape}, got {tuple(t.shape)}")
    dev = x.device
    th, tw = tiles(s, m)
    a = m + r - 1
    n_chunk = chunk(s, dev, m)
    P_max = n_chunk * th * tw
    V = empty((a * a * s.C * P_max,), dev)
    Z = empty((a * a * s.O * P_max,), dev)
    Mhat = empty((a * a, s.O, s.C), dev)
    block = store_block(dev, a)
    k_in = _kernel(dev, "winograd_input_pc", m, r)
    k_z = _kernel(dev, "winograd_grad_output", m, r)
    for n0 in range(0, s.N, n_chunk):
        nimg = min(n_chunk, s.N - n0)
        P = nimg * th * tw
        # square work-groups: V is stored through local memory (winograd.cl, store_channel_fastest)
        kernels.launch(dev, k_in, (P, s.C), (block, block), x, n0 * s.C * s.H * s.W, s.C, s.H, s.W, s.PH, s.PW, th, tw,
                       nimg, V, what=what + " (Winograd input transform)")
        kernels.launch(dev, k_z, (s.O, P), kernels.ANY_GROUP, dy, n0 * s.O * s.OH * s.OW, s.O, s.OH, s.OW, th, tw, nimg,
                       Z, what=what + " (Winograd output-gradient transform)")
        # Mhat[xi] (O, C) (+)= Z[xi]^T (O, P) @ V[xi] (P, C); the first chunk overwrites whatever the pool handed out
        gemm(s.O, s.C, P, Z, Mat(bs=P * s.O, rs=1, cs=s.O), V, Mat(bs=P * s.C, rs=s.C, cs=1), Mhat,
             Mat(bs=s.O * s.C, rs=s.C, cs=1), beta=0.0 if n0 == 0 else 1.0, batch=a * a,
             what=what + " (Winograd products)")
    k = _kernel(dev, "winograd_grad_weights", m, r)
    kernels.launch(dev, k, (s.O * s.C,), kernels.ANY_GROUP, Mhat, s.O, s.C, dw, int(beta != 0.0),
                   what=what + " (Winograd weight transform)")
