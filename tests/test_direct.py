"""Direct convolution (clnet/direct.py) against the float64 NumPy reference, with both kernel shapes on every device."""

import numpy as np
import pytest

import clnet
from clnet import direct, nn, tuning

import reference as ref
from conftest import assert_close

CASES = [
    # (N, C, H, W, O, kernel, stride, padding, dilation, groups)
    (1, 1, 1, 1, 1, 1, 1, 0, 1, 1),           # 1x1 image, 1x1 kernel
    (3, 1, 1, 1, 5, 3, 1, 1, 1, 1),           # 1x1 image, 3x3 kernel: only the centre tap is inside
    (3, 2, 5, 7, 5, 3, 1, 0, 1, 1),
    (1, 3, 5, 7, 20, 1, 1, 0, 1, 1),          # pointwise
    (3, 1, 28, 28, 20, 5, 1, 0, 1, 1),        # LeNet conv1
    (1, 3, 31, 33, 64, 3, 1, 1, 1, 1),        # VGG conv1, small
    (3, 3, 31, 33, 64, 11, 4, 2, 1, 1),       # AlexNet conv1, small
    (1, 2, 31, 33, 5, 5, 1, 2, 1, 1),
    (3, 3, 31, 33, 20, 5, 1, "same", 1, 1),
    (1, 2, 31, 33, 5, 4, 1, "same", 1, 1),    # even kernel: the extra padding goes bottom/right
    (3, 3, 31, 33, 5, 3, 1, "same", 2, 1),    # dilation 2
    (1, 1, 31, 33, 64, 3, 2, 1, 2, 1),        # stride 2 and dilation 2
    (3, 2, 5, 7, 1, (3, 5), (2, 1), (2, 1), 1, 1),   # rectangular kernel, unequal strides and paddings
    (1, 3, 31, 33, 20, (5, 3), (1, 3), (0, 2), (2, 1), 1),
    (3, 2, 9, 11, 6, 3, 1, 1, 1, 2),          # two groups of 1 -> 3
    (1, 3, 7, 5, 5, 3, 2, 1, 1, 1),
    (3, 3, 11, 13, 3, 3, 1, 1, 1, 3),         # depthwise
]


def run(dev, rng, N, C, H, W, O, k, s, p, d, g, bias=True, relu=False, cfg=None, asym=None):
    """The direct convolution of a random input through nn.Conv2d's shape, against the reference."""
    layer = nn.Conv2d(C, O, k, stride=s, padding=p, dilation=d, groups=g, bias=bias).to(dev)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    shape = layer.conv_shape(x.shape)
    pad_begin, pad_total = layer._pad_begin, layer._pad_total
    if asym is not None:  # shift the window: top/left padding asym, the output size (bottom/right padding) unchanged
        shape = shape._replace(PH=asym[0], PW=asym[1])
        pad_begin = asym
    wt, b = layer.weight.numpy(), (layer.bias.numpy() if bias else None)
    y = direct.conv2d_forward(clnet.tensor(x, dev), layer.weight.data, layer.bias.data if bias else None, shape,
                              relu=relu, cfg=cfg).numpy()
    want = ref.conv2d(x, wt, b, layer.stride, pad_begin, pad_total, layer.dilation, g)
    if relu:
        want = np.maximum(want, 0.0)
    assert_close(y, want, "output")


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_direct_forward(dev, rng, case, kernel_shape):
    run(dev, rng, *case)


@pytest.mark.parametrize("bias,relu", [(False, False), (False, True), (True, True)])
def test_direct_bias_relu(dev, rng, bias, relu, kernel_shape):
    run(dev, rng, 3, 3, 31, 33, 20, 5, 1, 2, 1, 1, bias=bias, relu=relu)
    run(dev, rng, 1, 1, 5, 7, 5, 3, 2, 1, 1, 1, bias=bias, relu=relu)


@pytest.mark.parametrize("asym", [(0, 2), (2, 0), (3, 1)])
def test_direct_asymmetric_padding(dev, rng, asym, kernel_shape):
    """Top/left padding unlike the bottom/right one (the totals stay 4 per axis, so OH, OW stay the same)."""
    run(dev, rng, 3, 2, 31, 33, 5, 3, 1, 2, 1, 1, asym=asym)
    run(dev, rng, 1, 3, 31, 33, 64, 11, 4, 2, 1, 1, asym=asym)


@pytest.mark.parametrize("cfg", [
    dict(tuning.DIRECT_CPU, OB=2, PX=1), dict(tuning.DIRECT_CPU, OB=16, PX=16), dict(tuning.DIRECT_CPU, ROWS=1),
    dict(tuning.DIRECT_GPU, OB=2, LS=32), dict(tuning.DIRECT_GPU, OB=16, WLOCAL_MAX=0),  # weights read from global
], ids=["rows-ob2-px1", "rows-ob16-px16", "rows-1-per-group", "pixels-ob2", "pixels-global-weights"])
def test_direct_other_blocks(dev, rng, cfg):
    """Register blocks and work-group shapes other than the defaults (partial blocks, global weights)."""
    run(dev, rng, 3, 3, 31, 33, 20, 5, 1, 2, 1, 1, cfg=cfg)
    run(dev, rng, 1, 3, 31, 33, 64, 11, 4, 2, 1, 1, cfg=cfg)
    run(dev, rng, 3, 3, 11, 13, 6, 3, 2, 1, 2, 3, relu=True, cfg=cfg)


def test_direct_checks_shapes(dev):
    layer = nn.Conv2d(3, 4, 3).to(dev)
    s = layer.conv_shape((1, 3, 8, 8))
    with pytest.raises(ValueError, match="expected x of shape"):
        direct.conv2d_forward(clnet.tensor(np.zeros((1, 2, 8, 8), np.float32), dev), layer.weight.data, None, s)
