"""Winograd convolution, forward, backward-data and backward-weights, against the float64 NumPy reference, for each
variant: F(2x2, 3x3), F(4x4, 3x3) and F(2x2, 5x5).

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

The 6x6-tile variants, F(4, 3) and F(2, 5), measured the same way on PoCL (normwise / worst element):
    F(4, 3), C=64,  O=64, 2x14x14: forward 1.1e-6 / 2.0e-6, backward-data 1.0e-6 / 2.0e-6, weights 8.4e-7 / 1.3e-6
    F(4, 3), C=256, O=64, 2x14x14: forward 2.0e-6 / 4.1e-6, backward-data 1.1e-6 / 2.6e-6, weights 8.4e-7 / 1.4e-6
    F(4, 3), C=64,  O=64, 4x28x28: weights 1.8e-6 / 4.4e-6
    F(2, 5), C=64,  O=64, 2x14x14: forward 1.3e-6 / 1.6e-6, backward-data 1.3e-6 / 1.8e-6, weights 1.5e-6 / 4.5e-6
    F(2, 5), C=256, O=64, 2x14x14: forward 2.4e-6 / 2.9e-6, backward-data 1.3e-6 / 2.0e-6, weights 1.5e-6 / 3.8e-6
    F(2, 5), C=64,  O=64, 4x28x28: weights 4.0e-6 / 1.2e-5
about 4-5x F(2, 3)'s (their transforms multiply by 2, 4, 8 and divide by 6, 15, 30); their tolerances are 4-5x.
"""
import numpy as np
import pytest

import clnet
from clnet import nn, tuning, winograd
from clnet.shapes import ConvShape

import reference as ref
from conftest import assert_close, assert_close_to_terms, needs_torch

# by transformed tile side a = m + r - 1
TOL = {4: 3e-6, 6: 1.2e-5}
TOL_DW = {4: 4e-6, 6: 2e-5}
# Results of fewer than 16 elements are checked against the size of the terms Winograd sums for them, not their own
# size: one pixel can cancel to far below its terms. Winograd multiplies every tap of the kernel with its transformed
# tile, padding included (the taps that meet padding cancel exactly only in exact arithmetic), so a result's terms are
# bounded by all its kernel's |w| times the largest |x| (and the like for the gradients). Measured on PoCL with a
# tighter scale (only the taps that meet the image), 60 draws of every such case: at most 3.7e-7 for a = 4, 6.9e-5
# for a = 6 (whose transforms multiply by up to 8 and divide by 30); a result-relative check failed about one full
# run in five. An indexing mistake is of order 1 against either scale.
TOL_TERMS = {4: 4e-6, 6: 7e-4}
VARIANTS = [(2, 3), (4, 3), (2, 5)]  # (m, r), each listed here to be tested
VARIANT_IDS = [f"F{m}x{r}" for m, r in VARIANTS]


def conv_shape(N, C, H, W, O, padding, r=3):
    """(ConvShape, pad_begin, pad_total) of an r x r layer: an int or 'same' goes through nn.Conv2d as a layer would
    compute it; a pair ((top, left), (top + bottom, left + right)) gives asymmetric padding directly."""
    if isinstance(padding, tuple):
        begin, total = padding
        s = ConvShape(N, C, H, W, O, r, r, 1, 1, begin[0], begin[1], 1, 1, 1, H + total[0] - r + 1,
                      W + total[1] - r + 1)
        return s, begin, total
    layer = nn.Conv2d(C, O, r, padding=padding)
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
CASES_5 = [
    # the same, for 5x5 kernels
    (1, 1, 1, 1, 1, 2, True, False),               # one pixel
    (2, 1, 2, 2, 3, 2, False, False),
    (1, 3, 5, 5, 2, 0, True, False),               # one output pixel
    (3, 3, 7, 7, 4, "same", True, True),           # odd sizes: clipped tiles on the bottom and right
    (2, 17, 7, 9, 5, 4, True, False),              # output 11x13, larger than the input
    (1, 17, 31, 33, 8, 2, False, True),
    (2, 5, 8, 9, 3, ((1, 0), (3, 4)), True, False),  # top 1 bottom 2, left 0 right 4
    (2, 3, 6, 7, 2, ((5, 0), (6, 1)), True, False),  # top 5: the backward-data convolution's padding is negative
    (2, 64, 6, 5, 70, 2, True, True),
]
FORWARD = [(m, r, case) for m, r in VARIANTS for case in (CASES if r == 3 else CASES_5)]


