"""Parameter groups (each group's hyperparameters on its own parameters, one launch per group, editable between eager
and replayed steps), RMSprop, and nn.utils' gradient clipping, against torch.optim and torch.nn.utils in float64."""
import math

import numpy as np
import pytest

import clnet
from clnet import kernels, nn, optim
from clnet.graph import CaptureError

from conftest import eager_or_replayed, give_gradients, needs_torch

pytestmark = needs_torch


def net(dev):
    return nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3), nn.Linear(3, 1)).to(dev)


def torch_twin(model):
    import torch
    twin = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3), torch.nn.Linear(3, 1))
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return twin.double()


def groups_of(params, group_hyper):
    """[{"params": first two tensors, **hyper0}, {"params": the rest, **hyper1}]: the first layer against the rest."""
    return [dict(group_hyper[0], params=params[:2]), dict(group_hyper[1], params=params[2:])]


# (clnet class, torch class, constructor defaults, per-group overrides): every optimizer, with groups that differ in
# the settings that choose the kernel (momentum on or off, nesterov, centered) as well as in the numbers. RMSprop's
# eps is 1e-3 or more: its first step g / sqrt((1 - alpha) g^2) is +-10 however small g is, so an element whose
# gradient is a rounding's size moves by 10 lr in one engine and not in the other (with 1e-8, 1 and 4 of 1500 draws
# failed for the two cases; with these, none, the worst at 0.33 and 0.58 of the tolerance).
CASES = {
    "sgd": ("SGD", dict(lr=0.05, momentum=0.9), [dict(lr=0.2, nesterov=True, weight_decay=0.01), dict(momentum=0.0)]),
    "adam": ("Adam", dict(lr=0.01, betas=(0.8, 0.95)), [dict(weight_decay=0.05), dict(lr=0.03, eps=1e-4)]),
    "adamw": ("AdamW", dict(lr=0.01), [dict(weight_decay=0.1), dict(lr=0.02, betas=(0.5, 0.9))]),
    "rmsprop": ("RMSprop", dict(lr=0.01, eps=1e-3), [dict(momentum=0.5, centered=True, weight_decay=0.02),
                                                     dict(alpha=0.9, eps=1e-2)]),
    "rmsprop-momentum": ("RMSprop", dict(lr=0.005, momentum=0.9, eps=1e-3), [dict(), dict(centered=True, lr=0.002)]),
}


def train_pair(dev, rng, case, steps=5):
    """`steps` real training steps of clnet, of torch in float64 and of torch in float32 from the same weights and
    batches; (model, twin, twin32, start, opt)."""
    import torch
    cls, defaults, group_hyper = CASES[case]
    clnet.manual_seed(int(rng.integers(1 << 30)))  # the seed printed replays the weights too
    model = net(dev)
    start = model.state_dict()
    twin, twin32 = torch_twin(model), torch_twin(model).float()
    opt = getattr(optim, cls)(groups_of(model.parameters(), group_hyper), **defaults)
    topts = [getattr(torch.optim, cls)(groups_of(list(t.parameters()), group_hyper), **defaults) for t in (twin, twin32)]
    for _ in range(steps):
        x = rng.standard_normal((6, 7)).astype(np.float32)
        y = rng.standard_normal((6, 1)).astype(np.float32)
        opt.zero_grad()
        d = model(clnet.tensor(x, dev)) - clnet.tensor(y, dev)
        (d * d).mean().backward()
        opt.step()
        for t, topt in zip((twin, twin32), topts):
            topt.zero_grad()
            td = t(torch.from_numpy(x).to(t[0].weight.dtype)) - torch.from_numpy(y).to(t[0].weight.dtype)
            (td * td).mean().backward()
            topt.step()
    return model, twin, twin32, start, opt


