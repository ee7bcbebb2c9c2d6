"""Training and evaluation loops: `fit` and `evaluate` (the Python API behind `clnet train` and `clnet eval`).

A step runs the model, `loss.backward()` and the optimizer on the device; the step's (loss, correct) is read back
once, after the next batch's upload has been queued behind it.

A model wrapped in `clnet.distributed.DataParallel` trains data-parallel: ``batch`` is the global batch, each rank
takes its share of every global batch (`data.Loader`'s shard), the step's figures are summed over the ranks, and
only rank 0 writes checkpoints, logs and progress. Evaluation is split over the ranks and summed.
"""
import json
import math
import os
import signal
import threading
import time

import click
import numpy as np

from . import data as data_mod
from . import files, lr_scheduler, nn, optim, rng
from .autograd import no_grad
from .checkpoint import CheckpointError, load_checkpoint, load_into, save_checkpoint, scheduler_record
from .devices import device as _device
from .files import write_atomically
from .graph import CaptureError, StepReplayer
from .tensor import empty, region_alignment
from .errors import Error


def mpi_world():
    """The MPI job (a clnet.distributed.World) of a command that mpiexec launched with more than one rank, else None.
    Without a launcher's environment nothing MPI is imported, so mpi4py stays optional."""
    if not any(k in os.environ for k in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")):
        return None
    from . import distributed  # an ImportError here says: pip install 'clnet[mpi]'
    world = distributed.init()
    return world if world.size > 1 else None


class Diverged(Error, ArithmeticError):
    """Training produced a loss that is not finite; nothing was saved from that step on."""


class FitError(Error, ValueError):
    """An argument fit or evaluate cannot train or test with (an empty data set, images of another shape, a learning
    rate that is not a finite number), refused before any step runs."""


class WriteError(Error, OSError):
    """A log or plot that cannot be written (a full disk, a folder that is not writable, a device given as the file);
    the message says what was kept."""


def check_writable(path, what):
    """WriteError unless a file can be written atomically at PATH (files.write_atomically): PATH is not a directory
    or a device (/dev/full: the rename would replace the device itself), and its folder is one write_atomically
    accepts (files.check_writable: made if missing, safe, a file can be created in it). Checked before training, so
    a run is not lost to a log it cannot write at its end."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        kind = "a directory" if os.path.isdir(path) else "not a regular file (a device, a FIFO?)"
        raise WriteError(f"{what} {path} is {kind}; pass the name of a file to write")
    try:
        files.check_writable(path)
    except OSError as e:
        raise WriteError(f"{what} {path} cannot be written ({e.strerror or e}); pass a path in a writable "
                         "folder") from e


# -- evaluation ------------------------------------------------------------------------------------------------------
def _step_results(loss_fn, n):
    """(summed loss, correct count) of a finished training step of n examples: its one read-back, 8 bytes."""
    loss, correct = loss_fn.metrics.numpy()
    return float(loss) * n, int(correct)


class _StepFigures:
    """Each step's (mean loss, correct count), copied on the device into a ring of READ_EVERY slots and read back a
    ring at a time: reading every step would make the host wait for each step before it queues the next, so host and
    device would never overlap. A non-finite loss is still caught, and named by its step, READ_EVERY steps late at
    most; the loop reads the rest before it saves anything."""

    READ_EVERY = 16

    def __init__(self, dev, count):
        self.count = count  # count(step, epoch, n, summed loss, correct) for each step read
        self.stride = max(2, region_alignment(dev) // 4)  # each slot starts where a region may
        self.ring = empty((self.READ_EVERY * self.stride,), dev)
        self.slots = [self.ring.region(i * self.stride, (2,)) for i in range(self.READ_EVERY)]
        self.pending = []  # (step, epoch, n) of the slots filled

    def add(self, metrics, at_step, at_epoch, n):
        self.slots[len(self.pending)].copy_from(metrics)
        self.pending.append((at_step, at_epoch, n))
        if len(self.pending) == self.READ_EVERY:
            self.flush()

    def flush(self):
        if not self.pending:
            return
        values = self.ring.numpy().reshape(self.READ_EVERY, self.stride)
        pending, self.pending = self.pending, []
        for i, ((at_step, at_epoch, n), (loss, correct)) in enumerate(zip(pending, values[:, :2])):
            self.count(at_step, at_epoch, n, float(loss) * n, int(correct),
                       shown=len(pending) if i + 1 == len(pending) else 0)  # the progress bar moves once a read


def _has_hooks(model):
    """A module hook, or a parameter's gradient hook, is host code of the user's, which a replay would not run."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()) or any(
        p.__dict__.get("_grad_hooks") or p.__dict__.get("_post_grad_hooks") for p in model.parameters())


