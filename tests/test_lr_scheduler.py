"""clnet.optim.lr_scheduler against torch.optim.lr_scheduler: the same learning rates (and OneCycleLR's momentum) over
25 steps for two parameter groups, exactly; state_dict round trips; replayed Graph steps that follow a schedule."""
import numpy as np
import pytest

import clnet
from clnet import nn, optim
from clnet.optim import lr_scheduler

from conftest import HAVE_TORCH, eager_or_replayed, needs_torch


def two_groups(params, lrs=(0.1, 0.02)):
    return [{"params": params[:1], "lr": lrs[0]}, {"params": params[1:], "lr": lrs[1]}]


SCHEDULES = {
    "step": lambda m, o: m.StepLR(o, step_size=4, gamma=0.5),
    "multistep": lambda m, o: m.MultiStepLR(o, milestones=[3, 7, 7, 15], gamma=0.3),
    "cosine": lambda m, o: m.CosineAnnealingLR(o, T_max=7, eta_min=0.001),  # past T_max: back up, and down again
    "linear": lambda m, o: m.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=9),
    "onecycle": lambda m, o: m.OneCycleLR(o, max_lr=[0.5, 0.1], total_steps=26),
    "onecycle-3phase-linear": lambda m, o: m.OneCycleLR(o, max_lr=0.3, epochs=2, steps_per_epoch=13, pct_start=0.25,
                                                        anneal_strategy="linear", three_phase=True),
    "sequential": lambda m, o: m.SequentialLR(o, [m.LinearLR(o, start_factor=0.1, total_iters=5),
                                                  m.CosineAnnealingLR(o, T_max=8),
                                                  m.StepLR(o, step_size=3, gamma=0.7)], milestones=[6, 14]),
}


@needs_torch
@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_schedule_matches_torch(name, opt_name):
    import torch
    ours_p = nn.Linear(3, 2).parameters()  # the schedule needs no device: it only sets the groups
    theirs_p = [torch.zeros(2, 3, requires_grad=True), torch.zeros(2, requires_grad=True)]
    hyper = dict(momentum=0.9) if opt_name == "SGD" else {}
    opt = getattr(optim, opt_name)(two_groups(ours_p), **hyper)
    topt = getattr(torch.optim, opt_name)(two_groups(theirs_p), **hyper)
    ours, theirs = SCHEDULES[name](lr_scheduler, opt), SCHEDULES[name](torch.optim.lr_scheduler, topt)
    momentum = "momentum" if opt_name == "SGD" else "betas"
    for i in range(25):
        # the same Python arithmetic in the same order: equal to the last bit, not merely close
        assert ours.get_last_lr() == theirs.get_last_lr(), f"{name} step {i}"
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
        assert [g[momentum] for g in opt.param_groups] == [g[momentum] for g in topt.param_groups]
        topt.step()
        ours.step()
        theirs.step()


@needs_torch
def test_state_dict_resumes_the_schedule():
    """A scheduler's state loaded into a new one over a new optimizer (with the saved optimizer state) continues
    the sequence torch's continues."""
    import torch

    def make(module, opt):
        return SCHEDULES["sequential"](module, opt)
    opt = optim.SGD(two_groups(nn.Linear(3, 2).parameters()), momentum=0.9)
    s = make(lr_scheduler, opt)
    tp = [torch.zeros(2, 3, requires_grad=True), torch.zeros(2, requires_grad=True)]
    topt = torch.optim.SGD(two_groups(tp), momentum=0.9)
    t = make(torch.optim.lr_scheduler, topt)
    for _ in range(9):
        topt.step()
        s.step()
        t.step()
    opt2 = optim.SGD(two_groups(nn.Linear(3, 2).parameters(), lrs=(0.7, 0.7)), momentum=0.9)
    s2 = make(lr_scheduler, opt2)
    opt2.load_state_dict(opt.state_dict())
    s2.load_state_dict(s.state_dict())
    for i in range(10):
        topt.step()
        s2.step()
        t.step()
        assert s2.get_last_lr() == t.get_last_lr(), f"step {i} after the resume"


def test_scheduler_arguments_are_checked():
    opt = optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="StepLR: step_size"):
        lr_scheduler.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="OneCycleLR: give total_steps"):
        lr_scheduler.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="max_lr has 2 values, the optimizer has 1"):
        lr_scheduler.OneCycleLR(opt, max_lr=[1.0, 2.0], total_steps=5)
    with pytest.raises(TypeError, match="not an optimizer"):
        lr_scheduler.StepLR(object(), step_size=2)
    with pytest.raises(ValueError, match="3 schedulers need 2 milestones"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 2)] * 3, milestones=[4])
    other = optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="another optimizer"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(other, 2)], milestones=[])
    one = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=2)
    one.step()
    one.step()
    with pytest.raises(ValueError, match="past total_steps=2"):
        one.step()


def net(dev):
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2)).to(dev)


@pytest.mark.parametrize("where", ["between replays", "inside the capture"])
def test_replayed_steps_follow_a_schedule(dev, rng, where):
    """N replays of a captured SGD step (momentum cycled by OneCycleLR too), the scheduler stepped between replays or
    captured with the step, give the weights of N eager steps under the same schedule, bit for bit."""
    data = [(rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32))
            for _ in range(7)]

    def run(replayed):
        clnet.manual_seed(2)
        model = net(dev)
        params = model.parameters()
        opt = optim.SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.02}], lr=0.05, momentum=0.9)
        sched = lr_scheduler.OneCycleLR(opt, max_lr=[0.4, 0.1], total_steps=len(data))
        x, y = clnet.tensor(data[0][0], dev), clnet.tensor(data[0][1], dev)

        def step():
            opt.zero_grad()
            d = model(x) - y
            (d * d).mean().backward()
            opt.step()
            if where == "inside the capture":
                sched.step()
        step()
        if where == "between replays":
            sched.step()
        run_step = eager_or_replayed(step, replayed)
        for xb, yb in data[1:]:
            x.write(xb)
            y.write(yb)
            run_step()
            if where == "between replays":
                sched.step()
        return model.state_dict(), sched.get_last_lr(), sched.last_epoch
    (eager, lr_e, t_e), (replayed, lr_r, t_r) = run(False), run(True)
    assert lr_e == lr_r and t_e == t_r == len(data)
    for k in eager:
        np.testing.assert_array_equal(eager[k], replayed[k], err_msg=k)
    if HAVE_TORCH:  # and the eager steps are torch's under torch's schedule: the schedule reached the kernels
        import torch
        clnet.manual_seed(2)
        start = net(dev).state_dict()
        twin = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in start.items()})
        twin.double()
        tp = list(twin.parameters())
        topt = torch.optim.SGD([{"params": tp[:2]}, {"params": tp[2:], "lr": 0.02}], lr=0.05, momentum=0.9)
        tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=[0.4, 0.1], total_steps=len(data))
        for xb, yb in data:
            topt.zero_grad()
            d = twin(torch.from_numpy(xb).double()) - torch.from_numpy(yb).double()
            (d * d).mean().backward()
            topt.step()
            tsched.step()
        for k, v in twin.state_dict().items():
            scale = np.abs(start[k]).max() + 0.4 * len(data)
            worst = np.abs(eager[k] - v.numpy()).max()
            assert worst < 1e-6 * scale, f"{k}: error {worst:.2e} against torch, scale {scale:.2e}"
