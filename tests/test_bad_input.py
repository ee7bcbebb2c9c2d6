"""Bad input to training, data and checkpoints: a one-line error naming the problem, a non-zero exit, nothing lost.

A command's run is checked through what a user sees: the exit status, one line of message (click's `Error: ...`)
and no traceback. The data sets are tiny IDX files written here; the one network the commands train is lenet on
them, a few steps at a time."""
import errno
import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import checkpoint, cli, data, nn, optim, rng, train

from conftest import DEVICES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_error(r, status=1, alone=True):
    """The command failed with `status`, printing one line of message (the only line, with `alone`; click's usage
    errors, status 2, put the usage before it) and no traceback."""
    assert r.exit_code == status, (r.exit_code, r.output, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception  # not an exception that escaped click
    assert "Traceback" not in r.output, r.output
    lines = r.output.strip("\n").split("\n")
    assert lines[-1].startswith("Error: "), r.output
    if status == 1 and alone:
        assert len(lines) == 1, r.output
    return lines[-1]


def idx_dir(path, train=40, test=12, size=28, rng_=None):
    """A tiny mnist directory: `train` and `test` images of size x size (a bright bar by class) and their labels."""
    r = rng_ or np.random.default_rng(0)
    path.mkdir(exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        labels = r.integers(0, 10, n).astype(np.uint8)
        images = r.integers(0, 40, (n, size, size)).astype(np.uint8)
        for i, c in enumerate(labels):
            images[i, 2 * c:2 * c + 4, 3:9] = 240
        images_name, labels_name = data.FILES[split]
        data.write_idx(path / (images_name + ".gz"), images)
        data.write_idx(path / labels_name, labels)
    return path


def tiny_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10))


def synthetic(n, seed=1):
    r = np.random.default_rng(seed)
    labels = r.integers(0, 10, n).astype(np.uint8)
    images = r.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c:2 * c + 6, 4:10] = 250
    return data.Dataset(images, labels, "synthetic", 0.2, 0.3)


def train_args(d, dev, *more):
    return ["lenet", "--dataset", "mnist", "--data-dir", str(d), "--epochs", "1", "--batch", "16",
            "--device", str(dev.index), "--no-tune", *more]


# -- data -------------------------------------------------------------------------------------------------------------
def test_a_flipped_byte_in_gzip_data_is_an_idx_error(tmp_path):
    """Every byte of the compressed stream and its trailer flipped in turn: an IDXError naming the file (a flip in
    the deflate data raised zlib.error, which was not caught)."""
    images = np.zeros((6, 28, 28), np.uint8)
    images[:, 5:20, 8:12] = 200  # compressible: the flips land in deflate codes, not in stored blocks
    raw = bytes([0, 0, 0x08, 3]) + b"".join(int(d).to_bytes(4, "big") for d in images.shape) + images.tobytes()
    packed = gzip.compress(raw)
    path = tmp_path / "flipped-images.gz"
    for at in range(10, len(packed)):  # after the 10-byte gzip header (whose time stamp may change freely)
        bad = bytearray(packed)
        bad[at] ^= 0xFF
        path.write_bytes(bytes(bad))
        with pytest.raises(data.IDXError, match="flipped-images.gz: damaged gzip data"):
            data.read_idx(path)


def test_idx_dimensions_whose_product_overflows_int64(tmp_path):
    """Four dimensions of 2^16 multiply to 2^64, which wraps to 0 in int64: the header then 'matched' an empty
    body."""
    path = tmp_path / "huge"
    path.write_bytes(bytes([0, 0, 0x08, 4]) + (65536).to_bytes(4, "big") * 4)
    with pytest.raises(data.IDXError, match=r"huge: truncated: dimensions \(65536, 65536, 65536, 65536\)"):
        data.read_idx(path)


