"""Tensor hooks against PyTorch's: register_hook (a leaf's and a computed tensor's; a returned tensor replaces the
gradient), retain_grad, register_post_accumulate_grad_hook, is_leaf, grad_fn, retains_grad; what each hook sees, what
reaches the leaves, the order of the calls, and removal through the returned handle. Each case runs the same
program on clnet and on torch (float64 on the torch side) from fresh random data."""
import numpy as np
import pytest

import clnet
from clnet import nn

from conftest import assert_close_to_terms, close_to_largest

torch = pytest.importorskip("torch")

TOL = 2e-5


def close(got, want, name):
    close_to_largest(got, want, name, TOL)


def both(dev, array):
    """The same leaf on clnet (float32) and torch (float64), requiring a gradient."""
    return (clnet.tensor(array.astype(np.float32), dev, requires_grad=True),
            torch.tensor(array.astype(np.float64), requires_grad=True))


def value(t):
    return t.numpy() if isinstance(t, clnet.Tensor) else t.detach().numpy().copy()  # torch: not a view of .grad


def test_a_leaf_hook_sees_the_gradient_summed_over_its_uses_once_and_replaces_it(dev, rng):
    a = rng.standard_normal(33)
    seen = {"clnet": [], "torch": []}
    for (x, lib) in zip(both(dev, a), ("clnet", "torch")):
        x.register_hook(lambda g, lib=lib: seen[lib].append(value(g)))
        x.register_hook(lambda g: g * 3.0)  # the second sees what the first returned (None: the same gradient)
        y = (x * x + x * 2.0).sum()  # two uses: one call with the sum
        y.backward()
        seen[lib].append(value(x.grad))
    assert len(seen["clnet"]) == len(seen["torch"]) == 2
    for i, what in enumerate(["the hook's gradient", ".grad after the replacement"]):
        close(seen["clnet"][i], seen["torch"][i], what)


def test_a_computed_tensors_hooks_run_in_order_and_their_result_reaches_the_leaves(dev, rng):
    a, w = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    out = {}
    cx, tx = both(dev, a)
    cw, tw = both(dev, w)
    for x, wt, lib in ((cx, cw, "clnet"), (tx, tw, "torch")):
        log = out[lib] = []
        h = (x * wt).tanh()
        h.register_hook(lambda g, log=log: (log.append(("first", value(g))), g * 2.0)[1])
        h.register_hook(lambda g, log=log: (log.append(("second", value(g))), g + 1.0)[1])
        (h * h).sum().backward()
        log.append(("x", value(x.grad)))
        log.append(("w", value(wt.grad)))
    assert [n for n, _ in out["clnet"]] == [n for n, _ in out["torch"]] == ["first", "second", "x", "w"]
    for (name, got), (_, want) in zip(out["clnet"], out["torch"]):
        close(got, want, name)


def test_a_removed_hook_runs_no_more_and_a_second_remove_does_nothing(dev, rng):
    a = rng.standard_normal(31)
    grads = {}
    for x, lib in zip(both(dev, a), ("clnet", "torch")):
        doubling = x.register_hook(lambda g: g * 2.0)
        x.register_hook(lambda g: g + 1.0)
        twice = x.register_post_accumulate_grad_hook(lambda t: None)
        (x * 1.5).sum().backward()
        first = value(x.grad).copy()
        doubling.remove()
        doubling.remove()
        twice.remove()
        x.grad = None
        (x * 1.5).sum().backward()
        grads[lib] = first, value(x.grad)
    for i in range(2):
        close(grads["clnet"][i], grads["torch"][i], f"backward {i + 1}")
    np.testing.assert_allclose(grads["clnet"][1], np.full(31, 2.5), rtol=1e-6)


def test_retain_grad_keeps_a_computed_tensors_gradient_after_its_hooks_accumulated_over_backwards(dev, rng):
    a = rng.standard_normal((3, 65))
    out = {}
    for x, lib in zip(both(dev, a), ("clnet", "torch")):
        h = x.sigmoid() * 3.0
        h.retain_grad()  # before the hook is registered: it still sees the hook's result (PyTorch 2)
        h.register_hook(lambda g: g * 10.0)
        assert h.retains_grad and not x.retains_grad and not h.is_leaf and x.is_leaf and h.grad_fn is not None
        x.retain_grad()  # a leaf: nothing changes
        loss = (h * h + h).sum()
        loss.backward(retain_graph=True)
        once = value(h.grad).copy()
        loss.backward()
        out[lib] = once, value(h.grad), value(x.grad)
    for i, what in enumerate(["h.grad after one backward", "h.grad after two", "x.grad after two"]):
        close(out["clnet"][i], out["torch"][i], what)


