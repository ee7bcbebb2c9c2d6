"""clnet.Graph: a replayed training step gives bit for bit what eager steps give (dropout's fresh masks, batch
norm's counts, Adam's step count, a changed learning rate included), its buffers never go back to the pool while it
lives, a replay copies nothing to or from the host, and what a replay could not repeat is refused."""
import numpy as np
import pytest

import clnet
from clnet import kernels, nn, ops, optim
from clnet.tensor import pool

from conftest import assert_close


def small_net(dev, seed):
    clnet.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Dropout(0.3), nn.Linear(5 * 3 * 3, 7)).to(dev)


def batches(rng, n, batch):
    return [(rng.standard_normal((batch, 2, 7, 7)).astype(np.float32), rng.integers(0, 7, batch).astype(np.int32))
            for _ in range(n)]


def make_optimizer(name, model):
    if name == "sgd":
        return optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    return optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)


def state(model, losses):
    return {k: np.asarray(v) for k, v in model.state_dict().items()}, losses


def run_eager(dev, seed, name, data, lr_at=None):
    model = small_net(dev, seed)
    opt, loss_fn, losses = make_optimizer(name, model), nn.CrossEntropyLoss(), []
    for i, (xb, yb) in enumerate(data):
        if i == lr_at:
            opt.param_groups[0]["lr"] *= 0.5
        opt.zero_grad()
        loss = loss_fn(model(clnet.tensor(xb, dev)), clnet.tensor(yb, dev))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return state(model, losses)


def run_graphed(dev, seed, name, data, lr_at=None, event_free=True):
    """One eager step (as a warm-up), one captured, the rest replayed into the same input tensors (enqueued without
    events through ctypes, or through pyopencl)."""
    model = small_net(dev, seed)
    opt, loss_fn, losses = make_optimizer(name, model), nn.CrossEntropyLoss(), []
    x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)

    def step():
        opt.zero_grad()
        out = loss_fn(model(x), y)
        out.backward()
        opt.step()
        return out
    losses.append(float(step()))
    graph = clnet.Graph()
    graph.event_free = event_free
    x.write(data[1][0])
    y.write(data[1][1])
    with graph.capture():
        loss = step()
    losses.append(float(loss))
    for i, (xb, yb) in enumerate(data[2:], 2):
        if i == lr_at:
            opt.param_groups[0]["lr"] *= 0.5
        x.write(xb)
        y.write(yb)
        graph.replay()
        losses.append(float(loss))
    return state(model, losses), graph


def capture_step(model, opt, loss_fn, x, y):
    """(graph, loss): one training step captured."""
    g = clnet.Graph()
    with g.capture():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return g, loss


def fresh(dev, rng, steps):
    """(batches, eager result, model, optimizer, loss, x, y): a new model and its eager run to compare with."""
    seed = int(rng.integers(0, 2**31))
    data = batches(rng, steps, 4)
    expected = run_eager(dev, seed, "sgd", data)
    model = small_net(dev, seed)
    opt, loss_fn = make_optimizer("sgd", model), nn.CrossEntropyLoss()
    x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)
    return data, expected, model, opt, loss_fn, x, y


def assert_same(a, b):
    (sa, la), (sb, lb) = a, b
    assert la == lb, f"losses differ: eager {la}, replayed {lb}"
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