def _whole_arg(who, name, v, low):
    """FitError unless v is a whole number (an int, not a bool) of at least low."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise FitError(f"{who}: {name} is {v!r}; it must be a whole number of at least {low}")


def evaluate(model, dataset, batch=256, device=None, graphs=True):
    """Loss, accuracy and confusion counts (rows: true class, columns: predicted) of ``model`` on ``dataset``. With
    ``graphs`` the forward pass is captured once the batch shape repeats and replayed after (clnet.Graph), as in fit."""
    _whole_arg("evaluate", "batch", batch, 1)
    dev = _device(device if device is not None else (model.device or "auto"))
    model.to(dev)
    was_training = model.training
    model.eval()
    loss_fn = nn.CrossEntropyLoss()
    world = getattr(model, "world", None)  # a DataParallel model: each rank tests its contiguous share
    dataset = data_mod.as_dataset(dataset, "evaluate")
    if len(dataset) == 0:
        raise FitError("evaluate: the data set holds no images; pass one with at least one")
    order = data_mod.epoch_order(len(dataset), 0, 0, shuffle=False)
    if world is not None:
        a, b = data_mod.share(len(order), world.rank, world.size)
        order = order[a:b]
    confusion = None
    total_loss, correct, seen = 0.0, 0, 0

    def forward(x, y):
        with no_grad():
            out = model(x)
            return out, loss_fn(out, y)
    replayer = StepReplayer(forward, enabled=graphs and world is None and not _has_hooks(model))  # as in fit
    loader = data_mod.Loader(dataset, batch, dev, order, into=replayer.inputs)
    try:
        it = iter(loader)
        item = next(it, None)
        while item is not None:
            x, y, y_host = item
            try:
                out, loss = replayer(x, y)
            except CaptureError:  # the forward reads a tensor back: fine eagerly (it changes nothing under eval)
                replayer.enabled = False
                out, loss = replayer(x, y)
            item = next(it, None)  # queues the next upload before this batch's results are read
            pred = out.numpy().argmax(axis=1)  # the confusion counts need every prediction
            s_loss, s_correct = float(loss) * len(y_host), int((pred == y_host).sum())
            if confusion is None:
                confusion = np.zeros((out.shape[1], out.shape[1]), np.int64)
            np.add.at(confusion, (y_host, pred), 1)
            total_loss, correct, seen = total_loss + s_loss, correct + s_correct, seen + len(y_host)
    finally:
        model.train(was_training)
    if world is not None and world.size > 1:
        sizes = np.zeros(world.size, np.int64)  # a rank with no test images has no confusion counts yet
        sizes[world.rank] = 0 if confusion is None else len(confusion)
        classes = int(world.allreduce(sizes, "evaluation").max())
        mine = np.zeros((classes, classes), np.int64)
        if confusion is not None:
            mine[:len(confusion), :len(confusion)] = confusion
        totals = world.allreduce(np.array([total_loss, correct, seen], np.float64), "evaluation")
        confusion = world.allreduce(mine, "evaluation") if classes else None
        total_loss, correct, seen = float(totals[0]), int(totals[1]), int(totals[2])
    if seen == 0:
        raise FitError("evaluate: the data set is empty")
    return dict(loss=total_loss / seen, accuracy=correct / seen, images=seen, confusion=confusion,
                data_wait_s=loader.wait_s)


# -- training --------------------------------------------------------------------------------------------------------
class _StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM (what schedulers and `docker stop` send) during fit: the first sets a flag that the
    loop checks after each step, and `signum` says which; a second one aborts."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, echo):
        self.set = False
        self.signum = None
        self.echo = echo
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set, self.signum = True, signum
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
        self.echo(f"\n{'interrupted' if signum == signal.SIGINT else 'terminated (SIGTERM)'}: finishing this step "
                  f"and writing a checkpoint ({again} to abort)")

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def _write_log(path, record):
    write_atomically(path, lambda f: json.dump(record, f, indent=1), text=True)


def _check_hyper(optimizer):
    """FitError unless every group's settings are finite numbers (NaN passes every `lr > 0` test)."""
    groups = optimizer.param_groups
    for i, group in enumerate(groups):
        for k, v in group.items():
            values = v if isinstance(v, (tuple, list)) else (v,)
            if k != "params" and any(isinstance(x, float) and not math.isfinite(x) for x in values):
                where = f"param_groups[{i}]'s " if len(groups) > 1 else ""
                raise FitError(f"fit: the optimizer's {where}{k} is {v}; it must be a finite number")


