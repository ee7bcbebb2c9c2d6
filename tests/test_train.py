"""Training end to end: the IDX reader, the batch loader, fit on real Fashion-MNIST, checkpoints (resume equivalence,
atomic writes, damaged and wrong-model files, Ctrl-C) and the `train` / `eval` commands."""
import gzip
import hashlib
import json
import os
import queue
import signal
import types

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import checkpoint, cli, data, models, nn, ops, optim, train
from clnet.tensor import empty


def fashion_available():
    try:
        data.find_files("fashion-mnist", "train")
        data.find_files("fashion-mnist", "test")
        return True
    except data.DataNotFound:
        return False


needs_fashion = pytest.mark.skipif(not fashion_available(), reason="Fashion-MNIST is not installed: "
                                   "apt-get install dataset-fashion-mnist, or set CLNET_DATA to the IDX files")


def idx_bytes(code, array_bytes, dims):
    """An IDX file written by hand, independent of data.write_idx."""
    return bytes([0, 0, code, len(dims)]) + b"".join(int(d).to_bytes(4, "big") for d in dims) + array_bytes


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tiny_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 10))


def synthetic(n=160, seed=1):
    """Images whose class is a bright square's position: learnable in a few steps."""
    r = np.random.default_rng(seed)
    labels = r.integers(0, 10, n).astype(np.uint8)
    images = r.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c:2 * c + 6, 4:10] = 250
    return data.Dataset(images, labels, "synthetic", 0.2, 0.3)


# -- IDX reader -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compress", [False, True])
def test_idx_reads_valid_files(tmp_path, rng, compress):
    images = rng.integers(0, 256, (7, 5, 3)).astype(np.uint8)
    floats = rng.standard_normal((4, 2)).astype(np.float32)
    cases = [(0x08, images.tobytes(), images), (0x0D, floats.astype(">f4").tobytes(), floats)]
    for i, (code, body, expected) in enumerate(cases):
        raw = idx_bytes(code, body, expected.shape)
        path = tmp_path / (f"f{i}" + (".gz" if compress else ""))
        path.write_bytes(gzip.compress(raw) if compress else raw)
        got = data.read_idx(path)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
        data.write_idx(tmp_path / "again", got)
        np.testing.assert_array_equal(data.read_idx(tmp_path / "again"), expected)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_truncated_file_names_file_and_problem(tmp_path, compress):
    raw = idx_bytes(0x08, bytes(6 * 28 * 28), (6, 28, 28))
    cut = raw[:len(raw) - 100]
    path = tmp_path / ("short-images" + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(cut) if compress else cut)
    with pytest.raises(data.IDXError, match="short-images.*truncated"):
        data.read_idx(path)
    if compress:  # the gzip stream itself cut short
        path.write_bytes(gzip.compress(raw)[:-30])
        with pytest.raises(data.IDXError, match="short-images.*(gzip|truncated)"):
            data.read_idx(path)
    header_only = tmp_path / "header"
    header_only.write_bytes(raw[:9])
    with pytest.raises(data.IDXError, match="header.*truncated header"):
        data.read_idx(header_only)


def test_idx_wrong_magic_and_type(tmp_path):
    bad = tmp_path / "bad-magic"
    bad.write_bytes(b"\x89PNG" + bytes(40))
    with pytest.raises(data.IDXError, match="bad-magic.*magic number"):
        data.read_idx(bad)
    badtype = tmp_path / "bad-type"
    badtype.write_bytes(idx_bytes(0x07, bytes(4), (4,)))
    with pytest.raises(data.IDXError, match="bad-type.*element type 0x07"):
        data.read_idx(badtype)
    extra = tmp_path / "extra"
    extra.write_bytes(idx_bytes(0x08, bytes(5), (4,)))
    with pytest.raises(data.IDXError, match="extra.*trailing"):
        data.read_idx(extra)