@pytest.mark.parametrize("name, event_free", [("sgd", True), ("adam", True), ("adam", False)])
def test_replay_is_bit_identical_to_eager_steps(dev, rng, name, event_free):
    assert clnet.graph._enqueue_raw is not None, "no OpenCL loader found for event-free replays"
    seed = int(rng.integers(0, 2**31))
    data = batches(rng, 6, 5)
    graphed, graph = run_graphed(dev, seed, name, data, lr_at=4, event_free=event_free)
    assert_same(run_eager(dev, seed, name, data, lr_at=4), graphed)
    assert graph.launches > 10


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_a_replay_steps_at_the_learning_rate_set_now(dev, rng, name):
    """The learning rate a replay uses is param_groups[0]["lr"] at that replay, whatever eager steps (an epoch's
    smaller last batch) ran at in between: a replay after lr went 0.1 -> 0.5 (an eager step) -> 0.1 moves the weights
    by 0.1 x the gradient, as an eager step at 0.1 would."""
    clnet.manual_seed(0)
    lin = nn.Linear(3, 2).to(dev)
    opt = optim.SGD(lin.parameters(), lr=0.1) if name == "sgd" else optim.Adam(lin.parameters(), lr=0.1)
    x = clnet.tensor(rng.standard_normal((4, 3)).astype(np.float32), dev)

    def step():
        opt.zero_grad()
        lin(x).sum().backward()
        opt.step()
    step()
    g = clnet.Graph()
    with g.capture():
        step()
    opt.param_groups[0]["lr"] = 0.5
    step()
    opt.param_groups[0]["lr"] = 0.1
    twin = nn.Linear(3, 2).to(dev)  # the same state, stepped eagerly at 0.1
    twin.load_state_dict(lin.state_dict())
    twin_opt = optim.SGD(twin.parameters(), lr=0.1) if name == "sgd" else optim.Adam(twin.parameters(), lr=0.1)
    twin_opt.load_state_dict(opt.state_dict())
    twin_opt.zero_grad()
    twin(x).sum().backward()
    twin_opt.step()
    g.replay()
    np.testing.assert_array_equal(lin.weight.numpy(), twin.weight.numpy())
    np.testing.assert_array_equal(lin.bias.numpy(), twin.bias.numpy())


def test_dropout_draws_a_fresh_mask_at_every_replay(dev, rng):
    x = clnet.tensor(np.abs(rng.standard_normal((4, 301))).astype(np.float32) + 1, dev)
    drop = nn.Dropout(0.5)
    out = {}
    graph = clnet.Graph()
    with graph.capture():
        out["y"] = drop(x)
    masks = [out["y"].numpy() != 0]
    for _ in range(3):
        graph.replay()
        masks.append(out["y"].numpy() != 0)
    for i in range(1, len(masks)):
        assert not np.array_equal(masks[i], masks[i - 1]), "a replay kept the previous step's dropout mask"
        assert 0.35 < masks[i].mean() < 0.65


def test_another_batch_size_gets_its_own_graph(dev, rng):
    seed = int(rng.integers(0, 2**31))
    data = batches(rng, 4, 6) + batches(rng, 3, 3)  # an epoch's last, smaller batches
    model = small_net(dev, seed)
    opt, loss_fn = make_optimizer("sgd", model), nn.CrossEntropyLoss()
    graphs, losses = {}, []
    for xb, yb in data:
        entry = graphs.get(len(xb))
        if entry is None:
            x, y = clnet.tensor(xb, dev), clnet.tensor(yb, dev)
            entry = graphs[len(xb)] = (*capture_step(model, opt, loss_fn, x, y), x, y)
        else:
            g, loss, x, y = entry
            x.write(xb)
            y.write(yb)
            g.replay()
        losses.append(float(entry[1]))
    assert_same(run_eager(dev, seed, "sgd", data), state(model, losses))


def test_parameters_loaded_between_replays_are_used(dev, rng):
    """load_state_dict writes into the tensors the graph reads, so the next replay trains the loaded weights."""
    seed = int(rng.integers(0, 2**31))
    (xb, yb), = batches(rng, 1, 4)
    model = small_net(dev, seed)
    opt, loss_fn = optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss()  # no state besides the weights
    x, y = clnet.tensor(xb, dev), clnet.tensor(yb, dev)
    g, loss = capture_step(model, opt, loss_fn, x, y)
    loaded = small_net(dev, seed + 1).state_dict()
    model.load_state_dict(loaded)
    clnet.manual_seed(seed + 2)  # the replay's dropout mask
    g.replay()
    replayed = state(model, [float(loss)])
    twin = small_net(dev, seed + 3)
    twin.load_state_dict(loaded)
    twin_opt = optim.SGD(twin.parameters(), lr=0.05)
    clnet.manual_seed(seed + 2)
    twin_opt.zero_grad()
    twin_loss = loss_fn(twin(x), y)
    twin_loss.backward()
    twin_opt.step()
    assert_same(state(twin, [float(twin_loss)]), replayed)


