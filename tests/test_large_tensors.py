"""Tensors past the index limit (kernels.INDEX_LIMIT, what one launch indexes with 32-bit integers): each op splits
its launches, or refuses before launching. The limit is set to a few thousand elements here, so small tensors take
the paths a batch past 2**31 elements takes on a GPU (bench/large_tensors.py runs those with the real limit). Every
launch inside a test is checked to pass no tensor larger than the limit, so a path that forgot to split fails even
where its 32-bit indices would not yet overflow."""
import numpy as np
import pytest

import clnet
from clnet import kernels, nn, ops
from clnet.nn import functional as F
from clnet.tensor import TooLarge, empty

import reference as ref
from conftest import assert_close, give_gradients, no_launch


@pytest.fixture
def limit(monkeypatch):
    """Sets kernels.INDEX_LIMIT (restored after the test) and fails any launch given a tensor larger than it."""
    launch = kernels.launch

    def checked(dev, k, global_size, local_size, *args, what=""):
        for a in args:
            if isinstance(a, clnet.Tensor):
                assert a.size <= kernels.INDEX_LIMIT, \
                    f"{what or k.name}: a tensor of shape {a.shape} past the limit {kernels.INDEX_LIMIT}"
        return launch(dev, k, global_size, local_size, *args, what=what)

    monkeypatch.setattr(kernels, "launch", checked)

    def set_limit(n):
        monkeypatch.setattr(kernels, "INDEX_LIMIT", n)
    set_limit(5000)
    return set_limit


def leaf(dev, array):
    return clnet.tensor(array.astype(np.float32), dev, requires_grad=True)


def test_a_region_of_a_tensor_past_the_limit_is_a_window_that_launches_stage(dev, rng, limit):
    """No sub-buffer of a tensor past the limit reaches a kernel (NVIDIA's driver crashed releasing kernels that
    named sub-buffers of a buffer past 8 GiB): its region is a window, and a launch given one runs on a copy, which
    comes back into the parent, the elements around it untouched."""
    a = rng.standard_normal(3 * 5000 + 7).astype(np.float32)
    big = clnet.tensor(a, dev)
    part = big.region(5003, (4001,))
    with pytest.raises(kernels.NeedsStaging):
        part.storage.buffer
    ops.fill(part, 2.5)  # a launch on the window alone
    expect = a.copy()
    expect[5003:9004] = 2.5
    assert np.array_equal(big.numpy(), expect)
    assert np.array_equal(part.numpy(), expect[5003:9004])
    small = clnet.tensor(a[:4000], dev)
    assert hasattr(small.region(1024, (64,)).storage.buffer, "int_ptr")  # within the limit: a sub-buffer
    with pytest.raises(ValueError, match="overlapping parts of one tensor.*copy one of them"):
        ops.add(big.region(0, (4000,)), big.region(128, (4000,)))  # refused before anything is queued
    assert np.array_equal(big.numpy(), expect)


def test_runs_stay_within_the_staging_size(dev, rng, limit, monkeypatch):
    """Runs of a split op cover at most tensor.WINDOW_RUN elements (the size of its staging copies) where that is
    below the index limit: every launch's tensors within it, and the results those of one launch."""
    import importlib
    monkeypatch.setattr(importlib.import_module("clnet.tensor"), "WINDOW_RUN", 1500)  # (clnet.tensor is a function)
    launch = kernels.launch

    def small(dev_, k, global_size, local_size, *args, what=""):
        for a in args:
            if isinstance(a, clnet.Tensor) and a.size > 1:
                assert a.size <= 1500, f"{what or k.name}: a tensor of shape {a.shape} past the staging size"
        return launch(dev_, k, global_size, local_size, *args, what=what)
    monkeypatch.setattr(kernels, "launch", small)
    x = rng.standard_normal((5, 7, 13, 15))  # 6825 elements, past the limit of 5000: runs of at most 1500
    t = leaf(dev, x)
    y = F.relu(t)
    dy = rng.standard_normal(x.shape)
    y.backward(clnet.tensor(dy.astype(np.float32), dev))
    assert_close(y.numpy(), np.maximum(x, 0), "relu")
    assert_close(t.grad.numpy(), dy * (x > 0), "relu backward")
    p = F.max_pool2d(clnet.tensor(x.astype(np.float32), dev), 2)
    assert_close(p.numpy(), ref.maxpool2d(x, (2, 2), (2, 2), (0, 0), False), "max pooling")
    c = clnet.cat([clnet.tensor(x.astype(np.float32), dev)] * 2, dim=1)
    assert_close(c.numpy(), np.concatenate([x, x], axis=1), "cat")


