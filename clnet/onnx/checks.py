"""Load-time refusals: each node's operator and attributes, then what each handler needs of its inputs
(constants, host values from shapes, computed tensors, and their inferred shapes)."""

import numpy as np

from .common import OnnxImportError, _host_int_list
from .handlers import (DEVICE_OPS, _all3, _as_2d, _binary_plan, _dim_eq, _padding, _pool_geometry, _reduce_plan,
                       _transpose_plan)
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
    if op == "Dropout" and len(n.outputs) > 1 and n.outputs[1] and (n.outputs[1] in consumers or
                                                                   n.outputs[1] in graph_outputs):
        refuse("the mask output of Dropout is not supported")
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
    shape as far as ONNX's shape inference knows it; refuses every node whose handler would refuse at run time.
    What depends on a dimension unknown at load is left to the call."""
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
        for name, i in zip(n.inputs, ins):
            if i is not None and i[0] == "device" and i[1] is not None and 0 in i[1]:
                raise OnnxImportError(f"{where}: its input {name!r} has shape {tuple(i[1])}: clnet holds no empty "
                                      "tensors")
        kinds = [i[0] for i in ins if i is not None]
        out_kind = "device"
        if n.op in ("Shape", "Size") or (n.op in HOST_OPS and all(k != "device" for k in kinds)):
            out_kind = "host"
        elif n.op not in DEVICE_OPS:
            first = next(name for name, i in zip(n.inputs, ins) if i is not None and i[0] == "device")
            raise OnnxImportError(f"{where}: {n.op} of a computed tensor ({first!r}) is not supported: clnet evaluates "
                                  f"{n.op} on constants and shapes only, at load or on the host")
        else:
            check = _CHECKS.get(n.op)
            if check is not None:
                try:
                    check(n, ins, opset)
                except ValueError as e:
                    raise OnnxImportError(f"{where}: {e}") from None
        for name in n.outputs:
            if name:
                info[name] = (out_kind, shapes.get(name), None)


def _known(shape):
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _need_rank(n, ins, ranks, what="input"):
    shape = ins[0][1]
    if shape is not None and len(shape) not in ranks:
        raise ValueError(f"clnet runs {n.op} on {' or '.join(f'{r}-D' for r in ranks)} {what}s, got shape "
                         f"{tuple(shape)}")


def _need_constant(n, ins, slots, what):
    for s in slots:
        if s < len(ins) and ins[s] is not None and ins[s][0] == "device":
            raise ValueError(f"{what} ({n.inputs[s]!r}) must be a constant of the file or computed from shapes, not a "
                             "computed tensor")


def _c_conv(n, ins, opset):
    w = ins[1][1] if len(ins) > 1 and ins[1] is not None else None
    _need_rank(n, ins, (3, 4) if w is None else (len(w),) if len(w) in (3, 4) else (4,))


def _c_pool(n, ins, opset):
    k = n.attrs.get("kernel_shape", ())
    _need_rank(n, ins, (len(k) + 2,))
    shape = ins[0][1]
    at = n.attrs
    if len(k) == 1:
        at = _as_2d(at)
        shape = None if shape is None else (shape[0], shape[1], 1, shape[2])
    if n.op == "AveragePool" and at.get("count_include_pad", 0) and at.get("auto_pad", "NOTSET") in (
            "SAME_UPPER", "SAME_LOWER"):
        if shape is None or not _known(shape[2:]):
            raise ValueError("an average counting the padding with auto_pad SAME over a size unknown at load: the "
                             "pads may differ at the two ends, which clnet's divisor does not take")
        begin, total = _padding(at, shape[2:], at["kernel_shape"], at.get("strides", (1, 1)), (1, 1))
        if any(2 * b != t for b, t in zip(begin, total)):
            raise ValueError(f"an average counting the padding with auto_pad SAME gives pads {begin} and "
                             f"{tuple(t - b for b, t in zip(begin, total))} at the two ends: clnet's divisor assumes "
                             "equal pads")
    if shape is not None and _known(shape[2:]):
        _pool_geometry(at, (1, 1) + tuple(shape[2:]))


def _c_global_pool(n, ins, opset):
    _need_rank(n, ins, (4,))


def _c_reduce(n, ins, opset):
    _need_constant(n, ins, (1,), "the axes")
    shape = ins[0][1]
    if shape is None:
        return
    if "axes" in n.attrs:
        axes = _host_int_list(n.attrs["axes"])
    elif len(ins) > 1 and ins[1] is not None:
        if ins[1][0] != "const":
            return  # computed from shapes: the call decides
        axes = _host_int_list(ins[1][2])
    else:
        axes = []
    _reduce_plan(len(shape), axes, n.attrs.get("noop_with_empty_axes", 0))


def _c_gemm(n, ins, opset):
    for s, what in ((0, "A"), (1, "B"), (2, "C")):
        if s < len(ins) and ins[s] is not None:
            if ins[s][0] == "host":
                raise ValueError(f"its {what} ({n.inputs[s]!r}) is computed from shapes on the host; clnet multiplies "
                                 "constants and computed tensors")
            shape = ins[s][1]
            if s < 2 and shape is not None and len(shape) != 2:
                raise ValueError(f"its {what} ({n.inputs[s]!r}) has shape {tuple(shape)}; Gemm takes matrices")
    if len(ins) > 2 and ins[2] is not None and ins[0][1] is not None and ins[1][1] is not None:
        at = n.attrs
        M = ins[0][1][1 if at.get("transA", 0) else 0]
        N = ins[1][1][0 if at.get("transB", 0) else 1]
        _binary_plan("Add", True, (M, N), ins[2][0] == "device", ins[2][1])


def _c_matmul(n, ins, opset):
    (a_kind, a, _), (b_kind, b, _) = ins[0], ins[1]
    for kind, name in ((a_kind, n.inputs[0]), (b_kind, n.inputs[1])):
        if kind == "host":
            raise ValueError(f"{name!r} is computed from shapes on the host; clnet multiplies constants and computed "
                             "tensors")
    if b is not None and len(b) > 2:
        raise ValueError(f"a batched B ({n.inputs[1]!r} of shape {tuple(b)}): clnet multiplies by 1-D or 2-D B; "
                         "batched products need the tensor ops' matmul")
    if a_kind == "const" and (a is None or len(a) != 2 or b is None or len(b) != 2):
        raise ValueError(f"a constant A ({n.inputs[0]!r} of shape {a}) times a computed B of shape {b}: clnet "
                         "takes a constant A as a matrix, times a matrix")


def _c_binary(n, ins, opset):
    (a_kind, a, _), (b_kind, b, _) = ins[0], ins[1]
    _binary_plan(n.op, a_kind == "device", a, b_kind == "device", b)


def _c_batchnorm(n, ins, opset):
    shape = ins[0][1]
    if shape is not None and len(shape) < 2:
        raise ValueError(f"clnet normalises inputs of 2 dimensions or more (N, C, ...), got shape {tuple(shape)}")


def _c_clip(n, ins, opset):
    for s in (1, 2):
        if s < len(ins) and ins[s] is not None and ins[s][0] == "device" and ins[s][1] is not None and \
                _all3(_dim_eq(d, 1) for d in ins[s][1]) is False:
            raise ValueError(f"a bound ({n.inputs[s]!r}) of shape {tuple(ins[s][1])}: ONNX's bounds are scalars")
    lo, hi = n.attrs.get("min"), n.attrs.get("max")
    if len(ins) > 1 and ins[1] is not None and ins[1][0] == "const":
        lo = float(np.asarray(ins[1][2]).reshape(-1)[0])
    if len(ins) > 2 and ins[2] is not None and ins[2][0] == "const":
        hi = float(np.asarray(ins[2][2]).reshape(-1)[0])
    if lo is not None and hi is not None and hi <= lo:
        raise ValueError(f"Clip with min {lo} >= max {hi} is not supported")


def _c_dropout(n, ins, opset):
    _need_constant(n, ins, (1, 2), "the ratio and training_mode")


def _c_reshape(n, ins, opset):
    _need_constant(n, ins, (1,), "the target shape")


def _c_squeeze(n, ins, opset):
    _need_constant(n, ins, (1,), "the axes")


def _c_transpose(n, ins, opset):
    shape = ins[0][1]
    perm = list(n.attrs["perm"]) if "perm" in n.attrs else (None if shape is None else list(range(len(shape)))[::-1])
    if perm is None:
        return
    dims = tuple(shape) if shape is not None else (None,) * len(perm)
    _transpose_plan(perm, tuple(d if isinstance(d, (int, np.integer)) else -1 for d in dims))


def _c_cast(n, ins, opset):
    if n.attrs.get("to") not in (1,):
        raise ValueError(f"Cast of a computed tensor to ONNX type {n.attrs.get('to')}: clnet's computed tensors are "
                         "float32 (it casts constants and shapes only)")


def _c_variadic(n, ins, opset):
    shapes = [i[1] for i in ins if i is not None]
    if any(s is None for s in shapes):
        return
    for s in shapes[1:]:
        same = len(s) == len(shapes[0]) and _all3(_dim_eq(x, y) for x, y in zip(s, shapes[0]))
        if same is False:
            raise ValueError(f"{n.op} of shapes {', '.join(str(tuple(s)) for s in shapes)}: clnet takes tensors of one "
                             "shape; broadcasting ones need the tensor ops")


def _c_concat(n, ins, opset):
    for i in ins:
        if i is not None and i[0] == "host":
            raise ValueError("it joins a computed tensor with a value computed from shapes on the host")


_CHECKS = {
    "Conv": _c_conv, "MaxPool": _c_pool, "AveragePool": _c_pool, "GlobalAveragePool": _c_global_pool,
    "GlobalMaxPool": _c_global_pool, "ReduceMean": _c_reduce, "ReduceSum": _c_reduce,
    "ReduceMax": _c_reduce, "ReduceMin": _c_reduce, "Gemm": _c_gemm,
    "MatMul": _c_matmul, "Add": _c_binary, "Sub": _c_binary, "Mul": _c_binary, "Div": _c_binary,
    "BatchNormalization": _c_batchnorm, "Clip": _c_clip, "Dropout": _c_dropout, "Reshape": _c_reshape,
    "Squeeze": _c_squeeze, "Unsqueeze": _c_squeeze, "Transpose": _c_transpose, "Cast": _c_cast,
    "Sum": _c_variadic, "Max": _c_variadic, "Min": _c_variadic, "Mean": _c_variadic, "Concat": _c_concat,
}
