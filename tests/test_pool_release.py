"""The memory an optimizer's flat layout replaces goes back to the device: a parameter's own buffer, once its values
are copied into the flat buffers, is in sizes nothing else asks for, and the pool used to cache it (and an earlier
layout's buffers, when a group is added) for the process's lifetime: resnet50's pool held 678 MiB for a step whose
peak use is 489 MiB. An optimizer made on a model already on its device lays out at once, so the first step no
longer holds the old parameters through its backward (they were saved by the forward)."""
import numpy as np
import pytest

import clnet
from clnet import nn, optim
from clnet.tensor import pool

from conftest import assert_close


def _cached(dev):
    return {id(b) for bucket in pool(dev).free.values() for _, b in bucket}


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: optim.Adam(ps, lr=0.01)],
                         ids=["sgd", "adam"])
def test_replaced_parameter_buffers_leave_the_pool(dev, rng, make):
    model = nn.Sequential(nn.Linear(37, 23), nn.ReLU(), nn.Linear(23, 5)).to(dev)
    own = [p.storage.buffer for p in model.parameters()]
    own_bytes = sum(b.size for b in own)  # (read now: a buffer given back to the device is not to be touched)
    held = pool(dev).allocated_bytes
    opt = make(list(model.parameters()))
    assert all(p.storage.buffer is not b for p, b in zip(model.parameters(), own)), "laid out at construction"
    assert not {id(b) for b in own} & _cached(dev), "a replaced parameter buffer is still cached by the pool"
    flat = sum(t.storage.buffer.size for t in (opt._flat[0], opt._flat[1], *opt._flat[2].values()))
    assert pool(dev).allocated_bytes <= held - own_bytes + flat, "the old buffers were not given back"

    # The layout changes nothing of what the step computes (the weights were copied, not lost): the gradients and
    # one step against NumPy in float64.
    x = rng.standard_normal((9, 37)).astype(np.float32)
    before = [p.numpy().astype(np.float64) for p in model.parameters()]
    loss = model(clnet.tensor(x, dev)).sum()
    opt.zero_grad()
    loss.backward()
    grads = [p.grad.numpy().astype(np.float64) for p in model.parameters()]
    opt.step()
    w1, b1, w2, b2 = before
    h = x @ w1.T + b1
    gh = np.ones((9, 5)) @ w2 * (h > 0)
    assert_close(grads[2], np.ones((9, 5)).T @ np.maximum(h, 0), "d w2")
    assert_close(grads[0], gh.T @ x, "d w1")
    if isinstance(opt, optim.SGD):  # first step: momentum buffer = gradient
        for p, b, g in zip(model.parameters(), before, grads):
            assert_close(p.numpy(), b - 0.1 * g, "updated parameter")


def test_a_new_group_gives_the_old_layout_back(dev):
    a = nn.Linear(11, 7).to(dev)
    b = nn.Linear(7, 3).to(dev)
    opt = optim.SGD(a.parameters(), lr=0.1)
    old = [t.storage.buffer for t in opt._flat[:2]]
    opt.add_param_group({"params": list(b.parameters()), "lr": 0.01})
    opt.zero_grad()
    assert opt._flat[0].storage.buffer is not old[0]
    assert not {id(x) for x in old} & _cached(dev), "the earlier layout's flat buffers are still cached"