@pytest.mark.parametrize("case", list(CASES))
def test_groups_match_torch_training(dev, rng, case):
    model, twin, twin32, start, opt = train_pair(dev, rng, case)
    theirs, theirs32 = twin.state_dict(), twin32.state_dict()
    lr = max(g["lr"] for g in opt.param_groups)
    for k, v in model.state_dict().items():
        # float32 rounds each update and the weight it lands on: the error scales with the weights and five updates
        # of at most about lr each (RMSprop's first steps move by up to lr / sqrt(1 - alpha)), not with the result;
        # where the data make the steps ill-conditioned (RMSprop with momentum: PyTorch's own float32 run is 1.3e-5
        # off on one seed in 300), ten times PyTorch's float32 error
        scale = np.abs(start[k]).max() + 5 * lr * 10
        worst = np.abs(v - theirs[k].numpy()).max()
        torch32 = np.abs(theirs32[k].numpy() - theirs[k].numpy()).max()
        assert worst < max(2e-6 * scale, 10 * torch32), \
            f"{case} {k}: error {worst:.2e}, scale {scale:.2e}, PyTorch float32's error {torch32:.2e}"


def test_one_launch_per_group(dev, rng):
    model = net(dev)
    params = model.parameters()
    opt = optim.RMSprop(groups_of(params, [dict(centered=True), dict(momentum=0.5)]), lr=0.01)
    give_gradients(params)
    opt.zero_grad(set_to_none=False)
    for p in params:
        p.grad.write(rng.standard_normal(p.shape).astype(np.float32))
    before = kernels.launch_count
    opt.step()
    assert kernels.launch_count - before == 2


def test_rmsprop_matches_float64_reference(dev, rng):
    """PyTorch's documented update written out in NumPy, centered with momentum, over four steps of given gradients
    (a check that does not lean on torch)."""
    p0 = rng.standard_normal(37).astype(np.float32)
    w = clnet.Parameter(clnet.tensor(p0, dev))
    lr, alpha, eps, wd, mom = 0.01, 0.9, 1e-6, 0.1, 0.7
    opt = optim.RMSprop([w], lr=lr, alpha=alpha, eps=eps, weight_decay=wd, momentum=mom, centered=True)
    p, sq, ga, buf = p0.astype(np.float64), 0.0, 0.0, 0.0
    for _ in range(4):
        g = rng.standard_normal(37).astype(np.float32)
        give_gradients([w])
        opt.zero_grad(set_to_none=False)
        w.grad.write(g)
        opt.step()
        d = g + wd * p
        sq = alpha * sq + (1 - alpha) * d * d
        ga = alpha * ga + (1 - alpha) * d
        buf = mom * buf + d / (np.sqrt(sq - ga * ga) + eps)
        p = p - lr * buf
    worst = np.abs(w.numpy() - p).max()
    assert worst < 1e-5 * (np.abs(p0).max() + 4 * lr * 10), f"error {worst:.2e}"


def test_group_lr_changed_between_replays(dev, rng):
    """Two groups, each with its own learning rate changed by hand between replays of a captured step: the weights
    equal those of eager steps with the same changes, bit for bit (each group's Live arguments follow its dict)."""
    data = [(rng.standard_normal((4, 7)).astype(np.float32), rng.standard_normal((4, 1)).astype(np.float32))
            for _ in range(5)]

    def run(replayed):
        clnet.manual_seed(11)
        model = net(dev)
        opt = optim.SGD(groups_of(model.parameters(), [dict(lr=0.1), dict(momentum=0.5)]), lr=0.05, momentum=0.9)
        x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)

        def step():
            opt.zero_grad()
            d = model(x) - y
            (d * d).mean().backward()
            opt.step()
        step()
        run_step = eager_or_replayed(step, replayed)
        for i, (xb, yb) in enumerate(data[1:], 1):
            opt.param_groups[0]["lr"] = 0.1 / (i + 1)
            opt.param_groups[1]["lr"] = 0.05 * (i + 1)
            opt.param_groups[1]["momentum"] = 0.5 + 0.1 * i
            x.write(xb)
            y.write(yb)
            run_step()
        return model.state_dict()
    eager, replayed = run(False), run(True)
    for k in eager:
        np.testing.assert_array_equal(eager[k], replayed[k], err_msg=k)


