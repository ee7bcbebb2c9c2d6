"""PyTorch's optimizer-in-backward pattern (an optimizer per parameter, stepped and zeroed in the parameter's
post-accumulate-grad hook) against the same program in torch (float64), from fresh random data at batch 1. On a CPU
a dense layer's weight gradient is then deferred and taken by the SGD step in one pass over the weight
(conv.DeferredWeightGrad, sgd.cl rank1_sgd_rows): each test checks that the fused kernel ran where it should, and
the weights, momentum and gradients that reach the user."""
import numpy as np
import pytest

import clnet
from clnet import conv, kernels, nn, optim

from conftest import close_to_largest

torch = pytest.importorskip("torch")

TOL = 2e-5
I, H, O = 37, 53, 7  # odd sizes: the fused kernel's float8 runs and their tails


def close(got, want, name):
    close_to_largest(got, want, name, TOL)


@pytest.fixture
def defer_all(monkeypatch):
    """Every dense weight deferred (the default threshold leaves these small layers to the plain path)."""
    monkeypatch.setattr(conv, "DEFER_MIN", 1)


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels launched, in order."""
    names = []
    launch = kernels.launch

    def spy(dev, k, *args, **kwargs):
        names.append(k.name)
        return launch(dev, k, *args, **kwargs)
    monkeypatch.setattr(kernels, "launch", spy)
    return names


def twins(dev, rng, relu=True, bias=True, shared=False):
    """The same two-layer network in clnet and torch (float64), and a forward for each."""
    w1, w2 = rng.standard_normal((H, I)) / np.sqrt(I), rng.standard_normal((O, H)) / np.sqrt(H)
    b1, b2 = rng.standard_normal(H) * 0.1, rng.standard_normal(O) * 0.1
    c = nn.Sequential(nn.Linear(I, H, bias=bias), *([nn.ReLU()] if relu else []), nn.Linear(H, O, bias=bias))
    t = torch.nn.Sequential(torch.nn.Linear(I, H, bias=bias), *([torch.nn.ReLU()] if relu else []),
                            torch.nn.Linear(H, O, bias=bias)).double()
    with torch.no_grad():
        for layer_c, layer_t, w, b in ((c[0], t[0], w1, b1), (c[-1], t[-1], w2, b2)):
            layer_c.weight.write(w.astype(np.float32))
            layer_t.weight.copy_(torch.tensor(w))
            if bias:
                layer_c.bias.write(b.astype(np.float32))
                layer_t.bias.copy_(torch.tensor(b))
    c.to(dev)
    if shared:  # the second layer's weight is the first's, transposed back into it: a leaf with two uses
        square = nn.Linear(H, H, bias=False).to(dev)
        tsq = torch.nn.Linear(H, H, bias=False).double()
        ws = rng.standard_normal((H, H)) / np.sqrt(H)
        square.weight.write(ws.astype(np.float32))
        with torch.no_grad():
            tsq.weight.copy_(torch.tensor(ws))
        return ((lambda x: c[-1](square(square(c[0](x)).relu()))), list(c.parameters()) + [square.weight],
                (lambda x: t[-1](tsq(tsq(t[0](x)).relu()))), list(t.parameters()) + [tsq.weight])
    return c, list(c.parameters()), t, list(t.parameters())


def hooked(params, make, zero=True, log=None):
    """An optimizer per parameter, stepped (and zeroed unless not zero) in its post-accumulate-grad hook."""
    opts = {id(p): make([p]) for p in params}

    def hook(p):
        if log is not None:  # per parameter (the engines call different leaves' hooks in different orders)
            grad = p.grad.numpy() if isinstance(p, clnet.Tensor) else p.grad.detach().numpy().copy()
            log.setdefault([id(q) for q in params].index(id(p)), []).append(grad)
        opts[id(p)].step()
        if zero:
            opts[id(p)].zero_grad()
    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    return opts


def data(dev, rng, steps):
    xs = rng.standard_normal((steps, 1, I))
    ys = rng.integers(0, O, (steps, 1))
    return ([(clnet.tensor(x.astype(np.float32), dev), clnet.tensor(y.astype(np.int32), dev)) for x, y in zip(xs, ys)],
            [(torch.tensor(x), torch.tensor(y, dtype=torch.long)) for x, y in zip(xs, ys)])


@pytest.mark.parametrize("momentum,nesterov,decay", [(0.9, False, 0.0), (0.9, True, 0.01), (0.0, False, 0.01)])
@pytest.mark.parametrize("relu,bias", [(True, True), (False, False)])
def test_steps_in_hooks_match_torch(dev, rng, defer_all, launches, momentum, nesterov, decay, relu, bias):
    steps = 3
    cnet, cparams, tnet, tparams = twins(dev, rng, relu, bias)
    kw = dict(lr=0.1, momentum=momentum, weight_decay=decay, nesterov=nesterov)
    copts = hooked(cparams, lambda ps: optim.SGD(ps, **kw))
    topts = hooked(tparams, lambda ps: torch.optim.SGD(ps, **kw))
    cdata, tdata = data(dev, rng, steps)
    fused_per_step = []
    for (cx, cy), (tx, ty) in zip(cdata, tdata):
        before = len(launches)
        nn.CrossEntropyLoss()(cnet(cx), cy).backward()
        fused_per_step.append(launches[before:].count("rank1_sgd_rows"))
        torch.nn.functional.cross_entropy(tnet(tx), ty).backward()
    for i, (cp, tp) in enumerate(zip(cparams, tparams)):
        close(cp.numpy(), tp.detach().numpy(), f"parameter {i} after {steps} steps")
        if momentum:
            close(copts[id(cp)].state_dict()["state"][0]["momentum_buffer"],
                  topts[id(tp)].state[tp]["momentum_buffer"].numpy(), f"parameter {i}'s momentum")
    if tuning_cpu_shaped(dev):
        # both weights fused from the second step (the first lays out each optimizer's flat buffers, which reads
        # the gradient); a GPU keeps its own batch-1 kernels
        assert fused_per_step[1:] == [2] * (steps - 1), fused_per_step
    else:
        assert fused_per_step == [0] * steps


def tuning_cpu_shaped(dev):
    from clnet import tuning
    return tuning.cpu_shaped(dev)


def test_a_hook_that_reads_the_gradient_and_keeps_it(dev, rng, defer_all, launches):
    """A hook that reads .grad first sees the gradient; one that steps without zero_grad leaves .grad holding it
    (the deferred gradient is written after the fused step), as torch does."""
    cnet, cparams, tnet, tparams = twins(dev, rng)
    seen = {"clnet": {}, "torch": {}}
    hooked(cparams[:2], lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9), log=seen["clnet"])
    hooked(tparams[:2], lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), log=seen["torch"])
    kept = list(hooked(cparams[2:], lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9), zero=False).values())
    kept += list(hooked(tparams[2:], lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), zero=False).values())
    cdata, tdata = data(dev, rng, 3)
    for step, ((cx, cy), (tx, ty)) in enumerate(zip(cdata, tdata)):
        for o in kept:  # before the backward, not in the hook: each backward's gradient is kept after its step
            o.zero_grad()
        nn.CrossEntropyLoss()(cnet(cx), cy).backward()
        torch.nn.functional.cross_entropy(tnet(tx), ty).backward()
        for i, (cp, tp) in enumerate(zip(cparams[2:], tparams[2:])):
            close(cp.grad.numpy(), tp.grad.numpy(), f"kept gradient {i} at step {step}")
    assert sorted(seen["clnet"]) == sorted(seen["torch"]) == [0, 1]
    for i in (0, 1):
        assert len(seen["clnet"][i]) == len(seen["torch"][i]) == 3
        for step, (c, t) in enumerate(zip(seen["clnet"][i], seen["torch"][i])):
            close(c, t, f"parameter {i}'s gradient read in its hook at step {step}")
    for i, (cp, tp) in enumerate(zip(cparams, tparams)):
        close(cp.numpy(), tp.detach().numpy(), f"parameter {i}")
    if tuning_cpu_shaped(dev):
        assert launches.count("rank1_sgd_rows") == 3  # the second weight at every step (zero_grad laid it out first)


def test_a_weight_used_twice_gets_both_uses(dev, rng, defer_all):
    """The first use's deferred gradient is written before the second adds to it."""
    cf, cparams, tf, tparams = twins(dev, rng, shared=True)
    hooked(cparams, lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9))
    hooked(tparams, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    cdata, tdata = data(dev, rng, 3)
    for (cx, cy), (tx, ty) in zip(cdata, tdata):
        nn.CrossEntropyLoss()(cf(cx), cy).backward()
        torch.nn.functional.cross_entropy(tf(tx), ty).backward()
    for i, (cp, tp) in enumerate(zip(cparams, tparams)):
        close(cp.numpy(), tp.detach().numpy(), f"parameter {i}")


@pytest.mark.parametrize("zero_in_hooks", [False, True], ids=["zero_grad-first", "zero_grad-in-hooks-too"])
def test_a_captured_step_with_hooks_replays_as_eager_steps(dev, rng, defer_all, launches, zero_in_hooks):
    """zero_grad inside the captured step, then backward whose hooks step: the replays train as eager steps do. With
    zero_grad in each hook after its step too (PyTorch's order), the capture ends with every .grad marked, and each
    replay ends so, by a mark rather than a recorded fill of every gradient: each .grad reads None after a replay,
    as after an eager step."""
    cnet, cparams, tnet, tparams = twins(dev, rng)
    copts = hooked(cparams, lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), zero=zero_in_hooks)
    hooked(tparams, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    (cx, cy), = data(dev, rng, 1)[0]
    tx, ty = torch.tensor(cx.numpy(), dtype=torch.float64), torch.tensor(cy.numpy(), dtype=torch.long)

    def step():
        for o in copts.values():
            o.zero_grad()
        nn.CrossEntropyLoss()(cnet(cx), cy).backward()
    step()  # eager: lays out the optimizers' buffers
    g = clnet.Graph()
    first = len(launches)
    with g.capture():
        step()
    if zero_in_hooks:
        assert "fill" not in launches[first:], launches[first:]
    for _ in range(2):  # the capture ran a step too: four in all
        g.replay()
        if zero_in_hooks:
            for i, p in enumerate(cparams):
                assert p.grad is None, f"gradient {i} after a replay"  # zero_grad's set_to_none, as eager
    for _ in range(4):
        torch.nn.functional.cross_entropy(tnet(tx), ty).backward()
    for i, (cp, tp) in enumerate(zip(cparams, tparams)):
        close(cp.numpy(), tp.detach().numpy(), f"parameter {i} after 4 steps (captured and replayed)")
    if tuning_cpu_shaped(dev):
        assert launches.count("rank1_sgd_rows") >= 2  # the capture's two weights