def test_copies(dev, rng, limit):
    a = rng.standard_normal(7001).astype(np.float32)
    t = clnet.tensor(a, dev)
    assert np.array_equal(t.numpy(), a)
    u = empty((7001,), dev).copy_from(t)
    assert np.array_equal(u.numpy(), a)
    t.write(a[::-1])
    assert np.array_equal(t.numpy(), a[::-1])
    assert np.all(ops.full((7001,), dev, 2.5).numpy() == 2.5)


@pytest.mark.parametrize("kind", ["relu", "relu6", "sigmoid", "tanh"])
def test_activations(dev, rng, limit, kind):
    x = rng.standard_normal(7001) * 4
    x[np.abs(x) < 1e-3] += 0.01  # away from ReLU's kink
    x[np.abs(x - 6) < 1e-3] += 0.01
    dy = rng.standard_normal(7001)
    t = leaf(dev, x)
    y = getattr(F, kind)(t)
    y.backward(clnet.tensor(dy, dev))
    ry, rdx = ref.activation(kind, x.astype(np.float32), dy)
    assert_close(y.numpy(), ry, kind)
    assert_close(t.grad.numpy(), rdx, kind + " backward")


def test_arithmetic(dev, rng, limit):
    """a + b, a - b, a * b, scalar ops, and a gradient accumulated from several uses."""
    a, b, dy = (rng.standard_normal(7001) for _ in range(3))
    ta, tb = leaf(dev, a), leaf(dev, b)
    y = (ta + tb) * ta - 3.0 * tb + 0.5 - ta / 4.0
    y.backward(clnet.tensor(dy, dev))
    a64, b64 = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    assert_close(y.numpy(), (a64 + b64) * a64 - 3 * b64 + 0.5 - a64 / 4, "forward")
    assert_close(ta.grad.numpy(), dy * (2 * a64 + b64 - 0.25), "d a")
    assert_close(tb.grad.numpy(), dy * (a64 - 3), "d b")


def test_sum_and_mean(dev, rng, limit):
    # Offset from zero: a sum of zero-mean values cancels (seed 1293361484 summed 7747 values to 0.011), and its error
    # relative to the result says nothing of the summation's (float32's rounding scales with the sum of |x|).
    x = rng.standard_normal((61, 127)) + 0.5
    t = leaf(dev, x)
    s = t.sum()
    m = t.mean()
    x64 = x.astype(np.float32).astype(np.float64)
    assert_close(s.numpy(), x64.sum(), "sum", tol=1e-5)
    assert_close(m.numpy(), x64.mean(), "mean", tol=1e-5)
    (s + m * 2.0).backward()
    assert_close(t.grad.numpy(), np.full(x.shape, 1 + 2 / x.size), "sum and mean backward")


