"""fit with parameter groups and an lr scheduler: checkpoints hold every group and the schedule, so a resumed run
ends bit for bit where the uninterrupted one does; a checkpoint whose groups or scheduler do not match the run is
refused before anything is applied; the schedule reaches replayed steps (the lr is each replay's argument)."""
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import checkpoint, cli, optim, rng, train
from clnet.optim import lr_scheduler

from test_train import needs_fashion, strip_times, synthetic, tiny_model

STEPS_PER_EPOCH = 4  # synthetic(64) in batches of 16
EPOCHS = 3


def groups(model, **second):
    """Two groups with settings of their own: the first layer, and the rest."""
    p = model.parameters()
    return [{"params": p[:2]}, dict({"params": p[2:]}, **second)]


# (optimizer over a model, scheduler over the optimizer, scheduler_interval)
CASES = {
    "sgd-steplr-per-epoch": (
        lambda m: optim.SGD(groups(m, lr=0.02, momentum=0.5, weight_decay=0.0), lr=0.05, momentum=0.9,
                            weight_decay=1e-3),
        lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.5), "epoch"),
    "adamw-onecycle-per-step": (
        lambda m: optim.AdamW(groups(m, lr=3e-3, betas=(0.8, 0.99), weight_decay=0.0), lr=1e-2, weight_decay=0.05),
        lambda o: lr_scheduler.OneCycleLR(o, max_lr=[2e-2, 5e-3], total_steps=EPOCHS * STEPS_PER_EPOCH), "step"),
    "sgd-sequential-per-step": (  # nested schedulers, and MultiStepLR's milestones (a Counter) in the record
        lambda m: optim.SGD(groups(m, lr=0.01, nesterov=True), lr=0.05, momentum=0.9),
        lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=3),
                                                lr_scheduler.MultiStepLR(o, milestones=[2, 4, 4, 7], gamma=0.5)],
                                            milestones=[3]), "step"),
}


def run(dev, case, path=None, resume=None, max_steps=None, seed=7):
    make_opt, make_sched, interval = CASES[case]
    clnet.manual_seed(seed)
    model = tiny_model().to(dev)
    opt = make_opt(model)
    sched = make_sched(opt)
    result = train.fit(model, synthetic(64), epochs=EPOCHS, batch=16, optimizer=opt, scheduler=sched,
                       scheduler_interval=interval, device=dev, seed=5, checkpoint=path, resume=resume,
                       max_steps=max_steps, model_name="tiny")
    return model, opt, sched, result


@pytest.mark.parametrize("case", list(CASES))
def test_resume_with_groups_and_a_scheduler_continues_the_run(dev, tmp_path, case):
    full, full_opt, full_sched, full_result = run(dev, case)
    assert full_result["global_step"] == EPOCHS * STEPS_PER_EPOCH
    ckpt = tmp_path / "run.ckpt"
    _, _, _, part = run(dev, case, ckpt, max_steps=6)  # inside the second epoch
    assert part["stopped"] and (part["epoch"], part["step"]) == (1, 2)
    # fresh objects from another random stream: everything that matters comes from the checkpoint
    resumed, opt, sched, rest = run(dev, case, ckpt, resume=ckpt, seed=12345)
    assert rest["global_step"] == full_result["global_step"]
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=k)
    assert strip_times(full_result["epochs"]) == strip_times(rest["epochs"])
    assert sched.state_dict() == full_sched.state_dict()
    assert opt.state_dict()["param_groups"] == full_opt.state_dict()["param_groups"]
    lrs = [e["lr"] for e in full_result["epochs"]]
    assert len({tuple(lr) for lr in lrs}) == EPOCHS and all(a != b for a, b in lrs)  # the schedule moved, per group


def saved_with(tmp_path, make_opt, make_sched=None, name="run.ckpt"):
    """A checkpoint of tiny_model (host weights, no device) with the optimizer and scheduler made by the makers."""
    rng.manual_seed(0)
    net = tiny_model()
    opt = make_opt(net)
    sched = make_sched(opt) if make_sched else None
    meta = dict(model="tiny", architecture=repr(net), epoch=0, step=1, global_step=1, rng_state=rng.get_state(),
                config=dict(batch=16, seed=0, train_images=40), history=[])
    checkpoint.save_checkpoint(tmp_path / name, net, opt, meta, sched)
    return tmp_path / name


