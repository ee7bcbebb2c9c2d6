"""Depthwise convolution (clnet/depthwise.py, cl_kernels/depthwise.cl) against PyTorch in float64: forward, input,
weight and bias gradients through nn.Conv2d, in both kernel shapes on every device."""
import numpy as np
import pytest

import clnet
from clnet import depthwise, nn
from clnet.shapes import conv_shape

from conftest import assert_close, launched, needs_torch

CASES = [
    # (N, C, H, W, multiplier, kernel, stride, padding, dilation)
    (1, 3, 1, 1, 1, 3, 1, 1, 1),                # 1x1 image: only the centre tap is inside
    (2, 4, 31, 33, 1, 3, 1, 1, 1),              # mobilenet's 3x3 stride 1
    (1, 3, 33, 31, 2, 3, 2, 1, 1),              # stride 2, two output channels per input channel
    (2, 2, 3, 3, 2, 5, 1, 2, 1),                # window larger than the image
    (1, 3, 31, 33, 1, 5, 2, 2, 1),              # mnasnet's 5x5 stride 2
    (2, 2, 17, 19, 1, 7, 1, 3, 1),              # convnext's 7x7
    (1, 3, 31, 33, 1, 3, 1, 2, 2),              # dilation 2
    (2, 2, 12, 9, 1, 3, 1, 1, 1),               # rows a multiple of the GPU shape's 4 a column: the last block's window
                                                #   ends on the padding row
    (3, 2, 9, 11, 2, (3, 5), (2, 1), (0, 2), 1),  # rectangular window, unequal strides and paddings
    # CPU plane kernels (depthwise_cpu.cl; the cases above reach them where a plane fits 16 or 32 floats a row)
    (2, 3, 7, 7, 3, 3, 1, 1, 1),                # mobilenet's 7x7 plane, three output channels per input channel
    (1, 2, 14, 14, 2, 3, 2, 1, 1),              # 14x14 at stride 2: lanes from two vector loads' even elements
    (2, 2, 15, 14, 1, 3, 1, 1, 1),              # a padded row of exactly 16 floats
    (1, 2, 29, 27, 1, 3, 1, 1, 1),              # the 32-float tile: two chunks of 16 lanes a row, the second partial
    (1, 2, 11, 10, 1, 3, 1, 3, 1),              # padding past the window's reach: the data gradient's tile shifted
                                                #   up and left
    (2, 2, 13, 13, 1, 3, 2, 2, 2),              # stride 2 with dilation 2
    (1, 3, 15, 13, 1, 5, 2, 2, 1),              # 5x5 at stride 2 on an odd plane
    (3, 23, 7, 7, 1, 3, 1, 1, 1),               # 69 planes: runs of two a work-item, the last run one plane
]
SMALL = [i for i, c in enumerate(CASES) if max(c[2], c[3]) <= 17]


def _torch_reference(x, w, b, dy, stride, padding, dilation, groups):
    import torch
    xt, wt, bt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, stride, padding, dilation, groups)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    return yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_depthwise_layer(dev, rng, case, kernel_shape):
    N, C, H, W, mult, k, s, p, d = case
    layer = nn.Conv2d(C, C * mult, k, stride=s, padding=p, dilation=d, groups=C).to(dev)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    xt = clnet.tensor(x, dev, requires_grad=True)
    with launched() as names:
        y = layer(xt)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(clnet.tensor(dy, dev))
    assert sum("depthwise" in n for n in names) >= 3, names  # the three passes ran depthwise.cl's kernels
    ry, rdx, rdw, rdb = _torch_reference(x, layer.weight.numpy(), layer.bias.numpy(), dy, layer.stride,
                                         layer.padding, layer.dilation, C)
    assert_close(y.numpy(), ry, "output")
    assert_close(xt.grad.numpy(), rdx, "grad input")
    assert_close(layer.weight.grad.numpy(), rdw, "grad weight")
    assert_close(layer.bias.grad.numpy(), rdb, "grad bias")


@needs_torch
@pytest.mark.parametrize("case", [CASES[i] for i in SMALL], ids=[str(i) for i in SMALL])
def test_depthwise_row_kernels_on_small_planes(dev, rng, case, monkeypatch):
    """The CPU's row kernels (depthwise.cl) where the plane kernels would run: they still take the planes too wide
    for a tile, and small planes are where every row and column is an edge."""
    monkeypatch.setattr(clnet.tuning, "cpu_shaped", lambda dev: True)
    monkeypatch.setattr(depthwise, "planes_tile", lambda dev, s, which: None)
    test_depthwise_layer(dev, rng, case, "cpu-rows")


