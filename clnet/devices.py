"""OpenCL discovery: platforms, device choice, context and queue.

This is the only module that asks OpenCL which platforms and devices exist.  It also registers vendor OpenCL
libraries that are installed but have no ICD file (common in containers, where ``libnvidia-opencl.so.1`` is mounted
from the host but ``/etc/OpenCL/vendors`` is empty), so that such a GPU is found without editing system files. They
are registered at the first device use (nothing is written at import), in a directory only the user can write
(`icd_directory` says which).
"""
import atexit
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import pyopencl as cl  # importing it queries no platform: the loader reads OCL_ICD_VENDORS at the first query
import pyopencl.characterize

from .files import UnsafeFolder, open_folder, write_atomically
from .errors import Error
from . import sources

SYSTEM_VENDOR_DIR = "/etc/OpenCL/vendors"
# Vendor libraries that implement the ICD interface, by the file names their drivers install.
VENDOR_LIBRARIES = ("libnvidia-opencl.so.1", "libamdocl64.so", "libamdocl-orca64.so", "libigdrcl.so",
                    "libintelocl.so", "libmali.so", "libpocl.so.2", "liboclgrind-rt-icd.so")
# pip's intel-opencl-rt puts libintelocl.so in the environment's lib/ with an ICD file naming the path it was built
# at (/opt/anaconda1anaconda2anaconda3/lib), so nothing finds it; Debian's oclgrind installs no ICD file at all.
ENVIRONMENT_LIB = os.path.join(sys.prefix, "lib")
OCLGRIND_DIR = "/usr/lib/oclgrind"
LIBRARY_DIRS = (ENVIRONMENT_LIB, "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64", "/usr/lib", "/usr/local/lib", "/usr/lib/wsl/lib", "/opt/rocm/lib", "/opt/rocm/opencl/lib",
                "/usr/lib/x86_64-linux-gnu/intel-opencl", "/usr/lib/aarch64-linux-gnu", OCLGRIND_DIR)

# Libraries clnet registered itself, reported by `clnet devices`, and how each was found (path -> words).
registered_libraries = []
how_found = {}


def _how(directory, source):
    if directory == ENVIRONMENT_LIB:
        return f"found in the active Python environment ({directory}), where pip installs it without a usable ICD file"
    if directory == OCLGRIND_DIR:
        return f"found in {directory}, where Debian's oclgrind package installs it without an ICD file"
    return f"found {source} ({directory}), installed without an ICD file"


def _find_unregistered_libraries():
    """Vendor libraries present on disk that no ICD file already names.

    An ICD file may name a library by another name or path than ours (a versioned file, a full path), so a library
    counts as registered when its name or its resolved file matches an ICD entry's. An entry naming a full path that
    does not exist (pip's Intel ICD file) registers nothing.
    """
    vendor_dir = os.environ.get("OCL_ICD_VENDORS", SYSTEM_VENDOR_DIR)
    # absolute: an ICD file names the library by the path written in it, which the loader would otherwise read from
    # whatever folder a later process runs in
    search = [(os.path.abspath(d), "on LD_LIBRARY_PATH") for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
              if d]
    search += [(d, "in a usual library directory") for d in LIBRARY_DIRS]
    cached = _ldconfig_paths()

    def locate(entry):
        if os.path.isabs(entry):
            return (entry, "named by an ICD file") if os.path.exists(entry) else (None, None)
        for d, source in search:
            if os.path.exists(os.path.join(d, entry)):
                return os.path.join(d, entry), _how(d, source)
        for p in cached.get(entry, []):
            if os.path.exists(p):
                return p, _how(os.path.dirname(p), "in the dynamic linker's cache")
        return None, None

    named = set()
    for icd in glob.glob(os.path.join(vendor_dir, "*.icd")):
        try:
            with open(icd) as f:
                entry = f.read().strip()
        except OSError:
            continue
        path = locate(entry)[0]
        if path:
            named.add(os.path.realpath(path))
        if path or not os.path.isabs(entry):
            named.add(os.path.basename(entry))
    found = []
    for name in VENDOR_LIBRARIES:
        path, how = locate(name)
        if path and name not in named and os.path.realpath(path) not in named:
            found.append(path)
            how_found[path] = how
    return vendor_dir, found


# The system's ldconfig, by absolute path: one found on PATH could be anybody's program.
LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/usr/bin/ldconfig")