def refused(path, make_opt, make_sched=None):
    """The message load_into refuses the checkpoint with, having checked that nothing was applied."""
    rng.manual_seed(9)
    net = tiny_model()
    opt = make_opt(net)
    sched = make_sched(opt) if make_sched else None
    before, stream = net.state_dict(), rng.get_state()
    groups_before = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    sched_before = None if sched is None else sched.state_dict()
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_into(checkpoint.load_checkpoint(path), net, opt, scheduler=sched)
    for k, a in net.state_dict().items():
        np.testing.assert_array_equal(a, before[k], err_msg=k)
    assert rng.get_state() == stream
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before
    assert sched is None or sched.state_dict() == sched_before
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_groups_that_do_not_match_the_optimizers_are_refused_naming_both(tmp_path):
    two = saved_with(tmp_path, lambda m: optim.SGD(groups(m, lr=0.02), lr=0.1, momentum=0.9))
    one = lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
    assert ("run.ckpt holds 2 parameter groups of 2 and 2 parameters, the optimizer has 1 parameter group of 4 "
            "parameters; make the optimizer with the saved run's parameter groups") in refused(two, one)

    def other_split(m):
        p = m.parameters()
        return optim.SGD([{"params": p[:3]}, {"params": p[3:], "lr": 0.02}], lr=0.1, momentum=0.9)
    assert "holds 2 parameter groups of 2 and 2 parameters, the optimizer has 2 parameter groups of 3 and 1" \
        in refused(two, other_split)
    single = saved_with(tmp_path, one, name="one.ckpt")
    assert "one.ckpt holds 1 parameter group of 4 parameters, the optimizer has 2 parameter groups of 2 and 2" \
        in refused(single, lambda m: optim.SGD(groups(m, lr=0.02), lr=0.1, momentum=0.9))


def test_every_groups_settings_are_restored(tmp_path):
    """Each group's lr, momentum, weight decay, nesterov and the scheduler's initial_lr come back, not the first
    group's for all (what version 2 checkpoints held)."""
    def make(m):
        return optim.SGD(groups(m, lr=0.02, momentum=0.5, weight_decay=0.25, nesterov=True), lr=0.1, momentum=0.9)
    path = saved_with(tmp_path, make, lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5))
    net = tiny_model()
    opt = optim.SGD(groups(net, lr=0.7, momentum=0.3, nesterov=True), lr=0.3, momentum=0.1, weight_decay=0.5)
    sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    checkpoint.load_into(checkpoint.load_checkpoint(path), net, opt, scheduler=sched)
    hyper = [{k: g[k] for k in ("lr", "momentum", "weight_decay", "nesterov", "initial_lr")} for g in opt.param_groups]
    assert hyper == [dict(lr=0.1, momentum=0.9, weight_decay=0.0, nesterov=False, initial_lr=0.1),
                     dict(lr=0.02, momentum=0.5, weight_decay=0.25, nesterov=True, initial_lr=0.02)]
    assert sched.base_lrs == [0.1, 0.02] and sched.last_epoch == 0


def test_a_scheduler_that_does_not_match_the_checkpoints_is_refused(tmp_path):
    sgd = lambda m: optim.SGD(groups(m, lr=0.02), lr=0.1, momentum=0.9)  # noqa: E731
    steplr = lambda o: lr_scheduler.StepLR(o, step_size=2)  # noqa: E731
    with_step = saved_with(tmp_path, sgd, steplr)
    without = saved_with(tmp_path, sgd, name="plain.ckpt")
    assert "run.ckpt holds a StepLR lr scheduler's state, the run has none; pass the saved run's StepLR" \
        in refused(with_step, sgd)
    assert "plain.ckpt holds no lr scheduler, the run has a StepLR; resume without a scheduler" \
        in refused(without, sgd, steplr)
    assert "holds a StepLR lr scheduler's state, the run has a CosineAnnealingLR; resume with the checkpoint's" \
        in refused(with_step, sgd, lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=3))

    def sequential(o, n):
        return lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(o, step_size=2) for _ in range(n)],
                                         milestones=list(range(3, 3 * n, 3)))
    seq = saved_with(tmp_path, sgd, lambda o: sequential(o, 2), name="seq.ckpt")
    message = refused(seq, sgd, lambda o: sequential(o, 3))
    assert "seq.ckpt: its SequentialLR's state['_milestones'] is [3], expected a list of 2" in message, message
    # a record edited by hand: a scheduler state without one of its keys
    with np.load(with_step) as z:
        entries = {k: z[k] for k in z.files}
    record = json.loads(str(entries["meta"]))
    del record["scheduler"]["state"]["gamma"]
    entries["meta"] = np.array(json.dumps(record))
    edited = tmp_path / "edited.ckpt"
    with open(edited, "wb") as f:
        np.savez(f, **entries)
    assert "edited.ckpt: its StepLR's state holds [" in refused(edited, sgd, steplr)