@pytest.mark.parametrize("case", ["no-training-images", "no-test-images", "32x32-images"])
def test_train_command_refuses_data_it_cannot_use_before_training(dev, tmp_path, case):
    d = idx_dir(tmp_path / "mnist", train=0 if case == "no-training-images" else 20,
                test=0 if case == "no-test-images" else 6, size=32 if case == "32x32-images" else 28)
    r = CliRunner().invoke(cli.train_command, train_args(d, dev))
    line = one_line_error(r)
    expected = {"no-training-images": "train-images-idx3-ubyte.gz holds no images",
                "no-test-images": "t10k-images-idx3-ubyte.gz holds no images",
                "32x32-images": r"holds images of shape (1, 32, 32); lenet takes (1, 28, 28)"}[case]
    assert expected in line, line
    assert "epoch 1/1" not in r.output  # refused before a step ran


def test_fit_refuses_empty_data_sets_before_the_first_step(dev):
    train_set, empty = synthetic(20), synthetic(20).subset(None)
    empty = data.Dataset(empty.images[:0], empty.labels[:0])
    clnet.manual_seed(1)
    model = tiny_model().to(dev)
    before = model.state_dict()
    with pytest.raises(train.FitError, match="the training set holds no images"):
        train.fit(model, empty, epochs=1, batch=8, device=dev)
    with pytest.raises(train.FitError, match="the test set holds no images"):
        train.fit(model, train_set, empty, epochs=1, batch=8, device=dev)
    odd = data.Dataset(np.zeros((4, 30, 30), np.uint8), np.zeros(4, np.uint8))
    with pytest.raises(train.FitError, match=r"test images have shape \(1, 30, 30\), the training images \(1, 28"):
        train.fit(model, train_set, odd, epochs=1, batch=8, device=dev)
    for k, a in model.state_dict().items():  # nothing trained
        np.testing.assert_array_equal(a, before[k], err_msg=k)


def test_fit_takes_arrays_as_the_dataset_they_make(dev):
    """(images, labels) NumPy arrays train exactly as the Dataset of the same values; anything else is refused by
    name (it died on "'tuple' object has no attribute 'batch'")."""
    ds, test = synthetic(40), synthetic(12, seed=2)
    x, y = ds.batch(np.arange(len(ds)))  # the normalised float32 images: a Dataset's batch of them is the same
    xt, yt = test.batch(np.arange(len(test)))
    runs = []
    features = (x.reshape(len(x), -1), y), (xt.reshape(len(xt), -1), yt)  # (N, 784): for dense layers alone
    for train_data, test_data in ((ds, test), ((x, y), (xt, yt)), features):
        clnet.manual_seed(4)
        model = tiny_model() if train_data is not features[0] else nn.Sequential(*list(tiny_model())[1:])
        result = train.fit(model, train_data, test_data, epochs=1, batch=16, lr=0.05, device=dev, seed=2)
        runs.append((list(model.state_dict().values()), result["final"]["accuracy"],
                     result["epochs"][0]["train_loss"]))
    for b, acc_b, loss_b in runs[1:]:
        a, acc_a, loss_a = runs[0]
        assert (acc_a, loss_a) == (acc_b, loss_b)
        for i, (wa, wb) in enumerate(zip(a, b)):
            np.testing.assert_array_equal(wa, wb, err_msg=str(i))
    with pytest.raises(TypeError, match=r"fit: train_data: expected a clnet.data.Dataset or a pair of NumPy arrays "
                                        r"\(images, labels\), got a tuple of 3 items"):
        train.fit(tiny_model(), (x, y, y), device=dev)
    with pytest.raises(TypeError, match="fit: test_data: .*got a list"):
        train.fit(tiny_model(), (x, y), [1, 2], device=dev)
    with pytest.raises(ValueError, match=r"fit: train_data: Dataset: expected images .* got \(40, 1, 28, 28\) and "
                                         r"\(39,\)"):
        train.fit(tiny_model(), (x, y[:-1]), device=dev)