def test_graph_buffers_stay_out_of_the_pool_and_replay_copies_nothing(dev, rng):
    data, expected, model, opt, loss_fn, x, y = fresh(dev, rng, 5)
    g, loss = capture_step(model, opt, loss_fn, x, y)
    losses = [float(loss)]
    held = {id(entry[1]) for _, entry in g._taken}  # whole buffers: (creation number, buffer, size)
    assert held, "the capture freed temporaries; the graph should hold their buffers"
    free = {id(b) for bucket in pool(dev).free.values() for _, b in bucket}
    assert not held & free
    for xb, yb in data[1:]:
        # eager work between replays takes every free buffer and scribbles on it
        junk = [ops.full((n // 4,), dev, np.nan) for n in sorted({s for s in pool(dev).free}) for _ in range(4)]
        x.write(xb)
        y.write(yb)
        clnet.reset_transfer_stats()
        g.replay()
        assert clnet.transfer_stats()["host_to_device_count"] == 0
        assert clnet.transfer_stats()["device_to_host_count"] == 0
        losses.append(float(loss))
        del junk
    assert_same(expected, state(model, losses))
    taken = len(g._taken)
    free_before = sum(len(b) for b in pool(dev).free.values())
    del g
    assert sum(len(b) for b in pool(dev).free.values()) == free_before + taken


def test_what_a_replay_cannot_repeat_is_refused(dev):
    x = clnet.tensor(np.ones((3, 4), np.float32), dev)
    g = clnet.Graph()
    with pytest.raises(clnet.CaptureError, match="replay\\(\\) before capture"):
        g.replay()
    with pytest.raises(clnet.CaptureError, match="reading a tensor of shape \\(3, 4\\) back"):
        with g.capture():
            (x * 2.0).numpy()
    g2 = clnet.Graph()
    with pytest.raises(clnet.CaptureError, match="writing a host array"):
        with g2.capture():
            x.write(np.zeros((3, 4), np.float32))
    g3 = clnet.Graph()
    with pytest.raises(clnet.CaptureError, match="do not nest"):
        with g3.capture():
            with clnet.Graph().capture():
                pass
    assert kernels.capturing is None
    with pytest.raises(clnet.CaptureError, match="captured already"):
        with g3.capture():
            pass


def test_a_capture_that_would_record_the_optimizers_first_layout_is_refused(dev, rng):
    """An optimizer made before its model is on a device lays the parameters out at its first zero_grad() or step().
    PyTorch's order (forward, backward, step, zero_grad) on it records launches on the old layout first: a replay
    would train stale copies, so the capture says what to do."""
    clnet.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 7 * 7, 7))
    opt, loss_fn = make_optimizer("sgd", model), nn.CrossEntropyLoss()
    model.to(dev)
    (xb, yb), = batches(rng, 1, 3)
    x, y = clnet.tensor(xb, dev), clnet.tensor(yb, dev)
    g = clnet.Graph()
    with pytest.raises(clnet.CaptureError, match="run one step \\(or call zero_grad\\(\\)\\) before capturing"):
        with g.capture():
            loss_fn(model(x), y).backward()
            opt.step()
    with pytest.raises(clnet.CaptureError, match="capture raised"):
        g.replay()
    assert kernels.capturing is None


@pytest.mark.parametrize("name", ["sgd", "adam"])
@pytest.mark.parametrize("captured_at", [0, 1], ids=["first-step", "after-an-eager-step"])
def test_pytorchs_order_replays_as_eager_steps(dev, rng, name, captured_at):
    """PyTorch's order (backward, step, zero_grad) captured and replayed gives what eager steps give, bit for bit:
    the zero_grad at the end of the step marks the gradients for the next step, which every replay must do again
    (the second replay added to the first one's gradient). An optimizer made on a model already on its device has
    its layout from the start, so even the very first step can be the one captured."""
    data = batches(rng, 6, 3)

    def net():
        clnet.manual_seed(1)
        return nn.Sequential(nn.Conv2d(2, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(5 * 3 * 3, 7)).to(dev)

    runs = []
    for replayed in (False, True):
        model = net()
        opt, loss_fn = make_optimizer(name, model), nn.CrossEntropyLoss()
        x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)

        def step():
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        g = clnet.Graph() if replayed else None
        losses = []
        for i, (xb, yb) in enumerate(data):
            x.write(xb)
            y.write(yb)
            if g is None or i < captured_at:
                losses.append(float(step()))
            elif i == captured_at:
                with g.capture():
                    loss = step()
                losses.append(float(loss))
            else:
                g.replay()
                losses.append(float(loss))
        runs.append(state(model, losses))
    (eager, eager_losses), (replay, replay_losses) = runs
    assert eager_losses == replay_losses
    for k in eager:
        np.testing.assert_array_equal(replay[k], eager[k], err_msg=k)


def test_an_exception_inside_capture_leaves_nothing_to_replay(dev):
    x = clnet.tensor(np.ones((2, 3), np.float32), dev)
    g = clnet.Graph()
    with pytest.raises(KeyboardInterrupt):
        with g.capture():
            x * 2.0
            raise KeyboardInterrupt
    assert kernels.capturing is None and g.launches == 0
    with pytest.raises(clnet.CaptureError, match="capture raised"):
        g.replay()


def test_out_of_memory_retry_inside_a_capture_keeps_the_graphs_buffers(dev, rng, monkeypatch):
    """A launch that fails to allocate frees the pool's cached buffers, except those the capture already used."""
    import pyopencl as cl
    from test_memory import FailingEnqueue
    data, expected, model, opt, loss_fn, x, y = fresh(dev, rng, 4)
    opt.zero_grad()
    g = clnet.Graph()
    with g.capture():
        opt.zero_grad()
        out = model(x)
        monkeypatch.setattr(kernels, "event_free_launches", False)  # eager launches through pyopencl's enqueue ...
        monkeypatch.setattr(cl, "enqueue_nd_range_kernel", FailingEnqueue(failures=1))  # ... whose next one retries
        loss = loss_fn(out, y)
        monkeypatch.undo()
        loss.backward()
        opt.step()
    losses = [float(loss)]
    for xb, yb in data[1:]:
        x.write(xb)
        y.write(yb)
        g.replay()
        losses.append(float(loss))
    assert_same(expected, state(model, losses))


def test_eager_dropout_keeps_one_argument_set(dev):
    """A Live argument keys the kept argument sets by its place, not its identity: a fresh seed per call must not
    make a new kernel clone per call."""
    x = clnet.tensor(np.ones((5, 7), np.float32), dev)
    k = kernels.kernel(dev, "elementwise.cl", "dropout_fwd")
    before = set(k.clones)  # earlier tests' argument sets
    for _ in range(20):
        nn.functional.dropout(x, 0.5)
    assert len(set(k.clones) - before) <= 2


def test_a_cycle_of_argument_sets_as_long_as_densenets_is_kept(dev, monkeypatch):
    """Each kernel keeps its argument sets (kernels._with_args), least recently used out first: a cycle of more sets
    than it keeps misses at every launch, and each miss sets every argument again (about 55 us of host time on
    NVIDIA's driver). densenet121's step copies into its concatenations 1186 times, each a set of its own: a second
    step must set none of them again."""
    k = kernels.kernel(dev, "elementwise.cl", "copy2d")
    tensors = [clnet.tensor(np.full(3, i, np.float32), dev) for i in range(1200)]
    out = clnet.tensor(np.zeros(3, np.float32), dev)

    def cycle():
        for t in tensors:
            kernels.launch(dev, k, (3, 1), kernels.ANY_GROUP, t, 0, 3, out, 0, 3, 1, 3)
    cycle()
    before = kernels.arguments_set
    cycle()
    assert kernels.arguments_set == before
    assert float(out.numpy()[2]) == 1199.0


def test_the_replayer_captures_the_shape_that_repeats(dev, rng):
    """Resumed at an epoch's last, smaller batch, fit's replayer still captures the full batches that follow."""
    from clnet.graph import StepReplayer
    calls = []

    def step(x, y):
        calls.append((x.shape, kernels.capturing is not None))
        return ops.fill(ops.empty(x.shape, dev), 1.0)
    r = StepReplayer(step)
    for n in (3, 5, 5, 5, 5, 3):
        r(clnet.tensor(np.zeros((n, 2), np.float32), dev), clnet.tensor(np.zeros(n, np.int32), dev))
    assert calls == [((3, 2), False), ((5, 2), False), ((5, 2), True), ((3, 2), False)]


def test_a_replayed_step_still_checks_each_batch_of_labels(dev, rng):
    from clnet.graph import StepReplayer
    model = small_net(dev, 1)
    opt, loss_fn = make_optimizer("sgd", model), nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    replayer = StepReplayer(step)
    for xb, yb in batches(rng, 3, 4):  # eager, captured, replayed
        replayer(clnet.tensor(xb, dev), clnet.tensor(yb, dev))
    assert replayer.graph is not None
    xb, yb = batches(rng, 1, 4)[0]
    yb[2] = 7  # 7 classes: labels 0..6
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 6\] for 7 classes, got values in \[\d, 7\]"):
        replayer(clnet.tensor(xb, dev), clnet.tensor(yb, dev))