def test_replay_refuses_a_group_that_needs_another_kernel(dev, rng):
    model = net(dev)
    opt = optim.SGD(groups_of(model.parameters(), [dict(), dict(momentum=0.9)]), lr=0.05)
    x = clnet.tensor(rng.standard_normal((4, 7)).astype(np.float32), dev)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    step()
    graph = clnet.Graph()
    with graph.capture():
        step()
    graph.replay()
    opt.param_groups[1]["momentum"] = 0.0  # the group's kernel was built with a momentum buffer
    with pytest.raises(clnet.CaptureError, match=r"param_groups\[1\].*capture the step again"):
        graph.replay()


def test_state_dict_layout_and_round_trip(dev, rng):
    """PyTorch's layout (state by parameter index counted across groups; params as indices per group), and a state
    loaded into a fresh optimizer continues as the original, bit for bit."""
    def make():
        clnet.manual_seed(3)
        model = net(dev)
        opt = optim.RMSprop(groups_of(model.parameters(), [dict(momentum=0.9), dict(centered=True, lr=0.02)]),
                            lr=0.01)
        return model, opt
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in make()[0].parameters()] for _ in range(4)]

    def step(model, opt, g):
        give_gradients(model.parameters())
        opt.zero_grad(set_to_none=False)
        for p, gi in zip(model.parameters(), g):
            p.grad.write(gi)
        opt.step()
    a, opt_a = make()
    for g in grads[:2]:
        step(a, opt_a, g)
    state = opt_a.state_dict()
    assert [g["params"] for g in state["param_groups"]] == [[0, 1], [2, 3, 4, 5]]
    assert [g["step"] for g in state["param_groups"]] == [2, 2]
    assert set(state["state"][0]) == {"square_avg", "momentum_buffer"}
    assert set(state["state"][2]) == {"square_avg", "grad_avg"}
    assert state["param_groups"][1]["lr"] == 0.02 and state["param_groups"][0]["lr"] == 0.01
    b, opt_b = make()
    b.load_state_dict(a.state_dict())
    opt_b.param_groups[1]["lr"] = 0.5
    opt_b.load_state_dict(state)
    assert opt_b.param_groups[1]["lr"] == 0.02
    for g in grads[2:]:
        step(a, opt_a, g)
        step(b, opt_b, g)
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    with pytest.raises(ValueError, match="2 parameter groups"):
        optim.RMSprop(b.parameters()).load_state_dict(state)


def test_add_param_group_after_steps(dev, rng):
    """A group added after a step joins the flat buffers; the first group's momentum survives the new layout."""
    import torch
    model = net(dev)
    twin = torch_twin(model)
    params, tparams = model.parameters(), list(twin.parameters())
    opt = optim.SGD(params[:4], lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tparams[:4], lr=0.1, momentum=0.9)
    for i in range(4):
        if i == 2:
            opt.add_param_group({"params": params[4:], "lr": 0.3})
            topt.add_param_group({"params": tparams[4:], "lr": 0.3})
        n = len(params) if i >= 2 else 4
        g = [rng.standard_normal(p.shape).astype(np.float32) for p in params[:n]]
        give_gradients(params)
        opt.zero_grad(set_to_none=False)
        for p, gi in zip(params, g):
            p.grad.write(gi)
        opt.step()
        for p, gi in zip(tparams, g):
            p.grad = torch.from_numpy(gi).double()
        topt.step()
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=0, atol=1e-5)


def test_group_arguments_are_checked():
    params = nn.Linear(2, 2).parameters()
    with pytest.raises(ValueError, match="appears twice"):
        optim.SGD([{"params": params}, {"params": params[:1]}])
    with pytest.raises(TypeError, match="mixes parameter groups"):
        optim.SGD([{"params": params[:1]}, params[1]])
    with pytest.raises(TypeError, match="one tensor"):
        optim.SGD(params[0])
    with pytest.raises(ValueError, match=r"SGD: lr, momentum and weight_decay must be non-negative \(got lr=-1.0"):
        optim.SGD([{"params": params[:1], "lr": -1.0}, {"params": params[1:]}])
    optim.SGD(params, lr=0.0)  # the end of a cosine schedule, as PyTorch takes it
    with pytest.raises(ValueError, match="RMSprop: need .*alpha"):
        optim.RMSprop(params, alpha=1.5)
    opt = optim.Adam([{"params": params[:1], "lr": 0.1}, {"params": params[1:]}], lr=0.01)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01] and opt.defaults["lr"] == 0.01
    with pytest.raises(AttributeError, match=r"2 parameter groups; use param_groups\[i\]\['lr'\]"):
        opt.lr  # noqa: B018


