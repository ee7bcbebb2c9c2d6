"""Checkpoints: one ``.npz`` file (no pickle) holding the weights and buffers, the optimizer's state as arrays, and
a JSON record of the model (name and architecture), the optimizer's type and every parameter group's settings (lr,
momentum, weight decay, betas, Adam's step count, a scheduler's initial_lr, and the parameters each group holds), the
lr scheduler's state when the run has one, the run's configuration, the position (epoch, step), the random-stream
state and the history so far. Written atomically (files.write_atomically): an interrupted write never leaves a broken
checkpoint.
"""
import copy
import json
import math
import os
import stat
import zipfile
import zlib
from collections import Counter

import numpy as np

from . import rng
from .files import write_atomically
from .errors import Error

FORMAT = "clnet-checkpoint"
VERSION = 3  # 3: every parameter group and the lr scheduler; 2: buffers (batch norm), optimizer state per parameter
READS = (2, 3)  # a version 2 record holds the first group's settings only (one group: all version 2 could write)


class CheckpointError(Error, ValueError):
    """A checkpoint that cannot be read, or that does not fit the model or run it is loaded into."""


def save_checkpoint(path, model, optimizer, meta, scheduler=None):
    """Write model weights and buffers, the optimizer's state (every parameter group), the lr scheduler's state (if
    given) and the JSON-able ``meta`` record to PATH atomically."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    for i, entry in state["state"].items():
        for name, a in entry.items():
            arrays[f"optim/{i}/{name}"] = a
    record = dict(meta, format=FORMAT, version=VERSION,
                  optimizer=dict(type=type(optimizer).__name__, param_groups=state["param_groups"]),
                  scheduler=None if scheduler is None else scheduler_record(scheduler))
    arrays["meta"] = np.array(json.dumps(record))
    write_atomically(path, lambda f: np.savez(f, **arrays))


def scheduler_record(scheduler):
    """The checkpoint's record of an lr scheduler: its type and its state_dict() as JSON. CheckpointError for a
    scheduler (one of the user's) whose state JSON cannot hold: checked by fit before the first step."""
    record = dict(type=type(scheduler).__name__, state=_to_json(scheduler.state_dict()))
    try:
        json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the lr scheduler {type(scheduler).__name__}'s state_dict() cannot be saved in a "
                              f"checkpoint ({e}): keep numbers, strings, lists and dicts in it") from e
    return record


# A scheduler's state is plain numbers, strings, lists and dicts, but for MultiStepLR's Counter of milestones (integer
# keys, which JSON would turn into strings): it is written as {COUNTER: [[milestone, count], ...]}.
COUNTER = "__Counter__"