def test_sgd_step(dev, rng, limit):
    p, g, buf = (rng.standard_normal(7001).astype(np.float32) for _ in range(3))
    tp, tg, tb = (clnet.tensor(a, dev) for a in (p, g, buf))
    ops.sgd_step(tp, tg, tb, 0.1, 0.9, 0.01, True)
    rp, rbuf = ref.sgd(p.astype(np.float64), g, buf.astype(np.float64), 0.1, 0.9, 0.01, True)
    assert_close(tp.numpy(), rp, "parameters")
    assert_close(tb.numpy(), rbuf, "momentum")


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pooling(dev, rng, limit, kernel_shape, pool):
    """(5, 11, 13, 11): 55 planes of 143 values; runs of 41 planes under 6000, then 14 (windows: no start of a run
    but the first is where a sub-buffer may start)."""
    limit(6000)
    x = rng.standard_normal((5, 11, 13, 11))
    t = leaf(dev, x)
    if pool == "max":
        y = F.max_pool2d(t, 3, 2, 1)
    else:
        y = F.avg_pool2d(t, 3, 2, 1, count_include_pad=False)
    dy = rng.standard_normal(y.shape)
    y.backward(clnet.tensor(dy, dev))
    x32 = x.astype(np.float32)
    if pool == "max":
        ry, rdx = ref.maxpool2d(x32, (3, 3), (2, 2), (1, 1), False, dy)
    else:
        ry, rdx = ref.avgpool2d(x32, (3, 3), (2, 2), (1, 1), False, False, dy)
    assert_close(y.numpy(), ry, pool + " pooling")
    assert_close(t.grad.numpy(), rdx, pool + " pooling backward")


GRIDS = ("maxpool2d_fwd_grid", "maxpool2d_bwd_grid", "maxpool2d_bwd_tiles")


@pytest.mark.parametrize("k,s,p,ceil", [(3, 2, 1, True), (2, 2, 0, False)], ids=["3x3-s2", "tiles"])
def test_max_pooling_grids_in_runs_of_planes(dev, rng, limit, kernel_shape, monkeypatch, k, s, p, ceil):
    """A grid launch holds at most GRID_PLANES planes along its third dimension (NVIDIA's cap): with 7 a launch and
    INDEX_LIMIT 1000, (3, 11, 9, 10)'s 33 planes of 90 values run in runs of 11, each as launches of 7 and 4, each a
    region of the tensors: the CPU shape's forward grid, the GPU shape's backward grid (a work-item an input element,
    or a window where the windows tile the input), with the ReLU before the pooling taken inside it (nn.Sequential:
    RELU=1, the pooled output in regions too)."""
    monkeypatch.setattr(ops, "GRID_PLANES", 7)
    limit(1000)
    planes, launch, inside = [], kernels.launch, []

    def counted(dev_, kern, global_size, *args, **kwargs):
        if kern.name in GRIDS and not inside:  # not a staged window's relaunch
            planes.append(global_size[2])
        inside.append(kern)
        try:
            return launch(dev_, kern, global_size, *args, **kwargs)
        finally:
            inside.pop()
    monkeypatch.setattr(kernels, "launch", counted)
    x = rng.standard_normal((3, 11, 9, 10))
    t = leaf(dev, x)
    y = nn.Sequential(nn.ReLU(), nn.MaxPool2d(k, s, p, ceil_mode=ceil)).to(dev)(t)
    dy = rng.standard_normal(y.shape)
    y.backward(clnet.tensor(dy, dev))
    assert planes == [7, 4] * 3, planes
    ry, rdx = ref.maxpool2d(np.maximum(x, 0).astype(np.float32), (k, k), (s, s), (p, p), ceil, dy)
    assert_close(y.numpy(), ry, "max pooling")
    assert_close(t.grad.numpy(), rdx * (x > 0), "max pooling backward")