def test_depthwise_plane_kernels_take_mobilenets_small_planes(dev, monkeypatch):
    """Which CPU kernel runs which of mobilenet_v2's planes: the plane kernels up to 28x28 (the data gradient at
    stride 2 excepted), the row kernels at 56x56 and 112x112; never on a GPU-shaped device."""
    monkeypatch.setattr(clnet.tuning, "cpu_shaped", lambda dev: True)
    for side, stride, planes in [(7, 1, 16), (14, 1, 16), (14, 2, 16), (28, 1, 32), (28, 2, 32), (56, 1, None),
                                 (112, 2, None)]:
        s = conv_shape("test", (16, 8, side, side), (8, 1, 3, 3), (stride, stride), (1, 1), (2, 2), (1, 1), 8)
        got = [(depthwise.planes_tile(dev, s, which) or (None,))[0] for which in ("forward", "data", "weights")]
        assert got == [planes, planes if stride == 1 else None, planes], (side, stride, got)
    monkeypatch.setattr(clnet.tuning, "cpu_shaped", lambda dev: False)
    assert depthwise.planes_tile(dev, s, "forward") is None


@needs_torch
@pytest.mark.parametrize("runs", [1, 3])
def test_depthwise_weight_gradient_adds(dev, rng, runs, kernel_shape, monkeypatch):
    """beta 0 overwrites dw (NaN there must not show), beta 1 adds to it; with the pixels cut into runs (GPU shape)
    or the images (CPU shape), each run's sums kept apart and then added."""
    N, C, H, W, mult = 3, 5, 13, 11, 2
    s = conv_shape("test", (N, C, H, W), (C * mult, 1, 3, 3), (2, 1), (1, 1), (2, 2), (1, 1), C)
    if runs > 1:  # (on the CPU shape, the row kernel: the plane kernel takes every image in one work-item)
        monkeypatch.setattr(depthwise, "planes_tile", lambda dev, s, which: None)
        default = depthwise.weight_runs
        monkeypatch.setattr(depthwise, "weight_runs", lambda dev, s: (
            runs, -(-N // runs) if clnet.tuning.cpu_shaped(dev) else -(-N * s.OH * s.OW // runs), default(dev, s)[2]))
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    dy = rng.standard_normal((N, C * mult, s.OH, s.OW)).astype(np.float32)
    w = rng.standard_normal((C * mult, 1, 3, 3)).astype(np.float32)
    _, _, want, _ = _torch_reference(x, w, np.zeros(C * mult, np.float32), dy, (2, 1), (1, 1), (1, 1), C)
    X, DY = clnet.tensor(x, dev), clnet.tensor(dy, dev)
    dw = clnet.tensor(np.full(w.shape, np.nan, np.float32), dev)
    depthwise.conv2d_backward_weights(X, DY, s, dw, beta=0.0)
    assert_close(dw.numpy(), want, "grad weight, overwritten")
    start = rng.standard_normal(w.shape).astype(np.float32)
    dw = clnet.tensor(start, dev)
    depthwise.conv2d_backward_weights(X, DY, s, dw, beta=1.0)
    assert_close(dw.numpy(), want + start, "grad weight, added")


def test_depthwise_refuses_other_shapes(dev):
    s = conv_shape("test", (1, 4, 8, 8), (4, 2, 3, 3), (1, 1), (1, 1), (2, 2), (1, 1), 2)  # two channels per group
    assert not depthwise.supported(s)
    with pytest.raises(ValueError, match="groups == in_channels"):
        depthwise.conv2d_forward(clnet.tensor(np.zeros((1, 4, 8, 8), np.float32), dev),
                                 clnet.tensor(np.zeros((4, 2, 3, 3), np.float32), dev), None, s)


@needs_torch
def test_depthwise_relu_without_bias(dev, rng, kernel_shape):
    """The forward's flags: no bias read, the fused ReLU applied."""
    N, C, H, W = 2, 3, 7, 9
    s = conv_shape("test", (N, C, H, W), (C, 1, 5, 5), (1, 1), (2, 2), (4, 4), (1, 1), C)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((C, 1, 5, 5)).astype(np.float32)
    y = depthwise.conv2d_forward(clnet.tensor(x, dev), clnet.tensor(w, dev), None, s, relu=True).numpy()
    want, _, _, _ = _torch_reference(x, w, np.zeros(C, np.float32), np.zeros((N, C, H, W), np.float32), 1, 2, 1, C)
    assert_close(y, np.maximum(want, 0.0), "output")
