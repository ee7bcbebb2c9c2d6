"""An op that saves its own output for backward (relu, sigmoid, tanh, softmax, a convolution with its ReLU, max
pooling) holds no reference cycle: a forward whose graph is dropped without backward (an evaluation or inference
pass with parameters that want gradients) gives its memory back at once, not when the garbage collector runs. Late
releases handed the next forward other buffers, so every launch missed its kernel's argument cache (forward-only
eager passes of resnet50 made a new kernel object for 203 of their 336 launches)."""
import gc
import weakref

import numpy as np
import pytest
import torch

import clnet
import clnet.nn.functional as F
from clnet import kernels, models, nn
from conftest import assert_close

OPS = {
    "relu": (F.relu, torch.relu),
    "sigmoid": (lambda t: t.sigmoid(), torch.sigmoid),
    "tanh": (lambda t: t.tanh(), torch.tanh),
    "softmax": (lambda t: F.softmax(t, dim=1), lambda t: torch.softmax(t, dim=1)),
    "log_softmax": (lambda t: F.log_softmax(t, dim=1), lambda t: torch.log_softmax(t, dim=1)),
}


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.parametrize("op", sorted(OPS))
def test_dropped_forward_frees_its_output(dev, rng, op, collector_off):
    fn, torch_fn = OPS[op]
    x = rng.standard_normal((3, 7)).astype(np.float32)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    lin = nn.Linear(7, 5, bias=False).to(dev)
    lin.weight.copy_from(clnet.tensor(w, dev))
    y = fn(lin(clnet.tensor(x, dev)))
    assert y.grad_fn is not None
    freed = weakref.ref(y.storage)
    del y
    assert freed() is None, f"{op}: the dropped output's memory is still held (a reference cycle through grad_fn)"

    # The saved output still serves backward: the weight's gradient against PyTorch in float64.
    g = rng.standard_normal((3, 5)).astype(np.float32)
    y = fn(lin(clnet.tensor(x, dev)))
    y.backward(clnet.tensor(g, dev))
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    torch_fn(torch.tensor(x, dtype=torch.float64) @ wt.T).backward(torch.tensor(g, dtype=torch.float64))
    assert_close(lin.weight.grad.numpy(), wt.grad.numpy(), f"{op}: d weight")


def test_forward_only_passes_reuse_their_launches(dev, rng, collector_off):
    """Forward passes whose graphs are dropped, one after another, get the same buffers each time, so after the
    first no launch makes a new argument set (conv + batch norm + ReLU + max pool + a linear head)."""
    model = models.build("resnet8").to(dev)
    x = clnet.tensor(rng.standard_normal((2, 1, 28, 28)).astype(np.float32), dev)
    for _ in range(2):
        y = model(x)
        del y
    dev.synchronize()
    made = {}
    clones = {id(k): len(k.clones) for k in kernels._kernels.values()}
    for _ in range(3):
        y = model(x)
        assert y.grad_fn is not None
        del y
    dev.synchronize()
    for k in kernels._kernels.values():
        if len(k.clones) != clones.get(id(k), 0):
            made[k.name] = len(k.clones) - clones.get(id(k), 0)
    assert not made, f"new argument sets in steady state: {made}"
