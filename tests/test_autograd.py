"""Autograd's own semantics, against float64 NumPy: accumulation over several uses, diamonds, leaves' .grad, no_grad,
detach, released graphs, non-scalar roots; and the clear errors for misuse."""
import numpy as np
import pytest

import clnet
from clnet import autograd, nn
import clnet.nn.functional as F

from conftest import assert_close, assert_close_to_terms


def leaf(rng, dev, *shape):
    a = rng.standard_normal(shape).astype(np.float32)
    return a, clnet.tensor(a, device=dev, requires_grad=True)


def test_leaf_flags(dev, rng):
    a = rng.standard_normal((3, 2))
    x = clnet.tensor(a, device=dev)
    w = clnet.tensor(a, device=dev, requires_grad=True)
    assert not x.requires_grad and x.grad is None and x.is_leaf
    assert w.requires_grad and w.grad is None and w.is_leaf
    y = w * 2.0
    assert y.requires_grad and not y.is_leaf and (x * 2.0).grad_fn is None


def test_tensor_used_twice_sums_its_gradients(dev, rng):
    a, x = leaf(rng, dev, 5, 7)
    b, w = leaf(rng, dev, 5, 7)
    # y = sum(x * w + x * 3 - w): dy/dx = w + 3, dy/dw = x - 1
    y = (x * w + x * 3.0 - w).sum()
    y.backward()
    assert_close(x.grad.numpy(), b.astype(np.float64) + 3, "dx")
    assert_close(w.grad.numpy(), a.astype(np.float64) - 1, "dw")
    a64 = a.astype(np.float64)
    # a sum of 35 terms can cancel far below them: compare its error with the terms' size
    assert_close_to_terms(y.item(), (a64 * b + 3 * a64 - b).sum(), (np.abs(a64 * b) + 3 * np.abs(a64) + np.abs(b)).sum(),
                          "y", tol=1e-6)


def test_diamond_and_accumulation_across_backwards(dev, rng):
    """x feeds two branches that meet again; a second forward and backward adds (+=) to .grad."""
    a, x = leaf(rng, dev, 4, 6)
    g = rng.standard_normal((4, 6)).astype(np.float32)
    for _ in range(2):
        h = x * 2.0
        top, bottom = F.relu(h), F.sigmoid(h)
        (top * bottom).backward(clnet.tensor(g, dev))
    h = 2 * a.astype(np.float64)
    s = 1 / (1 + np.exp(-h))
    d = g * (np.where(h > 0, s, 0) + np.maximum(h, 0) * s * (1 - s)) * 2
    assert_close(x.grad.numpy(), 2 * d, "dx after two backwards", tol=1e-5)


def test_no_grad_records_nothing(dev, rng):
    _, w = leaf(rng, dev, 3, 3)
    with clnet.no_grad():
        y = w * 2.0 + 1.0
        assert not clnet.is_grad_enabled()
    assert clnet.is_grad_enabled()
    assert y.grad_fn is None and not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require a gradient"):
        y.sum().backward()

    @clnet.no_grad()
    def f(t):
        return t * 3.0
    assert f(w).grad_fn is None


def test_detach_cuts_the_graph(dev, rng):
    a, x = leaf(rng, dev, 2, 5)
    y = x * 3.0
    z = (y.detach() * x).sum()  # d/dx = y (the detached factor is a constant)
    z.backward()
    assert_close(x.grad.numpy(), 3 * a.astype(np.float64), "dx")
    assert y.detach().grad_fn is None


def test_freed_graph_and_missing_gradient_are_clear_errors(dev, rng):
    _, x = leaf(rng, dev, 3, 4)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="already released"):
        y.backward()
    z = x * 2.0
    with pytest.raises(RuntimeError, match=r"shape \(3, 4\) needs its gradient"):
        z.backward()
    with pytest.raises(ValueError, match="gradient has shape"):
        z.backward(clnet.tensor(np.ones((4, 3), np.float32), dev))


def test_retain_graph_allows_a_second_backward(dev, rng):
    a, x = leaf(rng, dev, 6)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_close(x.grad.numpy(), 4 * a.astype(np.float64), "dx after two backwards")


def test_graph_is_released_after_backward(dev, rng):
    """Saved tensors go as soon as backward has run: the recorded op keeps no inputs."""
    layer = nn.Linear(5, 3).to(dev)
    x = clnet.tensor(rng.standard_normal((2, 5)), dev)
    y = layer(x)
    fn = y.grad_fn
    assert fn.saved is not None and fn.inputs is not None
    y.sum().backward()
    assert fn.saved is None and fn.inputs is None


