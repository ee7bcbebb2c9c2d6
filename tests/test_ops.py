"""The autograd ops (clnet/ops.py) and the layers and functional forms built on them, forward and every gradient,
against float64 NumPy references (tests/reference.py) and PyTorch where installed; bad input refused before any
kernel runs."""
import numpy as np
import pytest

import clnet
from clnet import nn
from clnet.nn import functional as F

import reference as ref
from conftest import HAVE_TORCH, assert_close, assert_close_to_terms, launched, no_launch

if HAVE_TORCH:
    import torch


def torch64(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def check_op(dev, rng, fn, inputs, numpy_fn, torch_fn=None, needs=None, tol=2e-5, name="op"):
    """Runs fn on device tensors made from the float32 arrays `inputs` (each requiring a gradient unless `needs` says
    otherwise), then backward with a random upstream gradient, and compares the output and every input gradient with
    numpy_fn(*inputs, dy) -> (y, gradient per input) and, where PyTorch is installed, with torch_fn (the same
    function of float64 torch tensors, differentiated by torch). An input that needs no gradient must get none."""
    needs = needs or [True] * len(inputs)
    ts = [clnet.tensor(a, dev, requires_grad=n) for a, n in zip(inputs, needs)]
    y = fn(*ts)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    expected = numpy_fn(*inputs, dy)
    assert_close(y.numpy(), expected[0], f"{name} output", tol)
    for i, (t, n) in enumerate(zip(ts, needs)):
        if n:
            assert_close(t.grad.numpy(), expected[1 + i], f"{name} grad of input {i}", tol)
        else:
            assert t.grad is None, f"{name}: input {i} needs no gradient but got one"
    if torch_fn is None or not HAVE_TORCH:
        return
    tts = [torch64(a, n) for a, n in zip(inputs, needs)]
    ty = torch_fn(*tts)
    ty.backward(torch64(dy, False))
    assert_close(y.numpy(), ty.detach().numpy(), f"{name} output against torch", tol)
    for i, (t, tt, n) in enumerate(zip(ts, tts, needs)):
        if n:
            assert_close(t.grad.numpy(), tt.grad.numpy(), f"{name} grad of input {i} against torch", tol)


def finite_difference_check(f, arrays, dy, grads, rng, eps=1e-6, points=6):
    """d sum(f(*arrays) * dy) / d arrays[i] at a few random elements, by central differences in float64, against
    grads[i]: the references' gradients are right before anything is compared with them."""
    for arr, grad in zip(arrays, grads):
        for idx in [tuple(rng.integers(0, s) for s in arr.shape) for _ in range(points)]:
            old = arr[idx]
            arr[idx] = old + eps
            up = (f(*arrays) * dy).sum()
            arr[idx] = old - eps
            down = (f(*arrays) * dy).sum()
            arr[idx] = old
            fd = (up - down) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-6 * max(1.0, abs(grad[idx])), (idx, fd, grad[idx])


SHAPES = [(1,), (31,), (3, 33), (65, 3, 1)]


# ---- arithmetic -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_binary_tensors(dev, rng, shape, op):
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    fn = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}[op]
    check_op(dev, rng, fn, [a, b], lambda a, b, dy: ref.binary(op, a, b, dy), fn, tol=1e-6, name=op)


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_binary_one_side_needs_gradient(dev, rng, op, needs):
    a, b = (rng.standard_normal((3, 33)).astype(np.float32) for _ in range(2))
    fn = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}[op]
    check_op(dev, rng, fn, [a, b], lambda a, b, dy: ref.binary(op, a, b, dy), fn, needs=list(needs), tol=1e-6,
             name=op)


NUMBER_OPS = {  # name: (clnet and torch, NumPy value, derivative)
    "t+2.5": (lambda t: t + 2.5, lambda a: a + 2.5, 1.0),
    "2.5+t": (lambda t: 2.5 + t, lambda a: 2.5 + a, 1.0),
    "t-1.5": (lambda t: t - 1.5, lambda a: a - 1.5, 1.0),
    "1.5-t": (lambda t: 1.5 - t, lambda a: 1.5 - a, -1.0),
    "t*-3": (lambda t: t * -3.0, lambda a: -3.0 * a, -3.0),
    "-3*t": (lambda t: -3.0 * t, lambda a: -3.0 * a, -3.0),
    "t*2(int)": (lambda t: t * 2, lambda a: 2 * a, 2.0),
    "2(int)-t": (lambda t: 2 - t, lambda a: 2 - a, -1.0),
    "t/4": (lambda t: t / 4.0, lambda a: a / 4.0, 0.25),
    "-t": (lambda t: -t, lambda a: -a, -1.0),
    "np.float32(0.5)*t": (lambda t: np.float32(0.5) * t, lambda a: 0.5 * a, 0.5),
    "t+np.float64(1.25)": (lambda t: t + np.float64(1.25), lambda a: a + 1.25, 1.0),
}


@pytest.mark.parametrize("shape", [(1,), (3, 31)], ids=str)
@pytest.mark.parametrize("name", list(NUMBER_OPS))
def test_binary_numbers(dev, rng, shape, name):
    """Python (and NumPy) numbers on either side of + - * /, and negation."""
    fn, value, slope = NUMBER_OPS[name]
    a = rng.standard_normal(shape).astype(np.float32)
    check_op(dev, rng, fn, [a], lambda a, dy: (value(a.astype(np.float64)), slope * dy.astype(np.float64)), fn,
             tol=1e-6, name=name)


def test_same_tensor_in_both_operands(dev, rng):
    """a * a + a: d/da = 2a + 1, from both operands of one op and a third use in another."""
    a = rng.standard_normal((5, 7)).astype(np.float32)
    check_op(dev, rng, lambda t: t * t + t, [a],
             lambda a, dy: ((a.astype(np.float64) ** 2 + a), dy * (2.0 * a.astype(np.float64) + 1)),
             lambda t: t * t + t, tol=1e-6, name="a*a+a")


