"""Reading a file safely: external data only from inside the model's folder, declared sizes checked before
anything is read or allocated, the checker run on the file."""

import math
import os

import numpy as np

from .common import OnnxImportError


# ---- load ----------------------------------------------------------------------------------------------------------

def _all_tensors(graph):
    """Every TensorProto of a graph: initializers and tensor attributes, subgraphs' included."""
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


def _declared_bytes(onnx, t):
    """The bytes a tensor's declared dims and type make (Python ints: no overflow)."""
    count = math.prod(int(d) for d in t.dims)
    P = onnx.TensorProto
    packed = {getattr(P, k): bits for k, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2),
                                                   ("UINT2", 2)) if hasattr(P, k)}
    if t.data_type in packed:  # sub-byte types are packed, the last byte padded
        return -(-count * packed[t.data_type] // 8)
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:
        itemsize = 8
    return count * itemsize


def _check_external(onnx, path, model):
    """External data only from inside the model's folder: a relative location without "..", whose real path (symbolic
    links followed) stays in the folder, a regular file long enough for the tensor's declared size."""
    base = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    any_external = False
    for t in _all_tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        any_external = True
        entries = {e.key: e.value for e in t.external_data}
        location = entries.get("location", "")

        def refuse(why):
            raise OnnxImportError(f"{path}: tensor {t.name!r} keeps its data in {location!r}, {why}; clnet reads "
                                  "external data only from files inside the model's folder")
        parts = location.replace("\\", "/").split("/")
        if not location or os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in parts[0]:
            refuse("an absolute path")
        if ".." in parts:
            refuse("a path that climbs out with '..'")
        real = os.path.realpath(os.path.join(base, location))
        if os.path.commonpath([base, real]) != base:
            refuse(f"which a symbolic link leads out of the folder (to {real})")
        if not os.path.isfile(real):
            refuse("which is not a regular file there")
        try:
            offset, length = int(entries.get("offset", 0)), entries.get("length")
        except ValueError:
            refuse(f"with an offset that is not a number ({entries.get('offset')!r})")
        need = _declared_bytes(onnx, t)
        if length is not None and int(length) != need:
            refuse(f"with length {length} where its dims {list(t.dims)} make {need} bytes")
        if offset < 0 or offset + need > os.path.getsize(real):
            refuse(f"whose {os.path.getsize(real)} bytes do not hold {need} bytes from offset {offset}")
    return any_external


def _host_memory():
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_sizes(onnx, path, model, device):
    """Refuses, before any weight is read or allocated, a model whose declared initializers do not fit: in the
    device's memory (or, with no device named, the host's), or one tensor past the device's largest buffer. Tensors
    in the file must hold as many bytes as their dims say."""
    total, largest = 0, None
    for t in model.graph.initializer:
        need = _declared_bytes(onnx, t)
        total += need
        if largest is None or need > largest[0]:
            largest = (need, t.name, list(t.dims))
        if t.data_location != onnx.TensorProto.EXTERNAL and t.HasField("raw_data") and len(t.raw_data) != need:
            raise OnnxImportError(f"{path}: initializer {t.name!r} declares dims {list(t.dims)} ({need} bytes) but "
                                  f"holds {len(t.raw_data)} bytes; the file is damaged: export it again")
    if device is not None:
        cl = device.cl_device
        limit, where, one = cl.global_mem_size, f"device {device.name}", cl.max_mem_alloc_size
    else:
        limit, where, one = _host_memory(), "this machine's memory", None
    if limit and total > limit:
        raise OnnxImportError(f"{path}: the initializers declare {total / 2**30:.2f} GiB, more than {where} "
                              f"({limit / 2**30:.2f} GiB); refused before reading them")
    if one and largest and largest[0] > one:
        raise OnnxImportError(f"{path}: initializer {largest[1]!r} of dims {largest[2]} declares "
                              f"{largest[0] / 2**20:.1f} MiB, more than the largest buffer {where} allocates "
                              f"({one / 2**20:.1f} MiB)")


def _read(onnx, path, device=None):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"clnet.onnx.load: no such file: {path}")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # a truncated or damaged protobuf
        raise OnnxImportError(f"{path}: not a readable ONNX file ({type(e).__name__}: {e}); the file may be "
                              "truncated or damaged: export it again") from e
    external = _check_external(onnx, path, model)
    _check_sizes(onnx, path, model, device)
    try:
        onnx.checker.check_model(path)  # from the file (C++), not a re-serialisation of the whole model
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{path}: not a valid ONNX model ({first}); the file may be truncated or damaged: "
                              "export it again") from e
    if external:
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    return path, model