def test_first_layer_skips_its_input_gradient(dev, rng):
    """x does not require grad: no data-gradient product runs for the layer it feeds (a training step's first
    layer), while x made with requires_grad gets one."""
    from clnet import kernels
    layer = nn.Linear(6, 4).to(dev)
    a = rng.standard_normal((3, 6))

    def launches(x):
        y = layer(x)
        before = kernels.launch_count
        y.sum().backward()
        return kernels.launch_count - before

    launches(clnet.tensor(a, dev))  # the first backward also allocates (fills) the parameters' .grad
    plain = launches(clnet.tensor(a, dev))
    layer.zero_grad()
    x = clnet.tensor(a, dev, requires_grad=True)
    assert launches(x) == plain + 1
    w = layer.weight.numpy().astype(np.float64)
    assert_close(x.grad.numpy(), np.ones((3, 4)) @ w, "dx")


def test_frozen_parameters_get_no_gradient(dev, rng):
    layer = nn.Linear(4, 2).to(dev)
    layer.weight.requires_grad_(False)
    x = clnet.tensor(rng.standard_normal((3, 4)), dev, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None and layer.bias.grad is not None and x.grad is not None
    assert_close(layer.bias.grad.numpy(), np.full(2, 3.0), "db")


def test_graph_keeps_only_what_backward_needs(dev, rng):
    """A recorded op holds what its forward saved, not its inputs: an intermediate that no backward reads (the input
    of a ReLU, which saves its output) is freed as soon as the user drops it, before backward."""
    import weakref
    a, x = leaf(rng, dev, 4, 5)
    h = x * 2.0
    y = F.relu(h)
    gone = weakref.ref(h)
    del h
    assert gone() is None
    y.sum().backward()
    assert_close(x.grad.numpy(), np.where(a > 0, 2.0, 0.0), "dx")


def test_computed_tensor_plus_a_function_of_it(dev, rng):
    """y = x + f(x) with x computed and the first operand (MobileNetV2's inverted residual): x's op runs its backward
    after f's gradient has reached it (a topological order that marked ops when first pushed ran it before: dx lost
    f's share)."""
    a, leaf_x = leaf(rng, dev, 4, 6)
    x = leaf_x * 2.0
    y = (x + F.relu(x) * 3.0).sum()
    y.backward()
    a64 = a.astype(np.float64)
    assert_close(leaf_x.grad.numpy(), 2.0 * (1.0 + 3.0 * (a64 > 0)), "d(x + 3 relu(x))/dx")


class _ZeroGradNet:
    """A 3x3 convolution, batch norm, a dense layer applied twice (one parameter, two uses), a head and a dense layer
    left unused (the last), in clnet or PyTorch."""

    @staticmethod
    def build(lib, eval_norm):
        nn_ = lib.nn
        layers = nn_.Sequential(nn_.Conv2d(2, 3, 3, padding=1), nn_.BatchNorm2d(3), nn_.Linear(12, 12),
                                nn_.Linear(12, 4), nn_.Linear(4, 4))  # run by forward(), the last not at all
        if eval_norm:
            layers[1].eval()
        return layers

    @staticmethod
    def forward(lib, layers, x):
        conv, bn, shared, head = layers[0], layers[1], layers[2], layers[3]
        h = lib.nn.functional.max_pool2d(bn(lib.nn.functional.relu(conv(x))), 2).reshape(x.shape[0], 12)
        return head(shared(shared(h)))


@pytest.mark.parametrize("algorithm", ["im2col", "winograd"])
@pytest.mark.parametrize("eval_norm", [False, True], ids=["bn-train", "bn-eval"])
def test_zero_grad_marks_gradients_that_backward_then_overwrites(dev, rng, monkeypatch, kernel_shape, algorithm,
                                                                 eval_norm):
    """zero_grad writes nothing: the next backward's kernels overwrite each .grad (conv weights by im2col or
    Winograd, biases, batch norm, a dense layer used twice, which adds its second use), so NaN left in the gradients
    beforehand never shows; a parameter no backward reached reads as None, as PyTorch's, and SGD passes over it;
    without zero_grad, gradients add up. Against PyTorch in float64."""
    torch = pytest.importorskip("torch")
    from clnet import optim, tuning
    monkeypatch.setattr(tuning, "conv_default",
                        lambda d, s, options, kind=None: algorithm if algorithm in options else "im2col")
    tuning.forget()
    clnet.manual_seed(int(rng.integers(1 << 30)))
    ours = _ZeroGradNet.build(clnet, eval_norm).to(dev)
    theirs = _ZeroGradNet.build(torch, eval_norm)
    theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ours.state_dict().items()})
    theirs.double()
    opt = optim.SGD(ours.parameters(), lr=0.1, weight_decay=0.5)
    params = dict(ours.named_parameters())

    def step(x, dy, zero):
        if zero:
            opt.zero_grad()
            theirs.zero_grad(set_to_none=False)
        _ZeroGradNet.forward(clnet, ours, clnet.tensor(x, dev)).backward(clnet.tensor(dy, dev))
        _ZeroGradNet.forward(torch, theirs, torch.from_numpy(x.astype(np.float64))).backward(
            torch.from_numpy(dy.astype(np.float64)))

    def batch():
        return (rng.standard_normal((3, 2, 4, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32))

    step(*batch(), zero=True)
    for p in params.values():
        if p.grad is not None:  # (the unused layer's is None, as PyTorch's)
            p.grad.write(np.full(p.shape, np.nan, np.float32))
    step(*batch(), zero=True)
    step(*batch(), zero=False)  # adds
    for k, p in params.items():
        want = theirs.get_parameter(k).grad
        if want is None:
            assert p.grad is None, f"{k}: no backward reached it, and its .grad is not None"
            continue
        assert_close(p.grad.numpy(), want.numpy(), "grad " + k, tol=1e-4)  # batch norm at batch 3 cancels; a lost
        # write is O(1)
    opt.zero_grad(set_to_none=False)
    before = {k: p.numpy().astype(np.float64) for k, p in params.items()}
    opt.step()  # the gradients read as zeros: weight decay alone moves the weights; the unused layer's (None) stay
    assert_close(params["0.weight"].numpy(), before["0.weight"] * (1 - 0.1 * 0.5), "weight after a step", tol=1e-6)
    assert np.array_equal(params["4.weight"].numpy(), before["4.weight"]), "an unused weight moved"
    assert not params["0.weight"].grad.numpy().any()
    opt.zero_grad()  # set_to_none, PyTorch's default: every .grad None, and a step moves nothing
    assert all(p.grad is None for p in params.values())
    before = {k: p.numpy() for k, p in params.items()}
    opt.step()
    for k, p in params.items():
        assert np.array_equal(p.numpy(), before[k]), f"{k} moved in a step without gradients"


def test_a_saved_tensor_changed_in_place_is_refused_at_backward(dev, rng):
    """As PyTorch's version counters: backward refuses an op whose saved tensor took an in-place write since (an
    in-place method, x[...] = value, write() of host data, through an alias too), naming the op; the gradient would
    be computed from the new values (w * x's dw was x after x.mul_(10)). Writes to other tensors, or before the
    forward, change nothing."""
    a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    w = clnet.tensor(a, dev, requires_grad=True)
    for change in (lambda x: x.mul_(10.0), lambda x: x.__setitem__(0, 9.0), lambda x: x.write(np.zeros(5)),
                   lambda x: x.reshape(1, 5).add_(1.0)):
        x = clnet.tensor(b, dev)
        y = (w * x).sum()
        change(x)
        with pytest.raises(RuntimeError, match=r"Mul backward: a tensor of shape \(5,\) that this op saved for its "
                                               r"gradient was changed in place since"):
            y.backward()
    layer = clnet.nn.Linear(5, 2).to(dev)  # an optimizer's step writes the weights a backward still to come saved
    opt = clnet.optim.SGD(layer.parameters(), lr=0.1)
    out = layer(clnet.tensor(np.stack([a, b]), dev)).sum()
    out.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match=r"Linear backward: a tensor of shape \(2, 5\) that this op saved"):
        out.backward()
    w.grad = None
    x, other = clnet.tensor(b, dev), clnet.tensor(b, dev)
    x.mul_(2.0)  # before the forward
    y = (w * x).sum()
    other.add_(1.0)  # another tensor
    y.backward()
    assert_close(w.grad.numpy(), 2.0 * b.astype(np.float64), "dw after writes that do not touch what Mul saved")