def test_a_launch_the_driver_refuses_in_a_replay_is_a_clear_error(dev, rng):
    x = clnet.tensor(rng.standard_normal(37), dev)
    g = clnet.Graph()
    with g.capture():
        y = ops.full_like(x, 2.0) * x
    g.replay()
    assert np.array_equal(y.numpy(), 2 * x.numpy())
    import ctypes
    clone, gsize, lsize, live, kernel, dims, sizes, local = g._items[0]
    n = dims.value  # a ctypes.c_uint32
    too_big = (ctypes.c_size_t * n)(*([1 << 24] * n))  # more work-items per group than any device allows
    g._items[0] = (clone, gsize, lsize, live, kernel, dims, sizes, too_big)
    with pytest.raises(kernels.KernelError, match=r"a replayed launch of \w+ could not run on .*\(global size .*\): "
                                                  r"OpenCL status INVALID_WORK_GROUP_SIZE"):
        g.replay()


@pytest.mark.parametrize("zero_inside", [True, False], ids=["zero_grad-captured", "zero_grad-eager"])
def test_an_eager_zero_grad_between_replays_is_honoured(dev, rng, zero_inside):
    """zero_grad only marks gradients, and a replay fills what an eager zero_grad marked since its capture (its
    recorded kernels may add to them). So eager zero_grad, then a replay of forward and backward, gives that batch's
    gradients alone: neither zeros nor a sum with the last replay's, whether or not the capture held a zero_grad."""
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(3 * 5 * 5, 4)).to(dev)
    opt = optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = clnet.tensor(np.zeros((2, 2, 7, 7), np.float32), dev)
    y = clnet.tensor(np.zeros(2, np.int32), dev)
    opt.zero_grad()  # lays out the flat buffers (and marks the gradients)

    def step():
        if zero_inside:
            opt.zero_grad()
        loss_fn(model(x), y).backward()

    g = clnet.Graph()
    if not zero_inside:
        loss_fn(model(x), y).backward()  # gradients written, marks gone: the capture below records kernels that add
    with g.capture():
        step()
    for images, labels in batches(rng, 3, 2):
        images = images[:, :, :7, :7]
        labels = labels % 4
        opt.zero_grad()
        x.write(images)
        y.write(labels)
        g.replay()
        got = [p.grad.numpy() for p in model.parameters()]
        opt.zero_grad()
        loss_fn(model(clnet.tensor(images, dev)), labels).backward()  # eager, the same weights (no step)
        for i, p in enumerate(model.parameters()):
            assert_close(got[i], p.grad.numpy(), f"replayed gradient {i}", tol=1e-6)
            assert np.abs(got[i]).max() > 0
