"""Winograd F(2x2, 3x3) convolution, forward, backward-data and backward-weights, against the float64 NumPy reference.

Tolerance: float32 Winograd F(2, 3) measured against float64 on PoCL (normwise relative error; worst element relative
to the largest magnitude), 3x3 'same' layers with weights of PyTorch's default scale:
    C=64,   O=64, 2x14x14:  forward 2.7e-7 / 3.5e-7, backward-data 2.7e-7 / 3.1e-7 (im2col: 4.1e-7, 1.6e-7)
    C=256,  O=64, 2x14x14:  forward 5.0e-7 / 5.9e-7, backward-data 2.6e-7 / 3.4e-7 (im2col: 8.3e-7, 1.5e-7)
    C=1024, O=16, 1x6x6:    forward 7.4e-7 / 8.0e-7
Inputs after a ReLU or offset by +3 gave the same (at most 4.4e-7 / 7.6e-7 at C=256). F(2, 3)'s transforms only add,
subtract and halve, so its error stays at im2col's level; TOL is about 4x the largest of these, and an indexing or
padding mistake gives errors of order 1.

The weight gradient sums over every pixel of the batch, so its error grows with N*OH*OW. Measured the same way on PoCL
(x standard normal, after a ReLU or offset by +3; dy standard normal), Winograd against im2col + GEMM:
    C=64,  O=64, 4x28x28:   8.5e-7 / 1.5e-6 (im2col 6.9e-7 / 1.0e-6); after a ReLU 7.4e-7 / 1.1e-6; +3 5.9e-7 / 9.0e-7
    C=256, O=64, 2x14x14:   3.2e-7 / 4.5e-7 (im2col 3.4e-7 / 7.5e-7)
    C=16,  O=16, 8x28x28:   5.1e-7 / 6.0e-7 (im2col 3.7e-7 / 3.8e-7)
TOL_DW is about 5x the largest; the shapes tested here are smaller, so it has room.
"""
import numpy as np
import pytest

import clnet
from clnet import nn, tuning, winograd
from clnet.ops import ConvShape

import reference as ref
from conftest import assert_close, needs_torch

TOL = 3e-6
TOL_DW = 4e-6
TOL_TINY = 1e-5


def conv_shape(N, C, H, W, O, padding):
    """(ConvShape, pad_begin, pad_total): an int or 'same' goes through nn.Conv2d as a layer would compute it; a pair
    ((top, left), (top + bottom, left + right)) gives asymmetric padding directly."""
    if isinstance(padding, tuple):
        begin, total = padding
        s = ConvShape(N, C, H, W, O, 3, 3, 1, 1, begin[0], begin[1], 1, 1, 1, H + total[0] - 2, W + total[1] - 2)
        return s, begin, total
    layer = nn.Conv2d(C, O, 3, padding=padding)
    return layer.conv_shape((N, C, H, W)), layer._pad_begin, layer._pad_total


CASES = [
    # (N, C, H, W, O, padding, bias, relu)
    (1, 1, 1, 1, 1, 1, True, False),               # one pixel, all of the window but the centre is padding
    (2, 1, 2, 2, 3, 1, False, False),
    (1, 3, 3, 3, 2, 0, True, False),               # one output pixel: a tile clipped to 1x1 (no ReLU: with two
                                                   # outputs, a tiny survivor of cancellation made the relative error
                                                   # of a correct result exceed any fixed tolerance now and then)
    (3, 3, 5, 5, 4, "same", True, True),           # odd sizes: clipped tiles on the bottom and right
    (2, 17, 7, 7, 5, 2, True, False),              # output 9x9, larger than the input
    (1, 17, 31, 33, 8, 1, False, True),
    (2, 3, 7, 5, 6, ((0, 0), (0, 0)), True, False),  # PH = 0, OH = H - 2
    (2, 5, 6, 7, 3, ((1, 0), (1, 2)), True, False),  # top 1 bottom 0, left 0 right 2
    (1, 4, 5, 6, 5, ((2, 1), (2, 3)), False, True),  # top 2 bottom 0, left 1 right 2
    (2, 3, 4, 5, 2, ((3, 0), (4, 1)), True, False),  # top 3: the backward-data convolution's padding is negative
    (2, 64, 6, 5, 70, 1, True, True),
    (2, 128, 8, 8, 64, "same", True, False),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_winograd_conv2d(dev, rng, case):
    N, C, H, W, O, padding, has_bias, relu = case
    s, begin, total = conv_shape(N, C, H, W, O, padding)
    assert winograd.supported(s)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.uniform(-1, 1, (O, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
    b = rng.uniform(-1, 1, O).astype(np.float32) if has_bias else None
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    ry, rdx, _, _ = ref.conv2d(x, w, b, (1, 1), begin, total, (1, 1), 1, dy)
    if relu:
        ry = np.maximum(ry, 0.0)
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev) if has_bias else None, s, relu=relu)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s)
    # A result of a few elements is a sum whose Winograd terms can cancel to far below their own size: its error is
    # relative to those terms, not to the result (one pixel's input gradient came out 3.3e-6 off, about one full run
    # in fifteen). Such results get TOL_TINY, still 1e5 times finer than any indexing mistake.
    assert_close(y.numpy(), ry, "output", tol=TOL if ry.size >= 16 else TOL_TINY)
    assert_close(dx.numpy(), rdx, "grad input", tol=TOL if rdx.size >= 16 else TOL_TINY)


