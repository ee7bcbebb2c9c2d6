"""Whole-model behaviour: a LeNet training step against the reference, transfers, memory, weights, optimizer."""
import numpy as np
import pytest

import clnet
from clnet import models, nn, optim
from clnet.tensor import pool

import reference as ref
from conftest import assert_close, give_gradients, needs_torch, recorded_launches


def lenet_reference(params, x, labels):
    """Float64 forward and backward of models.build("lenet") from the reference ops: (loss, logits, grads by key)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    one, zero = (1, 1), (0, 0)
    c1 = ref.conv2d(x, p["0.weight"], p["0.bias"], one, zero, zero, one, 1)
    p1 = ref.maxpool2d(c1, (2, 2), (2, 2), zero, False)
    c2 = ref.conv2d(p1, p["2.weight"], p["2.bias"], one, zero, zero, one, 1)
    p2 = ref.maxpool2d(c2, (2, 2), (2, 2), zero, False)
    f = p2.reshape(len(x), -1)
    h = ref.linear(f, p["5.weight"], p["5.bias"])
    r = ref.activation("relu", h)
    z = ref.linear(r, p["7.weight"], p["7.bias"])
    loss, dz = ref.cross_entropy(z, labels)
    g = {}
    _, dr, g["7.weight"], g["7.bias"] = ref.linear(r, p["7.weight"], p["7.bias"], dz)
    _, dh = ref.activation("relu", h, dr)
    _, df, g["5.weight"], g["5.bias"] = ref.linear(f, p["5.weight"], p["5.bias"], dh)
    _, dc2 = ref.maxpool2d(c2, (2, 2), (2, 2), zero, False, df.reshape(p2.shape))
    _, dp1, g["2.weight"], g["2.bias"] = ref.conv2d(p1, p["2.weight"], p["2.bias"], one, zero, zero, one, 1, dc2)
    _, dc1 = ref.maxpool2d(c1, (2, 2), (2, 2), zero, False, dp1)
    _, dx, g["0.weight"], g["0.bias"] = ref.conv2d(x, p["0.weight"], p["0.bias"], one, zero, zero, one, 1, dc1)
    return loss, z, g, dx, _kink_margin(c1, c2, h)


def _kink_margin(c1, c2, h):
    """The smallest gap, relative to the values' scale, between a 2x2 pooling window's two largest inputs or between
    a ReLU input and 0: near float32's rounding of these sums (1e-6 of the scale), clnet may route a gradient where
    float64 does not."""
    gaps = []
    for c in (c1, c2):
        N, C, H, W = c.shape
        win = np.sort(c[:, :, :H // 2 * 2, :W // 2 * 2].reshape(N, C, H // 2, 2, W // 2, 2)
                      .transpose(0, 1, 2, 4, 3, 5).reshape(N, C, H // 2, W // 2, 4), axis=-1)
        gaps.append((win[..., -1] - win[..., -2]).min() / np.abs(c).max())
    gaps.append(np.abs(h).min() / np.abs(h).max())
    return min(gaps)


def training_step(model, loss_fn, opt, x, labels):
    opt.zero_grad()
    out = model(x)
    loss = loss_fn(out, labels)
    loss.backward()
    opt.step()
    return out, loss


@pytest.mark.parametrize("batch", [1, 5])
def test_lenet_training_step_matches_reference(dev, rng, batch):
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = models.build("lenet").to(dev)
    before = model.state_dict()
    for _ in range(10):  # data away from max-pooling ties and ReLU's kink, where rounding reroutes a gradient
        x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
        labels = rng.integers(0, 10, batch)
        rloss, rz, rgrads, _, margin = lenet_reference(before, x, labels)
        if margin > 1e-6:
            break
    loss_fn = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    out, loss = training_step(model, loss_fn, opt, clnet.tensor(x, dev), labels)
    assert_close(out.numpy(), rz, "logits", tol=1e-4)
    assert abs(float(loss) - rloss) < 1e-4 * max(1.0, abs(rloss))
    for name, p in model.named_parameters():
        assert_close(p.grad.numpy(), rgrads[name], f"grad {name}", tol=1e-4)
        expected, _ = ref.sgd(before[name].astype(np.float64), rgrads[name], None, 0.1, 0.9, 1e-3, False)
        assert_close(p.data.numpy(), expected, f"updated {name}", tol=1e-4)


def test_training_step_transfers_exactly_input_labels_and_loss(dev, rng):
    model = models.build("lenet").to(dev)
    loss_fn, opt = nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 8)
    training_step(model, loss_fn, opt, clnet.tensor(x, dev), labels)  # first step creates momentum buffers
    clnet.reset_transfer_stats()
    _, loss = training_step(model, loss_fn, opt, clnet.tensor(x, dev), labels)
    float(loss)
    assert clnet.transfer_stats() == dict(host_to_device_bytes=x.nbytes + 8 * 4, host_to_device_count=2,
                                          device_to_host_bytes=4, device_to_host_count=1)


def test_memory_stays_flat_over_50_steps(dev, rng):
    model = models.build("lenet").to(dev)
    loss_fn, opt = nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = clnet.tensor(rng.standard_normal((4, 1, 28, 28)), dev)
    labels = clnet.tensor(rng.integers(0, 10, 4), dev)
    for _ in range(2):
        training_step(model, loss_fn, opt, x, labels)
    dev.synchronize()
    after_warmup = pool(dev).allocated_bytes
    for _ in range(50):
        training_step(model, loss_fn, opt, x, labels)
    dev.synchronize()
    assert pool(dev).allocated_bytes == after_warmup
    assert np.isfinite(float(loss_fn(model(x), labels)))


def test_training_reduces_loss(dev, rng):
    """A few steps on a fixed batch drive the loss down: the pieces work together."""
    clnet.manual_seed(1)
    model = models.build("lenet").to(dev)
    # lr 0.05 diverged on 3 of 200 random batches; at 0.02 over 25 steps the worst of 200 ended at 0.15 of the start
    loss_fn, opt = nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    x = clnet.tensor(rng.standard_normal((16, 1, 28, 28)), dev)
    labels = rng.integers(0, 10, 16)
    first = float(training_step(model, loss_fn, opt, x, labels)[1])
    for _ in range(24):
        last = float(training_step(model, loss_fn, opt, x, labels)[1])
    assert last < 0.5 * first


@pytest.mark.parametrize("momentum,weight_decay,nesterov", [(0.0, 0.0, False), (0.9, 0.01, False), (0.8, 0.0, True)])
def test_sgd_matches_reference(dev, rng, momentum, weight_decay, nesterov):
    layer = nn.Linear(13, 3).to(dev)
    opt = optim.SGD(layer.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    p = layer.weight.numpy().astype(np.float64)
    buf = None
    give_gradients(layer.parameters())  # each .grad then exists in the flat buffer, and reads zeros after:
    opt.zero_grad(set_to_none=False)
    for _ in range(3):
        g = rng.standard_normal(p.shape)
        layer.weight.grad.write(g)
        layer.bias.grad.write(np.zeros(3))
        opt.step()
        p, buf = ref.sgd(p, g.astype(np.float32).astype(np.float64), buf, 0.1, momentum, weight_decay, nesterov)
    assert_close(layer.weight.data.numpy(), p, "parameters after 3 steps", tol=1e-6)


def test_sgd_updates_every_parameter_in_one_launch(dev, rng):
    """Parameters of odd sizes (not multiples of the sub-buffer alignment) share one flat buffer per role: step and
    zero_grad are one launch and none (it marks the gradients zero; a read fills them; a step that no backward came
    before fills them too), and every parameter still
    follows the reference, with momentum carried over."""
    from clnet import kernels
    model = nn.Sequential(nn.Linear(7, 5), nn.Linear(5, 3), nn.Linear(3, 1)).to(dev)
    params = model.parameters()
    opt = optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)
    p = [q.numpy().astype(np.float64) for q in params]
    start = [a.copy() for a in p]
    bufs = [None] * len(p)
    give_gradients(params)  # each .grad exists in the flat buffer
    for _ in range(3):
        before = kernels.launch_count
        opt.zero_grad(set_to_none=False)
        assert kernels.launch_count - before == 0
        assert all(not q.grad.numpy().any() for q in params)
        grads = [rng.standard_normal(q.shape).astype(np.float32) for q in params]
        for q, g in zip(params, grads):
            q.grad.write(g)
        before = kernels.launch_count
        opt.step()
        assert kernels.launch_count - before == 1
        for i, g in enumerate(grads):
            p[i], bufs[i] = ref.sgd(p[i], g.astype(np.float64), bufs[i], 0.05, 0.9, 0.01, True)
    for i, q in enumerate(params):
        # within 1e-6 of the parameter's scale before and after the steps: a one-element bias that the steps carried
        # near 0 (0.004 in one CI run, from about 0.3) keeps the rounding of the values it passed through
        scale = max(np.abs(start[i]).max(), np.abs(p[i]).max())
        err = np.abs(q.data.numpy() - p[i]).max()
        assert err <= 1e-6 * scale, f"parameter {i} after 3 steps: error {err:.2e}, scale {scale:.2e}"


def test_sgd_state_survives_loading_before_the_first_step(dev, rng):
    """A resumed optimizer hands back the momentum it was given even before its first step (an interrupt right
    after resuming writes it again), and continues exactly as the original would."""
    def make():
        clnet.manual_seed(3)
        return nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2)).to(dev)
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in make().parameters()] for _ in range(3)]

    def step(model, opt, g):
        give_gradients(model.parameters())
        opt.zero_grad(set_to_none=False)
        for p, gi in zip(model.parameters(), g):
            p.grad.write(gi)
        opt.step()

    model = make()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step(model, opt, grads[0])
    state = opt.state_dict()
    resumed = make()
    resumed.load_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="saved with momentum 0.9, this optimizer has 0.0"):
        optim.SGD(resumed.parameters(), lr=0.5, momentum=0.0).load_state_dict(state)  # no buffer to load into
    opt2 = optim.SGD(resumed.parameters(), lr=0.5, momentum=0.5)
    opt2.load_state_dict(state)  # the saved hyperparameters replace the ones it was made with, as in PyTorch
    assert (opt2.lr, opt2.momentum) == (0.1, 0.9)
    handed_back = opt2.state_dict()["state"]
    assert sorted(handed_back) == sorted(state["state"]) == list(range(len(model.parameters())))
    for i, entry in state["state"].items():
        np.testing.assert_array_equal(handed_back[i]["momentum_buffer"], entry["momentum_buffer"])
    for g in grads[1:]:
        step(model, opt, g)
        step(resumed, opt2, g)
    for p, q in zip(model.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_state_dict_round_trip_and_keys(dev, rng):
    model = models.build("lenet").to(dev)
    sd = model.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias", "5.weight", "5.bias", "7.weight", "7.bias"]
    assert sd["0.weight"].shape == (20, 1, 5, 5) and sd["5.weight"].shape == (500, 800)
    new = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in sd.items()}
    model.load_state_dict(new)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, new[k])


@needs_torch
def test_lenet_matches_torch(dev, rng):
    import torch
    model = models.build("lenet").to(dev)
    tm = torch.nn.Sequential(torch.nn.Conv2d(1, 20, 5), torch.nn.MaxPool2d(2), torch.nn.Conv2d(20, 50, 5),
                             torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(800, 500), torch.nn.ReLU(),
                             torch.nn.Linear(500, 10)).double()
    tm.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in model.state_dict().items()})

    def near_tie(x):
        """Whether a max-pool window holds two values closer than float32 rounding can tell apart: there float32
        and float64 may pick different maxima and route the gradient differently (about 1 run in 20 failed so)."""
        h = torch.tensor(x, dtype=torch.float64)
        for layer in tm:
            if isinstance(layer, torch.nn.MaxPool2d):
                win = torch.nn.functional.unfold(h.flatten(0, 1)[:, None], 2, stride=2)  # (N*C, 4, windows)
                top = win.topk(2, dim=1).values
                if ((top[:, 0] - top[:, 1]) < 1e-5 * h.abs().max()).any():
                    return True
            h = layer(h)
        return False

    x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    while near_tie(x):
        x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 3)
    loss_fn = nn.CrossEntropyLoss()
    loss = loss_fn(model(clnet.tensor(x, dev)), labels)
    loss.backward()
    tl = torch.nn.functional.cross_entropy(tm(torch.tensor(x, dtype=torch.float64)), torch.tensor(labels))
    tl.backward()
    assert abs(float(loss) - tl.item()) < 1e-4
    tparams = dict(tm.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad.numpy(), tparams[name].grad.numpy(), f"grad {name}", tol=1e-4)


@pytest.mark.parametrize("name", ["lenet-wide", "alexnet", "overfeat", "vgg-a"])
def test_zoo_shapes(name):
    """Each zoo model maps its input to 10 or 1000 classes (pure Python, no device)."""
    entry = models.MODELS[name]
    out = models.build(name).output_shape((2,) + entry["input_shape"])
    assert out == (2, 10 if name.startswith("lenet") else 1000)


def test_relu_fused_into_the_layer_before_it_matches_reference(dev, rng):
    """A ReLU after a Conv2d or Linear in a Sequential runs in that layer's kernels (nn.Sequential's fusion): the
    forward and every gradient, the input's included, follow the reference; each ReLU costs no launch forward, and
    backward the Linear's one (its mask) while the Conv2d's is taken in its bias gradient's pass (bias_grad), so
    the same layers without their ReLUs launch exactly 1 fewer kernel."""
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 4, 7),
                          nn.ReLU(), nn.Linear(7, 4)).to(dev)
    p = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    x = rng.standard_normal((3, 2, 5, 4)).astype(np.float32)
    dy = rng.standard_normal((3, 4)).astype(np.float32)
    model(clnet.tensor(x, dev)).backward(clnet.tensor(dy, dev))  # allocates the .grads, so both counts below
    model.zero_grad()                                            # see only the forward and backward launches
    with recorded_launches() as launches:
        xt = clnet.tensor(x, dev, requires_grad=True)
        out = model(xt)
        out.backward(clnet.tensor(dy, dev))

    c = ref.conv2d(x, p["0.weight"], p["0.bias"], (1, 1), (1, 1), (2, 2), (1, 1), 1)
    r1 = ref.activation("relu", c)
    h = ref.linear(r1.reshape(3, -1), p["3.weight"], p["3.bias"])
    r2 = ref.activation("relu", h)
    z, dr2, g5w, g5b = ref.linear(r2, p["5.weight"], p["5.bias"], dy)
    _, dh = ref.activation("relu", h, dr2)
    _, dr1, g3w, g3b = ref.linear(r1.reshape(3, -1), p["3.weight"], p["3.bias"], dh)
    _, dc = ref.activation("relu", c, dr1.reshape(c.shape))
    _, rdx, g0w, g0b = ref.conv2d(x, p["0.weight"], p["0.bias"], (1, 1), (1, 1), (2, 2), (1, 1), 1, dc)
    assert_close(out.numpy(), z, "output")
    assert_close(xt.grad.numpy(), rdx, "grad input")
    for name, expected in (("0.weight", g0w), ("0.bias", g0b), ("3.weight", g3w), ("3.bias", g3b),
                           ("5.weight", g5w), ("5.bias", g5b)):
        assert_close(dict(model.named_parameters())[name].grad.numpy(), expected, f"grad {name}")
    assert launches.count("relu") == 0 and sum(w.endswith("(its ReLU)") for w in launches) == 1, launches

    plain = nn.Sequential(*[m for m in model if not isinstance(m, nn.ReLU)])  # the same layers and parameters
    with recorded_launches() as plain_launches:
        plain(clnet.tensor(x, dev, requires_grad=True)).backward(clnet.tensor(dy, dev))
    assert len(launches) - len(plain_launches) == 1, (launches, plain_launches)


def test_first_layer_computes_no_input_gradient_unless_asked(dev, rng):
    """A training step's input does not require a gradient, so the first layer's data gradient, which nothing uses,
    is never computed: none of its data-gradient kernels runs, fewer kernels run in all, x.grad stays None, and the
    parameter gradients are the same as those of a run whose input does require a gradient."""
    clnet.manual_seed(2)
    model = models.build("lenet").to(dev)
    first = repr(model[0])
    x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 3)
    nn.CrossEntropyLoss()(model(clnet.tensor(x, dev)), labels).backward()  # allocates the .grads
    results = {}
    for input_grad in (True, False):
        model.zero_grad()
        xt = clnet.tensor(x, dev, requires_grad=input_grad)
        loss = nn.CrossEntropyLoss()(model(xt), labels)
        with recorded_launches() as launches:
            loss.backward()
        data = [w for w in launches if w.startswith(first) and "(data)" in w]
        results[input_grad] = (len(launches), data, xt.grad, [p.grad.numpy() for p in model.parameters()])
    assert results[True][1] and not results[False][1], (results[True][1], results[False][1])
    assert results[True][2] is not None and results[False][2] is None
    assert results[True][2].shape == x.shape
    assert results[False][0] < results[True][0]
    for a, b in zip(results[True][3], results[False][3]):
        np.testing.assert_array_equal(a, b)


def randomised_state(model, rng):
    """model's state_dict with every batch norm's weight, bias and running statistics drawn at random (the defaults,
    ones and zeros, would hide a weight or mean that is ignored), the other entries as they are."""
    state = model.state_dict()
    for key, value in state.items():
        if value.ndim != 1 or key.endswith("fc.bias"):
            continue
        if key.endswith("weight") or key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, value.shape).astype(np.float32)
        elif key.endswith("bias") or key.endswith("running_mean"):
            state[key] = (0.1 * rng.standard_normal(value.shape)).astype(np.float32)
    return state


@needs_torch
def test_resnet8_matches_its_torch_twin(dev, rng):
    """The zoo's resnet8 (basic blocks; test_zoo.py checks bottleneck blocks) beside models.build("resnet8",
    lib=torch) with the same weights and random batch-norm state, in float64: logits, loss, every parameter's
    gradient, the input's gradient and the running statistics after a training step; then, in eval, the logits from
    those statistics. The input is drawn again while a ReLU's input in the float64 twin lies within 2e-5 of zero,
    where float32 rounding may switch that ReLU the other way and move a gradient by 1e-2 (CI seed 3979598406:
    layer1's residual sum at -3.1e-7 in float64, +6e-8 in clnet's float32)."""
    import torch
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = models.build("resnet8").to(dev)
    twin = models.build("resnet8", lib=torch).double()
    state = randomised_state(model, rng)
    model.load_state_dict(state)
    twin_state = {k: torch.tensor(v) if v.dtype.kind == "i" else torch.tensor(v, dtype=torch.float64)
                  for k, v in state.items()}
    twin.load_state_dict(twin_state)
    assert list(model.state_dict()) == list(twin.state_dict())
    nearest = []  # the smallest |input| of each ReLU call in the twin
    hooks = [m.register_forward_pre_hook(lambda m, args: nearest.append(args[0].abs().min().item()))
             for m in twin.modules() if isinstance(m, torch.nn.ReLU)]
    for _ in range(20):
        x = rng.standard_normal((2, 1, 28, 28)).astype(np.float32)
        nearest.clear()
        with torch.no_grad():
            twin(torch.tensor(x, dtype=torch.float64))
        if min(nearest) > 2e-5:
            break
    for h in hooks:
        h.remove()
    twin.load_state_dict(twin_state)  # the draws' forwards moved its running statistics
    labels = rng.integers(0, 10, 2)

    xt = clnet.tensor(x, dev, requires_grad=True)
    logits = model(xt)
    loss = nn.CrossEntropyLoss()(logits, labels)
    loss.backward()
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tlogits = twin(tx)
    tloss = torch.nn.functional.cross_entropy(tlogits, torch.tensor(labels))
    tloss.backward()
    assert_close(logits.numpy(), tlogits.detach().numpy(), "logits", tol=1e-4)
    assert abs(float(loss) - tloss.item()) < 1e-4 * max(1.0, tloss.item())
    assert_close(xt.grad.numpy(), tx.grad.numpy(), "grad input", tol=1e-4)
    tparams = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        assert_close(p.grad.numpy(), tparams[name].grad.numpy(), f"grad {name}", tol=1e-4)
    tstate = twin.state_dict()
    for name, value in model.state_dict().items():
        if "running" in name:
            assert_close(value, tstate[name].numpy(), name, tol=1e-5)
        elif name.endswith("num_batches_tracked"):
            assert value == tstate[name].item() == 1, name

    model.eval()
    twin.eval()
    with clnet.no_grad():
        eval_logits = model(clnet.tensor(x, dev))
    with torch.no_grad():
        teval = twin(torch.tensor(x, dtype=torch.float64))
    assert_close(eval_logits.numpy(), teval.numpy(), "logits in eval", tol=1e-4)
