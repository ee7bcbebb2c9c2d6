"""files.write_atomically, through which clnet writes every file: no folder another user can change, no link or
file another user planted followed, modes set on the open file and taken from the umask or the file replaced.

Another user is simulated with modes (a folder its group or everyone can write), with links put where clnet's
temporary file is, and, as root, with chown; the checks read owners and modes, which root's writes would bypass."""
import os
import stat

import numpy as np
import pytest

import clnet
from clnet import files, models, optim
from clnet.checkpoint import save_checkpoint

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def umask():
    """Sets the process's umask for one test (umask(m)), restoring it afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def _write(path, text="new"):
    files.write_atomically(path, lambda f: f.write(text), text=True)


def test_a_temporary_file_swapped_for_a_link_never_changes_the_links_target(tmp_path):
    """The attack the review ran as root: while clnet writes its temporary file, the file is replaced by a link to a
    private file. Nothing is done to the private file by path (no chmod, no rename onto it), and the write fails
    instead of putting the link in the checkpoint's place."""
    victim = tmp_path / "root-only"
    victim.write_text("secret")
    victim.chmod(0o600)
    target = tmp_path / "out.json"

    def swap(f):
        f.write("payload")
        tmp, = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        tmp.unlink()
        tmp.symlink_to(victim)

    with pytest.raises(files.UnsafeFolder, match="replaced"):
        files.write_atomically(target, swap, text=True)
    assert _mode(victim) == 0o600 and victim.read_text() == "secret"
    assert not target.exists() and not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root-only"]  # the planted link is removed, not followed


def test_the_temporary_file_is_created_afresh_never_through_what_stands_there(tmp_path, monkeypatch):
    """O_CREAT|O_EXCL|O_NOFOLLOW: a link (or file) at the temporary name clnet draws is skipped, not opened."""
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / ".out.json.planted.tmp").symlink_to(elsewhere)
    _write(tmp_path / "out.json")
    assert not elsewhere.exists() and (tmp_path / "out.json").read_text() == "new"


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_takes_its_mode_from_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    _write(tmp_path / "new.json")
    assert _mode(tmp_path / "new.json") == expected


@pytest.mark.parametrize("old_mode", [0o600, 0o640, 0o664])
def test_a_replaced_file_keeps_its_mode(tmp_path, umask, old_mode):
    umask(0o022)
    path = tmp_path / "kept.json"
    path.write_text("old")
    path.chmod(old_mode)
    _write(path)
    assert path.read_text() == "new" and _mode(path) == old_mode


@pytest.mark.parametrize("mode,why", [(0o777, "can be written by others"), (0o770, "can be written by its group"),
                                      (0o1777, "can be written by others"), (0o757, "can be written by others")])
def test_a_folder_others_can_write_is_refused(tmp_path, mode, why):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(files.UnsafeFolder, match=why) as e:
        _write(folder / "out.json")
    message = str(e.value)
    assert str(folder) in message and f"chmod go-w {folder}" in message and "\n" not in message
    assert isinstance(e.value, clnet.Error) and isinstance(e.value, OSError) and e.value.strerror == message
    assert list(folder.iterdir()) == []


def test_a_folder_another_user_owns_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    if IS_ROOT:
        os.chown(folder, 65534, 65534)
    else:  # the process pretends to be someone else: its own folder then belongs to another user
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    with pytest.raises(files.UnsafeFolder, match="belongs to user id"):
        _write(folder / "out.json")
    monkeypatch.undo()
    assert list(folder.iterdir()) == []


def test_folders_clnet_makes_are_never_writable_by_others(tmp_path, umask):
    """A umask of 002 would leave them group-writable, and the next write in them would be refused."""
    umask(0o002)
    _write(tmp_path / "a" / "b" / "out.json")
    _write(tmp_path / "a" / "b" / "out.json", "again")
    for level in (tmp_path / "a", tmp_path / "a" / "b"):
        assert _mode(level) == 0o755, (level, oct(_mode(level)))


def test_a_link_in_a_folder_others_can_write_is_not_followed(tmp_path):
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    mine.mkdir(mode=0o700)
    shared.chmod(0o777)
    (shared / "runs").symlink_to(mine)
    with pytest.raises(files.UnsafeFolder, match="is a link in a folder others can write"):
        _write(shared / "runs" / "out.json")
    assert list(mine.iterdir()) == []
    (tmp_path / "mine-too").symlink_to(mine)  # a link in a folder of this user's own is followed
    _write(tmp_path / "mine-too" / "out.json")
    assert (mine / "out.json").read_text() == "new"


def test_a_folder_reached_through_dot_dot_after_a_link_is_the_one_the_kernel_finds(tmp_path, monkeypatch):
    """link/.. is the link target's parent (not normalised away), and a relative path starts at the working folder."""
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "deep" / "er")
    monkeypatch.chdir(tmp_path)
    _write("link/../out.json")
    assert (tmp_path / "deep" / "out.json").read_text() == "new" and not (tmp_path / "out.json").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "kept.json"
    path.write_text("old")

    def fail(f):
        f.write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.write_atomically(path, fail, text=True)
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["kept.json"]


def test_checkpoints_go_through_the_same_rules(tmp_path, umask):
    """A checkpoint of a private run stays private (umask 077), and one in a folder its group can write is refused."""
    net = models.build("lenet")
    opt = optim.SGD(net.parameters(), lr=0.1)
    umask(0o077)
    save_checkpoint(tmp_path / "run.ckpt", net, opt, dict(model="lenet"))
    assert _mode(tmp_path / "run.ckpt") == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    with pytest.raises(clnet.Error, match="can be written by its group"):
        save_checkpoint(shared / "run.ckpt", net, opt, dict(model="lenet"))
    assert list(shared.iterdir()) == []
    assert np.load(tmp_path / "run.ckpt").files  # the private one is a whole archive


def test_check_writable_refuses_what_a_write_would_and_writes_nothing(tmp_path):
    """For commands that check a log's or a checkpoint's folder before training, not after an epoch."""
    files.check_writable(tmp_path / "new" / "out.json")
    assert os.listdir(tmp_path / "new") == []
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    with pytest.raises(files.UnsafeFolder, match="can be written by its group"):
        files.check_writable(shared / "out.json")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError):
        files.check_writable(tmp_path / "a-file" / "out.json")
