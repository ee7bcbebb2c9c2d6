"""Registering vendor OpenCL libraries safely: nothing is written at import; the ICD files go, at the first device
use, into a directory only the user can write; a directory another user owns, that others may write, or a link in
its place is refused before anything is written (the OpenCL loader would load any library an ICD file there
names, inside this process)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

import clnet
from clnet import devices as device_mod


@pytest.fixture
def one_library(tmp_path, monkeypatch):
    """Discovery that finds one vendor library without an ICD file (a stand-in file; nothing loads it), with the
    cache directory under tmp_path/cache. Yields the registration root, tmp_path/cache/clnet/icd."""
    vendors, libdir = tmp_path / "vendors", tmp_path / "lib"
    vendors.mkdir()
    libdir.mkdir()
    (libdir / "libnvidia-opencl.so.1").write_text("")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    monkeypatch.delenv("CLNET_NO_ICD_SEARCH", raising=False)
    monkeypatch.setattr(device_mod, "LIBRARY_DIRS", (str(libdir),))
    monkeypatch.setattr(device_mod, "_ldconfig_paths", lambda: {})
    monkeypatch.setattr(device_mod, "registered_libraries", [])
    monkeypatch.setattr(device_mod, "how_found", {})
    yield tmp_path / "cache" / "clnet" / "icd"


def _mode(path):
    return os.stat(path).st_mode & 0o777


def test_registration_goes_into_a_private_directory(one_library):
    new_dir = device_mod.register_vendor_libraries()
    assert os.environ["OCL_ICD_VENDORS"] == new_dir and os.path.dirname(new_dir) == str(one_library)
    for level in (one_library.parent, one_library, new_dir):  # clnet/, icd/, icd/<digest>: each made 0700
        assert _mode(level) == 0o700, (level, oct(_mode(level)))
    assert [open(os.path.join(new_dir, f)).read() for f in os.listdir(new_dir)] == \
        [device_mod.registered_libraries[0] + "\n"]
    os.environ["OCL_ICD_VENDORS"] = str(one_library.parent.parent.parent / "vendors")  # as a new process sees it
    assert device_mod.register_vendor_libraries() == new_dir  # the next process reuses the directory


@pytest.mark.parametrize("level,mode,why", [("icd", 0o777, "can be written by others"),
                                            ("icd", 0o770, "can be written by its group"),
                                            ("clnet", 0o777, "can be written by others")])
def test_a_directory_others_can_write_is_refused(one_library, level, mode, why):
    made = one_library if level == "icd" else one_library.parent
    made.mkdir(parents=True)
    os.chmod(made, mode)
    before = os.environ["OCL_ICD_VENDORS"]
    with pytest.raises(device_mod.UnsafeICDDirectory, match=why) as e:
        device_mod.register_vendor_libraries()
    assert str(made) in str(e.value) and "CLNET_NO_ICD_SEARCH" in str(e.value)
    assert isinstance(e.value, clnet.DeviceNotFound)  # commands report it as they report a missing device
    assert [p for p in made.rglob("*")] == [] and os.environ["OCL_ICD_VENDORS"] == before  # nothing written, used
    assert device_mod.registered_libraries == []


def test_a_group_writable_cache_directory_is_accepted(one_library):
    """A umask of 002 leaves ~/.cache/clnet (made by the tuning cache) group-writable; the directories clnet makes
    below it for the registration are 0700 and checked strictly, so the group cannot enter them."""
    one_library.parent.mkdir(parents=True)
    os.chmod(one_library.parent, 0o775)
    assert _mode(os.path.dirname(device_mod.register_vendor_libraries())) == 0o700


def test_a_directory_owned_by_someone_else_is_refused(one_library, monkeypatch):
    one_library.mkdir(parents=True, mode=0o700)
    if os.getuid() == 0:  # root can give it away for real
        os.chown(one_library, 65534, 65534)
        refused = one_library
    else:  # elsewhere the process pretends to be another user: its own directories then belong to someone else
        real = os.getuid()
        monkeypatch.setattr(device_mod.os, "getuid", lambda: real + 1)
        refused = one_library.parent
    with pytest.raises(device_mod.UnsafeICDDirectory, match="belongs to user id") as e:
        device_mod.register_vendor_libraries()
    assert str(refused) in str(e.value)
    monkeypatch.undo()
    assert list(one_library.iterdir()) == []


def test_a_link_in_place_of_the_directory_is_refused(one_library, tmp_path):
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir(mode=0o700)
    one_library.parent.mkdir(parents=True, mode=0o700)
    os.symlink(elsewhere, one_library)
    with pytest.raises(device_mod.UnsafeICDDirectory, match="not a directory"):
        device_mod.register_vendor_libraries()
    assert list(elsewhere.iterdir()) == []


def test_without_a_writable_cache_a_fresh_private_directory_is_used(one_library, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))  # a directory below a file: no cache
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    vendors = os.environ["OCL_ICD_VENDORS"]
    new_dir = device_mod.register_vendor_libraries()
    assert os.path.dirname(new_dir) == str(tmp_path) and os.path.basename(new_dir).startswith("clnet-icd-")
    assert _mode(new_dir) == 0o700 and os.listdir(new_dir) == ["clnet-libnvidia-opencl.icd"]
    monkeypatch.setenv("OCL_ICD_VENDORS", vendors)  # as a new process sees it
    again = device_mod.register_vendor_libraries()
    assert again is not None and again != new_dir  # a new name each time


def test_import_writes_nothing_and_the_first_device_use_registers(tmp_path):
    """A fresh process (the loader reads OCL_ICD_VENDORS once, at its first platform query): importing clnet writes
    no file and sets nothing; listing the devices registers into the private directory, and the libraries that have
    no ICD file here (Intel's runtime in this Python environment, Debian's Oclgrind) are found through it."""
    cache, home, tmp = tmp_path / "cache", tmp_path / "home", tmp_path / "tmp"
    for d in (home, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", "CLNET_NO_ICD_SEARCH")}
    env.update(XDG_CACHE_HOME=str(cache), HOME=str(home), TMPDIR=str(tmp),
               PYTHONPATH=os.path.dirname(os.path.dirname(clnet.__file__)))
    script = (
        "import json, os, sys\n"
        "import clnet\n"
        "from clnet import devices\n"
        "root = sys.argv[1]\n"
        "after_import = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)\n"
        "print(json.dumps(dict(clnet=clnet.__file__, after_import=after_import,"
        " vendors=os.environ.get('OCL_ICD_VENDORS'),"
        " platforms=sorted({r['platform'] for r in clnet.list_devices()}), directory=devices.icd_directory(),"
        " registered=devices.registered_libraries)))\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["clnet"] == clnet.__file__  # the clnet under test, not an installed copy
    assert got["after_import"] == [] and got["vendors"] is None, got
    expected = {"Oclgrind": os.path.join(device_mod.OCLGRIND_DIR, "liboclgrind-rt-icd.so"),
                "Intel(R) OpenCL": os.path.join(device_mod.ENVIRONMENT_LIB, "libintelocl.so")}
    present = {platform for platform, lib in expected.items() if os.path.exists(lib)}
    assert present <= set(got["platforms"]), got
    if got["registered"]:
        assert os.path.dirname(got["directory"]) == str(cache / "clnet" / "icd"), got
        assert _mode(got["directory"]) == 0o700
        assert {lib for platform, lib in expected.items() if platform in present} <= set(got["registered"]), got
    else:
        assert not present and got["directory"] is None, got
