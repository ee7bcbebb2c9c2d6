"""Data-parallel training over MPI (clnet.distributed): the shares of a global batch, the post-accumulate-grad hook the
all-reduce starts from, and `mpiexec -n 2` runs of tests/mpi_train.py (lenet, and a network with batch norm, dropout
and a residual block, a few steps on 37 or 33 images) against one process: equal weights and loss curves, resume
under another world size, a failing or hanging rank ending both (the hanging one named), the communication thread
ending on close(); a launch whose MPI disagrees with its launcher refused; a missing device under mpiexec reported
in one line.

The mpiexec runs use one device (PoCL where present; CLNET_MPI_TEST_DEVICE names another) and are skipped when
mpi4py or mpiexec is missing (pip install 'clnet[mpi]' brings both). Each run costs a few seconds, most of it two
Python start-ups.
"""
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import clnet
from clnet import data, nn
from conftest import DEVICES, assert_close_to_terms

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(clnet.__file__)))
sys.path.insert(0, HERE)
import mpi_train  # noqa: E402


def _mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # pip's mpich installs it next to python
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def _test_device():
    wanted = os.environ.get("CLNET_MPI_TEST_DEVICE", "portable computing language").lower()
    chosen = [d for d in DEVICES if wanted in f"{d['name']} {d['platform']}".lower()] or DEVICES
    return chosen[0]["index"] if chosen else None


MPIEXEC, DEVICE = _mpiexec(), _test_device()
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None or DEVICE is None,
                               reason="mpi4py or mpiexec is not installed (pip install 'clnet[mpi]'), or no device")


def run(command, timeout=120, env=None):
    """(exit status, stdout, stderr, seconds) of a command run with the checkout's clnet."""
    environment = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=timeout, env=environment)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{command[0]} did not end within {timeout} s (a hang): {e.output}\n{e.stderr}")
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def mpirun(tmp_path, *args, timeout=120, env=None):
    """mpiexec -n 2 of tests/mpi_train.py; (exit status, output, seconds, rank 0's fit.json or None)."""
    out = tmp_path / "out"
    rc, stdout, stderr, seconds = run([MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "mpi_train.py"),
                                       "--device", DEVICE, "--out", out, *args], timeout, env)
    result = None
    if (out / "fit.json").exists():
        result = json.loads((out / "fit.json").read_text())
        result["weights"] = dict(np.load(out / "fit.npz"))
        if (out / "bn.npz").exists():
            result["bn_state"] = dict(np.load(out / "bn.npz"))
    return rc, stdout + stderr, seconds, result


def assert_same_weights(actual, expected, what, tol=1e-5):
    assert actual.keys() == expected.keys()
    for k in expected:
        if expected[k].dtype.kind == "i":  # batch norm's counter
            assert np.array_equal(actual[k], expected[k]), f"{what}: {k} is {actual[k]}, expected {expected[k]}"
            continue
        scale = np.abs(expected[k]).max()
        err = np.abs(actual[k] - expected[k]).max() / scale
        assert err < tol, f"{what}: {k} differs by {err:.1e} of its largest weight"


