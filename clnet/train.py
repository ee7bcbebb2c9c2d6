"""Training and evaluation: `fit` and `evaluate` (the Python API), checkpoints, and the `clnet train` / `clnet eval`
commands that call them.

A checkpoint is one ``.npz`` file (no pickle): the weights and momentum buffers as arrays, and a JSON record of the
model (name and architecture), the run's configuration, the position (epoch, step), the random-stream state and the
history so far.  It is written to ``PATH.tmp`` and renamed over PATH, so an interrupted write never leaves a broken
checkpoint.
"""
import json
import os
import signal
import threading
import time
import zipfile

import click
import numpy as np

from . import data as data_mod
from . import models, nn, optim, rng
from .devices import DeviceNotFound
from .devices import device as _device
from .tune import tune_first

FORMAT = "clnet-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the model or run it is loaded into."""


# -- checkpoints -----------------------------------------------------------------------------------------------------
def _write_atomically(path, write):
    """Call write(file) on PATH.tmp, flush it to disk, then rename it over PATH; on any failure PATH is untouched."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def save_checkpoint(path, model, optimizer, meta):
    """Write model weights, optimizer state and the JSON-able ``meta`` record to PATH atomically."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    buffers = state.pop("buffers")
    for i, b in enumerate(buffers):
        if b is not None:
            arrays[f"optim/{i}"] = b
    record = dict(meta, format=FORMAT, version=VERSION, optimizer=state,
                  optimizer_buffers=[b is not None for b in buffers])
    arrays["meta"] = np.array(json.dumps(record))
    _write_atomically(path, lambda f: np.savez(f, **arrays))