def test_pooling_grids_fit_small_work_groups():
    """The GPU grid's 32x4 work-group, narrowed where a device's work-groups hold fewer work-items. Pure Python."""
    from types import SimpleNamespace
    for most, group in ((1024, (32, 4, 1)), (128, (32, 4, 1)), (64, (32, 2, 1)), (32, (32, 1, 1)), (16, (16, 1, 1))):
        assert ops.grid_group(SimpleNamespace(max_work_group_size=most)) == group, most


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(dev, rng, limit, kernel_shape, training):
    """(37, 6, 8, 7): images of 336 values, runs of 14 images under 5000 (37 is no multiple of them)."""
    x = rng.standard_normal((37, 6, 8, 7)) * 2 + 3
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    rm, rv = rng.standard_normal(6), rng.uniform(0.5, 2, 6)
    tx, tw, tb = leaf(dev, x), leaf(dev, w), leaf(dev, b)
    trm, trv = clnet.tensor(rm, dev), clnet.tensor(rv, dev)
    y = F.batch_norm(tx, trm, trv, tw, tb, training=training, momentum=0.1, eps=1e-5)
    dy = rng.standard_normal(x.shape)
    y.backward(clnet.tensor(dy, dev))
    x, w, b, rm, rv = (a.astype(np.float32) for a in (x, w, b, rm, rv))
    if training:
        ry, mean, var, rdx, rdw, rdb = ref.batch_norm_train(x, w, b, 1e-5, dy)
        assert_close(trm.numpy(), ref.running_update(rm, mean, 0.1), "running mean")
        assert_close(trv.numpy(), ref.running_update(rv, var, 0.1), "running var")
    else:
        ry, rdx, rdw, rdb = ref.batch_norm_eval(x, rm, rv, w, b, 1e-5, dy)
    assert_close(y.numpy(), ry, "batch norm", tol=1e-4)
    assert_close(tx.grad.numpy(), rdx, "d x", tol=1e-4)
    assert_close(tw.grad.numpy(), rdw, "d weight", tol=1e-4)
    assert_close(tb.grad.numpy(), rdb, "d bias", tol=1e-4)


def test_batch_norm_with_its_relu(dev, rng, limit, kernel_shape):
    """The batch norm that applies its ReLU (ONNX's BatchNormalization -> Relu) in runs of images: the saved output
    cut into the same runs as dy and x in the backward's passes; bit for bit the two ops apart."""
    x = rng.standard_normal((37, 6, 8, 7)) * 2 + 3
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    dy = rng.standard_normal(x.shape)
    grads = {}
    for fused in (True, False):
        tx, tw, tb = leaf(dev, x), leaf(dev, w), leaf(dev, b)
        trm, trv = clnet.tensor(np.zeros(6), dev), clnet.tensor(np.ones(6), dev)
        if fused:
            y = ops.BatchNormTrain.apply(tx, tw, tb, trm, trv, momentum=0.1, eps=1e-5, act="relu")
        else:
            y = F.relu(ops.BatchNormTrain.apply(tx, tw, tb, trm, trv, momentum=0.1, eps=1e-5))
        y.backward(clnet.tensor(dy, dev))
        grads[fused] = [t.numpy() for t in (y, tx.grad, tw.grad, tb.grad)]
    assert (grads[True][0] == 0).any() and (grads[True][0] > 0).any()
    for a, c in zip(grads[True], grads[False]):
        assert np.array_equal(a, c)


def test_local_response_norm(dev, rng, limit, kernel_shape):
    x = rng.standard_normal((37, 6, 8, 7))
    t = leaf(dev, x)
    y = F.local_response_norm(t, 3, 1e-2, 0.75, 1.0)
    dy = rng.standard_normal(x.shape)
    y.backward(clnet.tensor(dy, dev))
    ry, rdx = ref.local_response_norm(x.astype(np.float32), 3, 1e-2, 0.75, 1.0, dy)
    assert_close(y.numpy(), ry, "lrn")
    assert_close(t.grad.numpy(), rdx, "lrn backward")


@pytest.mark.parametrize("log", [False, True])
def test_softmax(dev, rng, limit, log):
    """Over the middle dimension of (37, 5, 29): rows of 145 values, runs of 32 rows."""
    x = rng.standard_normal((37, 5, 29)) * 3
    t = leaf(dev, x)
    y = (F.log_softmax if log else F.softmax)(t, dim=1)
    dy = rng.standard_normal(x.shape)
    y.backward(clnet.tensor(dy, dev))
    ry, rdx = ref.softmax(x.astype(np.float32), 1, log, dy)
    assert_close(y.numpy(), ry, "softmax")
    assert_close(t.grad.numpy(), rdx, "softmax backward")