SCHEDULER_INTERVALS = ("epoch", "step")


def _check_scheduler(scheduler, optimizer, interval):
    """FitError unless scheduler is a clnet lr scheduler driving the optimizer fit trains with."""
    if interval not in SCHEDULER_INTERVALS:
        raise FitError(f"fit: scheduler_interval is {interval!r}; pass 'epoch' (PyTorch's usual loop) or 'step'")
    if scheduler is None:
        return
    if not isinstance(scheduler, lr_scheduler.LRScheduler):
        raise FitError(f"fit: the scheduler is a {type(scheduler).__name__}, not a clnet.optim.lr_scheduler "
                       "scheduler; make one over the optimizer (clnet.optim.lr_scheduler.StepLR(optimizer, ...))")
    if scheduler.optimizer is not optimizer:
        raise FitError(f"fit: the {type(scheduler).__name__} drives another optimizer than the one fit trains with; "
                       "pass optimizer=scheduler.optimizer (or make the scheduler over fit's optimizer)")


def _check_data(train_data, test_data):
    """FitError for data sets training would fail on only later: no training images (no step to average), no test
    images (found after a whole epoch), test images of another shape than the training images."""
    if len(train_data) == 0:
        raise FitError("fit: the training set holds no images; pass a data set with at least one")
    for name, d in (("training", train_data), ("test", test_data)):  # a data set of the user's: its first label,
        if d is not None and not isinstance(d, data_mod.Dataset) and len(d):  # before any epoch is spent
            labels = np.asarray(d.batch(np.arange(1))[1])
            if labels.dtype.kind not in "iu":
                raise FitError(f"fit: the {name} set's batch() gives labels of dtype {labels.dtype}; class labels "
                               "must be integers (return labels.astype(np.int64))")
    if test_data is None:
        return
    if len(test_data) == 0:
        raise FitError("fit: the test set holds no images; pass one with at least one image, or test_data=None")
    shapes = [getattr(d, "images", None) for d in (train_data, test_data)]
    if all(isinstance(a, np.ndarray) for a in shapes) and shapes[0].shape[1:] != shapes[1].shape[1:]:
        raise FitError(f"fit: the test images have shape {shapes[1].shape[1:]}, the training images "
                       f"{shapes[0].shape[1:]}; pass test images of the training images' shape")


