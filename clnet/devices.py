"""OpenCL discovery: platforms, device choice, context and queue.

This is the only module that asks OpenCL which platforms and devices exist.  It also registers vendor OpenCL
libraries that are installed but have no ICD file (common in containers, where ``libnvidia-opencl.so.1`` is mounted
from the host but ``/etc/OpenCL/vendors`` is empty), so that such a GPU is found without editing system files.
"""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile

from .files import write_atomically

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
    search = [(d, "on LD_LIBRARY_PATH") for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
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


def _ldconfig_paths():
    """Library name -> paths from the dynamic linker's cache, for libraries outside the usual directories."""
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    paths = {}
    for line in text.splitlines():
        name, _, path = line.strip().partition(" => ")
        name = name.split(" ", 1)[0]
        if path and name in VENDOR_LIBRARIES:
            paths.setdefault(name, []).append(path)
    return paths


def register_vendor_libraries():
    """Point the ICD loader at a directory naming every vendor library found; must run before OpenCL is queried.

    The loader reads ``OCL_ICD_VENDORS`` once, at the first platform query, and then ignores the system directory,
    so the new directory repeats every ICD file that was already registered.
    """
    if os.environ.get("CLNET_NO_ICD_SEARCH"):
        return
    vendor_dir, found = _find_unregistered_libraries()
    if not found:
        return
    files = {}
    for icd in glob.glob(os.path.join(vendor_dir, "*.icd")):
        with open(icd) as src:
            files[os.path.basename(icd)] = src.read()
    for path in found:
        files["clnet-" + os.path.basename(path).split(".")[0] + ".icd"] = path + "\n"
    # One directory per distinct content, reused by every process instead of a new one each time.
    digest = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()[:12]
    new_dir = os.path.join(tempfile.gettempdir(), f"clnet-icd-{os.getuid()}-{digest}")
    os.makedirs(new_dir, exist_ok=True)
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


register_vendor_libraries()

import pyopencl as cl  # noqa: E402  (the loader must see OCL_ICD_VENDORS first)
import pyopencl.characterize  # noqa: E402

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


class DeviceNotFound(RuntimeError):
    pass


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
    """Every device, simulators last, so that installing Oclgrind leaves the real devices' indices alone."""
    try:
        platforms = cl.get_platforms()
    except cl.LogicError:  # the ICD loader reports "no platform" as an error
        platforms = []
    devices = []
    for p in platforms:
        try:
            devices.extend(p.get_devices())
        except cl.Error:
            continue
    return sorted(devices, key=is_simulator)


def list_devices():
    """Every OpenCL device as a dict, in the index order that `device(int)` uses."""
    rows = []
    for i, d in enumerate(_all_cl_devices()):
        rows.append(dict(index=i, platform=d.platform.name.strip(), name=d.name.strip(), simulator=is_simulator(d),
                         type=cl.device_type.to_string(d.type), compute_units=d.max_compute_units,
                         global_mem=d.global_mem_size, local_mem=d.local_mem_size, version=d.version.strip(),
                         driver=d.driver_version.strip()))
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
        chosen = matches[0]
    index = devices.index(chosen)
    key = (chosen.platform.name, chosen.name, index)
    if key not in _open_devices:
        _open_devices[key] = Device(index, chosen)
    return _open_devices[key]
