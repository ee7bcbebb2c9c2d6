"""Checkpoints: one ``.npz`` file (no pickle) holding the weights and buffers, the optimizer's state as arrays, and
a JSON record of the model (name and architecture), the run's configuration, the position (epoch, step), the
random-stream state and the history so far. Written atomically (files.write_atomically): an interrupted write never
leaves a broken checkpoint.
"""
import json
import os
import zipfile
import zlib

import numpy as np

from . import rng
from .files import write_atomically
from .errors import Error

FORMAT = "clnet-checkpoint"
VERSION = 2  # 2: buffers (batch norm) in the model, optimizer state keyed by parameter and name


class CheckpointError(Error, ValueError):
    """A checkpoint that cannot be read, or that does not fit the model or run it is loaded into."""


def save_checkpoint(path, model, optimizer, meta):
    """Write model weights and buffers, optimizer state and the JSON-able ``meta`` record to PATH atomically."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    for i, entry in state["state"].items():
        for name, a in entry.items():
            arrays[f"optim/{i}/{name}"] = a
    group = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
    record = dict(meta, format=FORMAT, version=VERSION, optimizer=dict(type=type(optimizer).__name__, **group))
    arrays["meta"] = np.array(json.dumps(record))
    write_atomically(path, lambda f: np.savez(f, **arrays))


# np.savez writes a zip archive; every zip file starts with a local file header.
ZIP_MAGIC = b"PK\x03\x04"
NPY_MAGIC = b"\x93NUMPY"
NOT_A_CHECKPOINT = ("clnet writes checkpoints with `clnet train --checkpoint FILE` (or clnet.fit(..., "
                    "checkpoint=FILE)); pass one of those")


def _refuse_other_files(path):
    """Raise CheckpointError, in words a user can act on, for a PATH that cannot be a checkpoint: missing, a
    directory, unreadable, empty, or not a zip archive (/etc/passwd, a .npy array, a text file). np.load would
    otherwise guess the format from the first bytes and answer with its own advice (about unpickling)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP_MAGIC))
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {path}: no such file") from e
    except IsADirectoryError as e:
        raise CheckpointError(f"checkpoint {path} is a directory, not a checkpoint file") from e
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read ({e.strerror})") from e
    if not head:
        raise CheckpointError(f"checkpoint {path} is empty, not a clnet checkpoint (a write that never finished, or "
                              f"the wrong file); {NOT_A_CHECKPOINT}")
    if head != ZIP_MAGIC:
        kind = "a NumPy array file" if NPY_MAGIC.startswith(head) else "not the archive of arrays clnet writes"
        raise CheckpointError(f"{path} is not a clnet checkpoint ({kind}); {NOT_A_CHECKPOINT}")


def load_checkpoint(path):
    """Read a checkpoint into a dict: meta fields, plus ``state_dict`` and ``optimizer_state``. Nothing is applied.

    Raises CheckpointError naming the file when it is missing, damaged or not a clnet checkpoint, in words that
    name no library (the underlying exception stays chained as its cause).
    """
    path = os.fspath(path)
    _refuse_other_files(path)
    try:
        with np.load(path, allow_pickle=False) as z:
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
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {meta.get('version')}; this clnet reads "
                              f"version {VERSION}")
    try:
        state_dict = {k[len("model/"):]: v for k, v in entries.items() if k.startswith("model/")}
        state = {}
        for k, v in entries.items():
            if k.startswith("optim/"):
                _, i, name = k.split("/", 2)
                state.setdefault(int(i), {})[name] = v
        group = dict(meta["optimizer"])
        optimizer_state = dict(type=group.pop("type"), state=state, param_groups=[group])
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
    own = {k: tuple(t.shape) for k, t in model._state_items()}  # shapes only: no weights read back from the device
    theirs = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    if own != theirs:
        raise CheckpointError(f"{where}: its weights {theirs} do not match the model's {own}")


def load_into(ckpt, model, optimizer, model_name=None):
    """Check that ckpt fits, then load its weights, optimizer state and random-stream state."""
    check_checkpoint_fits(ckpt, model, model_name)
    try:
        model.load_state_dict(ckpt["state_dict"])
        if optimizer is not None:
            saved = ckpt["optimizer_state"]["type"]
            if saved != type(optimizer).__name__:
                raise CheckpointError(f"checkpoint {ckpt['path']} holds {saved} state, the run uses "
                                      f"{type(optimizer).__name__}; resume with the checkpoint's optimizer")
            optimizer.load_state_dict(ckpt["optimizer_state"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt['path']}: {e}") from e
    rng.set_state(ckpt["rng_state"])