def fit(model, train_data, test_data=None, epochs=1, batch=64, optimizer=None, lr=0.01, momentum=0.9,
        weight_decay=0.0, device=None, seed=0, checkpoint=None, resume=None, max_steps=None, log=None,
        progress=False, echo=None, model_name=None, config=None, interrupt_checkpoint=None, graphs=True,
        scheduler=None, scheduler_interval="epoch"):
    """Train ``model`` with cross-entropy on ``train_data`` for ``epochs`` epochs, on the device.

    Parameters
    ----------
    model : clnet.nn.Module
        Classifier from (N, C, H, W) images to (N, classes) logits; moved to ``device``.
    train_data, test_data : clnet.data.Dataset or (images, labels) NumPy arrays
        Training set (shuffled per epoch from ``seed``) and an optional test set evaluated after each epoch; a pair
        of arrays becomes a `clnet.data.Dataset` (uint8 images scaled to [0, 1], others fed as they are).
    epochs, batch : int
        Number of epochs and batch size; the last batch of an epoch may be smaller.
    optimizer : clnet.optim.Optimizer, optional
        SGD, Adam, AdamW or RMSprop over the model's parameters (groups allowed); the scheduler's optimizer when
        only ``scheduler`` is given; else SGD from ``lr``, ``momentum`` and ``weight_decay``.
    scheduler : clnet.optim.lr_scheduler.LRScheduler, optional
        A learning-rate schedule over ``optimizer``. As in PyTorch's usual loop, fit calls ``scheduler.step()`` once
        at the end of each epoch (after the epoch's test), so epoch ``e`` trains with the lr the schedule gives for
        ``e``; with ``scheduler_interval="step"`` it calls it after every optimizer step instead (OneCycleLR's and
        warm-up's way; give OneCycleLR ``total_steps=epochs * steps per epoch``). Each step reads the groups' lr
        when it runs, replayed steps too. Checkpoints hold the scheduler's state, and ``resume`` needs a scheduler
        of the same type and arguments, made fresh over the fresh optimizer: the run continues its schedule.
    scheduler_interval : {"epoch", "step"}
        When the scheduler steps (above).
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
        JSON file of the per-epoch figures, rewritten after every epoch. Checked before the first step (WriteError
        if it cannot be written), as ``checkpoint`` is.
    progress : bool
        Show a progress bar per epoch and a line per epoch (through ``echo``, default ``click.echo``), and the time
        the first step took to finish (kernel builds included).
    graphs : bool
        Replay the step as a captured `clnet.Graph` from the second step on (the first, and an epoch's smaller last
        batch, run eagerly): the same results, bit for bit, with a fraction of the host work per step.

    Returns
    -------
    dict
        ``epochs`` (per-epoch figures), ``interrupted``, ``signal`` (the signal number that interrupted the run, or
        None), ``stopped`` (max_steps reached), ``global_step``,
        ``epoch``, ``seconds``, ``first_step_s`` (from the call to the end of its first step), ``checkpoint``
        (path written or None) and ``final`` (last test figures or None).
    """
    for name, v, low in (("batch", batch, 1), ("epochs", epochs, 1), ("seed", seed, 0)) + \
            ((("max_steps", max_steps, 0),) if max_steps is not None else ()):
        _whole_arg("fit", name, v, low)
    world = getattr(model, "world", None)  # a clnet.distributed.DataParallel model trains over every rank
    rank, ranks = (world.rank, world.size) if world is not None else (0, 1)
    data_mod.check_global_batch(batch, ranks)
    train_data = data_mod.as_dataset(train_data, "fit: train_data")
    test_data = None if test_data is None else data_mod.as_dataset(test_data, "fit: test_data")
    _check_data(train_data, test_data)
    echo = echo or click.echo
    if rank != 0:  # one voice: rank 0 prints, logs and writes checkpoints
        echo, progress, log = (lambda *a, **k: None), False, None
    dev = _device(device if device is not None else (model.device or "auto"))
    model.to(dev)
    model.train()
    if optimizer is None and scheduler is not None:
        optimizer = getattr(scheduler, "optimizer", None)
    if optimizer is None:
        for k, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise FitError(f"fit: {k} is {v}; it must be a finite number")
        optimizer = optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    _check_hyper(optimizer)
    _check_scheduler(scheduler, optimizer, scheduler_interval)
    if rank == 0:
        for path, what in ((checkpoint or interrupt_checkpoint, "the checkpoint"), (log, "the log")):
            if path is not None:
                check_writable(path, what)
        if scheduler is not None and (checkpoint or interrupt_checkpoint) is not None:
            scheduler_record(scheduler)  # a user's scheduler whose state JSON cannot hold: said before the first step
    name = model_name or type(model).__name__
    config = dict(config or {}, batch=int(batch), seed=int(seed), train_images=len(train_data), epochs=int(epochs))
    history, epoch, step, global_step = [], 0, 0, 0
    sums = dict(loss=0.0, correct=0, seen=0, seconds=0.0, wait=0.0)
    if resume is not None:
        ckpt = resume if isinstance(resume, dict) else load_checkpoint(resume)
        for key in ("batch", "seed", "train_images"):
            if ckpt["config"].get(key) != config[key]:
                raise CheckpointError(f"checkpoint {ckpt['path']} was made with {key} {ckpt['config'].get(key)}, "
                                      f"this run has {config[key]}; resuming needs the same {key} to continue "
                                      f"the same run")
        load_into(ckpt, model, optimizer, model_name, scheduler)
        history, epoch, step, global_step = list(ckpt["history"]), ckpt["epoch"], ckpt["step"], ckpt["global_step"]
        sums.update(ckpt.get("running", {}))
        config = dict(ckpt["config"], **{k: v for k, v in config.items() if k not in ckpt["config"]})
        config["epochs"] = int(epochs)  # a resume may extend the run: the span it has now
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = -(-len(train_data) // batch)
    result = dict(epochs=history, interrupted=False, stopped=False, checkpoint=None, final=None, first_step_s=None)
    if max_steps is not None and global_step >= max_steps:  # (a resumed run that has made them all: no step more)
        result["stopped"] = True
    start = time.perf_counter()

    def meta():
        return dict(model=name, architecture=repr(model), epoch=epoch, step=step, global_step=global_step,
                    rng_state=rng.get_state(), config=config, history=history, running=sums)

    def save(path=checkpoint):
        if path is not None:
            if rank == 0:
                try:
                    save_checkpoint(path, model, optimizer, meta(), scheduler)
                except OSError as e:  # a full disk, a folder that went away: the last checkpoint stays whole
                    raise CheckpointError(
                        f"cannot write the checkpoint {path} ({e.strerror or e}); "
                        + ("the previous one there is intact" if os.path.exists(path) else "nothing was written")
                        + ": free some space or pass another --checkpoint") from e
            result["checkpoint"] = os.fspath(path)

    def log_now():
        if log is not None:
            try:
                _write_log(log, dict(model=name, config=config, epochs=history))
            except OSError as e:  # called after save(): the checkpoint already holds the run
                raise WriteError(f"cannot write the log {log} ({e.strerror or e}); "
                                 + (f"the checkpoint {result['checkpoint']} holds the run: free some space and "
                                    "resume from it" if result["checkpoint"] else "free some space or pass another "
                                    "--log")) from e

    def train_step(x, y):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        return loss_fn.metrics

    # Steps replay one captured graph (the first step runs eagerly; an epoch's smaller last batch too). A replay
    # repeats launches and clnet's own per-step host work only, so steps with host work of someone else's run
    # eagerly: a data-parallel step's all-reduce, an optimizer class of the user's, a module hook.
    replayer = StepReplayer(train_step, enabled=graphs and world is None
                            and type(optimizer) in (optim.SGD, optim.Adam, optim.AdamW, optim.RMSprop)
                            and not _has_hooks(model))

    def count(at_step, at_epoch, n, s_loss, s_correct, shown=1):
        """Add a finished step's figures (summed loss, correct count) to the epoch's; move the progress bar by
        `shown` steps."""
        if not np.isfinite(s_loss):  # stop before any checkpoint holds the non-finite weights
            raise Diverged(f"training diverged: the loss of step {at_step} (epoch {at_epoch}) is {s_loss / n}; "
                           + divergence_cause(at_step, at_epoch)
                           + (f"; the last checkpoint, {result['checkpoint']}, is from before"
                              if result["checkpoint"] else ""))
        sums["loss"] += s_loss
        sums["correct"] += s_correct
        sums["seen"] += n
        if bar is not None and shown:
            elapsed = sums["seconds"] + time.perf_counter() - t_epoch
            bar.update(shown, f"loss {sums['loss'] / sums['seen']:.4f} acc {sums['correct'] / sums['seen']:.4f} "
                          f"{sums['seen'] / elapsed:.0f} img/s")

    def divergence_cause(at_step, at_epoch):
        """What to change, named as closely as the run can tell: the data (NaN or inf found in a batch's inputs up to
        that step), a weight decay far above any usual one, else the learning rate."""
        in_epoch = at_step - 1 - (at_epoch - 1) * steps_per_epoch  # the loader's batch number
        bad = [b for b in loader.nonfinite if b <= in_epoch]
        if bad:
            first = (at_epoch - 1) * steps_per_epoch + bad[0] + 1
            return (f"the inputs of step {first} hold NaN or infinite values: the data, not the learning rate (check "
                    "the data set's images or its batch())")
        group = optimizer.param_groups[0]
        lr, decay = group.get("lr"), group.get("weight_decay") or 0.0
        if decay >= 1:  # SGD's and AdamW's step scales the weights by 1 - lr * decay; Adam's gradient grows by it
            return (f"the weight decay {decay} is far above usual values (1e-5 to 0.1): lower the weight decay"
                    + (f" (the learning rate is {lr})" if lr is not None else ""))
        return "lower the learning rate" + (f" (it is {lr})" if lr is not None else "")

    figures = _StepFigures(dev, count)
    bar = t_epoch = loader = stepped_lr = None
    with _StopFlag(echo) as flag:
        while epoch < epochs and not (flag.set or result["stopped"]):
            order = data_mod.epoch_order(len(train_data), config["seed"], epoch)
            loader = data_mod.Loader(train_data, batch, dev, order, start=step,
                                     shard=(rank, ranks) if world is not None else None, into=replayer.inputs)
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
                    n = min(batch, len(order) - step * batch)  # the global batch; y_host is this rank's share
                    if world is None:
                        figures.add(replayer(x, y), global_step + 1, epoch + 1, n)
                    else:
                        optimizer.zero_grad()
                        model.share(len(y_host), n)  # this rank's weight in the sum of gradients: its share
                        if len(y_host):
                            loss_fn(model(x), y).backward()
                        else:  # a last batch with fewer examples than ranks leaves this one nothing
                            model.skip_step()
                        model.finish()
                        optimizer.step()
                    if scheduler is not None and scheduler_interval == "step":
                        stepped_lr = [g["lr"] for g in optimizer.param_groups]  # what this step trained with
                        scheduler.step()  # outside the step's capture: the next step reads its lr, replayed or not
                    last = flag.set or (max_steps is not None and global_step + 1 >= max_steps)
                    # The next batch's upload is queued behind this step before its results are read.
                    item = None if last else next(it, None)
                    if world is not None:  # the global batch's figures; a Ctrl-C on any rank stops them all here
                        s_loss, s_correct = _step_results(loss_fn, len(y_host)) if len(y_host) else (0.0, 0)
                        s_loss, s_correct, stop = world.allreduce(
                            np.array([s_loss, s_correct, flag.set], np.float64), "the step's figures")
                        s_correct, flag.set = int(s_correct), flag.set or bool(stop)
                        count(global_step + 1, epoch + 1, n, s_loss, int(s_correct))
                    step, global_step = step + 1, global_step + 1
                    if result["first_step_s"] is None:  # one wait, for the report: builds, tuning, layout
                        dev.synchronize()
                        result["first_step_s"] = time.perf_counter() - start
                        if progress and rank == 0:
                            echo(f"first step done {result['first_step_s']:.1f} s after the start")
                    if max_steps is not None and global_step >= max_steps:
                        result["stopped"] = True
                    if flag.set or result["stopped"]:
                        break
                it.close()
                figures.flush()
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
            if world is not None:  # every rank tests and saves rank 0's batch-norm statistics (and weights)
                model.end_epoch()
            if test_data is not None:
                t_eval = time.perf_counter()
                ev = evaluate(model, test_data, batch=max(batch, 256), device=dev)
                record.update(test_loss=ev["loss"], test_accuracy=ev["accuracy"],
                              eval_seconds=time.perf_counter() - t_eval)
                result["final"] = ev
            record["lr"] = (stepped_lr if scheduler is not None and scheduler_interval == "step"
                            else [g["lr"] for g in optimizer.param_groups])  # the epoch's last step's, per group
            if scheduler is not None and scheduler_interval == "epoch":
                scheduler.step()
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
    result.update(interrupted=flag.set, signal=flag.signum if flag.set else None, epoch=epoch, step=step,
                  global_step=global_step, seconds=time.perf_counter() - start)
    return result


def _epoch_line(r, epochs):
    test = (f", test loss {r['test_loss']:.4f} acc {r['test_accuracy']:.4f}" if "test_loss" in r else "")
    return (f"epoch {r['epoch']}/{epochs}: train loss {r['train_loss']:.4f} acc {r['train_accuracy']:.4f}{test}; "
            f"{r['seconds']:.1f} s, {r['images_per_s']:.0f} img/s, waited for data {r['data_wait_s']:.2f} s "
            f"({100 * r['stall_fraction']:.1f}%)")