def test_cross_entropy(dev, rng, limit):
    """Logits (397, 13): runs of 384 rows, then 13."""
    z = rng.standard_normal((397, 13)) * 3
    labels = rng.integers(0, 13, 397)
    t = leaf(dev, z)
    loss, metrics = ops.cross_entropy(t, labels)
    loss.backward()
    rloss, rgrad = ref.cross_entropy(z.astype(np.float32), labels)
    assert_close(loss.numpy(), rloss, "loss")
    assert_close(metrics.numpy()[0], rloss, "metrics loss")
    assert metrics.numpy()[1] == np.sum(z.astype(np.float32).argmax(axis=1) == labels)
    assert_close(t.grad.numpy(), rgrad, "d logits")


@pytest.mark.parametrize("dim", [0, 1])
def test_cat(dev, rng, limit, dim):
    """Along dim 1, blocks of whole rows; along dim 0 each row (the whole tensor) is cut into pieces."""
    shapes = [(7, 3, 131), (7, 5, 131)] if dim == 1 else [(23, 131), (31, 131)]
    xs = [rng.standard_normal(s) for s in shapes]
    ts = [leaf(dev, x) for x in xs]
    y = clnet.cat(ts, dim)
    dy = rng.standard_normal(y.shape)
    y.backward(clnet.tensor(dy, dev))
    ry, *rdx = ref.cat([x.astype(np.float32) for x in xs], dim, dy)
    assert np.array_equal(y.numpy(), ry.astype(np.float32))
    for t, r in zip(ts, rdx):
        assert np.array_equal(t.grad.numpy(), r.astype(np.float32))


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_backward_into_a_pending_gradient(dev, rng, limit, dim):
    """A computed input joined twice: the second join's slice is added into the first's (copy2d_add) in the same
    blocks and pieces as a plain copy, its sum in the pending gradient's windows. Every step is exact in float32 (a
    slice added to itself, times 2), so the gradient is 4 times the slice, bit for bit."""
    shapes = [(7, 3, 131), (7, 5, 131)] if dim == 1 else [(23, 131), (31, 131)]
    a, b = (leaf(dev, rng.standard_normal(s)) for s in shapes)
    h = a * 2.0
    y = clnet.cat([h, b], dim) + clnet.cat([h, b], dim)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    first = dy[:, :shapes[0][1]] if dim == 1 else dy[:shapes[0][0]]
    assert np.array_equal(a.grad.numpy(), 4 * first)
    assert np.array_equal(b.grad.numpy(), 2 * (dy[:, shapes[0][1]:] if dim == 1 else dy[shapes[0][0]:]))


def test_conv2d(dev, rng, limit):
    """(45, 3, 11, 9) -> (45, 4, 11, 9): runs of 40 images (15840 output values under 16000), then 5."""
    limit(16000)
    x = rng.standard_normal((45, 3, 11, 9))
    w, b = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    tx, tw, tb = leaf(dev, x), leaf(dev, w), leaf(dev, b)
    y = F.conv2d(tx, tw, tb, padding=1)
    dy = rng.standard_normal(y.shape)
    y.backward(clnet.tensor(dy, dev))
    ry, rdx, rdw, rdb = ref.conv2d(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), (1, 1), (1, 1),
                                   (2, 2), (1, 1), 1, dy)
    assert_close(y.numpy(), ry, "conv2d")
    assert_close(tx.grad.numpy(), rdx, "d x")
    assert_close(tw.grad.numpy(), rdw, "d weight")
    assert_close(tb.grad.numpy(), rdb, "d bias")


def test_linear(dev, rng, limit):
    """(301, 19) @ (23, 19)^T: runs of 192 rows, then 109."""
    x = rng.standard_normal((301, 19))
    w, b = rng.standard_normal((23, 19)), rng.standard_normal(23)
    tx, tw, tb = leaf(dev, x), leaf(dev, w), leaf(dev, b)
    y = F.linear(tx, tw, tb)
    dy = rng.standard_normal(y.shape)
    y.backward(clnet.tensor(dy, dev))
    ry, rdx, rdw, rdb = ref.linear(x.astype(np.float32), w.astype(np.float32), b.astype(np.float32), dy)
    assert_close(y.numpy(), ry, "linear")
    assert_close(tx.grad.numpy(), rdx, "d x")
    assert_close(tw.grad.numpy(), rdw, "d weight")
    assert_close(tb.grad.numpy(), rdb, "d bias")


