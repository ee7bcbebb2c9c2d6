"""Checkpoints: one ``.npz`` file (no pickle) holding the weights and buffers, the optimizer's state as arrays, and
a JSON record of the model (name and architecture), the run's configuration, the position (epoch, step), the
random-stream state and the history so far. Written atomically (files.write_atomically): an interrupted write never
leaves a broken checkpoint.
"""
import json
import os
import zipfile

import numpy as np

from . import rng
from .files import write_atomically

FORMAT = "clnet-checkpoint"
VERSION = 2  # 2: buffers (batch norm) in the model, optimizer state keyed by parameter and name


class CheckpointError(ValueError):
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
