"""Load-time refusals: each node's operator and attributes, then, following the graph, what each entry of the
import table (handlers.OPS) needs of its inputs: which must be known on the host, and its own check of their
inferred shapes and values."""

import numpy as np

from .common import OnnxImportError, _onnx
from .handlers import OPS
from .host import HOST_OPS, _ONNX_DTYPES


def _check_node(m_where, n, opset, consumers, graph_outputs):
    """Refuses, at load, what the op handlers cannot run."""
    at, op = n.attrs, n.op
    where = f"ONNX node {n.name!r} ({op}, opset {opset})"

    def refuse(why):
        raise OnnxImportError(f"{m_where}: {where}: {why}")

    if op == "Conv":
        k = at.get("kernel_shape")
        if k is not None and len(k) not in (1, 2):
            refuse(f"clnet runs 1-D and 2-D convolutions, this one has a {len(k)}-D kernel {k}")
    if op in ("MaxPool", "AveragePool"):
        if len(at.get("kernel_shape", ())) not in (1, 2):
            refuse(f"clnet pools over 1-D and 2-D windows, this one has kernel_shape {at.get('kernel_shape')}")
        if any(d != 1 for d in at.get("dilations", (1, 1))):
            refuse(f"dilated pooling (dilations {at['dilations']}) is not supported")
        if op == "MaxPool" and len(n.outputs) > 1 and n.outputs[1] and (n.outputs[1] in consumers or
                                                                       n.outputs[1] in graph_outputs):
            refuse("the Indices output of MaxPool is not supported")
        pads = at.get("pads")
        if op == "AveragePool" and at.get("count_include_pad", 0) and pads is not None and \
                tuple(pads[:len(pads) // 2]) != tuple(pads[len(pads) // 2:]):
            refuse(f"an average counting the padding (count_include_pad=1) with pads {list(pads)} that differ at the "
                   "two ends: clnet's divisor assumes equal pads")
    if op == "Cast" and at.get("to") not in _ONNX_DTYPES:
        refuse(f"Cast to ONNX type {at.get('to')} is not supported (clnet holds "
               f"{', '.join(sorted(np.dtype(t).name for t in _ONNX_DTYPES.values()))})")
    if op == "Reshape" and len([i for i in n.inputs if i]) < 2 and "shape" not in at:
        refuse("Reshape without a target shape (neither the input nor the opset-1 attribute `shape`)")
    if op == "BatchNormalization" and any(o and (o in consumers or o in graph_outputs) for o in n.outputs[3:]):
        refuse("the saved mean and variance outputs of a training-mode BatchNormalization (opsets before 14) are "
               "not supported")
    if op == "LRN" and int(at.get("size", 1)) % 2 == 0:
        refuse(f"LRN of even size {at['size']}: ONNX centres an even window differently from clnet's (PyTorch's) "
               "local_response_norm")
    if op == "BatchNormalization" and at.get("spatial", 1) != 1:
        refuse("BatchNormalization with spatial=0 is not supported")


# ---- what load knows of each value: refusals before any kernel runs ------------------------------------------------

def _shape_of(value_info):
    """A ValueInfoProto's shape: a tuple of ints, free dimensions' names and None (unknown); None for an unknown
    rank."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)


def _inferred_shapes(onnx, model, initializers):
    """Each value's shape as ONNX's shape inference finds it ({} where inference fails). It runs on a graph of the
    same nodes whose large initializers are declared graph inputs of their shapes, so their data is not copied."""
    h = onnx.helper
    graph = model.graph
    small, declared = [], {i.name for i in graph.input}
    extra = []
    for t in graph.initializer:
        a = initializers[t.name]
        if a.size <= 64:
            small.append(t)
        elif t.name not in declared:
            extra.append(h.make_tensor_value_info(t.name, t.data_type, list(a.shape)))
    light = h.make_graph(list(graph.node), graph.name, list(graph.input) + extra, list(graph.output), small)
    probe = h.make_model(light, opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # no shapes known: the call's shapes decide what load cannot
        return {}
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shapes[vi.name] = _shape_of(vi)
    return shapes


def _check_flow(path, nodes, opset, constants, params, inputs, shapes):
    """Follows the graph from its inputs knowing, for each value, whether it is a constant of the file, a host value
    computed from shapes (Shape, Size and what follows them on the host), or a computed tensor on the device, and its
    shape as far as ONNX's shape inference knows it; refuses every node whose entry would refuse at run time, and
    every computed tensor that would be empty. What depends on a dimension unknown at load is left to the call."""
    onnx = _onnx()
    info = {k: ("const", tuple(v.shape), v) for k, v in constants.items()}
    info.update({k: ("device", tuple(v), None) for k, v in params.items()})
    for k in inputs:
        info[k] = ("device", shapes.get(k), None)
        if shapes.get(k) is not None and 0 in shapes[k]:
            raise OnnxImportError(f"{path}: graph input {k!r} has shape {tuple(shapes[k])}: clnet holds no empty "
                                  "tensors")
    for n in nodes:
        where = f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset})"
        ins = [info.get(name, ("device", shapes.get(name), None)) if name else None for name in n.inputs]
        kinds = [i[0] for i in ins if i is not None]
        out_kind = "device"
        if n.op in ("Shape", "Size") or (n.op in HOST_OPS and all(k != "device" for k in kinds)):
            out_kind = "host"
        elif n.op not in OPS:
            first = next(name for name, i in zip(n.inputs, ins) if i is not None and i[0] == "device")
            raise OnnxImportError(f"{where}: {n.op} of a computed tensor ({first!r}) is not supported: clnet evaluates "
                                  f"{n.op} on constants and shapes only, at load or on the host")
        else:
            entry = OPS[n.op]
            for s in entry.host:
                if s < len(ins) and ins[s] is not None and ins[s][0] == "device":
                    raise OnnxImportError(f"{where}: its input {_input_name(onnx, n.op, opset, s)!r} "
                                          f"({n.inputs[s]!r}) is a computed tensor; clnet needs it on the host (a "
                                          "constant of the file, or computed from shapes)")
            if entry.check is not None:
                try:
                    entry.check(n, ins, opset)
                except ValueError as e:
                    raise OnnxImportError(f"{where}: {e}") from None
        for name in n.outputs:
            if name:
                shape = shapes.get(name)
                if out_kind == "device" and shape is not None and 0 in shape:
                    raise OnnxImportError(f"{where}: its output {name!r} would have shape {tuple(shape)}: clnet holds "
                                          "no empty tensors")
                info[name] = (out_kind, shape, None)


def _input_name(onnx, op, opset, slot):
    """The name ONNX's schema gives input `slot` of `op`."""
    try:
        formal = onnx.defs.get_schema(op, opset).inputs
        return formal[min(slot, len(formal) - 1)].name
    except Exception:
        return f"#{slot}"
