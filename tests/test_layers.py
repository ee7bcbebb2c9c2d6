"""Every layer, forward and every gradient, against float64 NumPy references (and PyTorch where installed)."""
import numpy as np
import pytest

import clnet
from clnet import conv, nn

import reference as ref
from conftest import assert_close, assert_close_to_terms, launched, needs_torch


def run_layer(layer, dev, x, dy_fn=None, rng=None):
    """Forward and backward through a clnet layer with a random upstream gradient; returns (y, dy, dx). The input
    requires a gradient, so autograd computes d loss / d input into its .grad (and the parameters' into theirs)."""
    layer.to(dev)
    xt = clnet.tensor(x, dev, requires_grad=True)
    y = layer(xt)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    return y.numpy(), dy, xt.grad.numpy()


CONV_CASES = [
    # (N, C, H, W, O, kernel, stride, padding, dilation, groups)
    (2, 3, 9, 11, 5, 3, 1, 0, 1, 1),
    (1, 1, 28, 28, 20, 5, 1, 0, 1, 1),
    (3, 4, 13, 7, 6, (3, 2), (2, 1), (1, 2), 1, 2),
    (2, 6, 17, 15, 9, 3, 2, 1, (2, 1), 3),
    (2, 5, 12, 12, 31, 1, 1, 0, 1, 1),      # pointwise: no lowering
    (2, 33, 8, 8, 65, 1, 1, 0, 1, 1),
    (3, 12, 7, 9, 18, 1, 1, 0, 1, 3),       # pointwise in groups (the GPU shape lowers x for its weights)
    (2, 3, 10, 9, 4, 4, 1, "same", 1, 1),   # even kernel: PyTorch puts the extra pixel at the bottom/right
    (1, 2, 9, 9, 3, 3, 1, "same", 2, 1),
    (2, 3, 23, 23, 8, 11, 4, 2, 1, 1),      # AlexNet's first layer shape, small
    (3, 8, 5, 5, 8, 3, 1, 1, 1, 8),         # depthwise
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv2d(dev, rng, case, kernel_shape):
    N, C, H, W, O, k, s, p, d, g = case
    layer = nn.Conv2d(C, O, k, stride=s, padding=p, dilation=d, groups=g)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    ry, rdx, rdw, rdb = ref.conv2d(x, w, b, layer.stride, layer._pad_begin, layer._pad_total, layer.dilation, g, dy)
    assert_close(y, ry, "output")
    assert_close(dx, rdx, "grad input")
    assert_close(layer.weight.grad.numpy(), rdw, "grad weight")
    assert_close(layer.bias.grad.numpy(), rdb, "grad bias")


def test_conv2d_shapes_follow_the_input_and_the_attributes(dev, rng):
    """nn.Conv2d keeps its ConvShape by input shape: another batch or image size, and a stride or dilation set after
    a forward, each take their own (against the float64 reference, forward and backward)."""
    layer = nn.Conv2d(3, 4, 3, padding=1).to(dev)
    for shape, stride, dilation in [((2, 3, 9, 11), (1, 1), (1, 1)), ((1, 3, 9, 11), (1, 1), (1, 1)),
                                    ((2, 3, 7, 5), (1, 1), (1, 1)), ((2, 3, 9, 11), (2, 1), (1, 1)),
                                    ((2, 3, 9, 11), (2, 1), (1, 2))]:
        if (stride, dilation) != (layer.stride, layer.dilation):  # set only on a change: a set drops the shapes
            layer.stride, layer.dilation = stride, dilation
        layer.weight.grad = layer.bias.grad = None
        x = rng.standard_normal(shape).astype(np.float32)
        y, dy, dx = run_layer(layer, dev, x, rng=rng)
        ry, rdx, rdw, rdb = ref.conv2d(x, layer.weight.numpy(), layer.bias.numpy(), stride, layer._pad_begin,
                                       layer._pad_total, dilation, 1, dy)
        assert y.shape == ry.shape, (shape, stride, dilation)
        assert_close(y, ry, f"output {shape} stride {stride} dilation {dilation}")
        assert_close(dx, rdx, "grad input")
        assert_close(layer.weight.grad.numpy(), rdw, "grad weight")
        assert_close(layer.bias.grad.numpy(), rdb, "grad bias")


def test_bias_gradient_in_runs(dev, rng, monkeypatch):
    """The two-pass bias gradient (sums cut into runs, as on GPUs for first layers) against the reference."""
    from clnet import tuning
    monkeypatch.setattr(tuning, "cpu_shaped", lambda dev: False)  # the runs are the GPU shape's
    monkeypatch.setattr(tuning, "reduction_runs", lambda dev, n, groups, lsize: 3)
    layer = nn.Conv2d(2, 3, 3).to(dev)
    x = rng.standard_normal((5, 2, 11, 13)).astype(np.float32)
    y = layer(clnet.tensor(x, dev))
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    # tolerance scaled for a sum with heavy cancellation (about 1 seed in 300 failed at 1e-6)
    assert_close(layer.bias.grad.numpy(), dy.astype(np.float64).sum(axis=(0, 2, 3)), "bias gradient", tol=1e-5)


@pytest.mark.parametrize("runs", [None, 3])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("N,C,P", [(1, 1, 1), (3, 7, 33), (2, 5, 577), (64, 3, 8), (5, 500, 1)])
def test_bias_gradient(dev, rng, kernel_shape, monkeypatch, N, C, P, relu, runs):
    """db += the sum of dy over images and pixels, in both kernel shapes, P not a multiple of any vector width; with
    relu, dy first taken through the gradient of a ReLU whose output is y, that gradient returned (in bias_grad's
    pass: the same bits as act_bwd's, and db the same bits as bias_grad's of it); runs 3: the GPU shape's sums in
    runs."""
    from clnet import elementwise, tuning
    if runs and not tuning.cpu_shaped(dev):
        monkeypatch.setattr(tuning, "reduction_runs", lambda dev, n, groups, lsize: runs)
    dy = rng.standard_normal((N, C, P)).astype(np.float32)
    y = np.maximum(rng.standard_normal((N, C, P)), 0).astype(np.float32)  # a ReLU's output: zeros and positives
    db0 = rng.standard_normal(C).astype(np.float32)
    db = clnet.tensor(db0, dev)
    g = dy * (y > 0) if relu else dy
    out = conv.bias_grad(clnet.tensor(dy, dev), db, N, C, P, relu_y=clnet.tensor(y, dev) if relu else None)
    assert_close(db.numpy(), db0 + g.astype(np.float64).sum(axis=(0, 2)), "bias gradient", tol=1e-5)
    if not relu:
        assert out is None
        return
    assert np.array_equal(out.numpy(), g), "the ReLU's gradient"
    apart = clnet.tensor(db0, dev)
    conv.bias_grad(elementwise._activation_grad("relu", clnet.tensor(y, dev), clnet.tensor(dy, dev), "ReLU"), apart,
                   N, C, P)
    assert np.array_equal(db.numpy(), apart.numpy()), "one pass and two passes differ"


def test_conv2d_large_batch_is_chunked(dev, rng, monkeypatch):
    """Batches whose lowered matrix exceeds the budget run in chunks with the same result."""
    from clnet import tuning
    monkeypatch.setitem(tuning.COL_BYTES, "gpu", 3000)
    monkeypatch.setitem(tuning.COL_BYTES, "cpu", 3000)
    layer = nn.Conv2d(3, 4, 3, padding=1, bias=False)
    x = rng.standard_normal((5, 3, 7, 6)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    ry, rdx, rdw, _ = ref.conv2d(x, layer.weight.numpy(), None, (1, 1), (1, 1), (2, 2), (1, 1), 1, dy)
    assert_close(y, ry, "output")
    assert_close(dx, rdx, "grad input")
    assert_close(layer.weight.grad.numpy(), rdw, "grad weight")


def test_gradients_accumulate(dev, rng):
    """backward adds into .grad, so two passes give twice the gradient (the parameters' and the input's)."""
    layer = nn.Linear(7, 3).to(dev)
    x = clnet.tensor(rng.standard_normal((4, 7)), dev, requires_grad=True)
    dy = clnet.tensor(rng.standard_normal((4, 3)), dev)
    layer(x).backward(dy)
    once, once_x = layer.weight.grad.numpy(), x.grad.numpy()
    layer(x).backward(dy)
    assert_close(layer.weight.grad.numpy(), 2 * once.astype(np.float64), "accumulated grad")
    assert_close(x.grad.numpy(), 2 * once_x.astype(np.float64), "accumulated input grad")


@pytest.mark.parametrize("N,I,O", [(1, 1, 1), (1, 37, 19), (3, 31, 33), (65, 17, 5), (8, 800, 500)])
def test_linear(dev, rng, kernel_shape, N, I, O):
    """Forward and every gradient against float64; after zero_grad (NaN left in the gradients) a backward that
    overwrites them, then one that adds; in both kernel shapes (at batch 1 the rank-1 weight gradient writes the
    bias gradient in the same launch)."""
    layer = nn.Linear(I, O)
    x = rng.standard_normal((N, I)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    ry, rdx, rdw, rdb = ref.linear(x, layer.weight.numpy(), layer.bias.numpy(), dy)
    assert_close(y, ry, "output")
    assert_close(dx, rdx, "grad input")
    assert_close(layer.weight.grad.numpy(), rdw, "grad weight")
    assert_close(layer.bias.grad.numpy(), rdb, "grad bias")
    for p in (layer.weight, layer.bias):  # zero_grad's marks: the next backward overwrites, NaN never shows
        p.grad.write(np.full(p.shape, np.nan, np.float32))
    layer.zero_grad()
    dy2 = rng.standard_normal(dy.shape).astype(np.float32)
    y2 = layer(clnet.tensor(x, dev))
    with launched() as names:
        y2.backward(clnet.tensor(dy2, dev))
    from clnet import tuning
    if N == 1:  # weight and bias gradients in one rank-1 launch
        assert names == ["rank1_rows" if tuning.cpu_shaped(dev) else "gemm_rank1"], names
    _, _, rdw2, rdb2 = ref.linear(x, layer.weight.numpy(), layer.bias.numpy(), dy2)
    assert_close(layer.weight.grad.numpy(), rdw2, "grad weight after zero_grad")
    assert_close(layer.bias.grad.numpy(), rdb2, "grad bias after zero_grad")
    layer(clnet.tensor(x, dev)).backward(clnet.tensor(dy, dev))  # no zero_grad: adds
    assert_close(layer.weight.grad.numpy(), rdw + rdw2, "grad weight, two backwards")
    assert_close(layer.bias.grad.numpy(), rdb + rdb2, "grad bias, two backwards")


POOL_CASES = [
    # (N, C, H, W, kernel, stride, padding, ceil_mode)
    (2, 3, 8, 8, 2, None, 0, False),
    (1, 2, 13, 11, 3, 2, 0, False),
    (2, 3, 13, 11, 3, 2, 1, True),
    (1, 1, 7, 7, 3, 1, 1, False),           # 3x3 stride 1 that keeps the size
    (3, 2, 10, 9, (3, 2), (2, 3), (1, 1), True),
    (1, 4, 31, 33, 3, 2, 0, True),
    (2, 3, 9, 7, 2, None, 0, False),        # windows that tile the input, a row and a column past them
    (1, 2, 11, 10, (3, 2), (3, 2), 0, False),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_maxpool2d(dev, rng, case, kernel_shape):
    N, C, H, W, k, s, p, ceil = case
    layer = nn.MaxPool2d(k, s, p, ceil)
    x = rng.permutation(N * C * H * W).reshape(N, C, H, W).astype(np.float32) / 10  # no ties
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    ry, rdx = ref.maxpool2d(x, layer.kernel_size, layer.stride, layer.padding, ceil, dy)
    assert_close(y, ry, "output")
    assert_close(dx, rdx, "grad input")


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_avgpool2d(dev, rng, case, count_include_pad):
    N, C, H, W, k, s, p, ceil = case
    layer = nn.AvgPool2d(k, s, p, ceil, count_include_pad)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    ry, rdx = ref.avgpool2d(x, layer.kernel_size, layer.stride, layer.padding, ceil, count_include_pad, dy)
    assert_close(y, ry, "output")
    assert_close(dx, rdx, "grad input")


@pytest.mark.parametrize("kind,layer_cls", [("relu", nn.ReLU), ("sigmoid", nn.Sigmoid), ("tanh", nn.Tanh)])
def test_activations(dev, rng, kind, layer_cls):
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    x[np.abs(x) < 1e-3] = 0.5  # away from ReLU's kink
    y, dy, dx = run_layer(layer_cls(), dev, x, rng=rng)
    ry, rdx = ref.activation(kind, x, dy)
    assert_close(y, ry, "output", tol=1e-6)
    assert_close(dx, rdx, "grad input", tol=1e-6)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((4, 10), 1), ((2, 3, 5, 4), 1), ((3, 65), -1), ((1, 1), 1)])
def test_softmax(dev, rng, shape, dim, log):
    layer = nn.LogSoftmax(dim) if log else nn.Softmax(dim)
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    ry, rdx = ref.softmax(x, dim, log, dy)
    assert_close(y, ry, "output", tol=1e-5)
    assert_close(dx, rdx, "grad input", tol=1e-5)


def test_flatten(dev, rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y, dy, dx = run_layer(nn.Flatten(), dev, x, rng=rng)
    assert y.shape == (2, 60)
    np.testing.assert_array_equal(y, x.reshape(2, 60))
    np.testing.assert_array_equal(dx, dy.reshape(x.shape))


def test_dropout(dev, rng):
    clnet.manual_seed(int(rng.integers(1 << 30)))
    layer = nn.Dropout(0.3).to(dev)
    x = rng.standard_normal((50, 400)).astype(np.float32) + 3
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    kept = y != 0
    assert 0.65 < kept.mean() < 0.75, f"kept fraction {kept.mean():.3f}, expected about 0.7"
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-6)
    np.testing.assert_allclose(dx, np.where(kept, dy / 0.7, 0), rtol=1e-6)
    layer.eval()
    y_eval, dy_eval, dx_eval = run_layer(layer, dev, x, rng=rng)
    np.testing.assert_array_equal(y_eval, x)
    np.testing.assert_array_equal(dx_eval, dy_eval)


@pytest.mark.parametrize("N,C", [(1, 2), (7, 10), (300, 33), (64, 1000), (3, 517)])
def test_cross_entropy(dev, rng, N, C):
    """Rows shared by 1 to 256 work-items (ops._row_lanes: 2, 16, 1, 4 and 64 here), a row's classes past a power
    of two."""
    logits = (2 * rng.standard_normal((N, C))).astype(np.float32)
    labels = rng.integers(0, C, N)
    loss_fn = nn.CrossEntropyLoss()
    z = clnet.tensor(logits, dev, requires_grad=True)
    loss = loss_fn(z, labels)
    loss.backward()
    rl, rg = ref.cross_entropy(logits, labels)
    assert loss.shape == () and abs(float(loss) - rl) < 1e-5 * max(1, abs(rl))
    assert_close(z.grad.numpy(), rg, "grad logits", tol=1e-5)


def test_reference_conv_matches_finite_differences(rng):
    """The float64 reference's gradients agree with central differences, so the references themselves are right."""
    x = rng.standard_normal((1, 2, 5, 6))
    w = rng.standard_normal((4, 1, 3, 2))
    b = rng.standard_normal(4)
    args = ((2, 1), (1, 0), (2, 1), (1, 2), 2)
    y = ref.conv2d(x, w, b, *args)
    dy = rng.standard_normal(y.shape)
    _, dx, dw, db = ref.conv2d(x, w, b, *args, dy=dy)
    eps = 1e-6
    for arr, grad in ((x, dx), (w, dw), (b, db)):
        for idx in [tuple(rng.integers(0, s) for s in arr.shape) for _ in range(6)]:
            old = arr[idx]
            arr[idx] = old + eps
            up = (ref.conv2d(x, w, b, *args) * dy).sum()
            arr[idx] = old - eps
            down = (ref.conv2d(x, w, b, *args) * dy).sum()
            arr[idx] = old
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-6 * max(1, abs(grad[idx]))


def test_reference_pools_match_finite_differences(rng):
    x = rng.permutation(2 * 9 * 8).reshape(1, 2, 9, 8) / 7.0
    for fn in (lambda a, g=None: ref.maxpool2d(a, (3, 2), (2, 2), (1, 1), True, g),
               lambda a, g=None: ref.avgpool2d(a, (3, 3), (2, 1), (1, 1), True, False, g)):
        y = fn(x)
        dy = rng.standard_normal(y.shape)
        _, dx = fn(x, dy)
        eps = 1e-4
        for idx in [tuple(rng.integers(0, s) for s in x.shape) for _ in range(8)]:
            old = x[idx]
            x[idx] = old + eps
            up = (fn(x) * dy).sum()
            x[idx] = old - eps
            down = (fn(x) * dy).sum()
            x[idx] = old
            assert abs((up - down) / (2 * eps) - dx[idx]) < 1e-6


@needs_torch
@pytest.mark.parametrize("case", CONV_CASES[:4] + CONV_CASES[6:8], ids=[str(i) for i in (0, 1, 2, 3, 6, 7)])
def test_conv2d_against_torch(dev, rng, case):
    import torch
    N, C, H, W, O, k, s, p, d, g = case
    layer = nn.Conv2d(C, O, k, stride=s, padding=p, dilation=d, groups=g)
    tl = torch.nn.Conv2d(C, O, k, stride=s, padding=p, dilation=d, groups=g).double()
    tl.load_state_dict({k2: torch.tensor(v, dtype=torch.float64) for k2, v in layer.state_dict().items()})
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    y, dy, dx = run_layer(layer, dev, x, rng=rng)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = tl(tx)
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    assert_close(y, ty.detach().numpy(), "output")
    assert_close(dx, tx.grad.numpy(), "grad input")
    assert_close(layer.weight.grad.numpy(), tl.weight.grad.numpy(), "grad weight")


@needs_torch
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_pools_against_torch(dev, rng, case):
    import torch
    N, C, H, W, k, s, p, ceil = case
    x = rng.permutation(N * C * H * W).reshape(N, C, H, W).astype(np.float32) / 10
    for layer, tl in ((nn.MaxPool2d(k, s, p, ceil), torch.nn.MaxPool2d(k, s, p, ceil_mode=ceil)),
                      (nn.AvgPool2d(k, s, p, ceil, False), torch.nn.AvgPool2d(k, s, p, ceil, False))):
        y, dy, dx = run_layer(layer, dev, x, rng=rng)
        tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        ty = tl(tx)
        ty.backward(torch.tensor(dy, dtype=torch.float64))
        assert_close(y, ty.detach().numpy(), f"{layer!r} output")
        assert_close(dx, tx.grad.numpy(), f"{layer!r} grad input")


@pytest.mark.parametrize("N,C", [(37, 5), (9, 300)])
def test_cross_entropy_metrics_count_correct_predictions(dev, rng, N, C):
    """The loss's metrics tensor holds (loss, rows whose first argmax equals the label), read in one copy. Logits of
    three values tie often: a row counts only where its label is the first of its maxima (found across lanes)."""
    logits = rng.integers(0, 3, (N, C)).astype(np.float32)
    labels = np.where(rng.random(N) < 0.5, logits.argmax(axis=1), rng.integers(0, C, N))
    if C > 5:  # a later maximum as the label, which a tie must not count
        labels[0] = np.flatnonzero(logits[0] == logits[0].max())[-1]
    loss_fn = nn.CrossEntropyLoss()
    loss = loss_fn(clnet.tensor(logits, dev), labels)
    value, correct = loss_fn.metrics.numpy()
    assert correct == (logits.argmax(axis=1) == labels).sum()
    assert value == float(loss)
    assert abs(value - ref.cross_entropy(logits, labels)[0]) < 1e-5


def test_a_fused_relu_at_batch_1_with_a_frozen_weight(dev, rng, kernel_shape):
    """Linear + ReLU at batch 1 whose weight is frozen: only the bias gradient is wanted there, so the ReLU's gradient
    takes its own pass (the GPU shape's products take it inside only when they run); against float64 NumPy."""
    clnet.manual_seed(int(rng.integers(1 << 30)))  # the seed printed replays the weights too
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).to(dev)
    model[0].weight.requires_grad_(False)
    x = rng.standard_normal((1, 5)).astype(np.float32)
    y = model(clnet.tensor(x, dev))
    dy = rng.standard_normal((1, 3)).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    (w1, b1), (w2, b2) = [(model[i].weight.numpy(), model[i].bias.numpy()) for i in (0, 2)]
    z = ref.linear(x, w1, b1)
    _, da, _, _ = ref.linear(np.maximum(z, 0), w2, b2, dy)
    assert model[0].weight.grad is None
    # each element a sum of 3 products (dy by w2's column), which can cancel: judged against the terms' size
    terms = (np.abs(dy).astype(np.float64) @ np.abs(w2).astype(np.float64)) * (z > 0)
    assert_close_to_terms(model[0].bias.grad.numpy(), (da * (z > 0)).sum(axis=0), terms.sum(axis=0),
                          "bias gradient", tol=1e-6)


@pytest.mark.parametrize("pool", [(2, 2, 0, False), (3, 2, 1, True)], ids=["2x2", "3x3-s2-pad1-ceil"])
def test_sequential_runs_a_relu_before_max_pooling_inside_the_pooling(dev, rng, kernel_shape, pool):
    """Conv2d, ReLU, MaxPool2d: the ReLU runs after the max inside the pooling (they commute), so neither direction
    launches a ReLU kernel; forward and every gradient against float64 NumPy (ReLU, then pooling, as written), and
    bit for bit what the layers give run apart (windows that are all negative included), a NaN kept as NaN."""
    k, st, pad, ceil = pool
    N, C, H, W, O = 2, 3, 9, 8, 4
    model = nn.Sequential(nn.Conv2d(C, O, 3, padding=1), nn.ReLU(), nn.MaxPool2d(k, st, pad, ceil_mode=ceil),
                          nn.Flatten()).to(dev)
    bias = model[0].bias.numpy()
    bias[0] = -100.0  # channel 0: every window negative, so the ReLU gives 0 and no gradient passes
    model[0].bias.write(bias)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    xt = clnet.tensor(x, dev, requires_grad=True)
    with launched() as names:
        y = model(xt)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(clnet.tensor(dy, dev))
    assert "act_fwd" not in names and "act_bwd" not in names, names
    w, b = model[0].weight.numpy(), model[0].bias.numpy()
    z = ref.conv2d(x, w, b, (1, 1), (1, 1), (2, 2), (1, 1), 1)
    pooled, da = ref.maxpool2d(np.maximum(z, 0), (k, k), (st, st), (pad, pad), ceil,
                               dy.reshape(model[2].output_shape(z.shape)))
    assert_close(y.numpy(), pooled.reshape(N, -1), "forward")
    assert (z[:, 0] < 0).all()
    _, dx, dw, db = ref.conv2d(x, w, b, (1, 1), (1, 1), (2, 2), (1, 1), 1, da * (z > 0))
    for got, want, name in ((xt.grad, dx, "dx"), (model[0].weight.grad, dw, "conv dw"), (model[0].bias.grad, db,
                                                                                           "conv db")):
        assert_close(got.numpy(), want, name, tol=1e-4)
    fused_grads = [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    model.fuse_relu = False
    xu = clnet.tensor(x, dev, requires_grad=True)
    with launched() as apart:
        yu = model(xu)
        yu.backward(clnet.tensor(dy, dev))
    # apart, the ReLU is a launch each way, and so is the bias gradient where the pooling took it
    assert len(apart) == len(names) + 2 + names.count("maxpool2d_bwd_bias"), apart
    assert np.array_equal(yu.numpy(), y.numpy()) and np.array_equal(xu.grad.numpy(), xt.grad.numpy())
    assert all(np.array_equal(p.grad.numpy(), g) for p, g in zip(model.parameters(), fused_grads))
    model.fuse_relu = True
    x[1, 2, 3, 4] = np.nan
    with clnet.no_grad():
        fused = model(clnet.tensor(x, dev)).numpy()
        model.fuse_relu = False
        apart = model(clnet.tensor(x, dev)).numpy()
    assert np.isnan(fused).any() and np.array_equal(np.isnan(fused), np.isnan(apart))


@pytest.mark.parametrize("N,H,W,O,pool,accumulate", [(1, 12, 11, 7, (2, 2, 0, False), False),
                                                     (3, 9, 8, 5, (3, 2, 1, True), True),
                                                     (1, 64, 64, 3, (2, 2, 0, False), False)],  # 4096 pixels
                         ids=["b1", "b3-3x3-s2-pad1-ceil-accumulating", "b1-4096-pixels"])
@pytest.mark.parametrize("frozen,relu", [(False, True), (True, True), (False, False)],
                         ids=["relu", "relu-frozen-bias", "no-relu"])
def test_a_small_convolutions_pooling_takes_its_bias_gradient_on_gpus(dev, rng, kernel_shape, N, H, W, O, pool,
                                                                     accumulate, frozen, relu):
    """Conv2d, MaxPool2d (a ReLU between or not) at small sizes on a GPU: the pooling's backward also writes the
    convolution's bias gradient (one launch fewer), into a fresh .grad or adding to one, with the bits of the layers
    run apart; every gradient against float64 NumPy. A frozen bias, a CPU, a hook or a larger layer keep the separate
    launches."""
    from clnet import ops, tuning
    k, st, pad, ceil = pool
    C = 2
    model = nn.Sequential(nn.Conv2d(C, O, 3, padding=1), *([nn.ReLU()] if relu else []),
                          nn.MaxPool2d(k, st, pad, ceil_mode=ceil), nn.Flatten()).to(dev)
    pool_layer = model[1 + relu]
    model[0].bias.requires_grad_(not frozen)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    before = [rng.standard_normal(p.shape).astype(np.float32) for p in model.parameters()]
    dy = None

    def step():
        nonlocal dy
        model.zero_grad()
        if accumulate:
            for p, g in zip(model.parameters(), before):
                if p.requires_grad:
                    p.grad = clnet.tensor(g, dev)
        xt = clnet.tensor(x, dev, requires_grad=True)
        with launched() as names:
            y = model(xt)
            if dy is None:
                dy = rng.standard_normal(y.shape).astype(np.float32)
            y.backward(clnet.tensor(dy, dev))
        grads = [None if p.grad is None else p.grad.numpy() for p in model.parameters()]
        return names, y.numpy(), xt.grad.numpy(), grads
    names, y, dx, grads = step()
    assert ops.pool_takes_bias_grad(dev, model[0].conv_shape(x.shape)) == (not tuning.cpu_shaped(dev))
    fused = not tuning.cpu_shaped(dev) and not frozen
    own_launch = any(n.startswith("bias_grad") for n in names)  # bias_grad, or a CPU's bias_grad_planes
    assert ("maxpool2d_bwd_bias" in names) == fused and own_launch == (not fused and not frozen), names
    w, b = model[0].weight.numpy(), model[0].bias.numpy()
    z = ref.conv2d(x, w, b, (1, 1), (1, 1), (2, 2), (1, 1), 1)
    pooled, da = ref.maxpool2d(np.maximum(z, 0) if relu else z, (k, k), (st, st), (pad, pad), ceil,
                               dy.reshape(pool_layer.output_shape(z.shape)))
    assert_close(y, pooled.reshape(N, -1), "forward")
    _, dx64, dw64, db64 = ref.conv2d(x, w, b, (1, 1), (1, 1), (2, 2), (1, 1), 1, da * (z > 0) if relu else da)
    if accumulate:
        dw64, db64 = dw64 + before[0], db64 + before[1]
    assert_close(dx, dx64, "dx", tol=1e-4)
    assert_close(grads[0], dw64, "conv dw", tol=1e-4)
    if frozen:
        assert grads[1] is None
    else:
        assert_close(grads[1], db64, "conv db", tol=1e-4)
    model.fuse_relu = False
    apart_names, y_apart, dx_apart, grads_apart = step()
    assert "maxpool2d_bwd_bias" not in apart_names
    assert len(apart_names) == len(names) + 2 * relu + fused, apart_names  # the ReLU each way, the bias gradient
    assert np.array_equal(y_apart, y) and np.array_equal(dx_apart, dx)
    assert all((a is None and g is None) or np.array_equal(a, g) for a, g in zip(grads_apart, grads))
    model.fuse_relu = True
    pool_layer.register_forward_hook(lambda m, args, out: None)
    hooked_names = step()[0]
    assert "maxpool2d_bwd_bias" not in hooked_names


def test_a_larger_convolutions_pooling_leaves_the_bias_gradient_to_its_own_launch(dev):
    """Past ops.POOL_BIAS_GRAD_MAX pixels a channel the pooling's one work-group a channel would leave a GPU idle: the
    bias gradient keeps its own launch."""
    from clnet import ops
    s = nn.Conv2d(2, 3, 3, padding=1).conv_shape((1, 2, 65, 65))
    assert s.N * s.OH * s.OW > ops.POOL_BIAS_GRAD_MAX and not ops.pool_takes_bias_grad(dev, s)
    s = nn.Conv2d(2, 3, 3, padding=1).conv_shape((1, 2, 64, 64))
    assert ops.pool_takes_bias_grad(dev, s) == dev.is_gpu


@pytest.mark.parametrize("N", [2, 1])
@pytest.mark.parametrize("hooked", [False, True])
def test_sequential_fuses_relu_into_the_conv2d_and_linear_before_it(dev, rng, hooked, kernel_shape, N):
    """Conv2d + ReLU and Linear + ReLU in a Sequential run as one op each (no ReLU launch of their own; at batch 1
    the Linear's ReLU gradient is taken inside its gemv.cl or gemv_cpu.cl products), forward and backward against
    float64 NumPy; a hook on the ReLU keeps it a layer of its own, with the same results. A NaN in the input stays NaN
    through the fused ReLU, as in PyTorch."""
    C, H, W, O, F = 3, 7, 9, 5, 6
    model = nn.Sequential(nn.Conv2d(C, O, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(O * H * W, F), nn.ReLU(),
                          nn.Linear(F, 4)).to(dev)
    if hooked:
        model[1].register_forward_hook(lambda m, args, out: None)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    xt = clnet.tensor(x, dev, requires_grad=True)
    with launched() as names:
        y = model(xt)
    assert names.count("act_fwd") == (1 if hooked else 0), names
    conv_w, conv_b = model[0].weight.numpy(), model[0].bias.numpy()
    (w1, b1), (w2, b2) = [(model[i].weight.numpy(), model[i].bias.numpy()) for i in (3, 5)]
    z0 = ref.conv2d(x, conv_w, conv_b, (1, 1), (1, 1), (2, 2), (1, 1), 1)
    a0 = np.maximum(z0, 0).reshape(N, -1)
    z1 = ref.linear(a0, w1, b1)
    a1 = np.maximum(z1, 0)
    expect = ref.linear(a1, w2, b2)
    assert_close(y.numpy(), expect, "forward")
    dy = rng.standard_normal(expect.shape).astype(np.float32)
    with launched() as names:
        y.backward(clnet.tensor(dy, dev))
    masked_inside = N == 1  # the Linear's ReLU (a hook watches only the first)
    # the Conv2d's ReLU gradient is taken in its bias gradient's pass, unless hooked
    assert names.count("act_bwd") == (0 if masked_inside else 1) + hooked, names
    _, da1, dw2, db2 = ref.linear(a1, w2, b2, dy)
    dz1 = da1 * (z1 > 0)
    _, da0, dw1, db1 = ref.linear(a0, w1, b1, dz1)
    dz0 = da0.reshape(z0.shape) * (z0 > 0)
    _, dx, dcw, dcb = ref.conv2d(x, conv_w, conv_b, (1, 1), (1, 1), (2, 2), (1, 1), 1, dz0)
    for got, want, name in ((xt.grad, dx, "dx"), (model[0].weight.grad, dcw, "conv dw"),
                            (model[0].bias.grad, dcb, "conv db"), (model[3].weight.grad, dw1, "linear dw"),
                            (model[3].bias.grad, db1, "linear db"), (model[5].weight.grad, dw2, "last dw"),
                            (model[5].bias.grad, db2, "last db")):
        assert_close(got.numpy(), want, name, tol=1e-4)
    model.fuse_relu = False  # the same layers run apart: the same bits
    xu = clnet.tensor(x, dev, requires_grad=True)
    yu = model(xu)
    yu.backward(clnet.tensor(dy, dev))
    assert np.array_equal(yu.numpy(), y.numpy()) and np.array_equal(xu.grad.numpy(), xt.grad.numpy())
    model.fuse_relu = True
    x[-1, 2, 3, 4] = np.nan
    with clnet.no_grad():
        out = model[:2](clnet.tensor(x, dev)).numpy()
    expect = np.maximum(ref.conv2d(x, conv_w, conv_b, (1, 1), (1, 1), (2, 2), (1, 1), 1), 0)
    assert np.array_equal(np.isnan(out), np.isnan(expect)) and np.isnan(out).sum() == O * 9


def test_a_layer_is_named_by_its_configuration_as_it_is_now():
    """A layer's repr (which names it in every message of its forward) is kept between calls, and follows any
    attribute set or deleted since."""
    drop, conv = nn.Dropout(0.5), nn.Conv2d(3, 4, 3)
    assert repr(drop) == "Dropout(p=0.5)" and repr(drop) == "Dropout(p=0.5)"
    drop.p = 0.25
    assert repr(drop) == "Dropout(p=0.25)"
    assert repr(conv).endswith("stride=(1, 1))")
    conv.groups = 1
    conv.stride = (2, 2)
    assert repr(conv) == "Conv2d(3, 4, kernel_size=(3, 3), stride=(2, 2))", repr(conv)
    conv.extra = 1
    del conv.extra
    assert repr(conv) == "Conv2d(3, 4, kernel_size=(3, 3), stride=(2, 2))"


@pytest.mark.parametrize("layer", ["linear", "linear 3-d", "conv", "depthwise", "conv_transpose", "max_pool",
                                   "avg_pool"])
def test_an_empty_batch_gives_zero_gradients(dev, layer):
    """A batch of no examples, forward and backward, as PyTorch's: outputs of no elements, weight and bias gradients of
    zeros written over what the .grad held (a product of depth 0: linear's raised ZeroDivisionError, conv's left
    the pool's old values in its weight gradient)."""
    make, shape = {"linear": (lambda: nn.Linear(5, 3), (0, 5)), "linear 3-d": (lambda: nn.Linear(5, 3), (2, 0, 5)),
                   "conv": (lambda: nn.Conv2d(2, 3, 3), (0, 2, 5, 5)),
                   "depthwise": (lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), (0, 4, 5, 5)),
                   "conv_transpose": (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2), (0, 2, 4, 4)),
                   "max_pool": (lambda: nn.MaxPool2d(2), (0, 2, 4, 4)),
                   "avg_pool": (lambda: nn.AvgPool2d(2), (0, 2, 4, 4))}[layer]
    m = make().to(dev)
    for p in m.parameters():  # stale values where the gradients will be written
        p.grad = clnet.tensor(np.full(p.shape, np.nan, np.float32), dev)
    m.zero_grad(set_to_none=False)
    x = clnet.tensor(np.zeros(shape, np.float32), dev, requires_grad=True)
    y = m(x)
    y.sum().backward()
    assert x.grad.shape == shape
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p.grad.numpy(), np.zeros(p.shape), err_msg=f"{layer}: {name}'s gradient")
