"""Files that are not checkpoints: `clnet eval --checkpoint`, `clnet train --resume` and load_checkpoint say so in
words a user can act on (no library's internals, no advice about unpickling), for a system file, an empty file, a
truncated checkpoint, another program's archive. No device is needed: every file is refused before one is chosen."""
import numpy as np
import pytest
from click.testing import CliRunner

from clnet import models, optim, rng
from clnet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from clnet.cli import main

# words of NumPy's own messages (and Python's exception names) that must not reach the user
INTERNALS = ("pickle", "allow_pickle", "Traceback", "ValueError", "BadZipFile", "EOFError", "zip file", "CRC")


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A real lenet checkpoint, written from host weights (no device involved, no training)."""
    path = tmp_path_factory.mktemp("ckpt") / "lenet.ckpt"
    rng.manual_seed(0)
    net = models.build("lenet")
    meta = dict(model="lenet", architecture=repr(net), epoch=0, step=0, global_step=0, rng_state=rng.get_state(),
                config=dict(dataset="fashion-mnist"), history=[])
    save_checkpoint(path, net, optim.SGD(net.parameters(), lr=0.1, momentum=0.9), meta)
    return path


def bad_files(tmp_path, good):
    """(name, path, words the message must hold) for every kind of file that is not a usable checkpoint."""
    data = good.read_bytes()
    cases = {
        "empty": (b"", "is empty, not a clnet checkpoint"),
        "text": (b"root:x:0:0:root:/root:/bin/bash\n", "is not a clnet checkpoint"),
        "truncated": (data[:len(data) // 2], "is damaged"),
        "cut-at-header": (data[:3], "is not a clnet checkpoint"),
        "flipped-byte": (data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:],
                         "is damaged"),
    }
    out = [(name, tmp_path / f"{name}.ckpt", words) for name, (_, words) in cases.items()]
    for name, path, _ in out:
        path.write_bytes(cases[name][0])
    np.save(tmp_path / "array.npy", np.arange(3))
    out.append(("npy", tmp_path / "array.npy", "is not a clnet checkpoint (a NumPy array file)"))
    np.savez(tmp_path / "other.npz", weights=np.arange(3))
    out.append(("other-archive", tmp_path / "other.npz", "an archive without clnet's record"))
    # a record stored as a pickled object: refused without unpickling it
    np.savez(tmp_path / "object-record.npz", meta=np.array([{"format": "clnet-checkpoint"}], dtype=object))
    out.append(("pickled-record", tmp_path / "object-record.npz", "its record is not clnet's"))
    np.savez(tmp_path / "foreign.npz", meta=np.array('{"format": "something else"}'))
    out.append(("foreign-record", tmp_path / "foreign.npz", "no 'clnet-checkpoint' record"))
    out.append(("system-file", "/etc/passwd", "/etc/passwd is not a clnet checkpoint"))
    return out


def _clean(message, path, words):
    assert str(path) in message and words in message, message
    assert not any(w in message for w in INTERNALS), message


def test_load_checkpoint_explains_files_that_are_not_checkpoints(tmp_path, good_checkpoint):
    assert load_checkpoint(good_checkpoint)["model"] == "lenet"  # the fixture itself is a checkpoint
    for name, path, words in bad_files(tmp_path, good_checkpoint):
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path)
        _clean(str(e.value), path, words)
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "absent.ckpt")


@pytest.mark.parametrize("command", ["eval", "train --resume"])
def test_commands_explain_files_that_are_not_checkpoints(tmp_path, good_checkpoint, command):
    """One line (click's `Error: ...`), exit status 1, no traceback: through the command a user types."""
    for name, path, words in bad_files(tmp_path, good_checkpoint):
        args = ["eval", "lenet", "--checkpoint", str(path)] if command == "eval" else \
            ["train", "lenet", "--resume", str(path)]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and not isinstance(r.exception, CheckpointError), (name, r.output, r.exception)
        assert r.output.startswith("Error: ") and r.output.count("\n") == 1, (name, r.output)
        _clean(r.output, path, words)