def test_missing_files_say_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.delenv("CLNET_DATA", raising=False)
    with pytest.raises(data.DataNotFound) as e:
        data.load("fashion-mnist", "train", tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and "train-images-idx3-ubyte" in msg and "t10k-labels-idx1-ubyte" in msg
    assert "dataset-fashion-mnist" in msg and "--data-dir" in msg
    with pytest.raises(data.DataNotFound, match="CLNET_DATA"):
        data.load("mnist", "test")


def test_load_from_data_dir_and_clnet_data(tmp_path, monkeypatch, rng):
    sub = tmp_path / "mnist"
    sub.mkdir()
    images = rng.integers(0, 256, (9, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 9).astype(np.uint8)
    data.write_idx(sub / "t10k-images-idx3-ubyte.gz", images)
    data.write_idx(sub / "t10k-labels-idx1-ubyte", labels)
    monkeypatch.setenv("CLNET_DATA", str(tmp_path))
    ds = data.load("mnist", "test")  # found in $CLNET_DATA/mnist
    np.testing.assert_array_equal(ds.images[:, 0], images)
    np.testing.assert_array_equal(ds.labels, labels)
    assert len(data.load("mnist", "test", data_dir=sub)) == 9
    data.write_idx(sub / "t10k-labels-idx1-ubyte", labels[:5])
    with pytest.raises(data.IDXError, match="5 labels for 9 images"):
        data.load("mnist", "test", data_dir=sub)


# -- loader -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_block", [1, 2, 4])
def test_loader_feeds_every_example_once_and_counts_copies(dev, monkeypatch, per_block):
    """Batches of 16 from 80 examples, uploaded a batch at a time or in blocks of 2 or 4 batches (two host copies a
    block; with 4, a last block of one batch, which takes the one-batch path); each batch is read back only after the
    next ones were taken (a copy queued too early would show), and its tensors stay as they were until the batch
    after the next is taken (the loader's two slots). The last, smaller batch: test_loader_delivers_into_..."""
    monkeypatch.setattr(data.Loader, "BLOCK_BYTES", per_block * 16 * (28 * 28 + 1) * 4)
    ds = synthetic(80)
    order = data.epoch_order(len(ds), seed=3, epoch=1)
    assert not np.array_equal(order, data.epoch_order(len(ds), seed=3, epoch=2))
    np.testing.assert_array_equal(order, data.epoch_order(len(ds), seed=3, epoch=1))
    clnet.reset_transfer_stats()
    loader = data.Loader(ds, 16, dev, order)
    assert loader.per_block == per_block
    seen, copies, previous = [], [], None
    for x, y, labels in loader:
        assert x.shape == (len(labels), 1, 28, 28) and y.value_range == (labels.min(), labels.max())
        if previous is not None:  # the batch before this one is still whole in its own tensors
            px, py, plabels, pexpected = previous
            np.testing.assert_array_equal(px.numpy(), pexpected)
            np.testing.assert_array_equal(py.numpy(), plabels)
        at = sum(map(len, seen))
        previous = (x, y, labels, ds.batch(order[at:at + len(labels)])[0])
        seen.append(labels)
        copies.append((ops.product(x, 1.0), empty(y.shape, dev, np.int32).copy_from(y)))  # read after the loop
    assert [len(s) for s in seen] == [16, 16, 16, 16, 16]
    np.testing.assert_array_equal(np.concatenate(seen), ds.labels[order])
    at = 0
    for (x, y), labels in zip(copies, seen):
        np.testing.assert_array_equal(x.numpy(), ds.batch(order[at:at + len(labels)])[0])
        np.testing.assert_array_equal(y.numpy(), labels)
        at += len(labels)
    stats = clnet.transfer_stats()
    reads = 2 * (len(seen) - 1)  # the checks of the batch before each
    assert stats["host_to_device_count"] == 2 * -(-5 // per_block)
    assert stats["host_to_device_bytes"] == 80 * 28 * 28 * 4 + 80 * 4
    assert stats["device_to_host_count"] == reads + 2 * len(seen)


@pytest.mark.parametrize("per_block", [1, 4])
def test_loader_delivers_into_the_tensors_it_is_given(dev, monkeypatch, per_block):
    """`into` names tensors for batches of some shapes (a captured step's static inputs): those batches land there,
    the last, smaller batch in the loader's own tensors."""
    monkeypatch.setattr(data.Loader, "BLOCK_BYTES", per_block * 16 * (28 * 28 + 1) * 4)
    ds = synthetic(50)
    order = data.epoch_order(len(ds), seed=1, epoch=0)
    tx, ty = clnet.tensor(np.zeros((16, 1, 28, 28), np.float32), dev), clnet.tensor(np.zeros(16, np.int32), dev)
    loader = data.Loader(ds, 16, dev, order, into=lambda xs, ys: (tx, ty) if xs == tx.shape else None)
    at = 0
    for x, y, labels in loader:
        assert (x is tx and y is ty) == (len(labels) == 16)
        np.testing.assert_array_equal(x.numpy(), ds.batch(order[at:at + len(labels)])[0])
        np.testing.assert_array_equal(y.numpy(), labels)
        assert y.value_range == (labels.min(), labels.max())
        at += len(labels)
    assert at == 50


def test_loader_measures_the_wait_for_data(dev, monkeypatch):
    """wait_s is the time the consumer spent waiting for the loader's queue, and nothing else: on a clock that moves
    1 s inside each wait and 10 s in the consumer's own work, it is exactly one second per batch and one for the
    end of the epoch (the consumer's time is not counted). (A subclass's batch() is called once per batch.)"""
    clock = [0.0]

    class TimedQueue(queue.Queue):
        def get(self, *args, **kwargs):
            item = super().get(*args, **kwargs)
            clock[0] += 1.0
            return item

    class Subclass(data.Dataset):
        def batch(self, indices):
            return super().batch(indices)

    # data.py's own names only: the queue and time modules stay as they are for everything else
    monkeypatch.setattr(data, "queue", types.SimpleNamespace(Queue=TimedQueue, Full=queue.Full))
    monkeypatch.setattr(data, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    plain = synthetic(64)
    for ds in (plain, Subclass(plain.images, plain.labels, "s", plain.mean, plain.std)):
        loader = data.Loader(ds, 16, dev, data.epoch_order(64, 0, 0))
        batches = 0
        for _ in loader:
            clock[0] += 10.0  # the device busy with the step
            batches += 1
        assert batches == 4
        assert loader.wait_s == len(range(0, 4, loader.per_block)) + 1  # one get per block, one for the end


# -- training on real data --------------------------------------------------------------------------------------------
@needs_fashion
def test_lenet_learns_fashion_mnist_subset(dev):
    train_data = data.load("fashion-mnist", "train").subset(6400)
    test_data = data.load("fashion-mnist", "test").subset(1000)
    clnet.manual_seed(0)
    model = models.build("lenet").to(dev)
    clnet.reset_transfer_stats()
    result = train.fit(model, train_data, test_data, epochs=1, batch=32, lr=0.01, momentum=0.9, device=dev,
                       model_name="lenet")
    (record,) = result["epochs"]
    assert record["steps"] == 200 and record["images"] == 6400
    assert record["test_accuracy"] > 0.6, record  # chance is 0.1
    assert record["train_loss"] < 1.2, record
    assert record["stall_fraction"] == pytest.approx(record["data_wait_s"] / record["seconds"])
    assert record["stall_fraction"] < 0.5  # the loader prepares the next batch while the device computes
    # per block of batches (data.Loader): two uploads; per 16 steps one read of their (loss, correct) pairs; per
    # test batch: the logits (for the confusion counts) and the loss; nothing else
    stats = clnet.transfer_stats()
    eval_batches = -(-1000 // 256)
    blocks = [-(-n // data.Loader(d, b, dev, []).per_block) for n, d, b in ((200, train_data, 32),
                                                                            (eval_batches, test_data, 256))]
    assert blocks[0] > 1
    assert stats["host_to_device_count"] == 2 * sum(blocks)
    assert stats["device_to_host_count"] == -(-200 // train._StepFigures.READ_EVERY) + 2 * eval_batches
    assert result["first_step_s"] > 0


# -- checkpoints ------------------------------------------------------------------------------------------------------
def run_tiny(dev, path=None, resume=None, max_steps=None, data_set=None, epochs=2, model_fn=tiny_model,
             optimizer=None):
    if resume is None:
        clnet.manual_seed(7)
    model = model_fn()
    opt = None if optimizer is None else optimizer(model.to(dev).parameters())
    result = train.fit(model, data_set or synthetic(), epochs=epochs, batch=16, lr=0.05, momentum=0.9,
                       weight_decay=1e-4, device=dev, seed=5, checkpoint=path, resume=resume, max_steps=max_steps,
                       model_name="tiny", optimizer=opt)
    return model, result


def strip_times(history):
    return [{k: v for k, v in r.items() if "second" not in k and "wait" not in k and "per_s" not in k
             and "stall" not in k} for r in history]


def test_resume_gives_the_uninterrupted_result(dev, tmp_path):
    full, full_result = run_tiny(dev)
    assert full_result["global_step"] == 20
    ckpt = tmp_path / "tiny.ckpt"
    # stop inside the second epoch, then continue in a fresh model whose random stream is elsewhere
    _, part = run_tiny(dev, ckpt, max_steps=13)
    assert part["stopped"] and part["global_step"] == 13 and part["epoch"] == 1 and part["step"] == 3
    clnet.manual_seed(12345)
    resumed, rest = run_tiny(dev, ckpt, resume=ckpt)
    assert rest["global_step"] == 20
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=k)
    assert strip_times(full_result["epochs"]) == strip_times(rest["epochs"])
    done = checkpoint.load_checkpoint(ckpt)
    assert done["epoch"] == 2 and done["step"] == 0 and done["global_step"] == 20


def small_residual():
    """Batch norm (running statistics: buffers in the checkpoint) and a residual add."""
    return models.blocks(clnet)["ResNet"](models.blocks(clnet)["BasicBlock"], (1,), widths=(4,), classes=10,
                                          in_channels=1, small=True)


@pytest.mark.parametrize("kind", ["adamw-mlp", "sgd-resnet"])
def test_resume_keeps_optimizer_state_and_buffers(dev, tmp_path, kind):
    """Resuming restores Adam's moments and step count, and batch norm's running statistics and count, so the
    resumed run ends bit for bit where the uninterrupted one does."""
    model_fn, opt = ((tiny_model, lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.05)) if kind == "adamw-mlp"
                     else (small_residual, None))
    data_set = synthetic(64)
    full, full_result = run_tiny(dev, model_fn=model_fn, optimizer=opt, data_set=data_set)
    ckpt = tmp_path / "run.ckpt"
    run_tiny(dev, ckpt, max_steps=5, model_fn=model_fn, optimizer=opt, data_set=data_set)
    clnet.manual_seed(99)
    resumed, rest = run_tiny(dev, ckpt, resume=ckpt, model_fn=model_fn, optimizer=opt, data_set=data_set)
    assert rest["global_step"] == full_result["global_step"] == 8
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=k)
    if kind == "sgd-resnet":
        assert full.state_dict()["bn1.num_batches_tracked"] == 8


def test_ctrl_c_finishes_the_step_and_writes_a_checkpoint(dev, tmp_path):
    class Interrupting(data.Dataset):  # its own batch(): the loader calls it once per batch
        calls = 0

        def batch(self, indices):  # runs in the loader's thread; the signal goes to the main thread
            Interrupting.calls += 1
            if Interrupting.calls == 4:
                os.kill(os.getpid(), signal.SIGINT)
            return super().batch(indices)

    plain = synthetic()
    full, _ = run_tiny(dev)
    ckpt = tmp_path / "tiny.ckpt"
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    _, part = run_tiny(dev, ckpt, data_set=Interrupting(plain.images, plain.labels, "s", plain.mean, plain.std))
    assert part["interrupted"] and 0 < part["global_step"] < 20
    assert signal.getsignal(signal.SIGINT) is before
    resumed, rest = run_tiny(dev, ckpt, resume=ckpt)
    assert rest["global_step"] == 20 and not rest["interrupted"]
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        np.testing.assert_array_equal(a, b, err_msg=k)


def test_crash_mid_write_leaves_the_old_checkpoint(dev, tmp_path, monkeypatch):
    ckpt = tmp_path / "tiny.ckpt"
    model, _ = run_tiny(dev, ckpt, max_steps=3)
    before, weights = sha(ckpt), model.state_dict()

    def crash(f, **arrays):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint.np, "savez", crash)
    with pytest.raises(checkpoint.CheckpointError, match=r"cannot write the checkpoint .*simulated.*previous one "
                                                         r"there is intact"):
        run_tiny(dev, ckpt, max_steps=6)
    monkeypatch.undo()
    assert sha(ckpt) == before and sorted(os.listdir(tmp_path)) == ["tiny.ckpt"]  # no temporary file left
    loaded = checkpoint.load_checkpoint(ckpt)
    assert loaded["global_step"] == 3
    for k, a in weights.items():
        np.testing.assert_array_equal(loaded["state_dict"][k], a)


def test_damaged_and_wrong_model_checkpoints_fail_cleanly(dev, tmp_path):
    ckpt = tmp_path / "tiny.ckpt"
    run_tiny(dev, ckpt, max_steps=2)
    good = ckpt.read_bytes()
    digest = sha(ckpt)
    lenet = models.build("lenet").to(dev)
    lenet_weights = lenet.state_dict()
    with pytest.raises(checkpoint.CheckpointError, match="holds a 'tiny' model, not 'lenet'"):
        checkpoint.load_into(checkpoint.load_checkpoint(ckpt), lenet, None, "lenet")
    with pytest.raises(checkpoint.CheckpointError, match="another architecture"):
        checkpoint.load_into(checkpoint.load_checkpoint(ckpt), lenet, None)
    for k, a in lenet.state_dict().items():
        np.testing.assert_array_equal(a, lenet_weights[k])
    assert sha(ckpt) == digest
    damaged = tmp_path / "damaged.ckpt"
    for content in (good[:len(good) // 2], good[:200] + bytes(len(good) - 200), b"not a checkpoint"):
        damaged.write_bytes(content)
        with pytest.raises(checkpoint.CheckpointError, match="damaged.ckpt"):
            checkpoint.load_checkpoint(damaged)
    # a flipped byte inside the weights fails the archive's checksum
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    with pytest.raises(checkpoint.CheckpointError, match="damaged.ckpt"):
        checkpoint.load_checkpoint(damaged)
    with pytest.raises(checkpoint.CheckpointError, match="no such file"):
        checkpoint.load_checkpoint(tmp_path / "absent.ckpt")


# -- commands ---------------------------------------------------------------------------------------------------------
@needs_fashion
def test_train_and_eval_commands(dev, tmp_path):
    ckpt, log = tmp_path / "lenet.ckpt", tmp_path / "log.json"
    args = ["lenet", "--dataset", "fashion-mnist", "--subset", "320", "--test-subset", "200", "--epochs", "1",
            "--batch", "32", "--device", str(dev.index), "--checkpoint", str(ckpt), "--log", str(log)]
    r = CliRunner().invoke(cli.train_command, args)
    assert r.exit_code == 0, r.output
    assert "epoch 1/1: train loss" in r.output and "done: lenet on fashion-mnist, 1 epochs" in r.output
    (record,) = json.loads(log.read_text())["epochs"]
    assert record["steps"] == 10 and "test_accuracy" in record and "data_wait_s" in record
    r = CliRunner().invoke(cli.eval_command, ["lenet", "--checkpoint", str(ckpt), "--test-subset", "200",
                                                "--device", str(dev.index)])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.output and "Ankle boot" in r.output and "confusion counts" in r.output
    digest = sha(ckpt)
    r = CliRunner().invoke(cli.eval_command, ["lenet-wide", "--checkpoint", str(ckpt)])
    assert r.exit_code == 1 and "holds a 'lenet' model, not 'lenet-wide'" in r.output
    r = CliRunner().invoke(cli.train_command, ["lenet-wide", "--resume", str(ckpt)])
    assert r.exit_code == 1 and "not 'lenet-wide'" in r.output
    r = CliRunner().invoke(cli.train_command, ["lenet", "--resume", str(ckpt), "--batch", "64"])
    assert r.exit_code == 1 and "--batch 64 (checkpoint: 32)" in r.output
    assert sha(ckpt) == digest


def test_train_command_without_data_says_how_to_get_it(tmp_path):
    r = CliRunner().invoke(cli.train_command, ["lenet", "--dataset", "mnist", "--data-dir", str(tmp_path)])
    assert r.exit_code == 1
    assert "train-images-idx3-ubyte" in r.output and "--data-dir" in r.output and "Traceback" not in r.output


def test_divergence_stops_training_and_keeps_the_last_good_checkpoint(dev, tmp_path):
    """A non-finite loss stops fit at once with a message naming the step; the checkpoint of the last finished epoch
    stays as it was (nothing non-finite is written)."""
    class Poisoned(data.Dataset):  # the 14th batch (the 4th of epoch 2) holds a NaN
        calls = 0

        def batch(self, indices):
            x, y = super().batch(indices)
            Poisoned.calls += 1
            if Poisoned.calls == 14:
                x = x.copy()
                x[0, 0, 0, 0] = np.nan
            return x, y

    plain = synthetic()
    ckpt = tmp_path / "tiny.ckpt"
    clnet.manual_seed(7)
    with pytest.raises(train.Diverged, match=r"loss of step 14 \(epoch 2\) is nan; the inputs of step 14 hold NaN"):
        train.fit(tiny_model(), Poisoned(plain.images, plain.labels, "s", plain.mean, plain.std), epochs=2, batch=16,
                  lr=0.05, device=dev, seed=5, checkpoint=ckpt, model_name="tiny")
    saved = checkpoint.load_checkpoint(ckpt)
    assert saved["epoch"] == 1 and saved["global_step"] == 10
    assert all(np.isfinite(v).all() for v in saved["state_dict"].values())


@needs_fashion
def test_printed_resume_command_continues_the_same_run(dev, tmp_path, monkeypatch):
    """Ctrl-C in `clnet train` prints a command; following it ends where the uninterrupted run ends, bit for bit
    (the options the checkpoint does not hold, --epochs and --test-subset among them, are on that command)."""
    import shlex
    common = ["--dataset", "fashion-mnist", "--subset", "96", "--test-subset", "50", "--epochs", "2", "--batch", "32",
              "--device", str(dev.index), "--no-tune"]
    full = tmp_path / "full.ckpt"
    r = CliRunner().invoke(cli.train_command, ["lenet", *common, "--checkpoint", str(full)])
    assert r.exit_code == 0, r.output
    calls = [0]
    plain_batch = data.Dataset.batch

    def interrupting(self, indices):
        calls[0] += 1
        if calls[0] == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return plain_batch(self, indices)

    monkeypatch.setattr(data.Dataset, "batch", interrupting)
    part = tmp_path / "part.ckpt"
    r = CliRunner().invoke(cli.train_command, ["lenet", *common, "--checkpoint", str(part)])
    monkeypatch.undo()
    assert r.exit_code == 130 and "Continue with: clnet train" in r.output, r.output  # 128 + SIGINT
    command = shlex.split(r.output.split("Continue with: clnet train ")[1].strip())
    assert "--epochs" in command and "--test-subset" in command
    r = CliRunner().invoke(cli.train_command, command)
    assert r.exit_code == 0 and "done: lenet" in r.output, r.output
    a, b = checkpoint.load_checkpoint(full), checkpoint.load_checkpoint(part)
    assert a["global_step"] == b["global_step"] == 6
    for k, v in a["state_dict"].items():
        np.testing.assert_array_equal(v, b["state_dict"][k], err_msg=k)


@needs_fashion
def test_resume_without_epochs_keeps_the_runs(dev, tmp_path):
    """`clnet train --resume` without --epochs continues for the epochs the run was started with, which its
    checkpoint records (it fell back to the default 10: a finished 2-epoch run trained 8 more)."""
    path = tmp_path / "run.ckpt"
    common = ["--device", str(dev.index), "--no-tune"]
    r = CliRunner().invoke(cli.train_command, ["lenet", "--dataset", "fashion-mnist", "--subset", "64",
                                               "--test-subset", "32", "--epochs", "2", "--checkpoint", str(path),
                                               *common])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.train_command, ["lenet", "--resume", str(path), *common])
    assert r.exit_code == 0 and "2 epochs" in r.output, r.output
    assert checkpoint.load_checkpoint(path)["epoch"] == 2


@needs_fashion
def test_train_command_stops_on_divergence(dev, tmp_path):
    r = CliRunner().invoke(cli.train_command, ["lenet", "--dataset", "fashion-mnist", "--subset", "256", "--epochs", "1",
                                               "--lr", "1e9", "--device", str(dev.index), "--no-tune"])
    assert r.exit_code == 1 and "training diverged" in r.output and "lower the learning rate" in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_fit_replays_its_step_and_matches_eager_training(dev, monkeypatch, opt):
    """fit captures its step at the second batch and replays it after (the last, smaller batch of each epoch runs
    eagerly): the same weights, history and loss figures as eager steps, bit for bit, with dropout drawing fresh
    masks and batch norm counting."""
    from clnet import graph

    def model():
        clnet.manual_seed(3)
        return nn.Sequential(nn.Conv2d(1, 4, 5, stride=3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Dropout(0.3), nn.Linear(4 * 8 * 8, 10)).to(dev)
    replays = []
    real = graph.Graph.replay
    monkeypatch.setattr(graph.Graph, "replay", lambda g: (replays.append(1), real(g)))
    runs = {}
    for graphs in (False, True):
        m = model()
        o = (optim.Adam(m.parameters(), lr=1e-3) if opt == "adam"
             else optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
        r = train.fit(m, synthetic(150), synthetic(40, seed=2), epochs=2, batch=16, optimizer=o, device=dev,
                      graphs=graphs)
        runs[graphs] = (m.state_dict(), [{k: v for k, v in e.items() if "seconds" not in k and "wait" not in k
                                          and "per_s" not in k and "stall" not in k} for e in r["epochs"]])
    assert len(replays) == (9 - 2) + 9  # an epoch: 9 batches of 16 (the first eager, the second captured), 1 of 6
    (eager_state, eager_hist), (graph_state, graph_hist) = runs[False], runs[True]
    assert eager_hist == graph_hist
    for k in eager_state:
        np.testing.assert_array_equal(np.asarray(eager_state[k]), np.asarray(graph_state[k]), err_msg=k)


def test_evaluate_replays_its_forward_and_gives_the_eager_figures(dev, monkeypatch):
    from clnet import graph
    clnet.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(1, 3, 5, stride=3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.3),
                      nn.Linear(3 * 8 * 8, 10)).to(dev)
    replays = []
    real = graph.Graph.replay
    monkeypatch.setattr(graph.Graph, "replay", lambda g: (replays.append(1), real(g)))
    test = synthetic(61, seed=4)
    eager = train.evaluate(m, test, batch=8, graphs=False)
    assert not replays
    replayed = train.evaluate(m, test, batch=8)
    assert len(replays) == 7 - 2  # 7 batches of 8 (the first eager, the second captured) and one of 5, eager
    assert eager["loss"] == replayed["loss"] and eager["accuracy"] == replayed["accuracy"]
    np.testing.assert_array_equal(eager["confusion"], replayed["confusion"])


def test_evaluate_replays_leave_later_blocks_of_images_alone(dev, monkeypatch):
    """Test images come in blocks (data.Loader), and a block of another shape (the last) is made after the forward's
    capture: with every tensor of 1 KiB and up a block of the arena, lenet-wide's replayed figures are still the eager
    ones.
    (A block freed in the capture and taken again there by a smaller tensor kept its tail out of the graph: the last
    block of images was placed over it and each replay overwrote it; `clnet train`'s test figures were wrong.)"""
    import importlib
    tensor_module = importlib.import_module("clnet.tensor")
    monkeypatch.setattr(tensor_module, "ARENA_MIN", 1024)
    monkeypatch.setattr(tensor_module, "SHARED_SEGMENT", 64 * 1024)
    monkeypatch.setattr(tensor_module, "SEGMENT_ROUND", 4096)
    monkeypatch.setattr(data.Loader, "BLOCK_BYTES", 3 * 16 * 4 * (28 * 28 + 1))  # 3 batches of 16 a block
    clnet.manual_seed(3)
    m = models.build("lenet-wide").to(dev)
    test = synthetic(125, seed=6)  # 7 batches of 16 and one of 13: blocks of 48, 48 and 29 images
    eager = train.evaluate(m, test, batch=16, graphs=False)
    replayed = train.evaluate(m, test, batch=16)
    assert eager["loss"] == replayed["loss"] and eager["accuracy"] == replayed["accuracy"]
    np.testing.assert_array_equal(eager["confusion"], replayed["confusion"])


def test_evaluate_runs_a_forward_that_reads_back_eagerly(dev):
    class Peeking(nn.Module):  # reads a value back in its forward (a print, a log): a replay could not repeat that
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, 10)

        def forward(self, x):
            out = self.fc(x.flatten(1))
            self.seen = float(out.sum())
            return out
    clnet.manual_seed(2)
    m = Peeking().to(dev)
    test = synthetic(30, seed=6)
    a, b = train.evaluate(m, test, batch=8), train.evaluate(m, test, batch=8, graphs=False)
    assert (a["loss"], a["accuracy"]) == (b["loss"], b["accuracy"])
    np.testing.assert_array_equal(a["confusion"], b["confusion"])


def test_fit_runs_eagerly_what_a_replay_would_skip(dev):
    """fit's captured step holds no host code of the user's: a forward that reads a tensor back (.item()) falls back
    to eager steps (its capture raised CaptureError at step 2), and a parameter's gradient hook or
    post-accumulate-grad hook keeps the step eager (the replays skipped them: 2 of 6 calls). Either way the weights
    are those of graphs=False, bit for bit."""
    X = np.random.default_rng(0).standard_normal((12, 6)).astype(np.float32)
    Y = np.arange(12) % 3

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 3)

        def forward(self, x):
            out = self.a(x)
            return out * 0.0 if out.abs().max().item() > 1e6 else out

    def hooked():
        m = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
        m[0].weight.register_hook(lambda g: g * 0.5)
        m[2].weight.register_post_accumulate_grad_hook(lambda p: calls.append(1))
        return m
    for make in (Reads, hooked):
        weights = []
        for graphs in (True, False):
            calls = []
            clnet.manual_seed(0)
            model = make().to(dev)
            assert train.fit(model, (X, Y), epochs=2, batch=4, device=dev, graphs=graphs)["global_step"] == 6
            weights.append([p.numpy() for p in model.parameters()])
            if make is hooked:
                assert len(calls) == 6
        for a, b in zip(*weights):
            np.testing.assert_array_equal(a, b)