# -- learning rate, weight decay, divergence ---------------------------------------------------------------------------
@pytest.mark.parametrize("option,value", [("--lr", "nan"), ("--lr", "inf"), ("--lr", "-0.1"),
                                          ("--momentum", "nan"), ("--weight-decay", "inf")])
def test_train_command_refuses_hyperparameters_that_are_not_finite(tmp_path, option, value):
    """Refused while the options are read (click's usage error, status 2), before any data or device is touched: the
    data directory does not even exist."""
    r = CliRunner().invoke(cli.train_command, ["lenet", "--data-dir", str(tmp_path / "absent"), option, value])
    line = one_line_error(r, status=2)
    assert option in line and (value.lstrip("-") in line or "range" in line), line


def test_fit_refuses_a_learning_rate_that_is_not_a_number(dev):
    model = tiny_model()
    for lr in (float("nan"), float("inf")):
        with pytest.raises(train.FitError, match=f"fit: lr is {lr}; it must be a finite number"):
            train.fit(model, synthetic(16), lr=lr, device=dev)
    opt = optim.SGD(model.parameters(), lr=0.1)
    opt.param_groups[0]["lr"] = float("nan")  # SGD's own check lets NaN through (nan <= 0 is false)
    with pytest.raises(train.FitError, match="the optimizer's lr is nan"):
        train.fit(model, synthetic(16), optimizer=opt, device=dev)


def test_divergence_from_a_huge_weight_decay_names_the_weight_decay(dev):
    clnet.manual_seed(3)
    with pytest.raises(train.Diverged, match=r"is (nan|inf); the weight decay 1e\+30 is far above usual values") as e:
        train.fit(tiny_model(), synthetic(64), epochs=1, batch=16, lr=0.05, weight_decay=1e30, device=dev)
    assert "lower the learning rate" not in str(e.value)


# -- files that cannot be written --------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["log-fifo", "log-under-a-file", "plot-under-a-file"])
def test_train_command_refuses_a_log_or_plot_it_cannot_write_before_training(dev, tmp_path, monkeypatch, target):
    """A FIFO (or /dev/full: a device the atomic rename would have replaced) and a path under a regular file (what a
    read-only folder is to a user who is not root) are refused before the first step, not after the last."""
    d = idx_dir(tmp_path / "mnist", train=20, test=6)
    (tmp_path / "a-file").write_text("")
    path = str(tmp_path / "a-file" / "out") if "under" in target else str(tmp_path / "fifo")
    if target == "log-fifo":
        os.mkfifo(path)
    monkeypatch.setattr(cli, "_pyplot", lambda: None)  # the check needs no matplotlib
    option = "--plot" if target.startswith("plot") else "--log"
    r = CliRunner().invoke(cli.train_command, train_args(d, dev, option, path))
    line = one_line_error(r)
    assert line.startswith(f"Error: {option} {path} ")
    assert ("not a regular file" if target == "log-fifo" else "cannot be written") in line, line
    assert "epoch 1/1" not in r.output
    if target == "log-fifo":
        assert stat.S_ISFIFO(os.stat(path).st_mode)  # still the FIFO