@pytest.mark.parametrize("shape", [(1,), (31,), (3, 33), (65, 257)], ids=str)
@pytest.mark.parametrize("mean", [False, True])
def test_sum_and_mean(dev, rng, shape, mean):
    """A one-element result of shape (); backward without a gradient (ones, as loss.backward()) and with one."""
    a = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    n = a.size
    scale = 1.0 / n if mean else 1.0
    for upstream in (None, float(rng.standard_normal())):
        t = clnet.tensor(a, dev, requires_grad=True)
        y = t.mean() if mean else t.sum()
        assert y.shape == ()
        if upstream is None:
            y.backward()
        else:
            y.backward(clnet.tensor(np.array(upstream, np.float32), dev))
        # a sum can cancel to far below its terms: its error is checked against their size
        assert_close_to_terms(y.numpy(), scale * a.astype(np.float64).sum(), scale * np.abs(a).astype(np.float64).sum(),
                              "sum", tol=1e-6)
        g = 1.0 if upstream is None else np.float32(upstream)
        assert_close(t.grad.numpy(), np.full(shape, scale * np.float64(g)), "grad", tol=3e-7)
    if HAVE_TORCH:
        tt = torch64(a)
        ty = tt.mean() if mean else tt.sum()
        assert abs(float(y) - ty.item()) <= 1e-6 * scale * np.abs(a).sum()


# ---- shapes ---------------------------------------------------------------------------------------------------------

RESHAPES = {  # of a (3, 4, 5) tensor: (function, the shape NumPy and torch give)
    "reshape(12, 5)": (lambda t: t.reshape(12, 5), (12, 5)),
    "reshape((5, -1))": (lambda t: t.reshape((5, -1)), (5, 12)),
    "view(-1)": (lambda t: t.view(-1), (60,)),
    "view(3, 20)": (lambda t: t.view(3, 20), (3, 20)),
    "flatten()": (lambda t: t.flatten(), (60,)),
    "flatten(1)": (lambda t: t.flatten(1), (3, 20)),
    "flatten(0, 1)": (lambda t: t.flatten(0, 1), (12, 5)),
    "flatten(-2)": (lambda t: t.flatten(-2), (3, 20)),
    "F.flatten(start_dim=1)": (lambda t: F.flatten(t, start_dim=1), (3, 20)),
    "nn.Flatten()": (lambda t: nn.Flatten()(t), (3, 20)),
}


@pytest.mark.parametrize("name", list(RESHAPES))
def test_reshape_view_flatten(dev, rng, name):
    """A reshaped tensor and its gradient are the same values in another shape (as NumPy's and torch's reshape)."""
    fn, shape = RESHAPES[name]
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t = clnet.tensor(a, dev, requires_grad=True)
    y = fn(t)
    assert y.shape == shape
    dy = rng.standard_normal(y.shape).astype(np.float32)
    (y * 2.0).backward(clnet.tensor(dy, dev))  # a view inside a graph, not only at its root
    np.testing.assert_array_equal(y.numpy(), a.reshape(shape))
    np.testing.assert_array_equal(t.grad.numpy(), 2 * dy.reshape(a.shape))