@pytest.mark.parametrize("value,words", [
    ([], "optimizer is {'type': 'SGD', 'param_groups': []}, expected a mapping of the optimizer's type and its"),
    ([{"params": [0, 1]}, {"params": [3, 4]}], "optimizer param_groups[1] params is [3, 4], expected the parameters' "
                                                "numbers from 2 on"),
    ([{"params": [0, 1], "lr": "fast"}], "optimizer param_groups[0] lr is 'fast', expected a finite number"),
])
def test_a_damaged_group_record_is_refused(tmp_path, value, words):
    path = saved_with(tmp_path, lambda m: optim.SGD(groups(m, lr=0.02), lr=0.1))
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    record = json.loads(str(entries["meta"]))
    record["optimizer"]["param_groups"] = value
    entries["meta"] = np.array(json.dumps(record))
    with open(path, "wb") as f:
        np.savez(f, **entries)
    with pytest.raises(checkpoint.CheckpointError, match="is damaged: its record's ") as e:
        checkpoint.load_checkpoint(path)
    assert words in str(e.value), str(e.value)


def test_version_2_checkpoints_still_load(tmp_path):
    """A checkpoint written before groups were saved (its record: the first group's settings beside the type) loads
    into a one-group optimizer."""
    path = saved_with(tmp_path, lambda m: optim.SGD(m.parameters(), lr=0.125, momentum=0.5, weight_decay=0.25))
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    record = json.loads(str(entries["meta"]))
    group = record["optimizer"]["param_groups"][0]
    del group["params"], record["scheduler"]
    record.update(version=2, optimizer=dict(type="SGD", **group))
    entries["meta"] = np.array(json.dumps(record))
    with open(path, "wb") as f:
        np.savez(f, **entries)
    net = tiny_model()
    opt = optim.SGD(net.parameters(), lr=0.9, momentum=0.9)
    checkpoint.load_into(checkpoint.load_checkpoint(path), net, opt)
    assert (opt.lr, opt.momentum, opt.weight_decay) == (0.125, 0.5, 0.25)


REPLAYED = {  # (optimizer, scheduler, scheduler_interval, the per-epoch lr of its groups or None)
    "sgd-steplr-per-epoch": (lambda m: optim.SGD(groups(m, lr=0.02, momentum=0.0), lr=0.1, momentum=0.9),
                             lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.25), "epoch",
                             [[0.1, 0.02], [0.025, 0.005]]),
    "sgd-steplr-per-step": (lambda m: optim.SGD(groups(m, lr=0.02, momentum=0.0), lr=0.1, momentum=0.9),
                            lambda o: lr_scheduler.StepLR(o, step_size=3, gamma=0.25), "step",
                            [[0.025, 0.005], [0.1 / 16, 0.02 / 16]]),
    # beta1 cycles too: a runtime argument of the replayed step as the lr is
    "adamw-onecycle-per-step": (lambda m: optim.AdamW(groups(m, lr=1e-3), lr=1e-2),
                                lambda o: lr_scheduler.OneCycleLR(o, max_lr=[2e-2, 4e-3], total_steps=8), "step",
                                None),
}


