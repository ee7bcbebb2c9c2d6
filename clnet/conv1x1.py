"""1x1 convolutions at stride 1 without padding (pointwise layers: MobileNet's expansions and projections, ResNet's
bottlenecks, SqueezeNet's squeezes), every pass reading its operands in place (cl_kernels/conv1x1.cl), CPU-shaped.

im2col + GEMM runs such a layer with no column buffer (its input already is the lowered matrix), as a product whose
columns run across images, and its weight gradient still lowers x first; the direct kernel (direct.py, PoCL's forward
for up to 64 input channels) takes a vector over output channels and a scalar of x per pixel. Here a work-item holds
a block of output channels times a run of pixel vectors, so each load of x feeds a block of multiply-adds, and the
data gradient is the same kernel with the weight matrix read transposed. On PoCL, mobilenet_v2's layers of 28x28 and
up ran 1.05-4.4x faster than the better of the two, pass by pass (bench/NOTES.md v27); on 7x7 planes the GEMM
stays faster.
"""
from . import kernels, tuning
from .tensor import empty


def supported(s):
    """Whether a layer of shape s (a shapes.ConvShape) is pointwise: 1x1, stride 1, no padding, any groups."""
    return s.pointwise and s.C % s.G == 0 and s.O % s.G == 0 and min(s.N, s.C, s.O, s.H, s.W) >= 1


def _rows(x, w, bias, IC, OC, s, WO, WC, relu, what, cfg):
    dev = x.device
    P = s.H * s.W
    out = empty((s.N, OC, s.H, s.W), dev)
    per_run, ob = cfg["NV"] * cfg["PV"], cfg["OB"]
    blocks = s.G * -(-(OC // s.G) // ob)
    k = kernels.kernel(dev, "conv1x1.cl", "conv1x1_rows",
                       dict(PV=cfg["PV"], NV=cfg["NV"], OB=ob, BIAS=bias is not None, RELU=relu, WEIGHTS=0))
    runs = -(-P // per_run)
    ls = min(cfg["LS"], runs)
    kernels.launch(dev, k, (runs, blocks, s.N), (ls, 1, 1), x, w, bias, out, IC, OC, s.G, P, WO, WC, what=what)
    return out


def conv2d_forward(x, w, bias, s, relu=False, what="Conv2d"):
    """y = conv(x, w) + bias, then ReLU if relu (conv.conv2d_forward's contract) for a pointwise layer."""
    Cg = s.C // s.G
    return _rows(x, w, bias, s.C, s.O, s, Cg, 1, relu, what + " (1x1)", tuning.conv1x1_config(x.device, "rows"))


def conv2d_backward_data(w, dy, s, what="Conv2d backward (data)"):
    """d loss / d x: each group's weight matrix, transposed, times dy."""
    Cg = s.C // s.G
    return _rows(dy, w, None, s.O, s.C, s, 1, Cg, False, what + " (1x1)", tuning.conv1x1_config(dy.device, "rows"))


def conv2d_backward_weights(x, dy, s, dw, beta=1.0, what="Conv2d backward (weights)"):
    """dw = beta * dw + d loss / d w (beta 0: dw is not read): each image's share summed over its pixels, then the
    shares added in order."""
    dev = x.device
    cfg = tuning.conv1x1_config(dev, "weights")
    Og, Cg, P = s.O // s.G, s.C // s.G, s.H * s.W
    part = s.N > 1
    defines = dict(PV=cfg["PV"], OB=cfg["OB"], CB=cfg["CB"], PART=part, WEIGHTS=1)
    k = kernels.kernel(dev, "conv1x1.cl", "conv1x1_weights", defines)
    grid = (-(-Cg // cfg["CB"]), s.G * -(-Og // cfg["OB"]), s.N)
    target = empty((s.N, s.O, Cg), dev) if part else dw
    kernels.launch(dev, k, grid, (1, 1, 1), dy, x, target, s.C, s.O, s.G, P, float(beta), what=what + " (1x1)")
    if part:
        total = kernels.kernel(dev, "conv1x1.cl", "conv1x1_weights_sum", defines)  # the same build
        kernels.launch(dev, total, (s.O * Cg,), kernels.ANY_GROUP, target, dw, s.N, s.O * Cg, float(beta),
                       what=what + " (1x1, images' shares)")
    return dw