def test_a_log_that_fails_to_write_after_an_epoch_keeps_the_checkpoint(dev, tmp_path, monkeypatch):
    """The disk fills during the run: the log's write fails after the epoch's checkpoint is written, and the error
    says where the run is kept."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(train, "write_atomically", full)  # the log's writer; checkpoints write through their own
    ckpt, log = tmp_path / "run.ckpt", tmp_path / "log.json"
    clnet.manual_seed(2)
    with pytest.raises(train.WriteError, match=f"cannot write the log {log} .No space left on device.; the "
                                               f"checkpoint {ckpt} holds the run"):
        train.fit(tiny_model(), synthetic(32), epochs=2, batch=16, device=dev, checkpoint=ckpt, log=log)
    assert checkpoint.load_checkpoint(ckpt)["epoch"] == 1


def test_a_plot_that_fails_to_write_after_training_says_where_the_run_is_kept(dev, tmp_path, monkeypatch):
    """The disk fills during the run: the plot's write after the last epoch fails in one line that says the training
    is done and where its checkpoint and log are."""
    d = idx_dir(tmp_path / "mnist", train=20, test=6)
    ckpt, log, plot = tmp_path / "run.ckpt", tmp_path / "log.json", tmp_path / "curves.png"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cli, "_pyplot", lambda: None)  # the check before training needs no matplotlib
    monkeypatch.setattr(cli, "plot_history", full)
    r = CliRunner().invoke(cli.train_command, train_args(d, dev, "--checkpoint", str(ckpt), "--log", str(log),
                                                         "--plot", str(plot)))
    line = one_line_error(r, alone=False)  # the epoch's report comes first
    assert line == (f"Error: cannot write the plot {plot} (No space left on device); the training is done and kept "
                    f"in {ckpt}, the figures in {log}"), line
    assert "epoch 1/1" in r.output and checkpoint.load_checkpoint(ckpt)["epoch"] == 1 and log.exists()


def test_tune_command_fails_when_the_cache_cannot_be_written(dev, cache_dir, monkeypatch):
    """It exited 0, having tuned for the whole budget and kept nothing: refused before tuning when the cache's
    folder cannot be made, and a failure when the tuned shapes are not in the file afterwards (a full disk)."""
    (cache_dir / "a-file").write_text("")
    monkeypatch.setenv("CLNET_CACHE_DIR", str(cache_dir / "a-file" / "cache"))
    r = CliRunner().invoke(cli.main, ["tune", "lenet", "--device", str(dev.index), "--budget", "0"])
    assert "cannot be written" in one_line_error(r)
    monkeypatch.setenv("CLNET_CACHE_DIR", str(cache_dir))
    from clnet import tune as tune_mod, tuning

    def tuned_but_not_stored(name, dev, batch, **kwargs):  # tuning.store warns and goes on when its write fails
        return dict(device=tuning.device_key(dev), tuned={"gemm 1x2x3": dict(choice="x", ms=1.0, default_ms=2.0)},
                    cached=0, left=[], seconds=0.1)

    monkeypatch.setattr(tune_mod, "tune_model", tuned_but_not_stored)
    r = CliRunner().invoke(cli.main, ["tune", "lenet", "--device", str(dev.index)])
    line = one_line_error(r, alone=False)  # after the command's report of what it tuned
    assert line.startswith("Error: tune: 1 of the 1 tuned shapes could not be saved to the cache"), line


# -- checkpoints -------------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    """A checkpoint of tiny_model after 1 epoch and 2 steps of 3 (40 images in batches of 16), written from host
    weights (no device): (path, model, its meta record)."""
    path = tmp_path / "tiny.ckpt"
    rng.manual_seed(0)
    net = tiny_model()
    meta = dict(model="tiny", architecture=repr(net), epoch=1, step=2, global_step=5, rng_state=rng.get_state(),
                config=dict(batch=16, seed=0, train_images=40, lr=0.1), history=[dict(epoch=1, train_loss=2.0)],
                running=dict(loss=3.0, correct=4, seen=32, seconds=0.5, wait=0.0))
    checkpoint.save_checkpoint(path, net, optim.SGD(net.parameters(), lr=0.1, momentum=0.9), meta)
    return path, net, meta


def rewrite(path, out, meta=None, arrays=None):
    """A copy of checkpoint PATH at OUT with record fields and arrays replaced."""
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    record = json.loads(str(entries["meta"]))
    record.update(meta or {})
    entries.update(arrays or {}, meta=np.array(json.dumps(record)))
    with open(out, "wb") as f:  # a file, not a name: np.savez would add .npz to the name
        np.savez(f, **entries)
    return out


@pytest.mark.parametrize("field,value,words", [
    ("epoch", "abc", "epoch is 'abc', expected a whole number"),
    ("epoch", True, "epoch is True, expected a whole number"),
    ("step", 10**12, "step is 1000000000000, expected less than the 3 steps of an epoch"),
    ("global_step", 7, "global_step is 7, expected 5"),
    ("history", 5, "history is 5, expected a list"),
    ("history", [], "history is '0 epochs', expected one entry for each of the 1 finished epochs"),
    ("rng_state", {"bit_generator": "PCG64", "state": "junk"}, "rng_state is {'bit_generator'"),
    ("rng_state", "junk", "rng_state is 'junk', expected the state of NumPy's PCG64 generator"),
    ("running", {"loss": "x"}, "running is {'loss': 'x'}"),
    ("config", {"batch": 0, "train_images": 40}, "config batch is 0"),
    ("config", {"batch": 16, "train_images": 40, "lr": "fast"}, "config lr is 'fast'"),
    ("optimizer", {"type": "SGD", "lr": 0.1}, "optimizer is {'type': 'SGD', 'lr': 0.1}, expected a mapping"),
    ("optimizer", {"type": "SGD", "param_groups": [{"params": [0, 1, 2, 3], "lr": None}]},
     "optimizer param_groups[0] lr is None"),
    ("scheduler", {"type": "StepLR"}, "scheduler is {'type': 'StepLR'}, expected none or a mapping"),
    ("model", 3, "model is 3, expected a string"),
])
def test_a_record_of_the_wrong_types_is_refused_naming_the_field(saved, tmp_path, field, value, words):
    path, _, _ = saved
    bad = rewrite(path, tmp_path / "bad.ckpt", {field: value})
    with pytest.raises(checkpoint.CheckpointError, match="bad.ckpt is damaged: its record's ") as e:
        checkpoint.load_checkpoint(bad)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_train_command_refuses_a_resume_record_of_the_wrong_types(saved, tmp_path):
    path, _, _ = saved
    bad = rewrite(path, tmp_path / "bad.ckpt", {"model": "lenet", "step": 10**12})
    line = one_line_error(CliRunner().invoke(cli.train_command, ["lenet", "--resume", str(bad)]))
    assert "its record's step is 1000000000000" in line
    config = dict(checkpoint.load_checkpoint(path)["config"], dataset="cifar-11")
    bad = rewrite(path, tmp_path / "bad.ckpt", {"model": "lenet", "config": config})
    line = one_line_error(CliRunner().invoke(cli.train_command, ["lenet", "--resume", str(bad)]))
    assert "its record's data set 'cifar-11' is not one clnet knows" in line


def test_load_into_checks_the_optimizer_before_it_applies_anything(saved):
    path, _, _ = saved
    ckpt = checkpoint.load_checkpoint(path)
    rng.manual_seed(9)
    model = tiny_model()
    before, stream = model.state_dict(), rng.get_state()
    with pytest.raises(checkpoint.CheckpointError, match="holds SGD state, the run uses Adam"):
        checkpoint.load_into(ckpt, model, optim.Adam(model.parameters()))
    for k, a in model.state_dict().items():
        np.testing.assert_array_equal(a, before[k], err_msg=k)
    assert rng.get_state() == stream


def test_weights_of_other_dtypes_follow_one_rule(saved, tmp_path):
    """Real floating weights are cast to float32 (as PyTorch's load_state_dict casts); complex, integer and boolean
    weights are refused, with nothing applied."""
    path, net, _ = saved
    key = "1.weight"
    wide = net.state_dict()[key].astype(np.float64) + 1e-9  # float64 digits beyond float32's
    ckpt = checkpoint.load_checkpoint(rewrite(path, tmp_path / "f64.ckpt", arrays={f"model/{key}": wide}))
    model = tiny_model()
    checkpoint.load_into(ckpt, model, None)
    np.testing.assert_array_equal(model.state_dict()[key], wide.astype(np.float32))
    for kind, array in (("complex128", wide + 1j), ("int32", np.ones(wide.shape, np.int32)),
                        ("bool", np.ones(wide.shape, bool))):
        ckpt = checkpoint.load_checkpoint(rewrite(path, tmp_path / f"{kind}.ckpt", arrays={f"model/{key}": array}))
        rng.manual_seed(5)
        model = tiny_model()
        before = model.state_dict()
        with pytest.raises(checkpoint.CheckpointError, match=f"weight '{key}' is {kind}, not a floating type"):
            checkpoint.load_into(ckpt, model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        for k, a in model.state_dict().items():
            np.testing.assert_array_equal(a, before[k], err_msg=k)


def test_a_fifo_given_as_the_checkpoint_is_refused_without_waiting(tmp_path):
    """Opening a FIFO for reading waits for a writer that never comes: the resume hung."""
    fifo = str(tmp_path / "fifo.ckpt")
    os.mkfifo(fifo)
    outcome = []

    def load():
        try:
            checkpoint.load_checkpoint(fifo)
        except checkpoint.CheckpointError as e:
            outcome.append(str(e))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(60)  # a guard against a hang, not a timing: the refusal takes no time at all
    if t.is_alive():  # release the reader that waits (a writer that opens and closes at once)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("load_checkpoint waited on a FIFO")
    assert outcome and "fifo.ckpt is a FIFO, not a checkpoint file" in outcome[0], outcome


# -- resuming and signals ----------------------------------------------------------------------------------------------
def test_resume_keeps_the_test_subset(dev, tmp_path):
    d = idx_dir(tmp_path / "mnist", train=32, test=12)
    ckpt = tmp_path / "run.ckpt"
    r = CliRunner().invoke(cli.train_command, train_args(d, dev, "--test-subset", "5", "--checkpoint", str(ckpt)))
    assert r.exit_code == 0 and "(32 training, 5 test images)" in r.output, r.output
    assert checkpoint.load_checkpoint(ckpt)["config"]["test_subset"] == 5
    args = ["lenet", "--resume", str(ckpt), "--data-dir", str(d), "--epochs", "2", "--device", str(dev.index),
            "--no-tune"]
    r = CliRunner().invoke(cli.train_command, args)
    assert r.exit_code == 0 and "(32 training, 5 test images)" in r.output, r.output
    r = CliRunner().invoke(cli.train_command, args[:-1] + ["--test-subset", "7", "--no-tune"])
    assert "--test-subset 7 (checkpoint: 5)" in one_line_error(r)


@pytest.mark.parametrize("signum,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_checkpoints_prints_the_resume_command_and_exits_128_plus_it(tmp_path, signum, status):
    """`clnet train` in a process of its own, signalled once its first step is done: it finishes the step, writes
    the checkpoint, prints the command that continues the run, and exits with 128 + the signal (SIGTERM killed it,
    with the epoch's work lost). One device: the run is the same everywhere."""
    d = idx_dir(tmp_path / "mnist", train=32, test=6)
    ckpt = tmp_path / "run.ckpt"
    args = [sys.executable, "-m", "clnet.cli", "train", *train_args(d, clnet.device(DEVICES[0]["index"]))]
    args[args.index("--epochs") + 1] = "100000"  # it never finishes by itself: the signal always finds it running
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen(args + ["--checkpoint", str(ckpt)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines = []
    watchdog = threading.Timer(300, p.kill)  # a run that hangs before its first step fails instead of waiting forever
    watchdog.start()
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("first step done"):
                p.send_signal(signum)
                break
        out, _ = p.communicate(timeout=300)
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
    out = "".join(lines) + out
    assert p.returncode == status, out
    assert "Traceback" not in out, out
    assert f"Continue with: clnet train lenet --resume {ckpt}" in out, out
    saved = checkpoint.load_checkpoint(ckpt)
    assert saved["global_step"] >= 1


@pytest.mark.parametrize("name,value", [("batch", 0), ("batch", -3), ("batch", "4"), ("batch", 2.5),
                                        ("epochs", None), ("epochs", 1.5), ("max_steps", -1), ("seed", None)])
def test_fit_refuses_counts_that_are_not_whole_numbers(dev, name, value):
    """A FitError naming the argument before any step (ZeroDivisionError and TypeError escaped before; 1.5 epochs ran
    two)."""
    args = dict(dict(epochs=1, batch=16, device=dev), **{name: value})
    with pytest.raises(train.FitError, match=rf"fit: {name} is {value!r}; it must be a whole number of at least"):
        train.fit(tiny_model(), synthetic(32), **args)
    with pytest.raises(train.FitError, match=r"evaluate: batch is 0"):
        train.evaluate(tiny_model(), synthetic(8), batch=0, device=dev)


def test_fit_resumes_what_it_saved(dev, tmp_path):
    """max_steps counts the steps of a resumed run too (a run resumed at its max_steps trained one more and wrote its
    checkpoint over; max_steps=0 trained one); a checkpoint whose group holds a setting of the user's ("name") or
    whose schedule reached lr 0 resumes (both were refused as damaged); a model with a frozen layer trains, the layer
    unchanged (its optimizer refused it)."""
    path = tmp_path / "run.ckpt"
    assert train.fit(tiny_model(), synthetic(64), epochs=3, batch=16, max_steps=0, device=dev)["global_step"] == 0
    train.fit(tiny_model(), synthetic(64), epochs=3, batch=16, max_steps=4, checkpoint=path, device=dev)
    again = train.fit(tiny_model(), synthetic(64), epochs=3, batch=16, max_steps=4, checkpoint=path, resume=path,
                      device=dev)
    assert again["global_step"] == 4 and again["stopped"]
    old = checkpoint.load_checkpoint(path)  # a record written before fit kept the run's epochs
    del old["config"]["epochs"]
    assert train.fit(tiny_model(), synthetic(64), epochs=3, batch=16, resume=old, device=dev)["global_step"] == 12

    def run(resume=None):
        model = tiny_model()
        opt = optim.SGD([{"params": model.parameters(), "name": "all"}], lr=0.1, momentum=0.9)
        sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)  # lr 0 after two epochs
        return train.fit(model, synthetic(32), epochs=4, batch=16, optimizer=opt, scheduler=sched,
                         checkpoint=tmp_path / "named.ckpt", resume=resume, max_steps=None if resume else 5,
                         device=dev)
    run()
    assert run(resume=tmp_path / "named.ckpt")["global_step"] == 8
    model = tiny_model().to(dev)
    frozen = model[1]
    for p in frozen.parameters():
        p.requires_grad_(False)
    before = frozen.weight.numpy().copy()
    assert train.fit(model, synthetic(32), epochs=1, batch=16, device=dev, weight_decay=0.1)["global_step"] == 2
    np.testing.assert_array_equal(frozen.weight.numpy(), before)


def test_fit_refuses_float_labels_of_a_data_set_of_its_own_before_training(dev):
    """A data set of the user's whose labels are floats is refused before the first step (the epoch trained on them
    cast, then its test pass failed with a raw IndexError and no checkpoint was written)."""
    class Floats:
        def __len__(self):
            return 8

        def batch(self, idx):
            return np.zeros((len(idx), 1, 28, 28), np.float32), (np.asarray(idx) % 3).astype(np.float32)
    with pytest.raises(train.FitError, match=r"fit: the training set's batch\(\) gives labels of dtype float32; "
                                             r"class labels must be integers"):
        train.fit(tiny_model(), Floats(), epochs=1, batch=4, device=dev)