def test_captured_step_replays_split_launches(dev, rng, limit):
    """A graph captures the chunked launches (over sub-buffers) and replays them on new data."""
    x = clnet.tensor(rng.standard_normal(7001), dev)
    g = clnet.Graph()
    with g.capture():
        y = F.relu(x * 2.0)
    fresh = rng.standard_normal(7001).astype(np.float32)
    x.write(fresh)
    g.replay()
    assert_close(y.numpy(), np.maximum(2 * fresh.astype(np.float64), 0), "replayed")


def test_refusals(dev, rng, limit):
    """Dropout does not split its launches; pooling cannot when one plane is past the limit. Both say so before any
    launch, naming the op, the shape, the limit and the fix."""
    x = clnet.tensor(rng.standard_normal((7, 1001)), dev)
    with no_launch(), pytest.raises(TooLarge, match=r"dropout: a tensor of shape \(7, 1001\).*5000.*"
                                                    r"a batch of at most 4"):
        F.dropout(x, 0.5)
    limit(1000)
    x = clnet.tensor(rng.standard_normal((2, 3, 33, 31)), dev)
    with no_launch(), pytest.raises(TooLarge, match=r"max pooling: a tensor of shape \(2, 3, 33, 31\).*1000.*"
                                                    r"smaller planes"):
        F.max_pool2d(x, 3, 2, 1)


def test_what_is_never_split_is_refused_before_it_launches(dev, rng, limit):
    """Whatever the batch: one image's im2col columns (here 3*3*3 x 20*20 = 10800 elements) and a dense layer's
    weights (60 x 100) are never split, and Winograd does not take a layer whose one image's transforms pass the limit
    (im2col runs it instead)."""
    x = clnet.tensor(rng.standard_normal((1, 3, 20, 20)), dev)
    w = clnet.tensor(rng.standard_normal((4, 3, 3, 3)), dev)
    with no_launch(), pytest.raises(TooLarge, match=r"conv2d: .*column buffer of 10800 elements per image.*5000"):
        F.conv2d(x, w, padding=1)
    x = clnet.tensor(rng.standard_normal((2, 100)), dev)
    w = clnet.tensor(rng.standard_normal((60, 100)), dev)
    with no_launch(), pytest.raises(TooLarge, match=r"weight of shape \(60, 100\) has 6000 elements.*5000"):
        F.linear(x, w)
    from clnet import shapes, winograd
    s = shapes.conv_shape("conv2d", (1, 16, 24, 24), (16, 16, 3, 3), (1, 1), (1, 1), (2, 2), (1, 1), 1)
    assert winograd.supported(s) and not winograd.image_fits(s)  # 4*4*16 x 12*12 tiles = 36864 > 5000


def test_allocation_past_the_device_limit(dev):
    """A tensor larger than one buffer may be is refused with clnet's out-of-memory error, naming its shape."""
    n = dev.cl_device.max_mem_alloc_size // 4 + 1
    with pytest.raises(clnet.OutOfMemory, match=rf"allocates at once.*a tensor of shape \({n},\)"):
        empty((n,), dev)


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_step_split_equals_one_launch(dev, rng, limit, name):
    from clnet import optim
    p0, grads = rng.standard_normal(7003), [rng.standard_normal(7003).astype(np.float32) for _ in range(3)]

    def run():
        p = leaf(dev, p0)
        opt = getattr(optim, name)([p], lr=0.01, weight_decay=0.01)
        for g in grads:
            give_gradients([p])
            opt.zero_grad(set_to_none=False)
            p.grad.write(g)
            opt.step()
        return p.numpy()
    split = run()
    limit(2**31 - 2**16)
    one = run()
    np.testing.assert_array_equal(split, one)
    assert not np.array_equal(one, p0.astype(np.float32))