@pytest.mark.parametrize("case", list(REPLAYED))
def test_the_schedule_reaches_replayed_steps(dev, monkeypatch, case):
    """fit's replayed steps read the lr the scheduler set (a runtime argument of the replay, not baked into the
    capture): graphs on and off give the same weights bit for bit, and both differ from the unscheduled run."""
    from clnet import graph
    make_opt, make_sched, interval, expected_lr = REPLAYED[case]
    replays = []
    real = graph.Graph.replay
    monkeypatch.setattr(graph.Graph, "replay", lambda g: (replays.append(1), real(g)))
    runs = {}
    for graphs, schedule in ((False, True), (True, True), (True, False)):
        clnet.manual_seed(3)
        m = tiny_model().to(dev)
        o = make_opt(m)
        s = make_sched(o) if schedule else None
        r = train.fit(m, synthetic(64), epochs=2, batch=16, optimizer=o, scheduler=s, scheduler_interval=interval,
                      device=dev, graphs=graphs)
        runs[graphs, schedule] = m.state_dict(), [e["lr"] for e in r["epochs"]]
    assert len(replays) == 2 * (2 * STEPS_PER_EPOCH - 2)  # two runs with graphs: the first step eager, the second
    (eager, eager_lr), (replayed, replayed_lr) = runs[False, True], runs[True, True]  # captured
    assert eager_lr == replayed_lr and eager_lr != runs[True, False][1]
    assert expected_lr is None or eager_lr == expected_lr
    for k in eager:
        np.testing.assert_array_equal(eager[k], replayed[k], err_msg=k)
    plain = runs[True, False][0]
    assert any(not np.array_equal(plain[k], eager[k]) for k in eager)


def test_fit_refuses_a_scheduler_it_cannot_follow():
    model = tiny_model()
    opt = optim.SGD(model.parameters(), lr=0.1)
    other = lr_scheduler.StepLR(optim.SGD(tiny_model().parameters(), lr=0.1), step_size=1)
    data = synthetic(16)
    with pytest.raises(train.FitError, match="drives another optimizer than the one fit trains with"):
        train.fit(model, data, optimizer=opt, scheduler=other, device="cpu")
    with pytest.raises(train.FitError, match="scheduler_interval is 'batch'; pass 'epoch'"):
        train.fit(model, data, optimizer=opt, scheduler=lr_scheduler.StepLR(opt, 1), scheduler_interval="batch",
                  device="cpu")
    with pytest.raises(train.FitError, match="the scheduler is a function, not a clnet.optim.lr_scheduler"):
        train.fit(model, data, optimizer=opt, scheduler=lambda: None, device="cpu")
    bad = optim.SGD(groups(model, lr=0.02), lr=0.1)
    bad.param_groups[1]["weight_decay"] = float("nan")
    with pytest.raises(train.FitError, match=r"the optimizer's param_groups\[1\]'s weight_decay is nan"):
        train.fit(model, data, optimizer=bad, device="cpu")


@needs_fashion
def test_train_command_follows_a_cosine_schedule(dev, tmp_path):
    ckpt, log = tmp_path / "lenet.ckpt", tmp_path / "log.json"
    args = ["lenet", "--dataset", "fashion-mnist", "--subset", "64", "--test-subset", "32", "--epochs", "2", "--batch",
            "32", "--lr", "0.02", "--schedule", "cosine", "--device", str(dev.index), "--no-tune", "--checkpoint",
            str(ckpt), "--log", str(log)]
    r = CliRunner().invoke(cli.train_command, args)
    assert r.exit_code == 0 and "cosine schedule" in r.output, r.output
    lrs = [e["lr"] for e in json.loads(log.read_text())["epochs"]]
    assert lrs[0] == [0.02] and lrs[1] == [pytest.approx(0.02 * (1 + math.cos(math.pi / 2)) / 2, rel=1e-12)]
    saved = checkpoint.load_checkpoint(ckpt)
    assert saved["config"]["schedule"] == "cosine" and saved["scheduler"]["type"] == "CosineAnnealingLR"
    assert (saved["scheduler"]["state"]["T_max"], saved["scheduler"]["state"]["last_epoch"]) == (2, 2)
    r = CliRunner().invoke(cli.train_command, ["lenet", "--resume", str(ckpt), "--schedule", "constant"])
    assert r.exit_code == 1 and "--schedule constant (checkpoint: cosine)" in r.output, r.output