# ---- nn.utils: clipping ------------------------------------------------------------------------------------------

def grads_pair(dev, rng, shapes, scale=1.0):
    import torch
    arrays = [(scale * rng.standard_normal(s)).astype(np.float32) for s in shapes]
    ours = []
    for a in arrays:
        p = clnet.Parameter(clnet.tensor(np.zeros(a.shape, np.float32), dev))
        p.grad = clnet.tensor(a, dev)
        ours.append(p)
    theirs = []
    for a in arrays:
        t = torch.zeros(a.shape, dtype=torch.float64, requires_grad=True)
        t.grad = torch.from_numpy(a).double()
        theirs.append(t)
    return ours, theirs


@pytest.mark.parametrize("norm_type,max_norm", [(2.0, 1.0), (1.0, 3.0), (math.inf, 0.5), (3.5, 100.0)])
def test_clip_grad_norm_matches_torch(dev, rng, norm_type, max_norm):
    import torch
    ours, theirs = grads_pair(dev, rng, [(3, 5), (1,), (33,), (2, 2, 3)])
    clnet.reset_transfer_stats()
    total = nn.utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    assert clnet.transfer_stats()["device_to_host_count"] == 0, "clip_grad_norm_ read the device"
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type)
    assert isinstance(total, clnet.Tensor) and total.shape == ()
    np.testing.assert_allclose(total.numpy(), expected.numpy(), rtol=2e-6)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=3e-6, atol=1e-7)


def test_clip_grad_value_and_nonfinite(dev, rng):
    import torch
    ours, theirs = grads_pair(dev, rng, [(4, 3), (5,)], scale=2.0)
    nn.utils.clip_grad_value_(ours, 0.7)
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for p, t in zip(ours, theirs):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy().astype(np.float32))
    bad = clnet.Parameter(clnet.tensor(np.zeros(3, np.float32), dev))
    bad.grad = clnet.tensor(np.array([1.0, np.inf, 2.0], np.float32), dev)
    with pytest.raises(nn.utils.NonFiniteNorm, match="error_if_nonfinite=False"):
        nn.utils.clip_grad_norm_([bad], 1.0, error_if_nonfinite=True)


MAX_NORM = 0.05  # under the last step's gradient norm: at 0.5 one seed's last norm was 0.44 and nothing was clipped


