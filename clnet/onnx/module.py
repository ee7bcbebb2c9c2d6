"""OnnxModule: the network an ONNX file describes, as a clnet module whose forward walks the file's nodes."""

import os

import numpy as np

from ..errors import Error
from ..nn.module import Module
from ..tensor import Tensor, tensor as _to_device
from .common import OnnxImportError, _is_host


# ---- the imported network ------------------------------------------------------------------------------------------

def _passed_on(run):
    """The run of an activation node whose producer applies the activation (_fuse_relus): a device tensor comes
    through as it is; a host value (a producer run on the host, as shape arithmetic is) takes the node's own run."""
    def passed_on(module, node, args):
        return [args[0]] if isinstance(args[0], Tensor) else run(module, node, args)
    return passed_on


def _activation_of(n, constants):
    """"relu" for a Relu node, "relu6" for a Clip to [0, 6] (PyTorch's ReLU6), else None."""
    if n.op == "Relu":
        return "relu"
    if n.op != "Clip":
        return None
    if "min" in n.attrs or "max" in n.attrs:  # opset < 11
        bounds = n.attrs.get("min"), n.attrs.get("max")
    else:
        values = [np.asarray(constants[n.inputs[s]]) if s < len(n.inputs) and n.inputs[s] in constants else None
                  for s in (1, 2)]
        bounds = tuple(v.reshape(-1)[0] if v is not None and v.size == 1 else None for v in values)
    return "relu6" if bounds == (0.0, 6.0) else None


def _readers(nodes):
    """{value name: the nodes that read it, each node once}: what the graph's rewrites (here and load's) check."""
    readers = {}
    for n in nodes:
        for name in dict.fromkeys(n.inputs):
            if name:
                readers.setdefault(name, []).append(n)
    return readers


def _fuse_relus(nodes, outputs, constants):
    """A BatchNormalization, Conv or Add whose output only a Relu (a batch norm's: or a ReLU6's Clip) reads applies it
    itself: the batch norm in its pass and, in its backward, the activation's gradient (ops.BatchNormTrain act=: two
    launches and two passes over the activations fewer), the convolution in its product's epilogue (ops.Conv2d relu=,
    as nn.Sequential fuses it), the add in its launch (ops.AddRelu, a residual block's end): one launch and pass fewer;
    the activation's node passes its input on. Not where that output is a graph output or has another reader."""
    readers = _readers(nodes)
    for n in nodes:
        if n.op in ("BatchNormalization", "Conv", "Add") and n.outputs and n.outputs[0] and n.outputs[0] not in outputs:
            after = readers.get(n.outputs[0], [])
            if len(after) != 1 or after[0].inputs[:1] != [n.outputs[0]]:
                continue
            act = _activation_of(after[0], constants)
            if act == "relu" or (act == "relu6" and n.op == "BatchNormalization"):
                n.act, after[0].run = act, _passed_on(after[0].run)


def _chain_concats(nodes):
    """A Concat whose inputs begin with all the inputs of an earlier Concat along the same axis (densenet's: each layer
    joins every feature map before it) joins that Concat's output and the rest instead: the same values, copied in
    two launches rather than one an input, forward and backward (densenet121: 593 inputs in 58 joins). The gradient
    then reaches the earlier maps through the earlier join's (float32 sums in another order)."""
    joined = {}  # (axis, inputs) of each Concat -> its output
    for n in nodes:
        if n.op != "Concat" or not n.outputs or not n.outputs[0]:
            continue
        axis, written = n.attrs.get("axis"), tuple(n.inputs)  # a later join matches the inputs as written
        for k in range(len(written) - 1, 1, -1):  # the longest earlier join this one begins with
            earlier = joined.get((axis, written[:k]))
            if earlier is not None:
                n.inputs = [earlier] + n.inputs[k:]
                break
        joined[(axis, written)] = n.outputs[0]


class _Node:
    __slots__ = ("op", "name", "inputs", "outputs", "attrs", "run", "frees", "act")

    def __init__(self, op, name, inputs, outputs, attrs, run):
        self.op, self.name, self.inputs, self.outputs, self.attrs, self.run = op, name, inputs, outputs, attrs, run
        self.frees = ()
        self.act = None  # an activation this node applies for the node after it (_fuse_relus)

    def where(self, module):
        return f"ONNX node {self.name!r} ({self.op}, opset {module.opset})"


_COMPARED = 4096  # the size up to which device_constant compares a constant with the one it holds