@pytest.mark.parametrize("m,r,case", FORWARD, ids=[f"F{m}x{r}-{i}" for i, (m, r, _) in enumerate(FORWARD)])
def test_winograd_conv2d(dev, rng, m, r, case):
    N, C, H, W, O, padding, has_bias, relu = case
    s, begin, total = conv_shape(N, C, H, W, O, padding, r)
    assert winograd.supported(s, m)
    a = m + r - 1
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.uniform(-1, 1, (O, C, r, r)) / np.sqrt(r * r * C)).astype(np.float32)
    b = rng.uniform(-1, 1, O).astype(np.float32) if has_bias else None
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    ry, rdx, _, _ = ref.conv2d(x, w, b, (1, 1), begin, total, (1, 1), 1, dy)
    # the terms' sizes: every tap of each output's kernel slice times the largest input
    ty = (np.abs(w).sum(axis=(1, 2, 3)) * np.abs(x).max() + (0 if b is None else np.abs(b)))[None, :, None, None]
    tdx = (np.abs(w).sum(axis=(0, 2, 3)) * np.abs(dy).max())[None, :, None, None]
    if relu:
        ry = np.maximum(ry, 0.0)
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev) if has_bias else None, s, relu=relu,
                                m=m)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s, m=m)
    for name, got, want, terms in (("output", y.numpy(), ry, ty), ("grad input", dx.numpy(), rdx, tdx)):
        if want.size >= 16:
            assert_close(got, want, name, tol=TOL[a])
        else:
            assert_close_to_terms(got, want, terms, name, tol=TOL_TERMS[a])


@needs_torch
@pytest.mark.parametrize("m,r,case", [(m, r, (CASES if r == 3 else CASES_5)[i]) for m, r in VARIANTS for i in (3, 8)],
                         ids=[f"F{m}x{r}-{k}" for m, r in VARIANTS for k in ("same", "asymmetric")])
def test_winograd_against_torch(dev, rng, m, r, case):
    """A second, independent reference: PyTorch in float64, asymmetric padding through F.pad."""
    import torch
    import torch.nn.functional as F
    N, C, H, W, O, padding, _, relu = case
    s, begin, total = conv_shape(N, C, H, W, O, padding, r)
    a = m + r - 1
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((O, C, r, r)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    pads = (begin[1], total[1] - begin[1], begin[0], total[0] - begin[0])
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    ty = F.conv2d(F.pad(tx, pads), tw, torch.tensor(b, dtype=torch.float64))
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    ry = torch.relu(ty).detach().numpy() if relu else ty.detach().numpy()
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev), s, relu=relu, m=m)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s, m=m)
    dw = clnet.tensor(np.zeros_like(w), dev)
    winograd.conv2d_backward_weights(clnet.tensor(x, dev), clnet.tensor(dy, dev), s, dw, m=m)
    assert_close(y.numpy(), ry, "output", tol=TOL[a])
    assert_close(dx.numpy(), tx.grad.numpy(), "grad input", tol=TOL[a])
    assert_close(dw.numpy(), tw.grad.numpy(), "grad weights", tol=TOL_DW[a])


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
WEIGHT_CASES_5 = [
    (1, 1, 1, 1, 1, 2),                      # 1x1
    (3, 3, 5, 5, 17, 0),                     # 1x1 from a 5x5 image
    (3, 17, 6, 7, 3, 0),                     # 2x3
    (1, 64, 7, 7, 3, 2),                     # 7x7
    (3, 3, 31, 33, 5, 2),                    # 31x33
    (3, 17, 6, 7, 3, ((1, 0), (3, 4))),      # 5x7: top 1 bottom 2, left 0 right 4
    (3, 4, 6, 7, 17, ((5, 0), (6, 1))),      # 8x4: top 5, more than the kernel reaches
    (3, 64, 14, 14, 64, 2),                  # 14x14: a longer reduction
]
WEIGHTS = [(m, r, case) for m, r in VARIANTS for case in (WEIGHT_CASES if r == 3 else WEIGHT_CASES_5)]