def test_clipped_step_replays_as_eager_steps(dev, rng):
    """zero_grad, backward, clip_grad_norm_ and step captured in one Graph: replays give the eager steps' weights,
    bit for bit, the clipping factor recomputed on the device from each replay's gradients."""
    data = [(rng.standard_normal((4, 7)).astype(np.float32), 3 * rng.standard_normal((4, 1)).astype(np.float32))
            for _ in range(4)]

    def run(replayed):
        clnet.manual_seed(5)
        model = net(dev)
        opt = optim.Adam(model.parameters(), lr=0.05)
        x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)
        norms = []

        def step():
            opt.zero_grad()
            d = model(x) - y
            (d * d).mean().backward()
            norms.append(nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
            opt.step()
        step()
        run_step = eager_or_replayed(step, replayed)
        for xb, yb in data[1:]:
            x.write(xb)
            y.write(yb)
            run_step()
        return model.state_dict(), float(norms[-1].numpy())
    (eager, n_eager), (replayed, n_replayed) = run(False), run(True)
    assert n_eager == n_replayed and n_eager > MAX_NORM  # the clipping acted at the last step
    for k in eager:
        np.testing.assert_array_equal(eager[k], replayed[k], err_msg=k)


@pytest.mark.parametrize("which", ["all", "every other"])
def test_clip_grad_norm_over_an_optimizers_gradients(dev, rng, which):
    """Gradients in an optimizer's flat buffer: all of them are clipped in a fixed number of launches (one span), a
    subset with other gradients between them one by one; both as torch's. A NaN norm leaves the buffer's padding
    zero: the next norm, of finite gradients, is finite."""
    import torch
    model = net(dev)
    twin = torch_twin(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    x = rng.standard_normal((6, 7)).astype(np.float32)
    (model(clnet.tensor(x, dev)) ** 2).sum().backward()
    ours, theirs = model.parameters(), list(twin.parameters())
    for p, t in zip(ours, theirs):  # torch clips clnet's own gradients (in float64): the clipping is what is tested
        t.grad = torch.from_numpy(p.grad.numpy().astype(np.float64))
    if which == "every other":
        ours, theirs = ours[::2], theirs[::2]
    before = kernels.launch_count
    total = nn.utils.clip_grad_norm_(ours, 0.3)
    launches = kernels.launch_count - before
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.3)
    assert (launches <= 8) == (which == "all"), f"{launches} launches"
    np.testing.assert_allclose(total.numpy(), expected.numpy(), rtol=2e-6)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=3e-6, atol=1e-8)
    if which == "all":
        ours[0].grad.write(np.full(ours[0].shape, np.nan, np.float32))
        assert np.isnan(nn.utils.clip_grad_norm_(ours, 0.3).numpy())
        fresh = [rng.standard_normal(p.shape).astype(np.float32) for p in ours]
        for p, g in zip(ours, fresh):
            p.grad.write(g)
        ref = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in fresh))
        np.testing.assert_allclose(nn.utils.clip_grad_norm_(ours, 0.3).numpy(), ref, rtol=2e-6, equal_nan=False)