def _to_json(value):
    if isinstance(value, Counter):
        return {COUNTER: sorted([k, n] for k, n in value.items())}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value):
    if isinstance(value, dict):
        if set(value) == {COUNTER}:
            pairs = value[COUNTER]
            if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 and all(_whole(x, -2**53)
                                                    for x in p) for p in pairs)):
                raise ValueError(f"{pairs!r} is not a list of [milestone, count] pairs")
            return Counter(dict(pairs))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _like(own, theirs, where):
    """ValueError naming WHERE unless the scheduler state THEIRS has the layout of OWN (the state of the scheduler
    it is loaded into): the same keys, lists of the same lengths, values of the same kinds, finite numbers. The values
    themselves are the checkpoint's, as PyTorch's load_state_dict takes them."""
    if isinstance(own, Counter):
        if not isinstance(theirs, Counter):
            raise ValueError(f"{where} is {theirs!r}, expected milestones")
    elif isinstance(own, dict):
        if not isinstance(theirs, dict) or set(theirs) != set(own):
            keys = sorted(theirs) if isinstance(theirs, dict) else theirs
            raise ValueError(f"{where} holds {keys!r}, expected {sorted(own)}")
        for k in own:
            _like(own[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(own, (list, tuple)):
        if not isinstance(theirs, list) or len(theirs) != len(own):
            raise ValueError(f"{where} is {theirs!r}, expected a list of {len(own)}")
        for i, (a, b) in enumerate(zip(own, theirs)):
            _like(a, b, f"{where}[{i}]")
    elif isinstance(own, bool) or own is None or isinstance(own, str):
        if type(theirs) is not type(own):
            raise ValueError(f"{where} is {theirs!r}, expected {'a string' if isinstance(own, str) else type(own)}")
    elif isinstance(own, (int, float)) and not _number(theirs, -math.inf):
        raise ValueError(f"{where} is {theirs!r}, expected a finite number")


# np.savez writes a zip archive; every zip file starts with a local file header.
ZIP_MAGIC = b"PK\x03\x04"
NPY_MAGIC = b"\x93NUMPY"
NOT_A_CHECKPOINT = ("clnet writes checkpoints with `clnet train --checkpoint FILE` (or clnet.fit(..., "
                    "checkpoint=FILE)); pass one of those")


def _open_checkpoint(path):
    """The checkpoint file open for reading, or CheckpointError, in words a user can act on, for a PATH that cannot be
    a checkpoint: missing, a directory, a FIFO or device (opened without waiting for a writer, then refused),
    unreadable, empty, or not a zip archive (/etc/passwd, a .npy array, a text file). np.load would otherwise guess
    the format from the first bytes and answer with its own advice (about unpickling). The caller reads the file it
    was given, so a path swapped after the check is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {path}: no such file") from e
    except IsADirectoryError as e:
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file") from e
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({e.strerror})") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file")
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise CheckpointError(f"checkpoint {path} is {kind}, not a checkpoint file; {NOT_A_CHECKPOINT}")
    f = os.fdopen(fd, "rb")
    try:
        try:
            head = f.read(len(ZIP_MAGIC))
        except OSError as e:
            raise CheckpointError(f"checkpoint {path} cannot be read ({e.strerror})") from e
        if not head:
            raise CheckpointError(f"checkpoint {path} is empty, not a clnet checkpoint (a write that never finished, "
                                  f"or the wrong file); {NOT_A_CHECKPOINT}")
        if head != ZIP_MAGIC:
            kind = "a NumPy array file" if NPY_MAGIC.startswith(head) else "not the archive of arrays clnet writes"
            raise CheckpointError(f"{path} is not a clnet checkpoint ({kind}); {NOT_A_CHECKPOINT}")
        f.seek(0)
        return f
    except BaseException:
        f.close()
        raise


def _whole(v, low=0, high=None):
    """v is an int (not a bool) in [low, high]."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)


def _number(v, low=0.0, positive=False):
    """v is a finite real number (not a bool) >= low (> low with positive)."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v > low if positive else v >= low))


def _check_record(path, meta):
    """CheckpointError naming the first field of the record that has the wrong type or an impossible value: every
    field fit and the commands use is checked here, before any of it is applied."""
    def bad(field, value, expected):
        text = repr(value)
        raise CheckpointError(f"checkpoint {path} is damaged: its record's {field} is "
                              f"{text if len(text) <= 60 else text[:57] + '...'}, expected {expected}; "
                              "use an earlier checkpoint")
    for key in ("model", "architecture"):
        if not isinstance(meta[key], str):
            bad(key, meta[key], "a string")
    config = meta["config"]
    if not isinstance(config, dict):
        bad("config", config, "a mapping of the run's options")
    for key in ("batch", "train_images", "epochs"):  # fit writes them; it refuses a resume whose batch or images
        # differ from its own, and the train command resumes for the epochs recorded unless told otherwise
        if key in config and not _whole(config[key], 1):
            bad(f"config {key}", config[key], "a whole number of at least 1")
    if "seed" in config and not _whole(config["seed"], -2**63, 2**64 - 1):
        bad("config seed", config["seed"], "a whole number")
    for key, positive in (("lr", True), ("momentum", False), ("weight_decay", False)):
        if key in config and not _number(config[key], positive=positive):
            bad(f"config {key}", config[key], "a finite number " + ("above 0" if positive else "of at least 0"))
    for key in ("subset", "test_subset"):
        if config.get(key) is not None and not _whole(config[key], 1):
            bad(f"config {key}", config[key], "none or a whole number of at least 1")
    for key in ("dataset", "optimizer"):
        if key in config and not isinstance(config[key], str):
            bad(f"config {key}", config[key], "a name")
    for key in ("epoch", "step", "global_step"):
        if not _whole(meta[key], 0, 2**53):
            bad(key, meta[key], "a whole number of at least 0")
    if "batch" not in config or "train_images" not in config:
        steps_per_epoch = None
    else:
        steps_per_epoch = -(-config["train_images"] // config["batch"])
        if meta["step"] >= steps_per_epoch:
            bad("step", meta["step"], f"less than the {steps_per_epoch} steps of an epoch "
                f"({config['train_images']} images in batches of {config['batch']})")
    if meta["global_step"] < meta["step"]:
        bad("global_step", meta["global_step"], f"at least the step in the epoch, {meta['step']}")
    if steps_per_epoch is not None and meta["global_step"] != meta["epoch"] * steps_per_epoch + meta["step"]:
        bad("global_step", meta["global_step"], f"{meta['epoch'] * steps_per_epoch + meta['step']} (epoch "
            f"{meta['epoch']} of {steps_per_epoch} steps, then step {meta['step']})")
    history = meta["history"]
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        bad("history", history, "a list of the finished epochs' figures")
    if len(history) != meta["epoch"]:
        bad("history", f"{len(history)} epochs", f"one entry for each of the {meta['epoch']} finished epochs")
    running = meta.get("running", {})
    if (not isinstance(running, dict) or not set(running) <= set(RUNNING)
            or not all(_number(v) for v in running.values())):
        bad("running", running, f"a mapping of {', '.join(RUNNING)} to numbers of at least 0")
    try:  # on a generator of its own: clnet's random stream changes only when the checkpoint is applied
        np.random.default_rng().bit_generator.state = meta["rng_state"]
    except (TypeError, ValueError, KeyError) as e:
        bad("rng_state", meta["rng_state"], f"the state of NumPy's PCG64 generator ({e})")
    opt = meta["optimizer"]
    if (not isinstance(opt, dict) or set(opt) != {"type", "param_groups"} or not isinstance(opt["type"], str)
            or not isinstance(opt["param_groups"], list) or not opt["param_groups"]
            or not all(isinstance(g, dict) for g in opt["param_groups"])):
        bad("optimizer", opt, "a mapping of the optimizer's type and its parameter groups")
    first = 0  # each group's params count on from the previous group's, as an optimizer's state_dict numbers them
    for i, group in enumerate(opt["param_groups"]):
        where = f"optimizer param_groups[{i}]"
        params = group.get("params")
        if params is None and meta["version"] == 2:  # the optimizer's only group: all of its parameters
            continue
        if not isinstance(params, list) or params != list(range(first, first + len(params))):
            bad(f"{where} params", params, f"the parameters' numbers from {first} on")
        first += len(params)
        for key, v in group.items():  # the numbers the optimizers and schedulers read; a group may hold any other
            # setting of the user's, as PyTorch's may ("name": "backbone")
            if key == "params" or isinstance(v, bool) or (key not in GROUP_NUMBERS and (isinstance(v, str) or
                                                                                       v is None)):
                continue
            values = v if isinstance(v, list) else [v]
            if not values or not all(_number(x) for x in values):
                bad(f"{where} {key}", v, "a finite number of at least 0")
    sched = meta["scheduler"]
    if sched is not None and (not isinstance(sched, dict) or set(sched) != {"type", "state"}
                              or not isinstance(sched["type"], str) or not isinstance(sched["state"], dict)):
        bad("scheduler", sched, "none or a mapping of the lr scheduler's type and state")
    if sched is not None:
        try:
            sched["state"] = _from_json(sched["state"])
        except ValueError as e:
            bad("scheduler state", sched["state"], f"an lr scheduler's state ({e})")


RUNNING = ("loss", "correct", "seen", "seconds", "wait")  # the unfinished epoch's sums (train.fit)
# a parameter group's settings that clnet's optimizers and lr schedulers read as numbers
GROUP_NUMBERS = ("lr", "momentum", "weight_decay", "betas", "eps", "alpha", "step", "initial_lr", "max_lr",
                 "min_lr", "base_momentum", "max_momentum")


def load_checkpoint(path):
    """Read a checkpoint into a dict: meta fields, plus ``state_dict`` and ``optimizer_state``. Nothing is applied.

    Raises CheckpointError naming the file when it is missing, damaged or not a clnet checkpoint, or when its record
    holds a field of the wrong type or an impossible value, in words that name no library (the underlying exception
    stays chained as its cause).
    """
    path = os.fspath(path)
    try:
        with _open_checkpoint(path) as f, np.load(f, allow_pickle=False) as z:
            if "meta" not in z.files:
                raise CheckpointError(f"{path} is not a clnet checkpoint (an archive without clnet's record); "
                                      f"{NOT_A_CHECKPOINT}")
            try:  # the record first: another program's archive is refused before its arrays are read
                meta = json.loads(str(z["meta"]))
            except ValueError as e:
                raise CheckpointError(f"{path} is not a clnet checkpoint (its record is not clnet's); "
                                      f"{NOT_A_CHECKPOINT}") from e
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise CheckpointError(f"{path} is not a clnet checkpoint (no {FORMAT!r} record); {NOT_A_CHECKPOINT}")
            entries = {k: z[k] for k in z.files if k != "meta"}
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # a truncated archive has lost its directory (at the end); a flipped byte fails a member's checksum
        raise CheckpointError(f"checkpoint {path} is damaged (cut short or corrupted: an interrupted copy, a full "
                              f"disk?); use an earlier checkpoint") from e
    if meta.get("version") not in READS:
        raise CheckpointError(f"checkpoint {path} has format version {meta.get('version')}; this clnet reads "
                              f"versions {', '.join(map(str, READS))}")
    if meta["version"] == 2:  # one group, no scheduler
        if isinstance(meta.get("optimizer"), dict):
            group = {k: v for k, v in meta["optimizer"].items() if k != "type"}
            meta["optimizer"] = dict(type=meta["optimizer"].get("type"), param_groups=[group])
        meta.setdefault("scheduler", None)
    try:
        for key in ("model", "architecture", "epoch", "step", "global_step", "rng_state", "config", "history",
                    "optimizer", "scheduler"):
            meta[key]
    except KeyError as e:
        raise CheckpointError(f"checkpoint {path} is damaged: its record lacks {e}") from e
    _check_record(path, meta)
    state_dict = {k[len("model/"):]: v for k, v in entries.items() if k.startswith("model/")}
    state = {}
    for k, v in entries.items():
        if k.startswith("optim/"):
            parts = k.split("/", 2)
            if len(parts) != 3 or not parts[1].isdigit():
                raise CheckpointError(f"checkpoint {path} is damaged: {k!r} is not an optimizer state's name")
            state.setdefault(int(parts[1]), {})[parts[2]] = v
    optimizer_state = dict(type=meta["optimizer"]["type"], state=state, param_groups=meta["optimizer"]["param_groups"])
    return dict(meta, path=path, state_dict=state_dict, optimizer_state=optimizer_state)


def check_checkpoint_fits(ckpt, model, model_name=None):
    """Raise CheckpointError unless the checkpoint was made for this model (name, layers, keys, shapes and dtypes)
    and its weights can be loaded as they are.

    The dtype rule: a weight (a floating entry) takes any real floating array, cast to the model's float32 as
    PyTorch's load_state_dict casts; an integer buffer (batch norm's count) takes integers that fit it. Complex,
    boolean, integer-for-a-weight and text arrays are refused (clnet never writes them), as are non-finite weights.
    """
    where = f"checkpoint {ckpt['path']}"
    if model_name is not None and ckpt["model"] != model_name:
        raise CheckpointError(f"{where} holds a {ckpt['model']!r} model, not {model_name!r}; pass the model it was "
                              f"made for or another checkpoint")
    if ckpt["architecture"] != repr(model):
        raise CheckpointError(f"{where} was made for another architecture:\n{ckpt['architecture']}\n"
                              f"not the model given:\n{model!r}")
    items = dict(model._state_items())
    own = {k: tuple(t.shape) for k, t in items.items()}  # shapes only: no weights read back from the device
    theirs = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    if own != theirs:
        raise CheckpointError(f"{where}: its weights {theirs} do not match the model's {own}")
    for k, a in ckpt["state_dict"].items():
        _check_array(where, f"weight {k!r}", a, np.dtype(items[k].dtype))


def _check_array(where, what, a, dtype):
    """CheckpointError unless array a may be loaded into an entry of dtype (check_checkpoint_fits's rule)."""
    if dtype.kind == "f":
        if a.dtype.kind != "f":
            raise CheckpointError(f"{where}: {what} is {a.dtype}, not a floating type; clnet loads real floating "
                                  f"weights only (cast to {dtype})")
        if not np.isfinite(a).all():
            raise CheckpointError(f"{where}: {what} holds NaN or infinite values; use an earlier checkpoint")
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        if a.dtype.kind not in "iu" or (a.size and (a.min() < info.min or a.max() > info.max)):
            raise CheckpointError(f"{where}: {what} is {a.dtype}" + (f" with values up to {a.max()}" if
                                  a.dtype.kind in "iu" else "") + f"; the model's buffer holds {dtype}")


def _groups_text(sizes):
    return (f"{len(sizes)} parameter group{'s' if len(sizes) != 1 else ''} of "
            + (", ".join(map(str, sizes[:-1])) + " and " if len(sizes) > 1 else "")
            + f"{sizes[-1]} parameter{'s' if sizes[-1] != 1 else ''}")


def _check_groups(where, saved_groups, optimizer):
    """CheckpointError unless the checkpoint's parameter groups are the optimizer's: as many, each as large."""
    own = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g.get("params", ())) if "params" in g else sum(own) for g in saved_groups]
    if theirs != own:
        raise CheckpointError(f"{where} holds {_groups_text(theirs)}, the optimizer has {_groups_text(own)}; make "
                              "the optimizer with the saved run's parameter groups")


