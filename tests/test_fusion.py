"""Graph fusion: runs of consecutive element-wise launches of a capture replay as one launch of cl_kernels/chain.cl.
A fused replay gives bit for bit what the unfused replay and the eager step give (forward, backward, int and bool
steps, broadcast operands, training steps with SGD and Adam), and what the rules refuse (a chain-written buffer read
other than at the flat index, an output overlapping what an earlier step read elsewhere) does not fuse."""
import numpy as np
import pytest

import clnet
from clnet import graph as graph_module
from clnet import nn, ops, optim, pointwise, tuning
from clnet.chain import BINARY_FWD, UNARY_FWD, ChainStep

from conftest import assert_close, assert_close_to_terms

SIZES = [1, 31, 3 * 65]


def chain(a, b, c):
    """Float, bool and int steps of one element count, a broadcast operand b and a number among them."""
    y = clnet.exp(a)
    z = clnet.maximum(y, b)                    # b broadcast along the last dimension
    w = clnet.tanh(z) - c                      # c the same shape: flat
    m = w > 0.25                               # bool
    k = pointwise.cast(pointwise.binary("mul", w, c) * 10.0, np.int32)  # float -> int (truncated)
    q = pointwise.binary("remainder", k, 3)    # int working type
    s = clnet.where(m, w, clnet.sigmoid(c))    # where over a chain-written condition
    return s, m, q, pointwise.logical_not(m)


def reference(a, b, c):
    a, b, c = (v.astype(np.float64) for v in (a, b, c))
    w = np.tanh(np.maximum(np.exp(a), b)) - c
    return np.where(w > 0.25, w, 1 / (1 + np.exp(-c))), w


def flat_chain(a, b, w):
    """elementwise.cl's launches, the fast paths of same-shape and number arithmetic: affine (a product by a number,
    a number added), axpby (a same-shape sum and difference, and with other coefficients through the gradients of
    ops.binary), mul, the activations and their gradients from the saved output."""
    y = ops.binary(a, b, 0.7, -1.3, "+")           # axpby with coefficients that are not 1
    y = clnet.sigmoid(ops.Activation.apply(y * 1.7 + 0.2, kind="tanh")) * w  # affine, act, (pointwise), mul
    z = ops.Activation.apply(y - a, kind="relu6") + b  # axpby -1, act, axpby
    return z, ops.Activation.apply(z, kind="relu") * -0.0


@pytest.mark.parametrize("n", [1, 7, 1027])  # axpby and the activations take float4s: a tail, none, and both
def test_elementwise_steps_fuse_bit_for_bit(dev, rng, n):
    a, b, w = (clnet.tensor(rng.standard_normal(n).astype(np.float32), dev, requires_grad=True) for _ in range(3))
    g = clnet.tensor(rng.standard_normal(n).astype(np.float32), dev)
    grads = optim.SGD([a, b, w], lr=0.1)  # (only its zero_grad: the gradients stay where the graphs saw them)

    def step():
        grads.zero_grad()
        z, r = flat_chain(a, b, w)
        (z * g).sum().backward()
        return [z, r, a.grad, b.grad, w.grad]

    graphs = {}
    for fuse in (False, True):
        graphs[fuse] = clnet.Graph(fuse=fuse)
        with graphs[fuse].capture():
            outs = step()
        graphs[fuse] = (graphs[fuse], outs)
    assert graphs[True][0].fused >= 6, "the forward's and the backward's flat launches fuse"
    for _ in range(2):
        for t in (a, b, w):
            t.write(rng.standard_normal(n).astype(np.float32) * 3)
        got = {}
        for fuse, (graph, outs) in graphs.items():
            graph.replay()
            got[fuse] = [o.numpy().copy() for o in outs]
        with clnet.no_grad():
            z, r = flat_chain(a, b, w)
        for u, f in zip(got[False], got[True]):
            np.testing.assert_array_equal(f.view(np.int32), u.view(np.int32))  # bit for bit, signed zeros too
        np.testing.assert_array_equal(got[True][0].view(np.int32), z.numpy().view(np.int32))
        np.testing.assert_array_equal(got[True][1].view(np.int32), r.numpy().view(np.int32))
    x = [t.numpy().astype(np.float64) for t in (a, b, w)]
    y = 1 / (1 + np.exp(-np.tanh((0.7 * x[0] - 1.3 * x[1]) * 1.7 + 0.2))) * x[2]
    # judged against the terms' size: y - a, then + b, can cancel far below them (one element, seed 2473637911)
    assert_close_to_terms(got[True][0], np.clip(y - x[0], 0, 6) + x[1], np.abs(y) + np.abs(x[0]) + np.abs(x[1]),
                          "z against NumPy", tol=2e-5)


