"""1x1 convolutions (clnet/conv1x1.py, cl_kernels/conv1x1.cl) against PyTorch in float64: forward, input, weight and
bias gradients through nn.Conv2d on every device (the kernels are the CPU-shaped algorithm; on a GPU the tests make
the device take them)."""
import numpy as np
import pytest

import clnet
from clnet import nn, tuning

from conftest import assert_close, launched, needs_torch, skip_other_class_unless_first

CASES = [
    # (N, C, H, W, O, groups)
    (1, 2, 1, 1, 3, 1),           # one pixel: every run and block partial
    (1, 3, 17, 19, 5, 1),         # batch 1 (the weight gradient written at once), 323 pixels: a partial last run
    (3, 20, 15, 15, 33, 1),       # a partial block of output channels (33 = 4 x 8 + 1), partial input blocks
    (2, 12, 14, 14, 18, 3),       # three groups of 4 -> 6
    (2, 16, 28, 28, 24, 1),       # mobilenet's 28x28 expansion, smaller
    (3, 7, 2, 37, 9, 1),          # 74 pixels: two whole runs and a tail of 10
    (2, 8, 8, 8, 16, 4),          # four groups of 2 -> 4
]
# (a group of one input channel is depthwise.py's)
BLOCKS = [
    dict(rows=dict(PV=8, NV=1, OB=1, LS=1), weights=dict(PV=8, OB=1, CB=1)),
    dict(rows=dict(PV=16, NV=4, OB=16, LS=8), weights=dict(PV=16, OB=8, CB=8)),
    dict(rows=dict(PV=8, NV=3, OB=5, LS=2), weights=dict(PV=8, OB=3, CB=7)),
]


@pytest.fixture
def everywhere(monkeypatch, dev):
    """Every pointwise pass of every plane size takes the 1x1 kernels, on every device class."""
    monkeypatch.setattr(tuning, "cpu_shaped", lambda d: True)
    monkeypatch.setattr(tuning, "CONV1X1_MIN_PLANE", dict(conv2d_fwd=1, conv2d_bwd_data=1, conv2d_bwd_weights=1))
    tuning.forget()
    yield
    tuning.forget()


def _torch_reference(x, w, b, dy, groups, relu):
    import torch
    xt, wt, bt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, groups=groups)
    if relu:
        yt = torch.relu(yt)
    yt.backward(torch.tensor(dy, dtype=torch.float64))
    return yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


def _check(dev, rng, N, C, H, W, O, G, relu=False, steps=1, ran=("conv1x1_rows", "conv1x1_weights"), not_ran=()):
    """The layer's forward and gradients (after `steps` backward passes, which add up) against PyTorch's; the kernels
    `ran` launched, those of `not_ran` not."""
    layer = nn.Conv2d(C, O, 1, groups=G).to(dev)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32) + (0.3 if relu else 0.0)  # fewer outputs near 0
    xt = clnet.tensor(x, dev, requires_grad=True)
    with launched() as names:
        y = layer(xt)
        if relu:
            y = clnet.nn.functional.relu(y)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        for _ in range(steps):
            y.backward(clnet.tensor(dy, dev), retain_graph=True)
    assert set(ran) <= set(names) and not set(not_ran) & set(names), names
    ry, rdx, rdw, rdb = _torch_reference(x, layer.weight.numpy(), layer.bias.numpy(), dy, G, relu)
    assert_close(y.numpy(), ry, "output")
    assert_close(xt.grad.numpy(), steps * rdx, "input gradient")
    assert_close(layer.weight.grad.numpy(), steps * rdw, "weight gradient")
    assert_close(layer.bias.grad.numpy(), steps * rdb, "bias gradient")


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_conv1x1_layer(dev, rng, case, everywhere):
    _check(dev, rng, *case)