# -- shares of a global batch ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,size", [(8, 2), (5, 2), (1, 2), (0, 3), (33, 4), (7, 7), (6, 4), (65, 3)])
def test_shares_cover_the_batch_in_order(n, size):
    bounds = [data.share(n, r, size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "contiguous, in rank order"
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    if n % size == 0:
        assert len(set(sizes)) == 1


def test_indivisible_global_batch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"global batch .* 3 ranks: use a multiple of 3 \(9 or 12\)"):
        data.check_global_batch(10, 3)
    with pytest.raises(ValueError, match=r"multiple of 4 \(4\)"):
        data.check_global_batch(3, 4)
    data.check_global_batch(12, 3)
    data.check_global_batch(5, 1)


def test_fit_refuses_a_batch_that_does_not_split(dev):
    class FakeWorld:  # what fit reads of a DataParallel model: its world
        rank, size = 0, 4
    model = mpi_train.models.build("lenet").to(dev)
    model.__dict__["world"] = FakeWorld()
    with pytest.raises(ValueError, match="multiple of 4"):
        clnet.fit(model, mpi_train.dataset(), batch=10, device=dev)


def test_loader_shards_are_one_process_batches_split(dev):
    ds = data.Dataset(np.arange(11 * 4, dtype=np.uint8).reshape(11, 2, 2), np.arange(11) % 3)
    order = data.epoch_order(11, 5, 0)
    whole = [labels for _, _, labels in data.Loader(ds, 4, dev, order)]
    parts = [[labels for _, _, labels in data.Loader(ds, 4, dev, order, start=1, shard=(r, 3))] for r in range(3)]
    for i, batch in enumerate(whole[1:]):  # started at batch 1, as a resumed epoch does
        assert np.array_equal(np.concatenate([p[i] for p in parts]), batch)
    assert [len(p[-1]) for p in parts] == [1, 1, 1]  # the last batch of 3 splits 1 + 1 + 1
    assert [len(p[0]) for p in parts] == [2, 1, 1]  # a batch of 4 over 3 ranks: shares differ by one


def test_loader_stopped_at_its_last_batch_returns(dev):
    """A consumer that stops while the feeder waits to hand over the end of the epoch: closing must not hang."""
    ds = data.Dataset(np.zeros((6, 2, 2), np.uint8), np.zeros(6))
    it = iter(data.Loader(ds, 2, dev, data.epoch_order(6, 0, 0)))
    next(it)
    time.sleep(0.3)  # the feeder has put the other two batches and waits with the end marker
    closing = threading.Thread(target=it.close, daemon=True)  # a hang, not a slow machine, fails the test
    closing.start()
    closing.join(60)
    assert not closing.is_alive(), "closing the loader hung"


# -- the hook the all-reduce starts from -------------------------------------------------------------------------------
def test_post_accumulate_grad_hook_fires_once_with_the_whole_gradient(dev, rng):
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)).to(dev)
    seen = {}
    for name, p in net.named_parameters():
        p.register_post_accumulate_grad_hook(lambda t, name=name: seen.setdefault(name, []).append(t.grad.numpy()))
    x = clnet.tensor(rng.standard_normal((2, 1, 6, 6)), device=dev)
    nn.CrossEntropyLoss()(net(x), np.array([1, 3])).backward()
    assert sorted(seen) == sorted(n for n, _ in net.named_parameters())
    for name, p in net.named_parameters():
        assert len(seen[name]) == 1
        assert np.array_equal(seen[name][0], p.grad.numpy()), f"{name}: the hook saw a partial gradient"
    order = list(seen)
    assert order.index("3.weight") < order.index("0.weight"), "the last layer's gradient completes first"

    w = clnet.tensor(rng.standard_normal(5), device=dev, requires_grad=True)
    calls = []
    handle = clnet.autograd.register_post_accumulate_grad_hook(w, lambda t: calls.append(t.grad.numpy()))
    (w * w + w).sum().backward()  # three uses of one leaf: the hook waits for the last
    w64 = w.numpy().astype(np.float64)
    assert len(calls) == 1  # and it holds all three: (1 + w) + w rounds twice, so near w = -0.5 it cancels
    assert_close_to_terms(calls[0], 2 * w64 + 1, 2 * np.abs(w64) + 1, "the hooked gradient", tol=1e-6)
    handle.remove()
    (w * 2.0).sum().backward()
    assert len(calls) == 1
    with pytest.raises(RuntimeError, match="only a leaf"):
        clnet.autograd.register_post_accumulate_grad_hook(w * 2.0, print)