class OnnxModule(Module):
    """A network read from an ONNX file (made by `clnet.onnx.load`): forward takes the graph's inputs and returns its
    outputs, in the file's order (one output: the tensor itself).

    ``state_dict()`` is keyed by initializer names (TorchScript's unnamed "onnx::Conv_193" ones by their module's,
    ``file_names`` mapping each such key to the file's name). Weights that a MatMul or a Gemm with transB=0 reads as
    (in, out) are held as (out, in) for the dense kernels (their Parameters and gradients too); state_dict and
    load_state_dict give and take them in the file's layout."""

    def __init__(self, path, opset, inputs, outputs, nodes, constants, transposed):
        super().__init__()
        d = self.__dict__
        d["path"], d["opset"], d["input_names"], d["output_names"] = path, opset, inputs, outputs
        d["_nodes"], d["_constants"], d["_transposed"] = nodes, constants, transposed
        d["_device_constants"] = {}
        _chain_concats(nodes)
        last_use = {}
        for i, n in enumerate(nodes):
            for name in n.inputs:
                if name:
                    last_use[name] = i
        keep = set(outputs)
        d["_read"] = keep | set(last_use)  # the values a node or the caller reads
        _fuse_relus(nodes, keep, constants)
        for i, n in enumerate(nodes):  # activations leave the forward's table after their last reader
            n.frees = tuple(name for name in dict.fromkeys(n.inputs)
                            if name and last_use.get(name) == i and name not in keep)

    def extra_repr(self):
        return f"{os.path.basename(str(self.path))!r}, {len(self._nodes)} nodes, opset {self.opset}"

    def train(self, mode=True):
        if mode and self.__dict__.get("fused"):
            raise OnnxImportError(f"{self._name()}: loaded with fuse=True, its batch norms folded into the "
                                  "convolutions for inference; load the file with fuse=False to train it")
        return super().train(mode)

    # -- weights in the file's layout ----------------------------------------------------------------------------
    def state_dict(self):
        out = super().state_dict()
        for k in self._transposed:
            out[k] = np.ascontiguousarray(out[k].T)
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Module.load_state_dict, taking the model's own state_dict too: a PyTorch batch norm's num_batches_tracked,
        which no ONNX file holds, is passed over beside the running statistics the file does hold."""
        fixed = dict(state_dict)
        own = {k for k, _ in self._state_items()}  # (the keys alone: no read-back)
        for k in list(fixed):
            if k.endswith("num_batches_tracked") and k not in own and \
                    k[:-len("num_batches_tracked")] + "running_mean" in own:
                del fixed[k]
        for k in self._transposed:
            if k in fixed:
                v = fixed[k]
                a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
                fixed[k] = np.ascontiguousarray(a.T)
        return super().load_state_dict(fixed, strict)

    # -- running -------------------------------------------------------------------------------------------------
    def device_constant(self, key, array):
        """A host constant as a tensor on this module's device (floats as float32, integers as int32, booleans as
        bool), uploaded once. One of another shape or type, or a small one that differs from what was uploaded under
        its key, is uploaded again: host values computed from a call's shapes may change from call to call."""
        dev = self.device
        k = (key, id(dev))
        array = np.asarray(array)
        if array.dtype.kind in "iu" and array.size and (array.min() < -2**31 or array.max() >= 2**31):
            raise ValueError(f"integers in [{array.min()}, {array.max()}] do not fit clnet's int32 tensors")
        array = array.astype(np.bool_ if array.dtype == np.bool_ else np.int32 if array.dtype.kind in "iu" else
                             np.float32, copy=False)
        held = self._device_constants.get(k)
        if held is not None and held[0].shape == array.shape and held[0].dtype == array.dtype and (
                array.size > _COMPARED or np.array_equal(held[1], array)):
            return held[0]
        t = _to_device(array, dev)
        self._device_constants[k] = (t, array.copy() if array.size <= _COMPARED else None)
        return t

    def forward(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise TypeError(f"{self._name()}: the graph takes {len(self.input_names)} inputs "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        env = dict(self._constants)
        params = self._parameters
        buffers = self._buffers
        env.update(params)
        env.update(buffers)
        for name, x in zip(self.input_names, inputs):
            if not isinstance(x, Tensor):
                raise TypeError(f"{self._name()}: input {name!r} must be a clnet tensor, got {type(x).__name__}")
            env[name] = x
        for n in self._nodes:
            args = [env[name] if name else None for name in n.inputs]
            try:
                results = n.run(self, n, args)
            except Error:
                raise
            except (ValueError, TypeError) as e:  # a shape the call brought that load could not see
                raise OnnxImportError(f"{self.path}: {n.where(self)}: {e}") from e
            for name, v in zip(n.outputs, results):
                if name:
                    env[name] = v
            for name in n.frees:
                env.pop(name, None)
        outs = []
        for name in self.output_names:
            v = env[name]
            outs.append(self.device_constant(name, v) if _is_host(v) else v)
        return outs[0] if len(outs) == 1 else tuple(outs)
