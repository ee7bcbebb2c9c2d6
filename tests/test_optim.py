"""Adam and AdamW over several steps against float64 NumPy (written from PyTorch's documented update) and
torch.optim itself; their state round trip; one launch per update whatever the number of parameters."""
import numpy as np
import pytest

import clnet
from clnet import kernels, nn, optim

from conftest import assert_close, give_gradients, needs_torch


def adam_reference(p, grads, lr, betas, eps, weight_decay, decoupled):
    """Parameters after len(grads) steps of Adam (or AdamW), in float64."""
    p = p.astype(np.float64).copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if decoupled:
            p *= 1 - lr * weight_decay
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p -= lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return p


def net(dev):
    return nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 1)).to(dev)


@pytest.mark.parametrize("cls,weight_decay", [(optim.Adam, 0.0), (optim.Adam, 0.1), (optim.AdamW, 0.05)])
def test_adam_matches_reference_in_one_launch(dev, rng, cls, weight_decay):
    model = net(dev)
    params = model.parameters()
    start = [p.numpy() for p in params]
    opt = cls(params, lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    steps = [[rng.standard_normal(p.shape).astype(np.float32) for p in params] for _ in range(4)]
    for grads in steps:
        give_gradients(params)
        opt.zero_grad(set_to_none=False)
        for p, g in zip(params, grads):  # each .grad is in the flat buffer
            p.grad.write(g)
        before = kernels.launch_count
        opt.step()
        assert kernels.launch_count - before == 1
    for i, p in enumerate(params):
        ref = adam_reference(start[i], [s[i] for s in steps], 0.02, (0.8, 0.95), 1e-6, weight_decay,
                             cls is optim.AdamW)
        # float32 rounds each step's update and the weight it lands on: the error scales with those, not with the
        # result, which can all but cancel (a one-element bias near zero after four steps of +-lr)
        scale = np.abs(start[i]).max() + 4 * 0.02
        worst = np.abs(p.numpy() - ref).max()
        assert worst < 1e-6 * scale, f"parameter {i} after 4 steps: error {worst:.2e}, scale {scale:.2e}"


@needs_torch
@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_adam_matches_torch_training(dev, rng, cls):
    """Five real steps (forward, loss.backward(), step) beside torch.optim from the same weights and batches."""
    import torch
    model = net(dev)
    twin = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3), torch.nn.Linear(3, 1))
    start = model.state_dict()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()})
    twin.double()
    # eps 1e-3 rather than 1e-8: Adam's step m / sqrt(v) is about +-1 however small the gradient, so an element whose
    # gradient is a rounding's size (1e-9 here, 0 there) moves by lr in one engine and not in the other; with the
    # default eps that failed 4 of 2700 random draws here (clnet's gradients within float32 rounding of float64's at
    # every step, PyTorch float32 as far off as clnet), with 1e-3 none of 3000 (the worst at 0.57 of the tolerance)
    opt = getattr(optim, cls)(model.parameters(), lr=0.01, weight_decay=0.02, eps=1e-3)
    topt = getattr(torch.optim, cls)(twin.parameters(), lr=0.01, weight_decay=0.02, eps=1e-3)
    for _ in range(5):
        x = rng.standard_normal((6, 7)).astype(np.float32)
        y = rng.standard_normal((6, 1)).astype(np.float32)
        opt.zero_grad()
        d = model(clnet.tensor(x, dev)) - clnet.tensor(y, dev)
        (d * d).mean().backward()
        opt.step()
        topt.zero_grad()
        td = twin(torch.from_numpy(x).double()) - torch.from_numpy(y).double()
        (td * td).mean().backward()
        topt.step()
    theirs = twin.state_dict()
    for k, v in model.state_dict().items():
        # as in the test above: the error scales with the weights and five updates of about lr each, not with the
        # result (a one-element bias ended at -0.0067, 1.5e-7 from PyTorch's float64)
        scale = np.abs(start[k]).max() + 5 * 0.01
        worst = np.abs(v - theirs[k].numpy()).max()
        assert worst < 1e-5 * scale, f"{k}: error {worst:.2e}, scale {scale:.2e}"


def test_adam_state_round_trip_continues_exactly(dev, rng):
    """A state_dict taken after two steps, loaded into a fresh optimizer (before its first step), continues as the
    original does, bit for bit: moments, step count and hyperparameters all travel."""
    def make():
        clnet.manual_seed(4)
        return net(dev)
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in make().parameters()] for _ in range(4)]

    def step(model, opt, g):
        give_gradients(model.parameters())
        opt.zero_grad(set_to_none=False)
        for p, gi in zip(model.parameters(), g):
            p.grad.write(gi)
        opt.step()

    a = make()
    opt_a = optim.Adam(a.parameters(), lr=0.03, betas=(0.7, 0.9))
    for g in grads[:2]:
        step(a, opt_a, g)
    state = opt_a.state_dict()
    assert state["param_groups"][0]["step"] == 2 and set(state["state"][0]) == {"exp_avg", "exp_avg_sq"}
    b = make()
    b.load_state_dict(a.state_dict())
    opt_b = optim.Adam(b.parameters(), lr=0.5)
    opt_b.load_state_dict(state)
    assert opt_b.lr == 0.03 and tuple(opt_b.betas) == (0.7, 0.9)
    for g in grads[2:]:
        step(a, opt_a, g)
        step(b, opt_b, g)
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_optimizer_arguments_are_checked():
    params = nn.Linear(2, 2).parameters()
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="amsgrad"):
        optim.AdamW(params, amsgrad=True)
    with pytest.raises(TypeError, match="item 1 of params is not a leaf tensor .*, got ndarray"):
        optim.Adam([params[0], np.zeros(3)])
    optim.Adam([clnet.tensor(np.zeros(3))])  # a frozen one is taken, as PyTorch's: steps pass over it
    opt = optim.SGD(params, lr=0.1)
    opt.param_groups[0]["lr"] = 0.2  # PyTorch's way of changing a learning rate
    assert opt.lr == 0.2