def test_reshape_without_gradient_shares_memory(dev, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = clnet.tensor(a, dev)
    v = t.reshape(4, 3)
    assert v.grad_fn is None and not v.requires_grad and v.buffer is t.buffer
    with clnet.no_grad():
        g = clnet.tensor(a, dev, requires_grad=True).view(2, 6)
    assert g.grad_fn is None
    with no_launch(), pytest.raises(ValueError, match=r"cannot reshape a tensor of shape \(3, 4\)"):
        t.reshape(5, -1)
    with no_launch(), pytest.raises(ValueError, match="at most one -1"):
        t.reshape(-1, -1)


CAT_CASES = [
    # (shapes, dim)
    ([(1, 3, 5), (4, 3, 5), (2, 3, 5)], 0),
    ([(2, 1, 5), (2, 3, 5), (2, 31, 5)], 1),
    ([(2, 3, 1), (2, 3, 33), (2, 3, 4), (2, 3, 2)], -1),
    ([(1, 2, 3, 7), (1, 2, 3, 1), (1, 2, 3, 65)], 3),
    ([(3,), (31,), (1,)], 0),
    ([(1, 2, 1), (1, 3, 1), (1, 1, 1)], 1),
    ([(3, 1, 4), (3, 5, 4), (3, 2, 4)], 1),  # every slice, stride and offset in whole float4s (copy2d_x4)
    ([(5, 2, 6), (5, 2, 2)], 2),
]


@pytest.mark.parametrize("shapes,dim", CAT_CASES, ids=[str(i) for i in range(len(CAT_CASES))])
def test_cat(dev, rng, shapes, dim):
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    check_op(dev, rng, lambda *ts: clnet.cat(ts, dim), xs, lambda *a: ref.cat(a[:-1], dim, a[-1]),
             lambda *ts: torch.cat(ts, dim), tol=1e-7, name="cat")
    # the middle input needs no gradient: it gets none, the others still theirs
    needs = [i != 1 for i in range(len(xs))]
    check_op(dev, rng, lambda *ts: clnet.cat(ts, dim=dim), xs, lambda *a: ref.cat(a[:-1], dim, a[-1]), needs=needs,
             tol=1e-7, name="cat")


# Many inputs (densenet's growing concatenations), an empty input among them
MANY_CAT_CASES = [
    ([(2, c, 3) for c in (1, 4, 2, 7, 1, 3, 5, 2, 1, 6, 3)], 1),
    ([(2, 3, 1, 5)] + [(2, 3, 1, 0)] + [(2, 3, 1, w) for w in range(1, 18)], 3),
    ([(r, 4) for r in (3, 1, 2, 5, 1, 1, 2, 4, 3)], 0),
]


@pytest.mark.parametrize("shapes,dim", MANY_CAT_CASES, ids=[str(i) for i in range(len(MANY_CAT_CASES))])
@pytest.mark.parametrize("skip", [(), (0,), (7,), (8,), (1, 2, 9, 10)], ids=str)
def test_cat_of_many_inputs(dev, rng, shapes, dim, skip):
    """Every input's slice forward and back, where the inputs needing no gradient (`skip`) break the gradient's runs
    of columns at a launch's first, last and next slot."""
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    needs = [i not in skip for i in range(len(xs))]
    check_op(dev, rng, lambda *ts: clnet.cat(ts, dim), xs, lambda *a: ref.cat(a[:-1], dim, a[-1]),
             lambda *ts: torch.cat(ts, dim), needs=needs, tol=1e-7, name="cat")


def _dense_block(lib, cat, leaf, ws, dup):
    """densenet's pattern: each layer joins every feature map before it (the first a computed one, whose gradient
    is pending in autograd while later joins add theirs), with `dup`, a join that takes one map twice."""
    feats = [leaf * 1.5]
    for w in ws:
        x = cat(feats + feats[:1] if dup else feats, 1)
        feats.append((x * w).sum(1, keepdim=True) - 0.25 * x[:, :1])
    return cat(feats, 1)


@pytest.mark.parametrize("dup", [False, True], ids=["distinct", "an input twice"])
@pytest.mark.parametrize("inner", [7, 8], ids=["floats", "float4s"])
def test_cat_backward_adds_each_slice_into_the_gradient_so_far(dev, rng, monkeypatch, dup, inner):
    """A feature map joined into several concatenations gets its gradient summed over them: each join's slice is
    added into the sum so far in its own copy (copy2d_add, or copy2d_add_x4 where every slice is whole float4s), with
    no separate add, bit for bit what a copy and then autograd's add give, and against PyTorch in float64."""
    layers = 5
    a = rng.standard_normal((3, 2, inner)).astype(np.float32)
    ws = [rng.standard_normal((1, 2 + i + (2 if dup else 0), inner)).astype(np.float32) for i in range(layers)]
    r = rng.standard_normal((3, 2 + layers, inner)).astype(np.float32)

    def run():
        leaf = clnet.tensor(a, dev, requires_grad=True)
        y = _dense_block(clnet, clnet.cat, leaf, [clnet.tensor(w, dev) for w in ws], dup)
        (y * clnet.tensor(r, dev)).sum().backward()
        return leaf.grad.numpy()

    with launched() as names:
        run()
    fused = run()
    added = "copy2d_add" if inner % 4 else "copy2d_add_x4"
    assert names.count(added) >= layers - 1
    monkeypatch.setattr(clnet.ops.Cat, "adds_into_pending", False)
    with launched() as separate_names:
        run()
    assert added not in separate_names
    assert len(names) < len(separate_names)
    assert np.array_equal(run(), fused), "a slice added in its copy differs from a copy and an add"
    if HAVE_TORCH:
        leaf = torch.tensor(a.astype(np.float64), requires_grad=True)
        y = _dense_block(torch, torch.cat, leaf, [torch64(w, grad=False) for w in ws], dup)
        (y * torch64(r, grad=False)).sum().backward()
        assert_close(fused, leaf.grad.numpy(), "d leaf", tol=1e-6)


def test_cat_of_one_tensor_is_a_copy(dev, rng):
    """As PyTorch's: a new tensor, which an in-place write leaves the input's values out of."""
    a = rng.standard_normal((2, 3)).astype(np.float32)
    t = clnet.tensor(a, dev)
    y = clnet.cat([t], 1)
    assert y is not t and np.array_equal(y.numpy(), a)
    y.add_(1.0)
    assert np.array_equal(t.numpy(), a)


# ---- activations ----------------------------------------------------------------------------------------------------

def away_from(x, kinks, margin=1e-3):
    for k in kinks:
        x[np.abs(x - k) < margin] = k + 0.5
    return x


@pytest.mark.parametrize("shape", [(1,), (3, 31), (2, 33, 65)], ids=str)
def test_relu6(dev, rng, shape):
    x = away_from(rng.uniform(-3, 9, shape), (0.0, 6.0)).astype(np.float32)
    for fn in (F.relu6, nn.ReLU6()):
        check_op(dev, rng, fn, [x], lambda a, dy: ref.activation("relu6", a, dy), torch.nn.functional.relu6
                 if HAVE_TORCH else None, tol=1e-7, name="relu6")


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_nan_stays_nan_through_relu(dev, kind):
    """NaN in, NaN out (fmax would give 0), and its gradient passes as PyTorch's does; infinities are clamped."""
    x = np.array([np.nan, -np.inf, np.inf, -1.0, 0.0, 3.0, 6.0, 7.0], np.float32)
    dy = np.arange(1, 9, dtype=np.float32)
    t = clnet.tensor(x, dev, requires_grad=True)
    y = getattr(F, kind)(t)
    y.backward(clnet.tensor(dy, dev))
    want = np.array([np.nan, 0, np.inf, 0, 0, 3, 6, 7] if kind == "relu" else [np.nan, 0, 6, 0, 0, 3, 6, 6],
                    np.float32)
    np.testing.assert_array_equal(y.numpy(), want)
    want_grad = dy * np.array([1, 0, 1, 0, 0, 1, 1, 1] if kind == "relu" else [1, 0, 0, 0, 0, 1, 0, 0], np.float32)
    np.testing.assert_array_equal(t.grad.numpy(), want_grad)
    if HAVE_TORCH:
        tt = torch.tensor(x, requires_grad=True)
        ty = getattr(torch.nn.functional, kind)(tt)
        ty.backward(torch.tensor(dy))
        np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
        np.testing.assert_array_equal(t.grad.numpy(), tt.grad.numpy())


# ---- pooling --------------------------------------------------------------------------------------------------------

ADAPTIVE_CASES = [
    # (input shape, output_size)
    ((2, 3, 6, 9), (3, 3)),
    ((2, 3, 6, 9), (2, 1)),
    ((2, 3, 6, 9), (None, 3)),      # None keeps the input's size
    ((1, 1, 1, 1), 1),
    ((1, 33, 31, 33), 1),           # global average pooling of an odd plane (avgpool2d_bwd_whole)
    ((3, 5, 13, 13), 1),
    ((2, 3, 31, 33), (31, 11)),
    ((1, 3, 5, 7), (5, 7)),         # the input's own size: nothing to average
]


@pytest.mark.parametrize("shape,out", ADAPTIVE_CASES, ids=[str(i) for i in range(len(ADAPTIVE_CASES))])
def test_adaptive_avg_pool2d(dev, rng, shape, out):
    x = rng.standard_normal(shape).astype(np.float32)
    sizes = out if isinstance(out, tuple) else (out, out)
    sizes = tuple(i if o is None else o for o, i in zip(sizes, shape[2:]))
    module = nn.AdaptiveAvgPool2d(out)
    assert module.output_shape(shape) == shape[:2] + sizes
    for fn in (lambda t: F.adaptive_avg_pool2d(t, output_size=out), module):
        check_op(dev, rng, fn, [x], lambda a, dy: ref.adaptive_avg_pool2d(a, sizes, dy),
                 lambda t: torch.nn.functional.adaptive_avg_pool2d(t, out), tol=1e-6, name="adaptive_avg_pool2d")


def test_reference_adaptive_pool_matches_avgpool(rng):
    """The block-mean reference agrees with the windowed average pooling reference of the same geometry."""
    x = rng.standard_normal((2, 3, 6, 9))
    dy = rng.standard_normal((2, 3, 2, 3))
    y, dx = ref.adaptive_avg_pool2d(x, (2, 3), dy)
    y2, dx2 = ref.avgpool2d(x, (3, 3), (3, 3), (0, 0), False, True, dy)
    # a mean of nine values can cancel near 0 (6.4e-8 on one seed, the two sums' orders 2e-17 apart): against the terms
    np.testing.assert_allclose(y, y2, rtol=1e-12, atol=1e-14 * np.abs(x).max())
    np.testing.assert_allclose(dx, dx2, rtol=1e-12, atol=1e-14 * np.abs(dy).max())


# ---- batch normalisation --------------------------------------------------------------------------------------------

BN_CONFIGS = [
    dict(),
    dict(momentum=None),                   # cumulative average of the batch statistics
    dict(momentum=0.3, eps=1e-3),
    dict(affine=False),
    dict(track_running_stats=False),       # batch statistics in eval too; no running buffers
]
BN_SHAPES = [(3, 5, 7, 9), (1, 3, 5, 7), (3, 33, 1, 1)]


def channel_data(rng, shape):
    """Per-channel offsets and scales, so that the statistics differ between channels and from 0 and 1."""
    C = shape[1]
    return (rng.standard_normal(shape) * rng.uniform(0.5, 3, C)[None, :, None, None]
            + rng.uniform(-2, 2, C)[None, :, None, None]).astype(np.float32)


def batch_norm_dx_terms(x, weight, dy, eps):
    """The size of the terms that batch norm's input gradient w * invstd / n * (n dy - sum dy - xhat sum dy xhat)
    sums, with xhat's own terms (|x| + |mean|) * invstd: the scale of float32's error bound. With few values per
    channel (n = 3) the gradient can cancel to far below them: measured on PoCL over 300 draws, the error relative to
    the result reached 2.1e-5 at (3, 33, 1, 1) (a check at 1e-5 failed about 1 run in 20), relative to these terms at
    most 7.3e-7 at every shape of BN_SHAPES."""
    x, dy = x.astype(np.float64), np.abs(dy.astype(np.float64))
    axes = (0,) + tuple(range(2, x.ndim))
    n = x.size // x.shape[1]
    mean = x.mean(axis=axes, keepdims=True)
    invstd = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    xs = (np.abs(x) + np.abs(mean)) * invstd
    w = np.ones(x.shape[1]) if weight is None else np.abs(weight.astype(np.float64))
    return (w.reshape(1, -1, 1, 1) * invstd / n
            * (n * dy + dy.sum(axis=axes, keepdims=True) + xs * (dy * xs).sum(axis=axes, keepdims=True)))


@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
@pytest.mark.parametrize("config", BN_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_batchnorm2d(dev, rng, config, shape):
    """Three training steps (batch statistics; gradients of input, weight and bias; running statistics and
    num_batches_tracked updated), then eval (running statistics; the same gradients), each step against the NumPy
    reference and torch.nn.BatchNorm2d with the same configuration and weights."""
    C = shape[1]
    eps, momentum = config.get("eps", 1e-5), config.get("momentum", 0.1)
    affine, track = config.get("affine", True), config.get("track_running_stats", True)
    layer = nn.BatchNorm2d(C, **config).to(dev)
    state = {}
    if affine:
        state.update(weight=rng.uniform(0.5, 1.5, C), bias=rng.standard_normal(C))
    if track:
        state.update(running_mean=rng.standard_normal(C), running_var=rng.uniform(0.5, 2, C),
                     num_batches_tracked=np.array(0))
    state = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in state.items()}
    layer.load_state_dict(state)
    assert list(layer.state_dict()) == list(state)
    twin = None
    if HAVE_TORCH:
        twin = torch.nn.BatchNorm2d(C, **config).double()
        twin.load_state_dict({k: torch.tensor(v, dtype=torch.float64 if v.dtype.kind == "f" else torch.int64)
                              for k, v in state.items()})
        assert list(twin.state_dict()) == list(state)
    w, b = state.get("weight"), state.get("bias")
    rm, rv = (state["running_mean"].astype(np.float64), state["running_var"].astype(np.float64)) if track else (None,
                                                                                                                 None)
    rm_terms = np.abs(rm) if track else None  # the size of the terms the running mean sums: its float32 error's scale
    for step in range(1, 5):
        training = step <= 3
        layer.train(training)
        if twin is not None:
            twin.train(training)
        x = channel_data(rng, shape)
        dy = rng.standard_normal(shape).astype(np.float32)
        layer.zero_grad()
        xt = clnet.tensor(x, dev, requires_grad=True)
        y = layer(xt)
        y.backward(clnet.tensor(dy, dev))
        if training or not track:
            ry, mean, uvar, rdx, rdw, rdb = ref.batch_norm_train(x, w, b, eps, dy)
            if training and track:
                factor = 1.0 / step if momentum is None else momentum
                rm, rv = ref.running_update(rm, mean, factor), ref.running_update(rv, uvar, factor)
                rm_terms = ref.running_update(rm_terms, np.abs(x).mean(axis=(0, 2, 3)), factor)
        else:
            ry, rdx, rdw, rdb = ref.batch_norm_eval(x, rm, rv, w, b, eps, dy)
        what = f"step {step} ({'training' if training else 'eval'})"
        got = {"output": y.numpy(), "grad input": xt.grad.numpy()}
        expected = {"output": ry, "grad input": rdx}
        if affine:
            got.update({"grad weight": layer.weight.grad.numpy(), "grad bias": layer.bias.grad.numpy()})
            expected.update({"grad weight": rdw, "grad bias": rdb})
        batch_stats = training or not track
        dx_terms = batch_norm_dx_terms(x, w, dy, eps) if batch_stats else None

        def compare(theirs, against=""):
            for key in got:
                if key == "grad input" and batch_stats:
                    assert_close_to_terms(got[key], theirs[key], dx_terms, f"{what} {key}{against}", tol=4e-6)
                else:
                    assert_close(got[key], theirs[key], f"{what} {key}{against}", tol=1e-5)
        compare(expected)
        if twin is not None:
            twin.zero_grad()
            tx = torch64(x)
            ty = twin(tx)
            ty.backward(torch64(dy, False))
            theirs = {"output": ty.detach().numpy(), "grad input": tx.grad.numpy()}
            if affine:
                theirs.update({"grad weight": twin.weight.grad.numpy(), "grad bias": twin.bias.grad.numpy()})
            compare(theirs, " against torch")
        if step == 3 and track:
            sd = layer.state_dict()
            # a mean over few values (5 x 7) of both signs can cancel far below its terms (seed 1488551706)
            assert_close_to_terms(sd["running_mean"], rm, rm_terms, "running_mean", tol=1e-6)
            assert_close(sd["running_var"], rv, "running_var", tol=1e-6)
            assert sd["num_batches_tracked"] == 3
            if twin is not None:
                tsd = twin.state_dict()
                assert_close_to_terms(sd["running_mean"], tsd["running_mean"].numpy(), rm_terms,
                                      "running_mean against torch", tol=1e-6)
                assert_close(sd["running_var"], tsd["running_var"].numpy(), "running_var against torch", tol=1e-6)
                assert sd["num_batches_tracked"] == tsd["num_batches_tracked"].item()
    if track:  # eval changed no statistic
        assert layer.state_dict()["num_batches_tracked"] == 3
        assert_close_to_terms(layer.state_dict()["running_mean"], rm, rm_terms, "running_mean after eval", tol=1e-6)
    else:
        assert layer.running_mean is None and "running_mean" not in layer.state_dict()


def test_batchnorm2d_refuses_one_value_per_channel_in_training(dev, rng):
    """Batch 1 with a 1x1 image has no batch variance: refused in training before any kernel runs (as PyTorch
    refuses it) and not counted; in eval, where the running statistics are used, it runs."""
    layer = nn.BatchNorm2d(3).to(dev)
    x = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    with no_launch(), pytest.raises(ValueError, match=r"BatchNorm2d\(3.*expected more than 1 value per channel when "
                                                      r"training, got input of shape \(1, 3, 1, 1\)"):
        layer(clnet.tensor(x, dev))
    assert layer.state_dict()["num_batches_tracked"] == 0
    if HAVE_TORCH:
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            torch.nn.BatchNorm2d(3)(torch.tensor(x))
    layer.eval()
    y = layer(clnet.tensor(x, dev))
    assert_close(y.numpy(), ref.batch_norm_eval(x, np.zeros(3), np.ones(3), np.ones(3), np.zeros(3), 1e-5), "eval")


def test_reference_batch_norm_and_lrn_match_finite_differences(rng):
    """The float64 references' gradients (batch norm in training and eval, local response norm) agree with central
    differences."""
    x, w, b = rng.standard_normal((3, 4, 2, 3)), rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    dy = rng.standard_normal(x.shape)
    _, _, _, dx, dw, db = ref.batch_norm_train(x, w, b, 1e-5, dy)
    finite_difference_check(lambda x, w, b: ref.batch_norm_train(x, w, b, 1e-5)[0], [x, w, b], dy, [dx, dw, db], rng)
    rm, rv = rng.standard_normal(4), rng.uniform(0.5, 2, 4)
    _, dx, dw, db = ref.batch_norm_eval(x, rm, rv, w, b, 1e-5, dy)
    finite_difference_check(lambda x, w, b: ref.batch_norm_eval(x, rm, rv, w, b, 1e-5), [x, w, b], dy, [dx, dw, db],
                            rng)
    x = rng.standard_normal((2, 7, 2, 2))
    dy = rng.standard_normal(x.shape)
    for size in (1, 2, 5):
        _, dx = ref.local_response_norm(x, size, 0.5, 0.75, 2.0, dy)
        finite_difference_check(lambda x: ref.local_response_norm(x, size, 0.5, 0.75, 2.0), [x], dy, [dx], rng)


# ---- local response normalisation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 7, 5, 3), (1, 3, 1, 1)], ids=str)
@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize("alpha,beta,k", [(1e-4, 0.75, 2.0), (0.5, 0.75, 1.0)], ids=["alexnet", "strong"])
def test_local_response_norm(dev, rng, shape, size, alpha, beta, k):
    """Across channels, windows clipped at both ends (size 2 and 5 with 3 or 7 channels); AlexNet's parameters and
    ones strong enough that the normalisation, not the identity, dominates."""
    x = (2 * rng.standard_normal(shape)).astype(np.float32)
    for fn in (nn.LocalResponseNorm(size, alpha, beta, k),
               lambda t: F.local_response_norm(t, size=size, alpha=alpha, beta=beta, k=k)):
        check_op(dev, rng, fn, [x], lambda a, dy: ref.local_response_norm(a, size, alpha, beta, k, dy),
                 lambda t: torch.nn.functional.local_response_norm(t, size, alpha, beta, k), tol=1e-5,
                 name=f"local_response_norm size {size}")


# ---- functional forms, with PyTorch's argument names ----------------------------------------------------------------

def _conv_ref(a, dy):
    return ref.conv2d(a["input"], a["weight"], a["bias"], (2, 1), (1, 2), (2, 4), (1, 1), 1, dy)[:4]


FUNCTIONAL = [
    # (name, tensor arguments by name and shape, other keyword arguments, NumPy reference of the tensor arguments
    # (by name) and dy -> (y, gradient per tensor argument in order))
    ("conv2d", dict(input=(2, 3, 9, 8), weight=(4, 3, 3, 3), bias=(4,)),
     dict(stride=(2, 1), padding=(1, 2), dilation=1, groups=1), _conv_ref),
    ("conv2d", dict(input=(1, 4, 7, 7), weight=(6, 2, 3, 3)), dict(stride=1, padding="same", dilation=2, groups=2),
     lambda a, dy: ref.conv2d(a["input"], a["weight"], None, (1, 1), (2, 2), (4, 4), (2, 2), 2, dy)[:3]),
    ("linear", dict(input=(3, 31), weight=(33, 31), bias=(33,)), {},
     lambda a, dy: ref.linear(a["input"], a["weight"], a["bias"], dy)),
    ("linear", dict(input=(2, 3, 5), weight=(4, 5)), {},  # leading dimensions, as torch's
     lambda a, dy: (lambda r: (r[0].reshape(2, 3, 4), r[1].reshape(2, 3, 5), r[2]))(
         ref.linear(a["input"].reshape(6, 5), a["weight"], None, dy.reshape(6, 4)))),
    ("relu", dict(input=(3, 31)), {}, lambda a, dy: ref.activation("relu", a["input"], dy)),
    ("sigmoid", dict(input=(3, 31)), {}, lambda a, dy: ref.activation("sigmoid", a["input"], dy)),
    ("tanh", dict(input=(3, 31)), {}, lambda a, dy: ref.activation("tanh", a["input"], dy)),
    ("max_pool2d", dict(input=(2, 3, 9, 8)), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
     lambda a, dy: ref.maxpool2d(a["input"], (3, 3), (2, 2), (1, 1), True, dy)),
    ("avg_pool2d", dict(input=(2, 3, 9, 8)),
     dict(kernel_size=(3, 2), stride=(2, 3), padding=1, ceil_mode=False, count_include_pad=False),
     lambda a, dy: ref.avgpool2d(a["input"], (3, 2), (2, 3), (1, 1), False, False, dy)),
    ("softmax", dict(input=(3, 5, 2)), dict(dim=1), lambda a, dy: ref.softmax(a["input"], 1, False, dy)),
    ("log_softmax", dict(input=(3, 5, 2)), dict(dim=-1), lambda a, dy: ref.softmax(a["input"], -1, True, dy)),
    ("dropout", dict(input=(3, 31)), dict(p=0.4, training=False), lambda a, dy: (a["input"], dy)),
    ("batch_norm", dict(input=(3, 4, 5, 2), weight=(4,), bias=(4,)), dict(training=True, momentum=0.2, eps=1e-4),
     lambda a, dy: (lambda r: (r[0],) + r[3:])(ref.batch_norm_train(a["input"], a["weight"], a["bias"], 1e-4, dy))),
    ("batch_norm", dict(input=(3, 4, 5, 2), weight=(4,), bias=(4,)), dict(training=False, eps=1e-4),
     lambda a, dy: ref.batch_norm_eval(a["input"], a["running_mean"], a["running_var"], a["weight"], a["bias"], 1e-4,
                                       dy)),
    ("local_response_norm", dict(input=(2, 6, 3, 3)), dict(size=3, alpha=0.3, beta=0.6, k=1.5),
     lambda a, dy: ref.local_response_norm(a["input"], 3, 0.3, 0.6, 1.5, dy)),
]


@pytest.mark.parametrize("case", FUNCTIONAL, ids=[f"{c[0]}-{i}" for i, c in enumerate(FUNCTIONAL)])
def test_functional_with_torch_argument_names(dev, rng, case):
    """Each nn.functional form called with PyTorch's keyword names, as a PyTorch user would write it, against the
    NumPy reference and torch.nn.functional called with the very same keywords. Batch norm's running statistics
    (which are not differentiated) are given, and updated in training as torch updates them."""
    name, shapes, kwargs, numpy_fn = case
    arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    if name == "max_pool2d":
        arrays["input"] = rng.permutation(arrays["input"].size).reshape(shapes["input"]).astype(np.float32)  # no ties
    stats = {}
    if name == "batch_norm":
        C = shapes["input"][1]
        stats = dict(running_mean=rng.standard_normal(C).astype(np.float32),
                     running_var=rng.uniform(0.5, 2, C).astype(np.float32))
    keys = list(arrays)
    dev_stats = {k: clnet.tensor(v, dev) for k, v in stats.items()}
    check_op(dev, rng, lambda *ts: getattr(F, name)(**dict(zip(keys, ts)), **dev_stats, **kwargs),
             [arrays[k] for k in keys], lambda *a: numpy_fn(dict(zip(keys, a[:-1]), **stats), a[-1]),
             None if not HAVE_TORCH else lambda *ts: getattr(torch.nn.functional, name)(
                 **dict(zip(keys, ts)), **{k: torch64(v, False) for k, v in stats.items()}, **kwargs),
             tol=1e-5, name=name)
    if name == "batch_norm" and kwargs["training"]:
        _, mean, uvar = ref.batch_norm_train(arrays["input"], None, None, 1e-4)
        assert_close(dev_stats["running_mean"].numpy(), ref.running_update(stats["running_mean"], mean, 0.2),
                     "running_mean", tol=1e-6)
        assert_close(dev_stats["running_var"].numpy(), ref.running_update(stats["running_var"], uvar, 0.2),
                     "running_var", tol=1e-6)


@pytest.mark.parametrize("N,C", [(1, 3), (7, 31)])
def test_functional_cross_entropy(dev, rng, N, C):
    logits = (2 * rng.standard_normal((N, C))).astype(np.float32)
    labels = rng.integers(0, C, N)
    z = clnet.tensor(logits, dev, requires_grad=True)
    loss = F.cross_entropy(input=z, target=clnet.tensor(labels, dev))
    loss.backward()
    rl, rg = ref.cross_entropy(logits, labels)
    assert abs(float(loss) - rl) < 1e-5 * max(1, abs(rl))
    assert_close(z.grad.numpy(), rg, "grad logits", tol=1e-5)
    if HAVE_TORCH:
        tz = torch64(logits)
        tl = torch.nn.functional.cross_entropy(input=tz, target=torch.tensor(labels))
        tl.backward()
        assert abs(float(loss) - tl.item()) < 1e-5 * max(1, abs(rl))
        assert_close(z.grad.numpy(), tz.grad.numpy(), "grad logits against torch", tol=1e-5)


# ---- modules --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,dim", [((5, 3), 0), ((2, 3, 5, 4), 2), ((3, 31, 2), -3), ((2, 33, 3), 1)],
                         ids=["dim0", "dim2", "dim-3", "dim1"])