@needs_torch
@pytest.mark.parametrize("blocks", BLOCKS, ids=["smallest", "largest", "odd"])
def test_conv1x1_other_blocks(dev, rng, blocks, everywhere, monkeypatch):
    """Register blocks other than the defaults: one channel and one vector, the largest, and odd ones (a block of 5
    output channels, 7 input channels, three vectors a run); on the first device of each class (the same kernels
    built other ways: Intel's compiler takes up to 40 s for the largest)."""
    skip_other_class_unless_first(dev, "other register blocks")
    monkeypatch.setattr(tuning, "CONV1X1", blocks)
    monkeypatch.setattr(tuning, "CONV1X1_INTEL", blocks)
    for case in (CASES[1], CASES[2], CASES[3], CASES[5]):
        _check(dev, rng, *case)


@needs_torch
def test_conv1x1_fused_relu_and_gradients_that_add(dev, rng, everywhere):
    """A ReLU after the layer (fused into the forward where the graph allows) and two backward passes, whose weight
    gradients add (the second pass's beta 1)."""
    _check(dev, rng, 2, 10, 9, 11, 13, 1, relu=True, steps=2)
    _check(dev, rng, 1, 6, 5, 7, 4, 2, steps=2)


@needs_torch
def test_pointwise_weight_gradient_reads_x_where_it_lies_on_gpus(dev, rng, monkeypatch):
    """On a GPU's path (im2col's products) a 1x1 layer's weight gradient takes x^T as the product's B in place, its
    rows (image, pixel) split (Mat.split_rows), with no lowering: planes of 225 and 323 pixels (scalar loads), 784
    and 64 (float4s), one image (no split), groups, and chunks of two images (the second chunk's offset, a last
    chunk of one)."""
    import clnet.conv
    if not dev.is_gpu:
        skip_other_class_unless_first(dev, "gemm_tiled with a row split")
        monkeypatch.setattr(dev, "is_gpu", True)
    tuning.forget()
    for case in (CASES[1], CASES[2], CASES[3], CASES[4], CASES[6]):
        _check(dev, rng, *case, ran=("gemm_tiled",), not_ran=("im2col",))
    monkeypatch.setattr(clnet.conv, "_col_chunk", lambda s, dev: 2)
    _check(dev, rng, 3, 12, 7, 9, 10, 2, steps=2, ran=("gemm_tiled",), not_ran=("im2col",))
    tuning.forget()


@needs_torch
def test_a_gpu_without_the_tiled_product_lowers_pointwise_inputs(dev, rng, monkeypatch):
    """A GPU whose work-groups cannot hold the small tile's 256 work-items runs gemm_block, which cannot read B's rows
    split: its 1x1 layers' weight gradients lower x first (im2col), against PyTorch."""
    if not dev.is_gpu:
        skip_other_class_unless_first(dev, "gemm_block on a GPU")
        monkeypatch.setattr(dev, "is_gpu", True)
    monkeypatch.setattr(dev, "max_work_group_size", 128)
    tuning.forget()
    _check(dev, rng, 2, 12, 7, 7, 100, 1, ran=("im2col", "gemm_block"))  # 100 rows: no thin tile takes them
    tuning.forget()


def test_pointwise_layers_default_to_conv1x1_on_cpus_by_plane(dev):
    """The default per pass: 1x1 kernels on CPUs for planes of at least each pass's minimum (forward and data
    gradient 14x14, weight gradient 28x28), the algorithm before them below it (direct's forward for 32 input
    channels, im2col's gradients); GPUs are never offered them (conv._conv_algorithm)."""
    from clnet.shapes import ConvShape
    if dev.is_gpu:
        pytest.skip("CPUs' default")
    kinds = ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights")
    below = dict(conv2d_fwd="direct", conv2d_bwd_data="im2col", conv2d_bwd_weights="im2col")
    for plane, takes in ((7, ()), (13, ()), (14, kinds[:2]), (27, kinds[:2]), (28, kinds), (112, kinds)):
        s = ConvShape(16, 32, plane, plane, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, plane, plane)
        for kind in kinds:
            options = ["im2col", "conv1x1"] + (["direct"] if kind == "conv2d_fwd" else [])
            want = "conv1x1" if kind in takes else below[kind]
            assert tuning.conv_default(dev, s, options, kind) == want, (plane, kind)