def test_import_without_mpi4py_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # what an environment without mpi4py gives
    monkeypatch.delitem(sys.modules, "clnet.distributed", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'clnet\[mpi\]'"):
        importlib.import_module("clnet.distributed")


# -- mpiexec -n 2 against one process --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One mpiexec -n 2 run of mpi_train.py's default work, shared by the tests that read it: lenet's loop, tuning,
    timing and fit, then the batch-norm network's fit and close()."""
    rc, output, seconds, two = mpirun(tmp_path_factory.mktemp("two_ranks"))
    print(f"mpiexec -n 2: {seconds:.1f} s")
    assert rc == 0, output
    return two


@needs_mpi
def test_two_ranks_train_as_one_process(two_ranks):
    two = two_ranks
    dev = clnet.device(DEVICE)
    losses = mpi_train.run_loop(dev, None)
    weights, result = mpi_train.run_fit(dev, None)
    np.testing.assert_allclose(two["loop"], losses, rtol=2e-6, err_msg="the loss curve of the Python-API loop")
    np.testing.assert_allclose([r["train_loss"] for r in two["history"]], [r["train_loss"] for r in result["epochs"]],
                               rtol=2e-6, err_msg="fit's loss curve (the last batch of each epoch split 3 + 2)")
    assert [r["test_accuracy"] for r in two["history"]] == [r["test_accuracy"] for r in result["epochs"]]
    assert [r["lr"] for r in two["history"]] == [r["lr"] for r in result["epochs"]] == [[0.05], [0.025]], \
        "fit's StepLR on every rank (stepped at each epoch's end)"
    assert two["global_step"] == result["global_step"] == 10
    assert_same_weights(two["weights"], weights, "fit on two ranks against one process")
    # rank 0 tuned while rank 1 waited; rank 1 took rank 0's table
    entry = dict(kernel="none")
    assert two["extras"]["tuning"] == [dict(rank=0, returned="tuned", entry=entry),
                                       dict(rank=1, returned=None, entry=entry)]
    assert two["extras"]["in_sync"] == [True, False, True], "in sync; rank 1's weights changed; rank 0's again"
    timing = two["extras"]["timing"]
    assert timing["ranks"] == 2 and timing["gradient_bytes"] == 4 * 431080 and 0 < timing["efficiency"]
    assert all(r["step_s"] > 0 and r["compute_s"] > 0 for r in timing["per_rank"])


@needs_mpi
def test_batch_norm_dropout_and_residual_train_on_two_ranks_as_one_process_of_shares(two_ranks):
    """clnet.fit of a network with batch norm, dropout and a residual block on two ranks (each epoch's end gives
    every rank rank 0's buffers: the step that failed on a 0-d num_batches_tracked) against one process that runs
    each global batch's two shares in turn, each with its rank's random stream, keeping rank 0's statistics."""
    bn = two_ranks["bn"]
    assert bn is not None and bn["global_step"] == 10
    sums = bn["sums"]
    assert len(sums) == 2 and sums[0] == sums[1], "the ranks end with different weights or buffers"
    state, history = mpi_train.run_shares(clnet.device(DEVICE))
    assert two_ranks["bn_state"]["1.num_batches_tracked"] == 10  # rank 0's 10 forwards (5 steps x 2 epochs)
    assert_same_weights(two_ranks["bn_state"], state, "two ranks against one process of shares")
    for key in ("train_loss", "test_loss"):
        np.testing.assert_allclose([r[key] for r in bn["history"]], [r[key] for r in history], rtol=1e-5,
                                   err_msg=f"fit's {key} per epoch")
    assert [r["test_accuracy"] for r in bn["history"]] == [r["test_accuracy"] for r in history]


@needs_mpi
def test_close_ends_the_communication_thread(two_ranks):
    closed = two_ranks["bn"]["closed"]
    assert closed == dict(started=True, ended=True, left=[]), closed


@needs_mpi
def test_resume_one_rank_run_on_two_ranks(tmp_path):
    """A one-process run stopped after 3 steps, resumed by two ranks (33 images: each epoch's last batch of 1 leaves
    rank 1 nothing), ends where the uninterrupted one-process run does; only rank 0 writes the checkpoint."""
    dev = clnet.device(DEVICE)
    ckpt = tmp_path / "run.ckpt"
    _, first = mpi_train.run_fit(dev, None, max_steps=3, checkpoint=ckpt, images=33)
    assert first["stopped"] and ckpt.exists()
    before = ckpt.stat().st_mtime_ns
    rc, output, _, two = mpirun(tmp_path, "--no-loop", "--images", 33, "--resume", ckpt, "--checkpoint", ckpt)
    assert rc == 0, output
    assert ckpt.stat().st_mtime_ns != before
    weights, whole = mpi_train.run_fit(dev, None, images=33)
    assert two["global_step"] == whole["global_step"] == 10
    np.testing.assert_allclose([r["train_loss"] for r in two["history"]], [r["train_loss"] for r in whole["epochs"]],
                               rtol=2e-6)
    assert_same_weights(two["weights"], weights, "resumed on two ranks against one uninterrupted process")


@needs_mpi
def test_failing_rank_ends_every_rank_naming_it(tmp_path):
    rc, output, seconds, result = mpirun(tmp_path, "--no-loop", "--fail-rank", 1, "--fail-step", 2, timeout=60)
    assert rc != 0 and result is None
    assert "RuntimeError: injected failure at step 2" in output
    assert "clnet.distributed: rank 1 of 2" in output and "stopping every rank" in output, output


@needs_mpi
def test_hanging_rank_is_caught_by_the_deadline_and_named(tmp_path):
    """Rank 1 stops in step 2's forward; every rank's deadline drops to 2 s at step 2 (step 1 built the kernels under
    the default). Rank 0 waits in step 2's first gradient all-reduce, tells rank 1 after a second, hears nothing
    back, and names rank 1 when its deadline passes."""
    rc, output, seconds, result = mpirun(tmp_path, "--no-loop", "--hang-rank", 1, "--hang-step", 2,
                                         "--hang-timeout", 2, timeout=60)
    assert rc != 0 and result is None
    assert re.search(r"clnet\.distributed: rank 0 of 2 \(host [^)]*\): the all-reduce of gradient bucket 0 waited "
                     r"more than 2 s for rank 1, which never reached it", output), output


@needs_mpi
def test_mpi_that_disagrees_with_its_launcher_is_refused():
    """One process whose environment says a launcher started it as one of several ranks, as an mpiexec of another
    MPI than mpi4py's does, is refused naming the variable and MPI's size; a launcher's one-rank job is accepted."""
    script = ("import json, os, clnet, clnet.distributed as dist\n"
              "seen = {}\n"
              "for name, value in [('PMI_SIZE', '2'), ('OMPI_COMM_WORLD_SIZE', '4'), ('MPI_LOCALNRANKS', '3'),\n"
              "                    ('PMI_RANK', '1'), ('PMI_SIZE', '1')]:\n"
              "    os.environ[name] = value\n"
              "    dist._world = None\n"
              "    try:\n"
              "        seen[f'{name}={value}'] = repr(dist.init())\n"
              "    except clnet.Error as e:\n"
              "        seen[f'{name}={value}'] = type(e).__name__ + ': ' + str(e)\n"
              "    del os.environ[name]\n"
              "print(json.dumps(seen))\n")
    env = {k: "" for k in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")}
    rc, out, err, _ = run([sys.executable, "-c", script], env=env)
    assert rc == 0, err
    seen = json.loads(out)
    for said, ranks in (("PMI_SIZE=2", "2"), ("OMPI_COMM_WORLD_SIZE=4", "4"), ("MPI_LOCALNRANKS=3", "3"),
                        ("PMI_RANK=1", "at least 2")):
        message = seen[said]
        assert message.startswith("MPIMismatch: "), message
        assert "\n" not in message
        assert f"one of {ranks} ranks ({said})" in message and "MPI says the job has 1 rank" in message, message
        assert "launch with" in message and "mpiexec" in message, message
    assert seen["PMI_SIZE=1"].startswith("World(rank 0 of 1"), seen["PMI_SIZE=1"]


def clnet_train(tmp_path, *args):
    """The command line of `clnet train lenet` (the checkout's) on 4 training and 2 test images written to
    tmp_path."""
    for split, n in (("train", 4), ("t10k", 2)):
        data.write_idx(tmp_path / f"{split}-images-idx3-ubyte", np.zeros((n, 28, 28), np.uint8))
        data.write_idx(tmp_path / f"{split}-labels-idx1-ubyte", np.zeros(n, np.uint8))
    return [sys.executable, "-c", "from clnet.cli import main; main()", "train", "lenet", "--dataset", "mnist",
            "--data-dir", tmp_path, "--batch", 2, "--epochs", 1, *args]


def test_clnet_train_with_a_disagreeing_launcher_is_one_line(tmp_path):
    """`clnet train` started as one of several ranks by a launcher whose MPI is not mpi4py's: one line, status 1."""
    rc, out, err, _ = run([str(a) for a in clnet_train(tmp_path)], env=dict(PMI_SIZE="2"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("Error: clnet.distributed: the launcher started "
                                                               "this process as one of 2 ranks (PMI_SIZE=2)"), err


@needs_mpi
def test_missing_device_under_mpiexec_is_one_line_from_rank_0(tmp_path):
    """`mpiexec -n 2 clnet train --device 99` prints what one process prints, once, and exits 1 (it printed a
    traceback from each rank)."""
    train = clnet_train(tmp_path, "--device", 99)
    rc, out, err, _ = run(train, timeout=60)
    assert rc == 1 and out == "" and err.startswith("Error: no OpenCL device with index 99") and \
        err.count("\n") == 1, (out, err)
    rc2, out2, err2, _ = run([MPIEXEC, "-n", 2] + train, timeout=60)
    assert (rc2, out2, err2) == (1, "", err)


@needs_mpi
def test_command_error_on_rank_0_alone_is_one_report(tmp_path):
    """A checkpoint rank 0 alone cannot write (its folder is a file) ends both ranks with rank 0's one line and no
    traceback: MPI_Abort returns before the launcher kills the rank, and the rank reported a second time meanwhile."""
    (tmp_path / "file").write_text("")
    rc, out, err, _ = run([MPIEXEC, "-n", 2] + clnet_train(tmp_path, "--device", DEVICE, "--no-tune", "--checkpoint",
                                                           tmp_path / "file" / "run.ckpt"), timeout=120)
    reports = [line for line in err.splitlines() if line.startswith("clnet.distributed:")]
    assert rc != 0 and len(reports) == 1 and "Traceback" not in err, err
    assert re.match(r"clnet\.distributed: rank 0 of 2 \(host [^)]*\): error: .*run\.ckpt", reports[0]), err