def test_softmax_modules_on_other_dims(dev, rng, shape, dim, log):
    x = (3 * rng.standard_normal(shape)).astype(np.float32)
    layer = nn.LogSoftmax(dim=dim) if log else nn.Softmax(dim=dim)
    tlayer = (torch.nn.LogSoftmax(dim=dim) if log else torch.nn.Softmax(dim=dim)) if HAVE_TORCH else None
    check_op(dev, rng, layer, [x], lambda a, dy: ref.softmax(a, dim, log, dy), tlayer, tol=1e-5, name=repr(layer))


def test_identity(dev, rng):
    """nn.Identity takes (and ignores) any arguments, as PyTorch's; its output is its input, gradient and all."""
    layer = nn.Identity(54, unused_argument=0.1)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    t = clnet.tensor(x, dev, requires_grad=True)
    y = layer(t)
    assert y is t and list(layer.parameters()) == [] and layer.state_dict() == {}
    model = nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2)).to(dev)
    p = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    assert list(p) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    dy = rng.standard_normal((2, 2)).astype(np.float32)
    t = clnet.tensor(x, dev, requires_grad=True)
    model(t).backward(clnet.tensor(dy, dev))
    h = ref.linear(x, p["0.weight"], p["0.bias"])
    _, dh, _, _ = ref.linear(h, p["2.weight"], p["2.bias"], dy)
    _, dx, _, _ = ref.linear(x, p["0.weight"], p["0.bias"], dh)
    assert_close(t.grad.numpy(), dx, "grad input through Identity")