def load_checkpoint(path):
    """Read a checkpoint into a dict: meta fields, plus ``state_dict`` and ``optimizer_state``. Nothing is applied.

    Raises CheckpointError naming the file when it is missing, damaged or not a clnet checkpoint.
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            entries = {k: z[k] for k in z.files}
        meta = json.loads(str(entries.pop("meta")))
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {path}: no such file") from e
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path} is damaged or not a clnet checkpoint ({type(e).__name__}: {e})") \
            from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a clnet checkpoint (no {FORMAT!r} record)")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {meta.get('version')}; this clnet reads "
                              f"version {VERSION}")
    try:
        state_dict = {k[len("model/"):]: v for k, v in entries.items() if k.startswith("model/")}
        buffers = [entries[f"optim/{i}"] if present else None for i, present in enumerate(meta["optimizer_buffers"])]
        optimizer_state = dict(meta["optimizer"], buffers=buffers)
        for key in ("model", "architecture", "epoch", "step", "global_step", "rng_state", "config", "history"):
            meta[key]
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} is damaged: its record lacks {e}") from e
    return dict(meta, path=path, state_dict=state_dict, optimizer_state=optimizer_state)


def check_checkpoint_fits(ckpt, model, model_name=None):
    """Raise CheckpointError unless the checkpoint was made for this model (name, layers, keys and shapes)."""
    where = f"checkpoint {ckpt['path']}"
    if model_name is not None and ckpt["model"] != model_name:
        raise CheckpointError(f"{where} holds a {ckpt['model']!r} model, not {model_name!r}; pass the model it was "
                              f"made for or another checkpoint")
    if ckpt["architecture"] != repr(model):
        raise CheckpointError(f"{where} was made for another architecture:\n{ckpt['architecture']}\n"
                              f"not the model given:\n{model!r}")
    own = {k: p.shape for k, p in model.named_parameters()}
    theirs = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    if own != theirs:
        raise CheckpointError(f"{where}: its weights {theirs} do not match the model's {own}")


def load_into(ckpt, model, optimizer, model_name=None):
    """Check that ckpt fits, then load its weights, optimizer state and random-stream state."""
    check_checkpoint_fits(ckpt, model, model_name)
    try:
        model.load_state_dict(ckpt["state_dict"])
        if optimizer is not None:
            optimizer.load_state_dict(ckpt["optimizer_state"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt['path']}: {e}") from e
    rng.set_state(ckpt["rng_state"])


# -- evaluation ------------------------------------------------------------------------------------------------------
def _step_results(loss_fn, n):
    """(summed loss, correct count) of a finished training step of n examples: its one read-back, 8 bytes."""
    loss, correct = loss_fn.metrics.numpy()
    return float(loss) * n, int(correct)


def evaluate(model, dataset, batch=256, device=None):
    """Loss, accuracy and confusion counts (rows: true class, columns: predicted) of ``model`` on ``dataset``."""
    dev = _device(device if device is not None else (model.device or "auto"))
    model.to(dev)
    was_training = model.training
    model.eval()
    loss_fn = nn.CrossEntropyLoss()
    loader = data_mod.Loader(dataset, batch, dev, data_mod.epoch_order(len(dataset), 0, 0, shuffle=False))
    confusion = None
    total_loss, correct, seen = 0.0, 0, 0
    try:
        it = iter(loader)
        item = next(it, None)
        while item is not None:
            x, y, y_host = item
            out = model(x)
            loss = loss_fn(out, y)
            item = next(it, None)  # queues the next upload before this batch's results are read
            pred = out.numpy().argmax(axis=1)  # the confusion counts need every prediction
            s_loss, s_correct = float(loss) * len(y_host), int((pred == y_host).sum())
            if confusion is None:
                confusion = np.zeros((out.shape[1], out.shape[1]), np.int64)
            np.add.at(confusion, (y_host, pred), 1)
            total_loss, correct, seen = total_loss + s_loss, correct + s_correct, seen + len(y_host)
    finally:
        model.train(was_training)
    if seen == 0:
        raise ValueError("evaluate: the data set is empty")
    return dict(loss=total_loss / seen, accuracy=correct / seen, images=seen, confusion=confusion,
                data_wait_s=loader.wait_s)


# -- training --------------------------------------------------------------------------------------------------------
class _StopFlag:
    """Ctrl-C during fit: the first sets a flag that the loop checks after each step; a second one aborts."""

    def __init__(self, echo):
        self.set = False
        self.echo = echo
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True
        self.echo("\ninterrupted: finishing this step and writing a checkpoint (Ctrl-C again to abort)")

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _write_log(path, record):
    _write_atomically(path, lambda f: f.write(json.dumps(record, indent=1).encode()))


def fit(model, train_data, test_data=None, epochs=1, batch=64, optimizer=None, lr=0.01, momentum=0.9,
        weight_decay=0.0, device=None, seed=0, checkpoint=None, resume=None, max_steps=None, log=None,
        progress=False, echo=None, model_name=None, config=None, interrupt_checkpoint=None):
    """Train ``model`` with SGD and cross-entropy on ``train_data`` for ``epochs`` epochs, on the device.

    Parameters
    ----------
    model : clnet.nn.Module
        Classifier from (N, C, H, W) images to (N, classes) logits; moved to ``device``.
    train_data, test_data : clnet.data.Dataset
        Training set (shuffled per epoch from ``seed``) and an optional test set evaluated after each epoch.
    epochs, batch : int
        Number of epochs and batch size; the last batch of an epoch may be smaller.
    optimizer : clnet.optim.SGD, optional
        Made from ``lr``, ``momentum`` and ``weight_decay`` when not given.
    device : str or clnet.Device, optional
        The model's device if it has one, else ``"auto"``.
    seed : int
        Seeds the example order; initialise the model after ``clnet.manual_seed`` for a fully repeatable run.
    checkpoint : path, optional
        Written after every epoch, on Ctrl-C and at the end.
    interrupt_checkpoint : path, optional
        Where Ctrl-C or ``max_steps`` writes the checkpoint when ``checkpoint`` is not given.
    resume : path or dict from ``load_checkpoint``, optional
        Continue that run: same result as never stopping, given the same ``batch`` and ``seed``.
    max_steps : int, optional
        Stop (and write the checkpoint) after this many steps in all, counting those of a resumed run.
    log : path, optional
        JSON file of the per-epoch figures, rewritten after every epoch.
    progress : bool
        Show a progress bar per epoch and a line per epoch (through ``echo``, default ``click.echo``).

    Returns
    -------
    dict
        ``epochs`` (per-epoch figures), ``interrupted``, ``stopped`` (max_steps reached), ``global_step``,
        ``epoch``, ``seconds``, ``checkpoint`` (path written or None) and ``final`` (last test figures or None).
    """
    echo = echo or click.echo
    dev = _device(device if device is not None else (model.device or "auto"))
    model.to(dev)
    model.train()
    if optimizer is None:
        optimizer = optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    name = model_name or type(model).__name__
    config = dict(config or {}, batch=int(batch), seed=int(seed), train_images=len(train_data))
    history, epoch, step, global_step = [], 0, 0, 0
    sums = dict(loss=0.0, correct=0, seen=0, seconds=0.0, wait=0.0)
    if resume is not None:
        ckpt = resume if isinstance(resume, dict) else load_checkpoint(resume)
        for key in ("batch", "seed", "train_images"):
            if ckpt["config"].get(key) != config[key]:
                raise CheckpointError(f"checkpoint {ckpt['path']} was made with {key} {ckpt['config'].get(key)}, "
                                      f"this run has {config[key]}; resuming needs the same {key} to continue "
                                      f"the same run")
        load_into(ckpt, model, optimizer, model_name)
        history, epoch, step, global_step = list(ckpt["history"]), ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        sums.update(ckpt.get("running", {}))
        config = dict(ckpt["config"], **{k: v for k, v in config.items() if k not in ckpt["config"]})
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = -(-len(train_data) // batch)
    result = dict(epochs=history, interrupted=False, stopped=False, checkpoint=None, final=None)
    start = time.perf_counter()

    def meta():
        return dict(model=name, architecture=repr(model), epoch=epoch, step=step, global_step=global_step,
                    rng_state=rng.get_state(), config=config, history=history, running=sums)

    def save(path=checkpoint):
        if path is not None:
            save_checkpoint(path, model, optimizer, meta())
            result["checkpoint"] = os.fspath(path)

    def log_now():
        if log is not None:
            _write_log(log, dict(model=name, config=config, epochs=history))

    with _StopFlag(echo) as flag:
        while epoch < epochs and not (flag.set or result["stopped"]):
            order = data_mod.epoch_order(len(train_data), config["seed"], epoch)
            loader = data_mod.Loader(train_data, batch, dev, order, start=step)
            t_epoch = time.perf_counter()
            bar = click.progressbar(length=steps_per_epoch, label=f"epoch {epoch + 1}/{epochs}",
                                    item_show_func=lambda s: s, file=None) if progress else None
            if bar is not None:
                bar.__enter__()
                bar.update(step)
            try:
                it = iter(loader)
                item = next(it, None)
                while item is not None:
                    x, y, y_host = item
                    optimizer.zero_grad()
                    out = model(x)
                    loss_fn(out, y)
                    model.backward(loss_fn.backward(), input_grad=False)
                    optimizer.step()
                    last = flag.set or (max_steps is not None and global_step + 1 >= max_steps)
                    # The next batch's upload is queued behind this step before its results are read.
                    item = None if last else next(it, None)
                    s_loss, s_correct = _step_results(loss_fn, len(y_host))
                    step, global_step = step + 1, global_step + 1
                    sums["loss"] += s_loss
                    sums["correct"] += s_correct
                    sums["seen"] += len(y_host)
                    if bar is not None:
                        elapsed = sums["seconds"] + time.perf_counter() - t_epoch
                        bar.update(1, f"loss {sums['loss'] / sums['seen']:.4f} acc "
                                      f"{sums['correct'] / sums['seen']:.4f} {sums['seen'] / elapsed:.0f} img/s")
                    if max_steps is not None and global_step >= max_steps:
                        result["stopped"] = True
                    if flag.set or result["stopped"]:
                        break
                it.close()
            finally:
                if bar is not None:
                    bar.__exit__(None, None, None)
            sums["seconds"] += time.perf_counter() - t_epoch
            sums["wait"] += loader.wait_s
            if step < steps_per_epoch:  # stopped inside the epoch
                break
            record = dict(epoch=epoch + 1, steps=step, images=sums["seen"], train_loss=sums["loss"] / sums["seen"],
                          train_accuracy=sums["correct"] / sums["seen"], seconds=sums["seconds"],
                          images_per_s=sums["seen"] / sums["seconds"], data_wait_s=sums["wait"],
                          stall_fraction=sums["wait"] / sums["seconds"])
            if test_data is not None:
                t_eval = time.perf_counter()
                ev = evaluate(model, test_data, batch=max(batch, 256), device=dev)
                record.update(test_loss=ev["loss"], test_accuracy=ev["accuracy"],
                              eval_seconds=time.perf_counter() - t_eval)
                result["final"] = ev
            history.append(record)
            epoch, step = epoch + 1, 0
            sums = dict(loss=0.0, correct=0, seen=0, seconds=0.0, wait=0.0)
            if progress:
                echo(_epoch_line(record, epochs))
            save()
            log_now()
        if flag.set or result["stopped"]:
            save(checkpoint or interrupt_checkpoint)
            log_now()
    result.update(interrupted=flag.set, epoch=epoch, step=step, global_step=global_step,
                  seconds=time.perf_counter() - start)
    return result


def _epoch_line(r, epochs):
    test = (f", test loss {r['test_loss']:.4f} acc {r['test_accuracy']:.4f}" if "test_loss" in r else "")
    return (f"epoch {r['epoch']}/{epochs}: train loss {r['train_loss']:.4f} acc {r['train_accuracy']:.4f}{test}; "
            f"{r['seconds']:.1f} s, {r['images_per_s']:.0f} img/s, waited for data {r['data_wait_s']:.2f} s "
            f"({100 * r['stall_fraction']:.1f}%)")


# -- plotting --------------------------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise click.ClickException("--plot needs matplotlib, which is not installed: pip install 'clnet[plot]' "
                                   "(or pip install matplotlib)") from e
    return plt


def plot_history(path, history, title=""):
    """Write a PNG of the loss and accuracy curves per epoch (train, and test where measured)."""
    plt = _pyplot()
    ep = [r["epoch"] for r in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((a, "loss", "loss"), (b, "accuracy", "accuracy")):
        ax.plot(ep, [r["train_" + key] for r in history], "o-", label="train")
        if all("test_" + key in r for r in history):
            ax.plot(ep, [r["test_" + key] for r in history], "s-", label="test")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    _write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


# -- commands --------------------------------------------------------------------------------------------------------
def _load_data(dataset, data_dir, split, subset=None):
    try:
        return data_mod.load(dataset, split, data_dir).subset(subset)
    except (data_mod.DataNotFound, data_mod.IDXError) as e:
        raise click.ClickException(str(e)) from e


def _device_or_fail(spec):
    try:
        return _device(spec)
    except DeviceNotFound as e:
        raise click.ClickException(str(e)) from e


def _check_model(name):
    if name not in models.MODELS:
        raise click.BadParameter(f"unknown model {name!r}; known models: {', '.join(models.MODELS)}",
                                 param_hint="MODEL")
    shape = models.MODELS[name]["input_shape"]
    if shape != (1, 28, 28):
        raise click.BadParameter(f"{name} expects input {shape}; mnist and fashion-mnist are (1, 28, 28) images; "
                                 f"use lenet or lenet-wide", param_hint="MODEL")


TUNE_BUDGET_S = 60.0  # first-run tuning before training; `clnet tune` has its own budget
DEFAULTS = dict(epochs=10, batch=64, lr=0.01, momentum=0.9, weight_decay=0.0, seed=0, subset=None)


@click.command("train")
@click.argument("model")
@click.option("--dataset", type=click.Choice(data_mod.DATASETS), default=None,
              help="Data set (default fashion-mnist, or the resumed checkpoint's).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the IDX files (default $CLNET_DATA, else /usr/share/datasets/fashion-mnist).")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Epochs in all (default 10).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size (default 64).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="Learning rate (default 0.01).")
@click.option("--momentum", type=click.FloatRange(min=0), default=None, help="SGD momentum (default 0.9).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=None, help="L2 weight decay (default 0).")
@click.option("--device", "device_spec", default="auto", show_default=True,
              help="auto, gpu, cpu, an index from `clnet devices`, or a name substring.")
@click.option("--seed", type=int, default=None, help="Seed of initialisation and shuffling (default 0).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint written after each epoch, on Ctrl-C and at the end (default: the --resume file).")
@click.option("--resume", type=click.Path(dir_okay=False), default=None, help="Continue the run of this checkpoint.")
@click.option("--subset", type=click.IntRange(min=1), default=None, help="Train on the first N training images.")
@click.option("--test-subset", type=click.IntRange(min=1), default=None, help="Test on the first N test images.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None, help="JSON log of per-epoch figures.")
@click.option("--tune/--no-tune", default=None,
              help="autotune the model's shapes missing from the cache first [default: on GPUs]")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of the loss and accuracy curves (needs matplotlib: pip install 'clnet[plot]').")
def train_command(model, dataset, data_dir, epochs, batch, lr, momentum, weight_decay, device_spec, seed, checkpoint,
                  resume, subset, test_subset, log_path, tune, plot_path):
    """Train MODEL (lenet, lenet-wide) on MNIST or Fashion-MNIST, reporting test accuracy after each epoch.

    Ctrl-C finishes the current step, writes a checkpoint and exits; --resume continues it exactly.
    """
    _check_model(model)
    if plot_path:
        _pyplot()
    given = dict(epochs=epochs, batch=batch, lr=lr, momentum=momentum, weight_decay=weight_decay, seed=seed,
                 subset=subset)
    ckpt = None
    if resume:
        try:
            ckpt = load_checkpoint(resume)
        except CheckpointError as e:
            raise click.ClickException(str(e)) from e
        if ckpt["model"] != model:
            raise click.ClickException(f"checkpoint {resume} holds a {ckpt['model']!r} model, not {model!r}")
        stored = ckpt["config"]
        conflicts = [f"--{k.replace('_', '-')} {given[k]} (checkpoint: {stored.get(k)})" for k in
                     ("batch", "lr", "momentum", "weight_decay", "seed", "subset")
                     if given[k] is not None and given[k] != stored.get(k)]
        if dataset is not None and dataset != stored.get("dataset"):
            conflicts.append(f"--dataset {dataset} (checkpoint: {stored.get('dataset')})")
        if conflicts:
            raise click.ClickException(f"--resume continues the run of {resume} unchanged; these options differ "
                                       f"from it: {', '.join(conflicts)}. Leave them out.")
        dataset = stored.get("dataset")
        given = {k: stored.get(k) if k != "epochs" else v for k, v in given.items()}
        checkpoint = checkpoint or resume
    dataset = dataset or "fashion-mnist"
    cfg = {k: (DEFAULTS[k] if v is None and k != "subset" else v) for k, v in given.items()}
    train_data = _load_data(dataset, data_dir, "train", cfg["subset"])
    test_data = _load_data(dataset, data_dir, "test", test_subset)
    dev = _device_or_fail(device_spec)
    rng.manual_seed(cfg["seed"])
    net = models.build(model).to(dev)
    opt = optim.SGD(net.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"])
    tune_first(net, (cfg["batch"],) + tuple(models.MODELS[model]["input_shape"]), dev, tune, TUNE_BUDGET_S,
               click.echo)
    click.echo(f"training {model} on {dataset} ({len(train_data)} training, {len(test_data)} test images) on "
               f"{dev.name} ({dev.platform_name}): batch {cfg['batch']}, lr {cfg['lr']}, momentum "
               f"{cfg['momentum']}, weight decay {cfg['weight_decay']}, seed {cfg['seed']}")
    try:
        result = fit(net, train_data, test_data, epochs=cfg["epochs"], batch=cfg["batch"], optimizer=opt,
                     device=dev, seed=cfg["seed"], checkpoint=checkpoint, resume=ckpt, log=log_path,
                     progress=True, model_name=model, interrupt_checkpoint=f"{model}-{dataset}-interrupted.ckpt",
                     config=dict(dataset=dataset, lr=cfg["lr"], momentum=cfg["momentum"],
                                 weight_decay=cfg["weight_decay"], subset=cfg["subset"]))
    except CheckpointError as e:
        raise click.ClickException(str(e)) from e
    if result["interrupted"]:
        click.echo(f"stopped at epoch {result['epoch'] + 1}, step {result['step']}; checkpoint written to "
                   f"{result['checkpoint']}. Continue with: clnet train {model} --resume {result['checkpoint']}")
        return
    hist = result["epochs"]
    if plot_path and hist:
        plot_history(plot_path, hist, f"{model} on {dataset}")
    if hist:
        last = hist[-1]
        best = max(hist, key=lambda r: r.get("test_accuracy", 0.0))
        total = sum(r["seconds"] + r.get("eval_seconds", 0.0) for r in hist)
        click.echo(f"done: {model} on {dataset}, {len(hist)} epochs, test accuracy {last.get('test_accuracy', 0):.4f} "
                   f"(best {best.get('test_accuracy', 0):.4f} at epoch {best['epoch']}), test loss "
                   f"{last.get('test_loss', float('nan')):.4f}, {total:.1f} s of training and testing"
                   + (f"; checkpoint {result['checkpoint']}" if result["checkpoint"] else "")
                   + (f"; log {log_path}" if log_path else "") + (f"; plot {plot_path}" if plot_path else ""))


@click.command("eval")
@click.argument("model")
@click.option("--checkpoint", type=click.Path(dir_okay=False), required=True, help="Checkpoint to evaluate.")
@click.option("--dataset", type=click.Choice(data_mod.DATASETS), default=None,
              help="Data set (default: the checkpoint's).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the IDX files (default $CLNET_DATA, else /usr/share/datasets/fashion-mnist).")
@click.option("--batch", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--device", "device_spec", default="auto", show_default=True)
@click.option("--test-subset", type=click.IntRange(min=1), default=None, help="Test on the first N test images.")
def eval_command(model, checkpoint, dataset, data_dir, batch, device_spec, test_subset):
    """Test-set loss, accuracy and confusion counts per class of MODEL with the weights of a checkpoint."""
    _check_model(model)
    try:
        ckpt = load_checkpoint(checkpoint)
        net = models.build(model)
        check_checkpoint_fits(ckpt, net, model)
        net.load_state_dict(ckpt["state_dict"])
    except (CheckpointError, KeyError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    dataset = dataset or ckpt["config"].get("dataset") or "fashion-mnist"
    test_data = _load_data(dataset, data_dir, "test", test_subset)
    dev = _device_or_fail(device_spec)
    ev = evaluate(net.to(dev), test_data, batch=batch, device=dev)
    click.echo(f"{model} ({checkpoint}, epoch {ckpt['epoch']}) on the {dataset} test set, {ev['images']} images, "
               f"{dev.name}: accuracy {ev['accuracy']:.4f}, loss {ev['loss']:.4f}")
    conf = ev["confusion"]
    names = list(test_data.classes) + [str(i) for i in range(len(test_data.classes), len(conf))]
    width = max(6, max(len(str(v)) for v in conf.flat) + 1)
    click.echo("confusion counts (rows: true class, columns: predicted class)")
    click.echo(f"{'':>14}" + "".join(f"{i:>{width}}" for i in range(len(conf))) + "  accuracy")
    for i, row in enumerate(conf):
        total = row.sum()
        acc = f"{row[i] / total:.3f}" if total else "-"
        click.echo(f"{i:>2} {names[i][:11]:<11}" + "".join(f"{v:>{width}}" for v in row) + f"  {acc:>8}")
