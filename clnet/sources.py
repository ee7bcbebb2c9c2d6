"""Where clnet's OpenCL C sources are (cl_kernels/, shipped in the wheel as clnet.cl_kernels) and their text, read
once per process. kernels.py builds programs from them; devices.py probes each device's compiler with probe.cl."""
import os
from importlib import resources

from .errors import Error


class KernelError(Error, RuntimeError):
    """A kernel could not be built or run (or clnet's sources are missing)."""


def kernel_dir():
    """cl_kernels/ as installed in the wheel (clnet.cl_kernels), else beside the package in a source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "cl_kernels"), os.path.join(os.path.dirname(here), "cl_kernels")):
        if os.path.isfile(os.path.join(candidate, "common.h")):
            return candidate
    try:
        path = str(resources.files("clnet.cl_kernels"))
        if os.path.isfile(os.path.join(path, "common.h")):
            return path
    except ModuleNotFoundError:
        pass
    raise KernelError("clnet's OpenCL sources (cl_kernels/) are missing from the installation; reinstall clnet")


_sources = {}


def source(filename):
    """The text of cl_kernels/filename, read once per process: built as written (each kernel takes its pointers'
    byte offsets itself, common.h's OFFSET_PARAM and AT_OFFSET)."""
    if filename not in _sources:
        with open(os.path.join(kernel_dir(), filename)) as f:
            _sources[filename] = f.read()
    return _sources[filename]
