"""Winograd F(2x2, 3x3) convolution, forward and backward-data, against the float64 NumPy reference.

Tolerance: float32 Winograd F(2, 3) measured against float64 on PoCL (normwise relative error; worst element relative
to the largest magnitude), 3x3 'same' layers with weights of PyTorch's default scale:
    C=64,   O=64, 2x14x14:  forward 2.7e-7 / 3.5e-7, backward-data 2.7e-7 / 3.1e-7 (im2col: 4.1e-7, 1.6e-7)
    C=256,  O=64, 2x14x14:  forward 5.0e-7 / 5.9e-7, backward-data 2.6e-7 / 3.4e-7 (im2col: 8.3e-7, 1.5e-7)
    C=1024, O=16, 1x6x6:    forward 7.4e-7 / 8.0e-7
Inputs after a ReLU or offset by +3 gave the same (at most 4.4e-7 / 7.6e-7 at C=256). F(2, 3)'s transforms only add,
subtract and halve, so its error stays at im2col's level; TOL is about 4x the largest of these, and an indexing or
padding mistake gives errors of order 1.
"""
import numpy as np
import pytest

import clnet
from clnet import nn, tuning, winograd
from clnet.ops import ConvShape

import reference as ref
from conftest import assert_close, needs_torch

TOL = 3e-6


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
    (1, 3, 3, 3, 2, 0, True, True),                # one output pixel: a tile clipped to 1x1
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
    assert_close(y.numpy(), ry, "output", tol=TOL)
    assert_close(dx.numpy(), rdx, "grad input", tol=TOL)


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
    ty = F.conv2d(F.pad(tx, pads), torch.tensor(w, dtype=torch.float64), torch.tensor(b, dtype=torch.float64))
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    ry = torch.relu(ty).detach().numpy() if relu else ty.detach().numpy()
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev), s, relu=relu)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s)
    assert_close(y.numpy(), ry, "output", tol=TOL)
    assert_close(dx.numpy(), tx.grad.numpy(), "grad input", tol=TOL)


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