def _check_scheduler(where, saved, scheduler):
    """CheckpointError unless the checkpoint holds the state of a scheduler of SCHEDULER's type and layout, or holds
    none and none is given (a resumed run continues its schedule, or runs without one, as it did)."""
    if saved is None and scheduler is None:
        return
    if saved is None:
        raise CheckpointError(f"{where} holds no lr scheduler, the run has a {type(scheduler).__name__}; resume "
                              "without a scheduler, as the saved run ran")
    if scheduler is None:
        raise CheckpointError(f"{where} holds a {saved['type']} lr scheduler's state, the run has none; pass the "
                              f"saved run's {saved['type']} to continue its schedule")
    if saved["type"] != type(scheduler).__name__:
        raise CheckpointError(f"{where} holds a {saved['type']} lr scheduler's state, the run has a "
                              f"{type(scheduler).__name__}; resume with the checkpoint's scheduler")
    try:
        _like(scheduler.state_dict(), saved["state"], "state")
    except ValueError as e:
        raise CheckpointError(f"{where}: its {saved['type']}'s {e}; make the scheduler with the saved run's "
                              "arguments") from e


def load_into(ckpt, model, optimizer, model_name=None, scheduler=None):
    """Check that ckpt fits, then load its weights, optimizer state (every parameter group), the lr scheduler's state
    and the random-stream state.

    Everything is checked before anything is applied: on a CheckpointError the model, the optimizer, the scheduler
    and the random stream are as they were."""
    check_checkpoint_fits(ckpt, model, model_name)
    where = f"checkpoint {ckpt['path']}"
    if optimizer is not None:
        saved = ckpt["optimizer_state"]["type"]
        if saved != type(optimizer).__name__:
            raise CheckpointError(f"{where} holds {saved} state, the run uses {type(optimizer).__name__}; resume "
                                  f"with the checkpoint's optimizer")
        _check_groups(where, ckpt["optimizer_state"]["param_groups"], optimizer)
        for i, entry in ckpt["optimizer_state"]["state"].items():
            for name, a in entry.items():
                if name not in optimizer.counter_names:  # (a count, Adam's own "step": optimizer's check)
                    _check_array(where, f"the optimizer's {name} of parameter {i}", a, np.dtype(np.float32))
        _check_scheduler(where, ckpt["scheduler"], scheduler)
    try:
        if optimizer is not None:  # it checks the whole state before it changes anything
            optimizer.load_state_dict(ckpt["optimizer_state"])
        model.load_state_dict(ckpt["state_dict"])  # keys, shapes and values checked above: it cannot fail midway
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from e
    if scheduler is not None:  # its layout was checked above
        scheduler.load_state_dict(copy.deepcopy(ckpt["scheduler"]["state"]))
    rng.set_state(ckpt["rng_state"])  # checked by load_checkpoint
