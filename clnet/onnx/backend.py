"""clnet as an ONNX backend (`onnx.backend.base.Backend`, the interface ONNX's own backend tests drive, as
onnxruntime's and onnx-tensorrt's adapters do).

`prepare(model, device)` loads the model with clnet.onnx.load (every refusal there, at load); `run(inputs)` takes
NumPy arrays and returns NumPy arrays. Graph outputs are float32, bool, int32 or int64 (held as int32) tensors,
others refused at prepare. Graph inputs of other types (indices, shapes, axes: shape data in clnet), and float32 ones
that only inputs clnet needs on the host read (Resize's scales and roi, Pad's value, Dropout's ratio: constants in
the files exporters write), are taken as constants, the model loaded with them at the first run that brings each set
of their values. The device is an OpenCL device (clnet.device's spec: "auto", "pocl", an index); ONNX's "CPU" and
"CUDA" names pick the first OpenCL CPU or GPU.
"""
import numpy as np

from .. import devices
from ..autograd import no_grad
from ..tensor import tensor as _to_device
from .common import OnnxImportError, _onnx
from .handlers import OPS
from .host import HOST_OPS
from .load import load


def _backend_base():
    onnx = _onnx()
    import onnx.backend.base as base
    return onnx, base


def _device(spec):
    if spec in (None, "CPU", "CUDA"):
        want = "cpu" if spec in (None, "CPU") else "gpu"
        for d in devices.list_devices():
            if want in str(d.get("type", "")).lower() and d.get("usable", True) and not d.get("simulator"):
                return devices.device(d["index"])
        return devices.device("auto")
    return devices.device(spec)


def _host_only(graph, name):
    """Whether every node reading `name` needs it on the host (an input slot the import table takes from constants
    and shapes only: Resize's scales, Pad's value, Dropout's ratio, Range's bounds), or none reads it."""
    uses = [(n.op_type, s) for n in graph.node for s, i in enumerate(n.input) if i == name]
    return all((op in OPS and s in OPS[op].host) or (op not in OPS and op in HOST_OPS)
                              for op, s in uses)


def _split_inputs(onnx, model):
    """(float32 graph inputs, other graph inputs: those of other types and float32 ones that only host slots read,
    the NumPy type of each output); refuses outputs of types clnet does not hold (int64 ones are held as int32)."""
    init = {t.name for t in model.graph.initializer}
    floats, others = [], []
    for v in model.graph.input:
        if v.name in init:
            continue
        elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else None
        if elem is None:
            raise OnnxImportError(f"graph input {v.name!r} is a {v.type.WhichOneof('value')}: clnet's ONNX "
                                        "backend takes tensors only")
        computed = elem == onnx.TensorProto.FLOAT and not _host_only(model.graph, v.name)
        (floats if computed else others).append(v.name)
    outputs = []
    for v in model.graph.output:
        elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else None
        if elem not in _RETURNED:
            kind = onnx.TensorProto.DataType.Name(elem) if elem is not None else v.type.WhichOneof("value")
            raise OnnxImportError(f"graph output {v.name!r} is of type {kind}: clnet's ONNX backend returns "
                                  "float32, bool and integer (int32, int64) tensors")
        outputs.append(_RETURNED[elem])
    return floats, others, outputs


_RETURNED = {1: np.float32, 9: np.bool_, 6: np.int32, 7: np.int64}  # ONNX types of the outputs, as NumPy's


def _with_constants(onnx, model, values):
    """A copy of the model whose graph inputs named in `values` are initializers holding those arrays."""
    from onnx import numpy_helper
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [v for v in out.graph.input if v.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), k) for k, a in values.items())
    return out


def backend():
    """The Backend class (built on first use: the onnx package is optional)."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    onnx, base = _backend_base()

    class ClnetRep(base.BackendRep):
        """A prepared model. Graph inputs of types other than float32 (indices, shapes, axes) are shape data in clnet:
        the model is loaded with them as constants at the first run that brings each set of their values."""

        def __init__(self, model, device, floats, others, outputs):
            self.model, self.device, self.floats, self.others, self.outputs = model, device, floats, others, outputs
            self.names = [v.name for v in model.graph.input if v.name in set(floats) | set(others)]
            self.nets = {} if others else {(): load(model, device=device)}

        def run(self, inputs, **kwargs):
            given = dict(inputs) if isinstance(inputs, dict) else dict(zip(self.names, inputs))
            for k, a in given.items():
                if isinstance(a, onnx.TensorProto):  # a type NumPy holds only through onnx's own dtypes (bfloat16)
                    given[k] = a = onnx.numpy_helper.to_array(a)
                if not isinstance(a, (np.ndarray, np.generic, int, float)):
                    raise OnnxImportError(f"graph input {k!r} comes as a {type(a).__name__} (a type NumPy does "
                                                "not hold): clnet's ONNX backend takes NumPy arrays")
            consts = {k: np.asarray(given[k]) for k in self.others}
            key = tuple((k, a.dtype.str, a.shape, a.tobytes()) for k, a in consts.items())
            net = self.nets.get(key)
            if net is None:
                net = self.nets[key] = load(_with_constants(onnx, self.model, consts), device=self.device)
            arrays = [given[k] for k in net.input_names]
            with no_grad():
                out = net(*[_to_device(np.asarray(a, np.float32), self.device) for a in arrays])
            return tuple(o.numpy().astype(t, copy=False)
                         for o, t in zip(out if isinstance(out, tuple) else (out,), self.outputs))

    class ClnetBackend(base.Backend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            floats, others, outputs = _split_inputs(onnx, model)
            return ClnetRep(model, _device(device), floats, others, outputs)

        @classmethod
        def run_model(cls, model, inputs, device="CPU", **kwargs):
            return cls.prepare(model, device, **kwargs).run(inputs)

        @classmethod
        def supports_device(cls, device):
            return True

    _BACKEND = ClnetBackend
    return _BACKEND


_BACKEND = None

__all__ = ["backend"]