def check_backward_weights(dev, rng, N, C, H, W, O, padding, m=2, r=3):
    """dw, starting from random values, plus Winograd's weight gradient against the float64 reference's."""
    s, begin, total = conv_shape(N, C, H, W, O, padding, r)
    assert winograd.supported(s, m)
    a = m + r - 1
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.uniform(-1, 1, (O, C, r, r)) / np.sqrt(r * r * C)).astype(np.float32)
    dy = rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32)
    _, _, rdw, _ = ref.conv2d(x, w, None, (1, 1), begin, total, (1, 1), 1, dy)
    dw0 = rng.standard_normal(w.shape).astype(np.float32)
    dw = clnet.tensor(dw0, dev)
    winograd.conv2d_backward_weights(clnet.tensor(x, dev), clnet.tensor(dy, dev), s, dw, m=m)
    # += semantics: subtract the starting values in float64, so the comparison is of the gradient alone
    got = dw.numpy().astype(np.float64) - dw0
    if rdw.size >= 16 and N * s.OH * s.OW >= 16:
        assert_close(got, rdw, "grad weights", tol=TOL_DW[a])
    else:  # few results, or each a sum of few terms (a 1x1 output: one product, far below dw0 for some seeds, so
        # dw0 + gradient rounds at dw0's size). The terms: each channel's |x| times the largest |dy|, and dw0
        tdw = np.abs(x).sum(axis=(0, 2, 3))[None, :, None, None] * np.abs(dy).max() + np.abs(dw0)
        assert_close_to_terms(got, rdw, tdw, "grad weights", tol=TOL_TERMS[a])


@pytest.mark.parametrize("m,r,case", WEIGHTS, ids=[f"F{m}x{r}-{i}" for i, (m, r, _) in enumerate(WEIGHTS)])
def test_winograd_conv2d_backward_weights(dev, rng, m, r, case):
    check_backward_weights(dev, rng, *case, m=m, r=r)


def test_winograd_store_block_fits_the_device():
    """The input transform's square work-group shrinks to what the device's work-groups and local memory hold."""
    from types import SimpleNamespace as Device
    assert winograd.store_block(Device(max_work_group_size=1024, local_mem_size=48 << 10), 6) == 16
    assert winograd.store_block(Device(max_work_group_size=64, local_mem_size=48 << 10), 4) == 8
    assert winograd.store_block(Device(max_work_group_size=1024, local_mem_size=32 << 10), 6) == 8
    assert winograd.store_block(Device(max_work_group_size=1, local_mem_size=1 << 10), 6) == 1