@pytest.mark.parametrize("n", SIZES)
def test_a_fused_chain_replays_what_the_unfused_one_and_eager_give(dev, rng, n):
    shape = (n, 3) if n > 1 else (1,)
    a = clnet.tensor(rng.standard_normal(shape).astype(np.float32), dev)
    b = clnet.tensor(rng.standard_normal(shape[-1:]).astype(np.float32), dev)
    c = clnet.tensor(rng.standard_normal(shape).astype(np.float32), dev)
    graphs = {}
    for fuse in (False, True):
        g = clnet.Graph(fuse=fuse)
        with g.capture():
            outs = chain(a, b, c)
        graphs[fuse] = (g, outs)
    assert graphs[True][0].fused > 0 and graphs[False][0].fused == 0
    assert graphs[True][0].launches + graphs[True][0].fused == graphs[False][0].launches
    for _ in range(2):
        data = [rng.standard_normal(t.shape).astype(np.float32) * 2 for t in (a, b, c)]
        for t, v in zip((a, b, c), data):
            t.write(v)
        got = {}
        for fuse, (g, outs) in graphs.items():
            g.replay()
            got[fuse] = [o.numpy() for o in outs]
        eager = [o.numpy() for o in chain(a, b, c)]
        for e, u, f in zip(eager, got[False], got[True]):
            assert e.dtype == f.dtype
            np.testing.assert_array_equal(f.view(np.uint8), u.view(np.uint8))
            np.testing.assert_array_equal(f.view(np.uint8), e.view(np.uint8))
        s64, w64 = reference(*data)
        clear = np.abs(w64 - 0.25) > 1e-5  # away from the comparison's edge, where float32 may round either way
        np.testing.assert_array_equal(got[True][1][clear], (w64 > 0.25)[clear])
        np.testing.assert_array_equal(got[True][3][clear], (w64 <= 0.25)[clear])
        assert_close(np.where(clear, got[True][0], 0), np.where(clear, s64, 0), "where(w > 0.25, w, sigmoid(c))",
                     tol=1e-5)


def test_backward_chains_fuse_and_give_the_eager_gradients(dev, rng):
    x = clnet.tensor(rng.standard_normal((7, 33)).astype(np.float32), dev, requires_grad=True)
    opt = optim.SGD([x], lr=1.0)  # only its zero_grad: the step never calls step()

    def step():
        opt.zero_grad()
        y = clnet.sin(clnet.tanh(clnet.exp(x * 0.25)))
        y.sum().backward()
        return y
    step()
    graphs = {}
    for fuse in (False, True):
        g = clnet.Graph(fuse=fuse)
        with g.capture():
            y = step()
        graphs[fuse] = g, y
    g = graphs[True][0]
    assert g.fused >= 3, g.chains  # exp, tanh, sin forward; sin', tanh', exp' backward
    for _ in range(3):
        v = rng.standard_normal((7, 33)).astype(np.float32)
        x.write(v)
        graphs[False][0].replay()
        unfused = x.grad.numpy().copy(), graphs[False][1].numpy()
        g.replay()
        fused = x.grad.numpy().copy(), graphs[True][1].numpy()
        eager_y = step()
        eager = x.grad.numpy(), eager_y.numpy()
        for f, u, e in zip(fused, unfused, eager):
            np.testing.assert_array_equal(f, u)
            np.testing.assert_array_equal(f, e)
        v64 = v.astype(np.float64)
        t = np.exp(v64 * 0.25)
        grad = np.cos(np.tanh(t)) * (1 - np.tanh(t) ** 2) * t * 0.25
        assert_close(fused[0], grad, "d sin(tanh(exp(x/4))) / dx", tol=1e-5)