def test_fit_replays_rmsprop_with_groups_as_eager_steps(dev, rng, monkeypatch):
    """clnet.fit captures and replays an RMSprop step (two groups, one centered with momentum) and ends with the
    eager run's weights, bit for bit."""
    from clnet import graph
    images = rng.standard_normal((70, 1, 6, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 70).astype(np.int32)
    replays = []
    real = graph.Graph.replay
    monkeypatch.setattr(graph.Graph, "replay", lambda g: (replays.append(1), real(g)))
    runs = {}
    for graphs in (False, True):
        clnet.manual_seed(8)
        model = nn.Sequential(nn.Flatten(), nn.Linear(36, 5), nn.ReLU(), nn.Linear(5, 3)).to(dev)
        params = model.parameters()
        opt = optim.RMSprop([{"params": params[:2], "centered": True, "momentum": 0.5}, {"params": params[2:]}],
                            lr=0.01)
        clnet.fit(model, (images, labels), epochs=1, batch=16, optimizer=opt, device=dev, graphs=graphs)
        runs[graphs] = model.state_dict()
    assert len(replays) == 4 - 2  # 4 batches of 16 (the first eager, the second captured), 1 of 6 eager
    for k in runs[False]:
        np.testing.assert_array_equal(runs[False][k], runs[True][k], err_msg=k)


@needs_torch
@pytest.mark.parametrize("replayed", [False, True], ids=["eager", "replayed"])
@pytest.mark.parametrize("case", ["sgd", "adamw", "rmsprop"])
def test_parameters_without_a_gradient_are_passed_over(dev, rng, tmp_path, case, replayed):
    """As PyTorch's step: a parameter whose .grad is None is passed over. The first layer is frozen after the
    optimizer took it (requires_grad False: no momentum, no weight decay moves it), and a second head is used only
    at some steps, its Adam step count its own (bias corrections) where the layers around it count every step.
    zero_grad() sets the gradients to None (PyTorch's default). Replayed: a step of each kind captured once, the
    passed-over parameters fixed at the capture. Against torch.optim in float64 over six steps."""
    import torch
    cls, defaults, _ = CASES[case]
    defaults = dict(defaults, weight_decay=0.1, **({"momentum": 0.9} if case == "sgd" else {}))
    clnet.manual_seed(int(rng.integers(1 << 30)))
    layers = [nn.Linear(7, 5), nn.Linear(5, 3), nn.Linear(5, 3)]  # trunk, head, the head used at some steps
    model = nn.Sequential(*layers).to(dev)
    twin = torch.nn.Sequential(*[torch.nn.Linear(m.in_features, m.out_features) for m in layers]).double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    opt = getattr(optim, cls)(model.parameters(), **defaults)
    topt = getattr(torch.optim, cls)(twin.parameters(), **defaults)
    for p in list(model[0].parameters()) + list(twin[0].parameters()):
        p.requires_grad = False
    x, y = clnet.tensor(np.zeros((6, 7), np.float32), dev), clnet.tensor(np.zeros((6, 3), np.float32), dev)

    def step(both):
        opt.zero_grad()
        h = model[0](x)
        d = model[1](h) + model[2](h) - y if both else model[1](h) - y
        (d * d).mean().backward()
        opt.step()

    steps = {both: eager_or_replayed(lambda both=both: step(both), replayed) for both in (False, True)}
    start = model.state_dict()
    for i, both in enumerate((True, False, False, True, True, False)):
        xb, yb = rng.standard_normal((6, 7)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
        x.write(xb)
        y.write(yb)
        if replayed and case == "adamw" and i == 3:  # both heads in one launch, at counts 3 and 1 now: refused
            with pytest.raises(CaptureError, match=r"AdamW: parameters 2-5 .* stepped different numbers of times"):
                steps[both]()
            return
        steps[both]()
        topt.zero_grad()
        h = twin[0](torch.from_numpy(xb).double())
        d = twin[1](h) + (twin[2](h) if both else 0) - torch.from_numpy(yb).double()
        (d * d).mean().backward()
        topt.step()
        assert (model[2].weight.grad is None) == (not both), "the unused head's .grad is not None"
        theirs = twin.state_dict()
        for k, v in model.state_dict().items():
            scale = np.abs(start[k]).max() + 6 * defaults["lr"] * 10
            worst = np.abs(v - theirs[k].numpy()).max()
            assert worst < 2e-6 * scale, f"{case} {k}: error {worst:.2e}, scale {scale:.2e}"
    for k in ("0.weight", "0.bias"):
        assert np.array_equal(model.state_dict()[k], start[k]), f"the frozen {k} moved"
    if case == "adamw":  # the second head stepped three times, the frozen layer never, the rest six: each count
        state = opt.state_dict()  # that differs from the group's saved as the parameter's own, as PyTorch keeps it
        assert state["param_groups"][0]["step"] == 6
        assert [state["state"].get(i, {}).get("step") for i in range(6)] == [0, 0, None, None, 3, 3]
        # loaded into a fresh optimizer, directly and through a checkpoint (it refused "step" before), the counts come
        # back; so do PyTorch's own, a step in every entry
        from clnet import checkpoint
        path = tmp_path / "run.ckpt"
        checkpoint.save_checkpoint(path, model, opt, dict(model="heads", architecture=repr(model), epoch=0, step=0,
                                                          global_step=6, rng_state=clnet.rng.get_state(), config={},
                                                          history=[]))
        for load in (lambda o: o.load_state_dict(state),
                     lambda o: checkpoint.load_into(checkpoint.load_checkpoint(path), model, o)):
            fresh = getattr(optim, cls)(model.parameters(), **defaults)
            load(fresh)
            assert fresh.state_dict()["param_groups"][0]["step"] == 6
            assert [fresh.state_dict()["state"].get(i, {}).get("step") for i in range(6)] == [0, 0, None, None, 3, 3]
        theirs_state = topt.state_dict()
        fresh = getattr(optim, cls)(model.parameters(), **defaults)
        fresh.load_state_dict({"state": {i: {k: np.asarray(v) for k, v in e.items()}
                                         for i, e in theirs_state["state"].items()},
                               "param_groups": theirs_state["param_groups"]})
        assert [fresh.state_dict()["state"].get(i, {}).get("step") for i in range(2, 6)] == [None, None, 3, 3]