def test_post_accumulate_grad_hooks_run_after_the_tensor_hooks_with_the_complete_grad(dev, rng):
    """Including a Linear's weight, whose gradient the product's backward otherwise writes straight into .grad: a
    hook there must see the gradient and replace what is accumulated."""
    x_data = rng.standard_normal((4, 9))
    w_data, b_data = rng.standard_normal((3, 9)), rng.standard_normal(3)
    logs = {}
    for lib in ("clnet", "torch"):
        if lib == "clnet":
            lin = nn.Linear(9, 3).to(dev)
            lin.weight.write(w_data.astype(np.float32))
            lin.bias.write(b_data.astype(np.float32))
            x = clnet.tensor(x_data.astype(np.float32), dev)
        else:
            lin = torch.nn.Linear(9, 3).double()
            with torch.no_grad():
                lin.weight.copy_(torch.tensor(w_data))
                lin.bias.copy_(torch.tensor(b_data))
            x = torch.tensor(x_data)
        log = logs[lib] = []
        for name, p in (("weight", lin.weight), ("bias", lin.bias)):
            p.register_post_accumulate_grad_hook(lambda t, name=name, log=log: log.append((f"post {name}",
                                                                                          value(t.grad))))
            p.register_hook(lambda g, name=name, log=log: (log.append((f"hook {name}", value(g))), g * 0.5)[1])
        for _ in range(2):  # the second backward adds to .grad
            (lin(x) ** 2).sum().backward()
    for param in ("weight", "bias"):  # each parameter's own calls in torch's order (the two run in either order)
        mine = [(n, v) for n, v in logs["clnet"] if n.endswith(param)]
        theirs = [(n, v) for n, v in logs["torch"] if n.endswith(param)]
        assert [n for n, _ in mine] == [n for n, _ in theirs] == [f"hook {param}", f"post {param}"] * 2
        for i, ((name, got), (_, want)) in enumerate(zip(mine, theirs)):
            close(got, want, f"{name}, call {i + 1}")


def test_hooks_on_the_root_a_scalar_and_a_leaf(dev, rng):
    a = rng.standard_normal(3)
    out = {}
    for x, lib in zip(both(dev, a), ("clnet", "torch")):
        seen = out[lib] = []
        s = (x * 2.0).sum()
        s.register_hook(lambda g, seen=seen: (seen.append(value(g)), g * 4.0)[1])
        s.backward()
        seen.append(value(x.grad))
        leaf = both(dev, a[:1])[0 if lib == "clnet" else 1]
        leaf.register_hook(lambda g: g * 5.0)
        leaf.register_post_accumulate_grad_hook(lambda t, seen=seen: seen.append(value(t.grad)))
        leaf.backward()
    for i, (got, want) in enumerate(zip(out["clnet"], out["torch"])):
        close(np.reshape(got, np.shape(want)), want, f"value {i}")


def test_hooks_refuse_what_torch_refuses(dev, rng):
    x = clnet.tensor(rng.standard_normal(4).astype(np.float32), dev)
    with pytest.raises(RuntimeError, match="register_hook: a tensor of shape \\(4,\\) does not require a gradient"):
        x.register_hook(lambda g: g)
    with pytest.raises(RuntimeError, match="retain_grad: a tensor of shape \\(4,\\) does not require a gradient"):
        x.retain_grad()
    w = clnet.tensor(rng.standard_normal(4).astype(np.float32), dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="register_post_accumulate_grad_hook: a tensor of shape \\(4,\\) that is "
                                           "computed"):
        (w * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    h = w * 2.0

    def wrong(g):
        return clnet.ones(5, device=dev)

    h.register_hook(wrong)
    with pytest.raises(RuntimeError, match="the hook 'wrong' returned shape \\(5,\\) float32 for the gradient of a "
                                           "tensor of shape \\(4,\\)"):
        h.sum().backward()


def test_under_a_capture_retain_grad_replays_and_a_tensor_hook_is_refused(dev, rng):
    a = rng.standard_normal(37).astype(np.float32)
    x = clnet.tensor(a, dev, requires_grad=True)
    g = clnet.Graph()
    with g.capture():
        h = x.exp() * 2.0
        h.retain_grad()
        (h * h).sum().backward()
    b = rng.standard_normal(37).astype(np.float32)
    x.write(b)
    g.replay()
    np.testing.assert_allclose(h.grad.numpy(), 2 * (2 * np.exp(b.astype(np.float64))), rtol=1e-5)
    y = clnet.tensor(a, dev, requires_grad=True)
    y.register_hook(lambda grad: grad)
    with pytest.raises(clnet.CaptureError, match="register_hook: a tensor hook runs Python in backward"):
        with clnet.Graph().capture():
            (y * 3.0).sum().backward()


def test_under_a_capture_a_post_accumulate_hooks_launches_replay(dev, rng):
    """The hook runs once, at the capture; what it launches (here: halving the complete .grad in place) is recorded,
    so every replay halves the gradient it accumulated, as the eager step would."""
    a, b = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    x = clnet.tensor(a, dev, requires_grad=True)
    calls = []

    def halve(t):
        calls.append(1)
        with clnet.no_grad():
            t.grad.mul_(0.5)

    x.register_post_accumulate_grad_hook(halve)
    g = clnet.Graph()
    with g.capture():
        (x * x).sum().backward()
    x.write(b)
    g.replay()
    assert len(calls) == 1
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # float32 adds a, b and b in turn: where they nearly cancel, its error is relative to the terms, not the result
    assert_close_to_terms(x.grad.numpy(), (2 * a64 / 2 + 2 * b64) / 2, (np.abs(a64) + 2 * np.abs(b64)) / 2,
                          "the replayed gradient", tol=2e-6)