def _ldconfig_paths():
    """Library name -> paths from the dynamic linker's cache, for libraries outside the usual directories (none
    where the system has no ldconfig: libraries are then looked for in the directories searched above)."""
    program = next((p for p in LDCONFIG if os.access(p, os.X_OK)), None)
    if program is None:
        return {}
    try:
        text = subprocess.run([program, "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError) as e:
        warnings.warn(f"clnet: `{program} -p` failed ({e}); OpenCL libraries known only to the dynamic linker's "
                      "cache are not registered")
        return {}
    paths = {}
    for line in text.splitlines():
        name, _, path = line.strip().partition(" => ")
        name = name.split(" ", 1)[0]
        if path and name in VENDOR_LIBRARIES:
            paths.setdefault(name, []).append(path)
    return paths


class DeviceNotFound(Error, RuntimeError):
    pass


class UnsafeICDDirectory(DeviceNotFound):
    """The directory clnet would register vendor libraries in could be written by another user, who could then make
    the OpenCL loader load a library of theirs into this process. A DeviceNotFound, so that every command that
    reports a missing device reports this too, in one line."""


# Where the registration lives: a directory of ICD files that only this user can write. The loader dlopens every
# library an ICD file there names, so a directory another user could write (the old predictable
# /tmp/clnet-icd-<uid>-<digest>, which anyone could create first) would run their code in every clnet process.
_registration = None  # None until the first device use; then dict(directory=path or None, libraries=[...])


def icd_root():
    """$XDG_CACHE_HOME/clnet/icd, else ~/.cache/clnet/icd: one subdirectory per distinct set of ICD files."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "clnet", "icd")


def _refuse(path, why):
    """UnsafeICDDirectory for PATH (the registration directory or a folder on the way to it), with the remedy: icd/
    and below hold nothing but the registration, so they can be removed and made afresh; a folder above (clnet/
    holds the tuning cache too) is the user's to fix."""
    ours = os.path.realpath(icd_root())
    if path == ours or path.startswith(ours + os.sep):
        fix = f"Remove it (`rm -r {path}`; clnet makes it afresh, private to you)"
    elif "written by" in why:
        fix = f"Make it private (`chmod go-w {path}`)"
    else:
        fix = "Use a directory of your own"
    raise UnsafeICDDirectory(
        f"clnet will not register OpenCL libraries in {path}: it {why}, so another user could add a library that "
        f"this process would load. {fix}, or set XDG_CACHE_HOME to a directory of your own, or CLNET_NO_ICD_SEARCH=1 "
        "to skip registering libraries.")


def _checked_folder(path, create):
    """PATH with every link resolved, after checking that nobody but this user (and root) can change any folder on
    the way to it (files.open_folder with every_ancestor): the loader resolves the path again later, by name, so a
    folder on the way that another user could rename or replace would let them swap the directory read. Folders
    made on the way are 0700."""
    try:
        fd, real = open_folder(path, create=create, mode=0o700, every_ancestor=True)
    except UnsafeFolder as e:
        refused = e
    else:
        os.close(fd)
        return real
    _refuse(refused.path, refused.why)  # outside the handler: one message, not two chained


def _registration_dir(digest):
    """A directory only this user can write, for one set of ICD files: icd_root()/<digest>, with no folder on the way
    that another user could change (XDG_CACHE_HOME, clnet/ and icd/ included), else (no writable cache directory:
    a read-only home) a fresh private temporary directory, removed at exit, checked the same way."""
    try:
        return _checked_folder(os.path.join(icd_root(), digest), create=True)
    except UnsafeICDDirectory:
        raise
    except OSError:
        temporary = tempfile.mkdtemp(prefix="clnet-icd-")  # mode 0700, a name nobody can guess
        atexit.register(shutil.rmtree, temporary, ignore_errors=True)
        return _checked_folder(temporary, create=False)


def register_vendor_libraries():
    """Point the ICD loader at a private directory naming every vendor library found, and return that directory
    (None when every library present is registered already).

    The loader reads ``OCL_ICD_VENDORS`` once, at the first platform query (importing pyopencl queries nothing), and
    then ignores the system directory, so the new directory repeats every ICD file that was already registered. It
    must therefore run before anything in the process asks OpenCL for its platforms: clnet does it at its first
    device use (`_all_cl_devices`), never at import.
    """
    if os.environ.get("CLNET_NO_ICD_SEARCH"):
        return None
    vendor_dir, found = _find_unregistered_libraries()
    if not found:
        return None
    files = {}
    for icd in glob.glob(os.path.join(vendor_dir, "*.icd")):
        with open(icd) as src:
            files[os.path.basename(icd)] = src.read()
    for path in found:
        files["clnet-" + os.path.basename(path).split(".")[0] + ".icd"] = path + "\n"
    # One directory per distinct content, reused by every process instead of a new one each time.
    digest = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()[:12]
    new_dir = _registration_dir(digest)
    for stale in set(os.listdir(new_dir)) - set(files):
        if stale.endswith(".icd"):  # the loader would read it too
            os.remove(os.path.join(new_dir, stale))
    for name, text in files.items():
        path = os.path.join(new_dir, name)
        try:
            with open(path) as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        # a process reading the directory meanwhile never sees half a file
        write_atomically(path, lambda f, text=text: f.write(text), text=True)
    os.environ["OCL_ICD_VENDORS"] = new_dir
    registered_libraries.extend(found)
    return new_dir


def _register_once():
    global _registration
    if _registration is None:
        directory = register_vendor_libraries()
        _registration = dict(directory=directory, libraries=list(registered_libraries))
    return _registration


def icd_directory():
    """The directory of ICD files clnet pointed the OpenCL loader at in this process (registering first, if no device
    was used yet), or None when it registered nothing (every library present had an ICD file already)."""
    return _register_once()["directory"]


_nv_capability_query = cl.characterize.nv_compute_capability
_has_nv_attributes = {}


def _nv_compute_capability(dev):
    """pyopencl asks every device for NVIDIA's compute capability (at each build and each kernel's first set_args);
    a device without cl_nv_device_attribute_query answers CL_INVALID_VALUE, which Oclgrind's API check reports as an
    error. Asked only of devices that have the extension, the answer is the same."""
    key = dev.int_ptr
    if key not in _has_nv_attributes:
        _has_nv_attributes[key] = "cl_nv_device_attribute_query" in dev.extensions
    return _nv_capability_query(dev) if _has_nv_attributes[key] else None


cl.characterize.nv_compute_capability = _nv_compute_capability


NO_PLATFORM_HELP = ("no OpenCL platform found. Install PoCL for the CPU (`pip install pocl-binary-distribution`, "
                    "which `pip install clnet` brings) or your GPU vendor's OpenCL driver.")


class Device:
    """One OpenCL device with its own context and in-order, profiling-enabled queue."""

    def __init__(self, index, cl_device):
        self.index = index
        self.cl_device = cl_device
        self.context = cl.Context([cl_device])
        self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.name = cl_device.name.strip()
        self.platform_name = cl_device.platform.name.strip()
        self.is_gpu = bool(cl_device.type & cl.device_type.GPU)
        self.kind = "gpu" if self.is_gpu else ("cpu" if cl_device.type & cl.device_type.CPU else "other")
        self.compute_units = cl_device.max_compute_units
        self.local_mem_size = cl_device.local_mem_size
        self.max_work_group_size = cl_device.max_work_group_size
        self.global_mem_size = cl_device.global_mem_size
        self.driver_version = cl_device.driver_version
        self.version = cl_device.version
        self.vendor = cl_device.vendor.strip()
        self.is_simulator = is_simulator(cl_device)
        self.opencl_c_version = _opencl_c_version(cl_device)
        # The largest work-group that launches of kernels checking their own bounds are padded to
        # (kernels.any_group): PoCL compiles a work-group function for each local size it runs (80-180 ms each on a
        # CPU) and, given none, picks a divisor of the global size, so every odd size was a build of its own
        # (bench/NOTES.md v25); 1024 ran fill and add over 4M and 7M elements as fast as PoCL's own choice. Oclgrind
        # pads too, past the pool's rounding of a small buffer (64 floats), so that its checks see a padded
        # work-item that writes. Other drivers choose (None).
        self.padded_group = (1024 if self.platform_name == "Portable Computing Language" else
                             128 if self.is_simulator else None)

    def synchronize(self):
        self.queue.finish()

    def __repr__(self):
        return f"Device({self.index}: {self.name!r} on {self.platform_name!r}, {self.kind})"


def _opencl_c_version(cl_device):
    """(major, minor) of the highest OpenCL C the device compiles ("OpenCL C 1.2 PoCL"); (1, 0) if unreadable."""
    try:
        words = cl_device.opencl_c_version.split()
        major, minor = words[2].split(".")[:2]
        return int(major), int(minor)
    except (cl.Error, IndexError, ValueError):
        return (1, 0)


def is_simulator(cl_device):
    """Oclgrind interprets every work-item (thousands of times slower than a CPU) and calls itself every device type,
    so clnet picks it only by name or index."""
    return cl_device.platform.name.strip() == "Oclgrind"


def _all_cl_devices():
    """Every device, simulators last, so that installing Oclgrind leaves the real devices' indices alone. The one
    place that asks OpenCL for its platforms: vendor libraries are registered first."""
    _register_once()
    try:
        platforms = cl.get_platforms()
    except cl.LogicError:  # the ICD loader reports "no platform" as an error
        platforms = []
    devices = []
    for p in platforms:
        try:
            devices.extend(p.get_devices())
        except cl.Error as e:
            if getattr(e, "code", None) == cl.status_code.DEVICE_NOT_FOUND:
                continue  # a platform whose driver sees no device of its own (a GPU driver on a machine without one)
            warnings.warn(f"clnet: skipping the OpenCL platform {p.name.strip()!r}: listing its devices failed "
                          f"({e}); its driver may need reinstalling")
    return sorted(devices, key=is_simulator)


_problems = {}


def build_problem(cl_device):
    """Why the device's OpenCL C compiler cannot build a trivial kernel (its own words), or None when it can; asked
    once per device and process. PoCL 3.0 from PyPI (LLVM 14) fails every build on CPUs its LLVM does not know
    (AMD's Zen 5: "unknown target CPU 'generic'"), while listing the device as usable."""
    key = cl_device.int_ptr
    if key not in _problems:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cl.Program(cl.Context([cl_device]), sources.source("probe.cl")).build()
            _problems[key] = None
        except cl.Error as e:
            lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower() and ln.strip()]
            _problems[key] = (lines[-1] if lines else str(e).strip().splitlines()[0])[:200]
    return _problems[key]


def _unusable_help(d, problem):
    fix = ("Debian's PoCL (`apt-get install pocl-opencl-icd`) or Intel's CPU runtime (`pip install intel-opencl-rt "
           "intel-cmplr-lib-rt`) runs on this CPU" if d.platform.name.strip() == "Portable Computing Language"
           else "reinstall or update its driver")
    return (f"{d.name.strip()} ({d.platform.name.strip()}) cannot compile OpenCL kernels here ({problem}); {fix}")


def list_devices():
    """Every OpenCL device as a dict, in the index order that `device(int)` uses. `usable` is False (and `problem`
    says why) for a device whose compiler cannot build a kernel; `device()` never picks one."""
    rows = []
    for i, d in enumerate(_all_cl_devices()):
        problem = None if is_simulator(d) else build_problem(d)
        rows.append(dict(index=i, platform=d.platform.name.strip(), name=d.name.strip(), simulator=is_simulator(d),
                         type=cl.device_type.to_string(d.type), compute_units=d.max_compute_units,
                         global_mem=d.global_mem_size, local_mem=d.local_mem_size, version=d.version.strip(),
                         driver=d.driver_version.strip(), usable=problem is None, problem=problem))
    return rows


_open_devices = {}


def _speed(d):
    return d.max_compute_units * d.max_clock_frequency


def device(spec="auto"):
    """Return the Device named by spec: 'auto', 'gpu', 'cpu', an index from `clnet devices`, or a substring of the
    device's or the platform's name ('intel', 'oclgrind'). 'auto', 'gpu' and 'cpu' never pick a simulator.

    The same physical device always gives the same Device object, so tensors made through either share a context.
    """
    if isinstance(spec, Device):
        return spec
    devices = _all_cl_devices()
    if not devices:
        raise DeviceNotFound(NO_PLATFORM_HELP)
    listing = "; ".join(f"{i}: {d.name.strip()} ({d.platform.name.strip()})" for i, d in enumerate(devices))
    spec_text = str(spec).strip()
    chosen = None
    real = [d for d in devices if not is_simulator(d)]
    broken = [d for d in real if build_problem(d) is not None]
    if broken and len(broken) == len(real) and spec_text.lower() in ("auto", "gpu", "cpu"):
        raise DeviceNotFound("no usable OpenCL device: " + "; ".join(_unusable_help(d, build_problem(d))
                                                                   for d in broken))
    real = [d for d in real if d not in broken]
    gpus = [d for d in real if d.type & cl.device_type.GPU]
    cpus = [d for d in real if d.type & cl.device_type.CPU]
    if spec_text.lower() == "auto":
        chosen = max(gpus or cpus or real or devices, key=_speed)
    elif spec_text.lower() == "gpu":
        if not gpus:
            raise DeviceNotFound(f"no OpenCL GPU found; devices present: {listing}. Use --device cpu, or install "
                                 "the GPU vendor's OpenCL driver.")
        chosen = max(gpus, key=_speed)
    elif spec_text.lower() == "cpu":
        if not cpus:
            raise DeviceNotFound(f"no OpenCL CPU device found; devices present: {listing}. "
                                 "`pip install pocl-binary-distribution` adds one.")
        chosen = max(cpus, key=_speed)
    elif spec_text.lstrip("-").isdigit():
        i = int(spec_text)
        if not 0 <= i < len(devices):
            raise DeviceNotFound(f"no OpenCL device with index {i}; devices present: {listing}")
        chosen = devices[i]
    else:
        matches = [d for d in devices
                   if spec_text.lower() in (d.name + " " + d.platform.name).lower()]
        if not matches:
            raise DeviceNotFound(f"no OpenCL device matches {spec_text!r}; devices present: {listing}")
        chosen = next((d for d in matches if d not in broken), matches[0])  # two PoCLs: the one that builds
    if chosen in broken:
        raise DeviceNotFound(_unusable_help(chosen, build_problem(chosen)))
    index = devices.index(chosen)
    key = (chosen.platform.name, chosen.name, index)
    if key not in _open_devices:
        _open_devices[key] = Device(index, chosen)
    return _open_devices[key]
