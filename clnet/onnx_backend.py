"""clnet as an ONNX backend (`onnx.backend.base.Backend`, the interface ONNX's own backend tests drive, as
onnxruntime's and onnx-tensorrt's adapters do).

`prepare(model, device)` loads the model with clnet.onnx.load (every refusal there, at load); `run(inputs)` takes
NumPy arrays and returns NumPy arrays. clnet's computed tensors are float32: a model whose graph inputs or outputs are
of another type is refused at prepare. The device is an OpenCL device (clnet.device's spec: "auto", "pocl", an
index); ONNX's "CPU" and "CUDA" names pick the first OpenCL CPU or GPU.
"""
import numpy as np

from . import onnx as connx
from .autograd import no_grad
from .tensor import tensor as _to_device


def _backend_base():
    onnx = connx._onnx()
    import onnx.backend.base as base
    return onnx, base


def _device(spec):
    from .devices import device, list_devices
    if spec in (None, "CPU", "CUDA"):
        want = "cpu" if spec in (None, "CPU") else "gpu"
        for d in list_devices():
            if want in str(d.get("type", "")).lower() and d.get("usable", True) and not d.get("simulator"):
                return device(d["index"])
        return device("auto")
    return device(spec)


def _float32_only(onnx, model):
    init = {t.name for t in model.graph.initializer}
    for what, values in (("input", [i for i in model.graph.input if i.name not in init]),
                         ("output", list(model.graph.output))):
        for v in values:
            elem = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else None
            if elem != onnx.TensorProto.FLOAT:
                kind = onnx.TensorProto.DataType.Name(elem) if elem is not None else v.type.WhichOneof("value")
                raise connx.OnnxImportError(f"graph {what} {v.name!r} is of type {kind}: clnet's ONNX backend takes "
                                            "and returns float32 tensors only")


def backend():
    """The Backend class (built on first use: the onnx package is optional)."""
    global _BACKEND
    if _BACKEND is not None:
        return _BACKEND
    onnx, base = _backend_base()

    class ClnetRep(base.BackendRep):
        def __init__(self, net, device):
            self.net, self.device = net, device

        def run(self, inputs, **kwargs):
            arrays = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
            if isinstance(inputs, dict):
                arrays = [inputs[name] for name in self.net.input_names]
            with no_grad():
                out = self.net(*[_to_device(np.asarray(a, np.float32), self.device) for a in arrays])
            return tuple(o.numpy() for o in (out if isinstance(out, tuple) else (out,)))

    class ClnetBackend(base.Backend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            _float32_only(onnx, model)
            dev = _device(device)
            return ClnetRep(connx.load(model, device=dev), dev)

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
