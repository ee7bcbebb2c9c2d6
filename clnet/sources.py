"""Where clnet's OpenCL C sources are (cl_kernels/, shipped in the wheel as clnet.cl_kernels) and their text, read
once per process. kernels.py builds programs from them; devices.py probes each device's compiler with probe.cl."""
import os
import re
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


def text(filename):
    """cl_kernels/filename as written (devices.py's compiler probe builds probe.cl so: no header, no offsets)."""
    with open(os.path.join(kernel_dir(), filename)) as f:
        return f.read()


def source(filename):
    """The text of cl_kernels/filename as it is built: each kernel taking a byte offset after each pointer
    (with_offsets)."""
    if filename not in _sources:
        _sources[filename] = with_offsets(text(filename))
    return _sources[filename]


_KERNEL = re.compile(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(")
_NAME = re.compile(r"(\w+)\s*$")


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(?:[ \t]+((?:.*\\\n)*.*))?$", re.M)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def _parameter_macros(text, seen=None):
    """{name: [bodies]} of the object-like macros that text and the headers it includes define with a __global pointer
    in them (a kernel's parameters written once for several kernels, as gemm_common.h's GEMM_ARGS)."""
    seen = set() if seen is None else seen
    found = {}
    for header in _INCLUDE.findall(text):
        if header not in seen:
            seen.add(header)
            with open(os.path.join(kernel_dir(), header)) as f:
                for name, bodies in _parameter_macros(f.read(), seen).items():
                    found.setdefault(name, []).extend(bodies)
    bodies = {}
    for name, body in _DEFINE.findall(text):
        bodies.setdefault(name, []).append(re.sub(r"//[^\n]*", "", body.replace("\\\n", " ")))
    for name, texts in bodies.items():  # every definition of a name with a pointer in one (an empty one too)
        if any("__global" in t for t in texts):
            found.setdefault(name, []).extend(texts)
    return found


def with_offsets(text):
    """text with every kernel's `__global T* [restrict] p` parameter followed by `OFFSET_PARAM(p)`, and the kernel's
    body opening with `AT_OFFSET(__global T*, p)` (common.h's macros, which every kernel file includes: its byte
    offset, and p moved there). A pointer parameter written through a macro is read from the macro's one
    definition."""
    out, at = [], 0
    macros = None
    for m in _KERNEL.finditer(text):
        line = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        if "//" in line or m.start() < at:  # a kernel named in a comment
            continue
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        body = text.index("{", end) + 1
        params, prologue, written = [], [], text[m.end():end]
        if re.search(r"\b[A-Z][A-Z0-9_]*\b", written):  # a macro in the parameters: its text, where it has pointers
            macros = _parameter_macros(text) if macros is None else macros
            for name, bodies in macros.items():
                if re.search(rf"\b{name}\b", written):
                    if len(bodies) > 1:
                        raise KernelError(f"kernel {m.group(1)}: its parameters' macro {name} is defined "
                                          f"{len(bodies)} ways; write the pointer parameters in the signature")
                    written = re.sub(rf"\b{name}\b", lambda _: bodies[0], written)
        for param in written.split(","):
            name = _NAME.search(param)
            if "__global" in param and "*" in param and name:
                name = name.group(1)
                kind = " ".join(param[:param.rindex(name)].replace("restrict", " ").split()).replace(" *", "*")
                params.append(f"{param}, OFFSET_PARAM({name})")
                prologue.append(f"AT_OFFSET({kind}, {name})")
            else:
                params.append(param)
        out += [text[at:m.end()], ",".join(params), text[end:body], " ".join(prologue)]
        at = body
    return "".join(out) + text[at:]