def test_module_list(dev, rng):
    """Registered in order (parameters, state_dict keys as PyTorch's ModuleList gives them), indexed, sliced, iterated,
    extended; a module that loops over one gets every layer's gradient."""
    def stack(lib):
        class Stack(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = lib.nn.ModuleList([lib.nn.Linear(5, 4), lib.nn.Linear(4, 3)])
                self.layers.append(lib.nn.Linear(3, 3))
                self.layers.extend([lib.nn.Linear(3, 2)])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x
        return Stack()

    model = stack(clnet).to(dev)
    assert len(model.layers) == 4 and isinstance(model.layers[1], nn.Linear)
    assert [m.out_features for m in model.layers[1:3]] == [3, 3] and isinstance(model.layers[1:3], nn.ModuleList)
    keys = [f"layers.{i}.{p}" for i in range(4) for p in ("weight", "bias")]
    assert [k for k, _ in model.named_parameters()] == keys and list(model.state_dict()) == keys
    x = rng.standard_normal((3, 5)).astype(np.float32)
    dy = rng.standard_normal((3, 2)).astype(np.float32)
    model(clnet.tensor(x, dev)).backward(clnet.tensor(dy, dev))
    p = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    hs = [x.astype(np.float64)]
    for i in range(4):
        hs.append(ref.linear(hs[-1], p[f"layers.{i}.weight"], p[f"layers.{i}.bias"]))
    g = dy.astype(np.float64)
    grads = dict(model.named_parameters())
    for i in reversed(range(4)):
        _, g, dw, db = ref.linear(hs[i], p[f"layers.{i}.weight"], p[f"layers.{i}.bias"], g)
        assert_close(grads[f"layers.{i}.weight"].grad.numpy(), dw, f"grad layers.{i}.weight")
        assert_close(grads[f"layers.{i}.bias"].grad.numpy(), db, f"grad layers.{i}.bias")
    if HAVE_TORCH:
        assert list(stack(torch).state_dict()) == keys


# ---- autograd -------------------------------------------------------------------------------------------------------

def test_parameters_wait_on_the_host_and_only_floats_need_gradients(dev):
    """A new module's parameters stay on the host (requiring gradients) until the module is placed; an integer
    tensor cannot require a gradient. (tests/test_autograd.py covers the graph's own semantics.)"""
    layer = nn.Linear(3, 2)
    assert layer.weight.device is None and layer.weight.requires_grad and layer.weight.grad is None
    host = layer.weight.numpy()
    layer.to(dev)
    assert layer.weight.device is dev
    np.testing.assert_array_equal(layer.weight.numpy(), host)
    with no_launch(), pytest.raises(TypeError, match="only float32 tensors can require gradients"):
        clnet.tensor(np.arange(3), dev, requires_grad=True)


# ---- bad input, refused before any kernel runs ----------------------------------------------------------------------

def test_bad_operands_are_refused(dev):
    a = clnet.tensor(np.zeros((2, 3), np.float32), dev, requires_grad=True)
    b = clnet.tensor(np.zeros((3, 2), np.float32), dev)
    with no_launch(), pytest.raises(ValueError, match=r"'\+': shapes \(2, 3\) and \(3, 2\) do not broadcast"):
        a + b
    with no_launch(), pytest.raises(ValueError, match=r"'-': shapes \(3, 2\) and \(2, 3\) do not broadcast"):
        b - a
    with no_launch(), pytest.raises(TypeError, match=r"expected a clnet tensor or a Python number, got str"):
        a * "2"
    with no_launch(), pytest.raises(TypeError, match="got list"):
        a * [1.0, 2.0]
    with no_launch(), pytest.raises(TypeError, match="got ndarray"):
        a * np.ones((2, 3), np.float32)


def test_cat_refuses_mismatched_shapes(dev):
    a = clnet.tensor(np.zeros((2, 3, 4), np.float32), dev, requires_grad=True)
    b = clnet.tensor(np.zeros((2, 5, 4), np.float32), dev)
    clnet.cat([a, b], 1)  # fine along the dimension that differs
    with no_launch(), pytest.raises(ValueError, match=r"cat: tensor 1 has shape \(2, 5, 4\), tensor 0 has "
                                                      r"\(2, 3, 4\); all sizes but dimension 0 must match"):
        clnet.cat([a, b], 0)
    with no_launch(), pytest.raises(ValueError, match=r"tensor 2 has shape \(2, 3\)"):
        clnet.cat([a, a, clnet.tensor(np.zeros((2, 3), np.float32), dev)], 2)
    with no_launch(), pytest.raises(IndexError, match="dim 3 is out of range"):
        clnet.cat([a, a], 3)
    with no_launch(), pytest.raises(ValueError, match="non-empty"):
        clnet.cat([], 0)


def test_conv2d_weight_of_the_wrong_rank(dev):
    x = clnet.tensor(np.zeros((1, 3, 8, 8), np.float32), dev)
    w = clnet.tensor(np.zeros((4, 3, 3), np.float32), dev)
    with no_launch(), pytest.raises(ValueError, match=r"conv2d: weight must be \(out_channels, in_channels/groups, "
                                                      r"kH, kW\), got \(4, 3, 3\)"):
        F.conv2d(x, w)
    w4 = clnet.tensor(np.zeros((4, 2, 3, 3), np.float32), dev)
    with no_launch(), pytest.raises(ValueError, match=r"expected input with 2 channels, got shape \(1, 3, 8, 8\)"):
        F.conv2d(x, w4)
    with no_launch(), pytest.raises(ValueError, match=r"bias has shape \(3,\), expected \(4,\)"):
        F.conv2d(x, clnet.tensor(np.zeros((4, 3, 3, 3), np.float32), dev),
                 clnet.tensor(np.zeros(3, np.float32), dev))


def test_batch_norm_of_the_wrong_channel_count(dev):
    x = clnet.tensor(np.zeros((2, 3, 4, 4), np.float32), dev)
    stats = [clnet.tensor(np.zeros(4, np.float32), dev) for _ in range(2)]
    with no_launch(), pytest.raises(ValueError, match=r"batch_norm: running_mean has shape \(4,\), expected \(3,\) "
                                                      r"for input \(2, 3, 4, 4\)"):
        F.batch_norm(x, *stats, training=True)
    with no_launch(), pytest.raises(ValueError, match=r"BatchNorm2d\(4.*expected input with 4 channels, got shape "
                                                      r"\(2, 3, 4, 4\)"):
        nn.BatchNorm2d(4).to(dev)(x)
    with no_launch(), pytest.raises(ValueError, match=r"weight has shape \(4,\), expected \(3,\)"):
        F.batch_norm(x, None, None, weight=stats[0], training=True)