@pytest.mark.parametrize("m,r", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("side", [1, 4, 8])
def test_winograd_backward_weights_with_smaller_blocks(dev, rng, monkeypatch, m, r, side):
    """The weight gradient with the smaller input-transform blocks of smaller devices (tiles and channels not
    multiples of them)."""
    monkeypatch.setattr(winograd, "store_block", lambda dev, a: side)
    check_backward_weights(dev, rng, 3, 11, 9, 7, 13, 1 if r == 3 else 2, m, r)


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
    assert_close(dw.numpy(), rdw, "grad weights", tol=TOL_DW[4])


def test_winograd_backward_weights_checks_shapes(dev):
    s, _, _ = conv_shape(2, 5, 6, 7, 4, 1)
    x, dy = clnet.tensor(np.zeros((2, 5, 6, 7), np.float32), dev), clnet.tensor(np.zeros((2, 4, 6, 7), np.float32), dev)
    with pytest.raises(ValueError, match=r"expected dw of shape \(4, 5, 3, 3\), got \(5, 4, 3, 3\)"):
        winograd.conv2d_backward_weights(x, dy, s, clnet.tensor(np.zeros((5, 4, 3, 3), np.float32), dev))


@pytest.mark.parametrize("m,r", VARIANTS, ids=VARIANT_IDS)
def test_winograd_large_batch_is_chunked(dev, rng, monkeypatch, m, r):
    """Batches whose transformed buffers exceed the budget run in chunks (here one image each) with the same result."""
    monkeypatch.setitem(tuning.COL_BYTES, "gpu", 3000)
    monkeypatch.setitem(tuning.COL_BYTES, "cpu", 3000)
    a = m + r - 1
    s, begin, total = conv_shape(5, 3, 7, 6, 4, r // 2, r)
    assert winograd.chunk(s, dev, m) == 1
    x = rng.standard_normal((5, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, r, r)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    dy = rng.standard_normal((5, 4, s.OH, s.OW)).astype(np.float32)
    ry, rdx, _, _ = ref.conv2d(x, w, b, (1, 1), begin, total, (1, 1), 1, dy)
    wt = clnet.tensor(w, dev)
    y = winograd.conv2d_forward(clnet.tensor(x, dev), wt, clnet.tensor(b, dev), s, m=m)
    dx = winograd.conv2d_backward_data(wt, clnet.tensor(dy, dev), s, m=m)
    assert_close(y.numpy(), ry, "output", tol=TOL[a])
    assert_close(dx.numpy(), rdx, "grad input", tol=TOL[a])
    # the weight gradient accumulates its chunks into one Winograd-domain buffer: with a padding larger than the
    # kernel's half (output larger than the input) and an asymmetric one, and dw starting non-zero
    for padding in (r // 2 + 1, ((1, 0), (r - 2, r - 1))):
        s, _, _ = conv_shape(5, 3, 7, 6, 4, padding, r)
        assert winograd.chunk(s, dev, m) == 1
        check_backward_weights(dev, rng, 5, 3, 7, 6, 4, padding, m, r)


def test_winograd_supported():
    """F(2, 3) and F(4, 3) for 3x3, F(2, 5) for 5x5; stride 1, dilation 1, one group; padding and sizes are free.
    Pure Python, no device."""
    def shape(**kw):
        args = dict(kernel_size=3, stride=1, padding=1, dilation=1, groups=1)
        args.update(kw)
        return nn.Conv2d(4, 8, **args).conv_shape((2, 4, 9, 9))
    for m in (2, 4):
        assert winograd.supported(shape(), m)
        assert winograd.supported(shape(padding=0), m)
        assert winograd.supported(shape(padding="same"), m)
        assert winograd.supported(shape(padding=3), m)
    assert winograd.supported(shape(kernel_size=5, padding=2), 2)
    assert not winograd.supported(shape(kernel_size=5, padding=2), 4)
    for kw in (dict(kernel_size=7), dict(kernel_size=1), dict(kernel_size=(3, 1)), dict(kernel_size=(5, 3)),
               dict(stride=2), dict(dilation=2), dict(groups=2)):
        for m in (2, 4):
            assert not winograd.supported(shape(**kw), m), (kw, m)
    with pytest.raises(ValueError, match="Winograd"):
        winograd.conv2d_forward(None, None, None, shape(stride=2))  # refused before any device work


def test_gpus_default_to_winograd_only_where_its_launches_pay():
    """A GPU's default (untuned) algorithm: Winograd for layers of at least tuning.WINOGRAD_MIN_FLOPS (and 16
    channels each side), im2col below, where its three transform launches cost more host time than its products save
    (lenet's 20->50 layer at batch 1: 3.2 MFLOP; lenet-wide's 120->120 layer at batch 64: 2.9 GFLOP). Pure Python."""
    from types import SimpleNamespace
    from clnet import tuning
    gpu = SimpleNamespace(is_gpu=True)

    def default(n, c, o, plane, k, kind):
        s = nn.Conv2d(c, o, k).conv_shape((n, c, plane, plane))
        return tuning.conv_default(gpu, s, ["im2col", "winograd"], kind)
    for kind in ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights"):
        assert default(1, 20, 50, 12, 5, kind) == "im2col"  # lenet b1
        assert default(64, 20, 50, 12, 5, kind) == "im2col"  # lenet b64: 205 MFLOP
        assert default(1, 120, 120, 12, 5, kind) == "im2col"  # lenet-wide b1: 46 MFLOP
        assert default(64, 120, 120, 12, 5, kind) == "winograd"  # lenet-wide b64: 2.9 GFLOP
        assert default(1, 64, 64, 58, 3, kind) == "winograd"  # resnet's first 3x3 layer at b1: 231 MFLOP
        assert default(64, 8, 64, 58, 3, kind) == "im2col"  # too few input channels, however large