@needs_torch
@pytest.mark.parametrize("case", [CASES[3], CASES[8]], ids=["same", "asymmetric"])
def test_winograd_against_torch(dev, rng, case):
    """A second, independent reference: PyTorch in float64, asymmetric padding through F.pad."""
    import torch
    import torch.nn.functional as F
    N, C, H, W, O, padding, _, relu = case
    s, begin, total = conv_shape(N, C, H, W, O, padding)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((O, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    pads = (begin[1], total[1] - begin[1], begin[0], total[0] - begin[0])
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    ty = F.conv2d(F.pad(tx, pads), tw, torch.tensor(b, dtype=torch.float64))
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    ry = torch.relu(ty).detach().numpy() if relu else ty.detach().numpy()
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev), s, relu=relu)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s)
    dw = clnet.tensor(np.zeros_like(w), dev)
    winograd.conv2d_backward_weights(clnet.tensor(x, dev), clnet.tensor(dy, dev), s, dw)
    assert_close(y.numpy(), ry, "output", tol=TOL)
    assert_close(dx.numpy(), tx.grad.numpy(), "grad input", tol=TOL)
    assert_close(dw.numpy(), tw.grad.numpy(), "grad weights", tol=TOL_DW)


WEIGHT_CASES = [
    # (N, C, H, W, O, padding); output size in the comment
    (1, 1, 1, 1, 1, 1),                      # 1x1: every tap but the centre reads padding
    (3, 3, 3, 3, 17, 0),                     # 1x1 from a 3x3 image: one tile clipped to one pixel
    (3, 17, 4, 5, 3, 0),                     # 2x3: one row of tiles, the second clipped to a column
    (1, 64, 5, 5, 3, 1),                     # 5x5
    (3, 3, 3, 3, 64, 2),                     # 5x5, larger than the input
    (3, 17, 7, 7, 17, "same"),               # 7x7
    (1, 3, 31, 33, 1, 1),                    # 31x33
    (3, 1, 31, 33, 64, 1),
    (3, 64, 7, 9, 64, ((0, 0), (0, 0))),     # 5x7, no padding
    (3, 17, 6, 7, 3, ((1, 0), (1, 2))),      # 5x7: top 1 bottom 0, left 0 right 2
    (1, 3, 5, 6, 64, ((2, 1), (2, 3))),      # 5x7: top 2 bottom 0, left 1 right 2
    (3, 4, 4, 5, 17, ((3, 0), (4, 1))),      # 6x4: top 3, more than the kernel reaches
    (3, 64, 14, 14, 64, 1),                  # 14x14: a longer reduction
]


