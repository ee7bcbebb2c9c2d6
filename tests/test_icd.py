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
                                            ("clnet", 0o777, "can be written by others"),
                                            ("clnet", 0o775, "can be written by its group"),
                                            ("cache", 0o777, "can be written by others"),
                                            ("cache", 0o775, "can be written by its group"),
                                            ("above", 0o757, "can be written by others")])
def test_a_directory_others_can_write_is_refused(one_library, level, mode, why):
    """Every folder on the way is refused if anyone else can write it, XDG_CACHE_HOME and the folders above it
    included: the loader resolves the path again by name, and whoever can rename an entry on the way can swap the
    directory it reads (a umask of 002's group-writable clnet/ too)."""
    made = dict(icd=one_library, clnet=one_library.parent, cache=one_library.parent.parent,
                above=one_library.parent.parent.parent)[level]
    made.mkdir(parents=True, exist_ok=True)
    os.chmod(made, mode)
    before = os.environ["OCL_ICD_VENDORS"]
    with pytest.raises(device_mod.UnsafeICDDirectory, match=why) as e:
        device_mod.register_vendor_libraries()
    assert str(made) in str(e.value) and "CLNET_NO_ICD_SEARCH" in str(e.value)
    assert ("rm -r" in str(e.value)) == (level == "icd") and "\n" not in str(e.value)
    assert isinstance(e.value, clnet.DeviceNotFound)  # commands report it as they report a missing device
    assert [p for p in made.rglob("*.icd")] == []  # nothing written
    assert os.environ["OCL_ICD_VENDORS"] == before and device_mod.registered_libraries == []  # nor used
    os.chmod(made, 0o700)


def test_a_sticky_cache_directory_is_accepted(one_library):
    """World-writable with the sticky bit (as /tmp): nobody can rename or remove what another user owns there, and
    clnet/ and below, this user's, are checked in turn."""
    cache = one_library.parent.parent
    cache.mkdir()
    os.chmod(cache, 0o1777)
    new_dir = device_mod.register_vendor_libraries()
    assert os.path.dirname(new_dir) == str(one_library) and _mode(one_library.parent) == 0o700


def test_a_directory_owned_by_someone_else_is_refused(one_library, monkeypatch):
    one_library.mkdir(parents=True, mode=0o700)
    if os.getuid() == 0:  # root can give it away for real
        os.chown(one_library, 65534, 65534)
        refused = one_library
    else:  # elsewhere the process pretends to be another user: its own directories then belong to someone else
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
        refused = next(p for p in reversed(one_library.parents) if os.stat(p).st_uid == real)  # the first one
    with pytest.raises(device_mod.UnsafeICDDirectory, match="belongs to user id") as e:
        device_mod.register_vendor_libraries()
    assert str(refused) in str(e.value)
    monkeypatch.undo()
    assert list(one_library.iterdir()) == []


def test_a_link_of_this_user_is_followed_and_the_loader_gets_the_resolved_path(one_library, tmp_path):
    """A link in a folder only this user can write (a cache kept on another disk) is followed; the loader is handed
    the path with every link resolved, so that nothing is resolved again through a link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    one_library.parent.mkdir(parents=True, mode=0o700)
    os.symlink(elsewhere, one_library)
    new_dir = device_mod.register_vendor_libraries()
    assert os.path.dirname(new_dir) == str(elsewhere) and os.path.realpath(new_dir) == new_dir
    assert os.environ["OCL_ICD_VENDORS"] == new_dir


@pytest.mark.skipif(os.geteuid() != 0, reason="a link owned by another user can only be made by root")
def test_another_users_link_in_a_sticky_folder_is_refused(one_library, tmp_path):
    """In a sticky folder others can write, a link another user made (in place of clnet/) is not followed."""
    cache, elsewhere = one_library.parent.parent, tmp_path / "someone-elses"
    elsewhere.mkdir(mode=0o700)
    cache.mkdir()
    os.chmod(cache, 0o1777)
    os.symlink(elsewhere, one_library.parent)
    os.lchown(one_library.parent, 65534, 65534)
    with pytest.raises(device_mod.UnsafeICDDirectory, match="is a link in a folder others can write"):
        device_mod.register_vendor_libraries()
    assert list(elsewhere.iterdir()) == []


def test_libraries_found_through_relative_search_paths_are_registered_by_absolute_path(one_library, tmp_path,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", "lib")  # relative: found from tmp_path, the folder this process runs in
    monkeypatch.setattr(device_mod, "LIBRARY_DIRS", ())
    new_dir = device_mod.register_vendor_libraries()
    text, = [open(os.path.join(new_dir, f)).read() for f in os.listdir(new_dir)]
    assert text == str(tmp_path / "lib" / "libnvidia-opencl.so.1") + "\n"


def test_ldconfig_is_run_by_absolute_path(tmp_path, monkeypatch):
    """An `ldconfig` earlier on PATH (anybody's program) is never run."""
    fake, marker = tmp_path / "ldconfig", tmp_path / "ran"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ.get('PATH', '')}")
    device_mod._ldconfig_paths()
    assert not marker.exists()


def test_a_platform_that_fails_to_list_its_devices_is_named(monkeypatch):
    """No device found on a platform is no news; any other failure is a warning naming the platform, not silence."""
    import pyopencl as cl

    class Platform:
        def __init__(self, name, code):
            self.name, self.code = name, code

        def get_devices(self):
            raise cl.RuntimeError(cl._cl._ErrorRecord(msg=f"clGetDeviceIDs failed: {self.code}", code=self.code,
                                                      routine="clGetDeviceIDs"))

    monkeypatch.setattr(device_mod, "_register_once", lambda: None)
    monkeypatch.setattr(cl, "get_platforms", lambda: [Platform("Quiet", cl.status_code.DEVICE_NOT_FOUND),
                                                      Platform("Broken", cl.status_code.OUT_OF_HOST_MEMORY)])
    with pytest.warns(UserWarning) as caught:
        assert device_mod._all_cl_devices() == []
    messages = [str(w.message) for w in caught]
    assert any("'Broken'" in m and "OUT_OF_HOST_MEMORY" in m for m in messages), messages
    assert not any("Quiet" in m for m in messages), messages


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


def test_a_device_that_cannot_build_is_listed_unusable_and_never_picked(monkeypatch):
    """A device whose compiler fails every build (PyPI's PoCL 3.0 on a CPU its LLVM 14 does not know) is listed with
    the compiler's words and skipped by auto/cpu; asked for by index it is refused with the fix."""
    import clnet
    from clnet import devices
    rows = [r for r in clnet.list_devices() if r["usable"] and not r["simulator"]]
    if not rows:
        pytest.skip("no usable device")
    victim = devices._all_cl_devices()[rows[0]["index"]]
    monkeypatch.setitem(devices._problems, victim.int_ptr, "error: unknown target CPU 'generic'")
    listed = {r["index"]: r for r in clnet.list_devices()}[rows[0]["index"]]
    assert not listed["usable"] and listed["problem"] == "error: unknown target CPU 'generic'"
    with pytest.raises(clnet.DeviceNotFound, match=r"cannot compile OpenCL kernels here \(error: unknown target CPU "
                                                   r"'generic'\)"):
        clnet.device(rows[0]["index"])
    others = [r for r in rows[1:]]
    if others:
        assert clnet.device("auto").index != rows[0]["index"]
    else:
        with pytest.raises(clnet.DeviceNotFound, match="no usable OpenCL device"):
            clnet.device("auto")