def test_in_place_ops_and_regions_of_one_buffer_stay_right(dev, rng):
    """An in-place op is a launch and a device copy into its tensor: the copy ends the chain, and the launches after
    it read what it wrote. Two regions (sub-buffers) of one tensor are read in one chain."""
    n = 1024  # q starts 4096 bytes in: a sub-buffer on every device (region_alignment), not a staged window
    big = clnet.tensor(rng.standard_normal(2 * n).astype(np.float32), dev)
    p, q = big.region(0, (n,)), big.region(n, (n,))
    assert type(q.storage).__name__ == "_Region"

    def step():
        y = clnet.exp(p)
        y.clamp_(max=1.5)
        z = clnet.tanh(y) * q
        z.mul_(q)
        return clnet.where(z > 0.0, z, y), y

    graphs = {}
    for fuse in (False, True):
        g = clnet.Graph(fuse=fuse)
        with g.capture():
            graphs[fuse] = g, step()
    assert graphs[True][0].fused >= 2, graphs[True][0].chains  # exp, clamp | gt, where (a same-shape * is ops.Mul)
    for _ in range(2):
        v = rng.standard_normal(2 * n).astype(np.float32)
        big.write(v)
        got = {}
        for fuse, (g, outs) in graphs.items():
            g.replay()
            got[fuse] = [o.numpy() for o in outs]
        eager = [o.numpy() for o in step()]
        for f, u, e in zip(got[True], got[False], eager):
            np.testing.assert_array_equal(f, u)
            np.testing.assert_array_equal(f, e)
        v64 = v.astype(np.float64)
        y64 = np.minimum(np.exp(v64[:n]), 1.5)
        z64 = np.tanh(y64) * v64[n:] * v64[n:]
        assert_close(got[True][0], np.where(z64 > 0, z64, y64), "where(z > 0, z, y) after in-place ops", tol=1e-5)


class Block(nn.Module):
    """A ConvNeXt-style block over channels-last input: layer norm, linear, GELU, linear, layer scale, residual."""

    def __init__(self, c):
        super().__init__()
        self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(clnet.tensor(np.full(c, 0.5, np.float32)))

    def forward(self, x):
        return x + self.gamma * self.fc2(self.act(self.fc1(self.norm(x))))


def train(dev, seed, name, data, fuse):
    """Eager steps (fuse None) or one eager, one captured and the rest replayed; the losses and final weights."""
    clnet.manual_seed(seed)
    model = Block(data[0][0].shape[-1]).to(dev)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if name == "sgd" else \
        optim.Adam(model.parameters(), lr=0.01)
    x = clnet.tensor(data[0][0], dev)
    t = clnet.tensor(data[0][1], dev)

    def step():
        opt.zero_grad()
        d = model(x) - t
        loss = (d * d).mean()
        loss.backward()
        opt.step()
        return loss
    losses, graph = [], None
    for i, (xb, tb) in enumerate(data):
        x.write(xb)
        t.write(tb)
        if fuse is None or i == 0:
            losses.append(float(step()))
        elif graph is None:
            graph = clnet.Graph(fuse=fuse)
            with graph.capture():
                loss = step()
            losses.append(float(loss))
        else:
            graph.replay()
            losses.append(float(loss))
    return losses, [p.numpy() for p in model.parameters()], graph


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_replayed_training_step_with_fusion_is_the_eager_one(dev, rng, name):
    data = [(rng.standard_normal((2, 5, 3, 13)).astype(np.float32),
             rng.standard_normal((2, 5, 3, 13)).astype(np.float32)) for _ in range(5)]
    seed = int(rng.integers(0, 2**31))
    eager_losses, eager_weights, _ = train(dev, seed, name, data, None)
    unfused_losses, unfused_weights, unfused = train(dev, seed, name, data, False)
    losses, weights, fused = train(dev, seed, name, data, True)
    assert losses == eager_losses == unfused_losses
    for w, e, u in zip(weights, eager_weights, unfused_weights):
        np.testing.assert_array_equal(w, e)
        np.testing.assert_array_equal(w, u)
    assert fused.fused > 0 and fused.launches < unfused.launches
    assert fused.launches + fused.fused == unfused.launches