def check_backward_weights(dev, rng, N, C, H, W, O, padding, tol=TOL_DW):
    """dw, starting from random values, plus Winograd's weight gradient against the float64 reference's."""
    s, begin, total = conv_shape(N, C, H, W, O, padding)
    assert winograd.supported(s)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.uniform(-1, 1, (O, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    _, _, rdw, _ = ref.conv2d(x, w, None, (1, 1), begin, total, (1, 1), 1, dy)
    dw0 = rng.standard_normal(w.shape).astype(np.float32)
    dw = clnet.tensor(dw0, dev)
    winograd.conv2d_backward_weights(clnet.tensor(x, dev), clnet.tensor(dy, dev), s, dw)
    # += semantics: subtract the starting values in float64, so the comparison is of the gradient alone (the float32
    # sum dw0 + gradient rounds at dw0's size: a gradient of a few tiny elements gets TOL_TINY, as above)
    assert_close(dw.numpy().astype(np.float64) - dw0, rdw, "grad weights", tol=tol if rdw.size >= 16 else TOL_TINY)


@pytest.mark.parametrize("case", WEIGHT_CASES, ids=[str(i) for i in range(len(WEIGHT_CASES))])
def test_winograd_conv2d_backward_weights(dev, rng, case):
    check_backward_weights(dev, rng, *case)


def test_winograd_backward_weights_accumulates(dev, rng):
    """Two calls add two gradients: dw holds the sum (a layer whose input is used twice)."""
    s, begin, total = conv_shape(2, 5, 6, 7, 4, 1)
    x = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
    dys = [rng.standard_normal((2, 4, s.OH, s.OW)).astype(np.float32) for _ in range(2)]
    w = np.zeros((4, 5, 3, 3), np.float32)
    dw = clnet.tensor(w, dev)
    for dy in dys:
        winograd.conv2d_backward_weights(clnet.tensor(x, dev), clnet.tensor(dy, dev), s, dw)
    rdw = sum(ref.conv2d(x, w, None, (1, 1), begin, total, (1, 1), 1, dy)[2] for dy in dys)
    assert_close(dw.numpy(), rdw, "grad weights", tol=TOL_DW)


def test_winograd_backward_weights_checks_shapes(dev):
    s, _, _ = conv_shape(2, 5, 6, 7, 4, 1)
    x, dy = clnet.tensor(np.zeros((2, 5, 6, 7), np.float32), dev), clnet.tensor(np.zeros((2, 4, 6, 7), np.float32), dev)
    with pytest.raises(ValueError, match=r"expected dw of shape \(4, 5, 3, 3\), got \(5, 4, 3, 3\)"):
        winograd.conv2d_backward_weights(x, dy, s, clnet.tensor(np.zeros((5, 4, 3, 3), np.float32), dev))


def test_winograd_large_batch_is_chunked(dev, rng, monkeypatch):
    """Batches whose transformed buffers exceed the budget run in chunks (here one image each) with the same result."""
    monkeypatch.setitem(tuning.COL_BYTES, "gpu", 3000)
    monkeypatch.setitem(tuning.COL_BYTES, "cpu", 3000)
    s, begin, total = conv_shape(5, 3, 7, 6, 4, 1)
    assert winograd.chunk(s, dev) == 1
    x = rng.standard_normal((5, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    dy = rng.standard_normal((5, 4, s.OH, s.OW)).astype(np.float32)
    ry, rdx, _, _ = ref.conv2d(x, w, b, (1, 1), begin, total, (1, 1), 1, dy)
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev), s)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s)
    assert_close(y.numpy(), ry, "output", tol=TOL)
    assert_close(dx.numpy(), rdx, "grad input", tol=TOL)
    # the weight gradient accumulates its chunks into one Winograd-domain buffer: with padding 2 (output 9x10) and an
    # asymmetric one (output 6x5), and dw starting non-zero
    for padding in (2, ((1, 0), (1, 1))):
        s, _, _ = conv_shape(5, 3, 7, 6, 4, padding)
        assert winograd.chunk(s, dev) == 1
        check_backward_weights(dev, rng, 5, 3, 7, 6, 4, padding)


def test_winograd_supported():
    """Only 3x3, stride 1, dilation 1, one group; padding and sizes are free. Pure Python, no device."""
    def shape(**kw):
        args = dict(kernel_size=3, stride=1, padding=1, dilation=1, groups=1)
        args.update(kw)
        return nn.Conv2d(4, 8, **args).conv_shape((2, 4, 9, 9))
    assert winograd.supported(shape())
    assert winograd.supported(shape(padding=0))
    assert winograd.supported(shape(padding="same"))
    assert winograd.supported(shape(padding=3))
    for kw in (dict(kernel_size=5), dict(kernel_size=(3, 1)), dict(stride=2), dict(dilation=2), dict(groups=2)):
        assert not winograd.supported(shape(**kw)), kw
    with pytest.raises(ValueError, match="Winograd"):
        winograd.conv2d_forward(None, None, None, shape(stride=2))  # refused before any device work