def test_lenet_at_batch_1_has_no_pointwise_chain(dev):
    """LeNet's step is convolutions, pooling, products with their activations fused, cross-entropy and one SGD
    launch: nothing for this fusion to merge (what bench/fusion.py reports too)."""
    from clnet import models
    clnet.manual_seed(0)
    model = models.build("lenet").to(dev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = clnet.tensor(np.zeros((1, 1, 28, 28), np.float32), dev)
    y = clnet.tensor(np.zeros(1, np.int32), dev)

    def step():
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        opt.step()
    step()
    g = clnet.Graph(fuse=True)
    with g.capture():
        step()
    assert g.fused == 0 and g.launches > 10


def test_the_environment_switch_turns_fusion_off(monkeypatch):
    monkeypatch.setattr(graph_module, "FUSE", False)
    assert clnet.Graph().fuse is False and clnet.Graph(fuse=True).fuse is True


def test_the_device_decides_which_runs_fuse(dev, monkeypatch):
    """Graph() leaves the choice to the device (tuning.fused_chain_elements): a GPU fuses runs of up to 2^19
    elements (the interpreted chain is slower than the separate launches past that), a CPU none (slower at every
    size); Graph(fuse=True) fuses every run."""
    def capture(n, fuse):
        x = clnet.tensor(np.arange(n, dtype=np.float32), dev)
        g = clnet.Graph(fuse=fuse)
        with clnet.no_grad(), g.capture():
            y = (x * 2.0 + x).relu() - x  # affine, axpby, an activation, axpby: one run
        np.testing.assert_array_equal(y.numpy(), np.maximum(np.arange(n) * 3.0, 0) - np.arange(n))
        return g

    assert capture(6, None).fused == (3 if dev.is_gpu else 0) and capture(6, True).fused == 3
    monkeypatch.setitem(tuning.FUSED_CHAIN_ELEMENTS, "gpu", 8)
    monkeypatch.setitem(tuning.FUSED_CHAIN_ELEMENTS, "cpu", 8)
    small, large = capture(8, None), capture(9, None)
    assert small.fuse and small.fused == 3, "a run of the limit's size fuses"
    assert large.fused == 0 and capture(9, True).fused == 3, "a larger one only when asked"


# ---- the rules, on the chain's bookkeeping itself -----------------------------------------------------------------

class FakeBuffer:
    def __init__(self, handle):
        self.int_ptr = handle


F32 = np.dtype(np.float32)


def region(handle, memory, start, n, dtype=F32):
    """An operand as graph._operands gives it: the (buffer, byte offset) slot a launch passes, then its memory."""
    return ((FakeBuffer(handle), 0), memory, start, n * dtype.itemsize, dtype)


def unary(read_layout=None):
    return ChainStep(UNARY_FWD, 2, 1, ((0, read_layout),))


def test_a_chain_written_buffer_read_through_a_layout_ends_the_chain():
    c = graph_module._Chain(12)
    assert c.admit("first", unary(), {0: region(1, 1, 0, 12), 1: region(2, 2, 0, 12)}, 12)
    layout = ((3, 4), (1, 3))  # a transposed read of what the first step wrote
    assert not c.admit("second", unary(layout), {0: region(2, 2, 0, 12), 1: region(3, 3, 0, 12)}, 12)
    assert c.admit("flat", unary(), {0: region(2, 2, 0, 12), 1: region(3, 3, 0, 12)}, 12)
    assert c.steps[-1][3] == [-1]  # read from the first step's value, not from memory


def test_overlapping_regions_and_shared_buffers_end_the_chain():
    # the first step writes elements 0..11 of memory 7 through sub-buffer 20
    first = {0: region(1, 1, 0, 12), 1: region(20, 7, 0, 12)}
    c = graph_module._Chain(12)
    assert c.admit("first", unary(), first, 12)
    # another sub-buffer of memory 7 starting at element 4: overlaps what was written, not the same region
    assert not c.admit("shifted read", unary(), {0: region(21, 7, 16, 12), 1: region(3, 3, 0, 12)}, 12)
    # the parent (memory 7 itself, handle 7) read whole: larger than what was written
    assert not c.admit("parent read", unary(), {0: region(7, 7, 0, 24), 1: region(3, 3, 0, 12)}, 12)
    # the same region under another cl buffer handle (a second storage of one buffer): read at i, so allowed
    assert c.admit("alias read", unary(), {0: region(22, 7, 0, 12), 1: region(3, 3, 0, 12)}, 12)
    assert c.steps[-1][3] == [-1]
    # a read of the same region as another type: refused
    i32 = np.dtype(np.int32)
    assert not c.admit("retyped", unary(), {0: region(22, 7, 0, 12, i32), 1: region(4, 4, 0, 12)}, 12)


def test_an_output_over_what_an_earlier_step_read_elsewhere_ends_the_chain():
    b = ChainStep(BINARY_FWD, 1, 2, ((0, None), (1, ((3, 4), (0, 1)))), F32)  # b broadcast along rows
    c = graph_module._Chain(12)
    assert c.admit("add", b, {0: region(1, 1, 0, 12), 1: region(5, 5, 0, 4), 2: region(2, 2, 0, 12)}, 12)
    # writing memory 5, which the first step read broadcast (every work-item read all of it): refused
    assert not c.admit("overwrite", unary(), {0: region(2, 2, 0, 12), 1: region(5, 5, 0, 12)}, 12)
    # in place over memory 1, which the first step read at i only: allowed
    assert c.admit("in place", unary(), {0: region(2, 2, 0, 12), 1: region(1, 1, 0, 12)}, 12)
    # another element count: a new chain
    assert not c.admit("other n", unary(), {0: region(2, 2, 0, 13), 1: region(9, 9, 0, 13)}, 13)


def test_a_chain_keeps_to_what_one_launch_holds():
    c = graph_module._Chain(5)
    for j in range(ChainStep.most_steps):
        assert c.admit(j, unary(), {0: region(100 + j, 100 + j, 0, 5), 1: region(200 + j, 200 + j, 0, 5)}, 5) == \
            (2 * (j + 1) <= ChainStep.most_buffers)
        if 2 * (j + 1) > ChainStep.most_buffers:
            break
    assert len(c.buffers) <= ChainStep.most_buffers


def test_a_buffer_reused_for_another_type_of_one_size_takes_the_last_writers_value():
    """The pool hands a step's freed float buffer to a later int output of the same bytes: at i, that is safe."""
    i32 = np.dtype(np.int32)
    c = graph_module._Chain(6)
    assert c.admit("float", unary(), {0: region(1, 1, 0, 6), 1: region(2, 2, 0, 6)}, 6)
    cast = ChainStep(pointwise.CAST, 0, 1, ((0, None),))
    assert c.admit("int over it", cast, {0: region(3, 3, 0, 6), 1: region(2, 2, 0, 6, i32)}, 6)
    assert c.admit("read as int", cast, {0: region(2, 2, 0, 6, i32), 1: region(4, 4, 0, 6)}, 6)
    assert c.steps[-1][3] == [-2]  # the int writer's value
    assert not c.admit("read as float", unary(), {0: region(2, 2, 0, 6), 1: region(5, 5, 0, 6)}, 6)


def test_a_chain_kernel_that_does_not_build_leaves_the_step_unfused(dev, rng, monkeypatch):
    def refuse(*args):
        raise clnet.kernels.KernelError("building chain.cl failed (injected)")
    monkeypatch.setattr(ChainStep, "chain_launch", staticmethod(refuse))
    x = clnet.tensor(rng.standard_normal(37).astype(np.float32), dev)
    g = clnet.Graph(fuse=True)
    with pytest.warns(RuntimeWarning, match="chain.cl did not build"):
        with g.capture():
            y = clnet.tanh(clnet.exp(x))
    assert g.fused == 0 and g.launches == 2 and "injected" in g.fusion_refused
    v = rng.standard_normal(37).astype(np.float32)
    x.write(v)
    g.replay()
    np.testing.assert_array_equal(y.numpy(), clnet.tanh(clnet.exp(x)).numpy())
