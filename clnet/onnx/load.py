"""clnet.onnx.load: a file (or a ModelProto) as an OnnxModule; constant folding; batch norm folding (fuse=True)."""

import warnings

import numpy as np

from ..devices import device as get_device
from ..tensor import Parameter, Tensor
from .checks import _check_flow, _check_node, _inferred_shapes
from .common import NEWEST_OPSET, OnnxImportError, OnnxOpsetWarning, _attributes, _onnx
from .handlers import DEVICE_OPS, OPS, _BUFFER_INPUTS, _PARAMETER_INPUTS, _d_silu, _dispatch
from .host import HOST_OPS
from .module import OnnxModule, _Node, _readers
from .reader import _all_tensors, _check_sizes, _read


def load(path, device=None, fuse=False):
    """Read an ONNX file as a clnet module.

    Parameters
    ----------
    path : str, os.PathLike or onnx.ModelProto
        The ONNX file (or a model in memory, without external data).
    device : clnet.Device or str, optional
        Where to place the weights now (the file's declared sizes are checked against its memory first); otherwise
        the first call moves them to its input's device.
    fuse : bool
        False (the default): the network as the file has it; ``state_dict()`` holds every initializer under its
        name, unchanged, and the module trains. True, an inference-only optimisation: each inference-mode
        BatchNormalization that alone reads a convolution's output is folded into that convolution's weights and
        bias, which then hold the folded values (the batch norm's initializers leave the state_dict); the module
        refuses train(), and a file exported in training mode is refused.

    Returns
    -------
    OnnxModule
        In train() mode when the file's batch norms were exported in training mode, else in eval().

    Raises
    ------
    OnnxImportError
        For a file clnet cannot read or run, at load, before any kernel runs: naming the node, the operator, the
        opset and the reason. An opset newer than NEWEST_OPSET loads with an OnnxOpsetWarning.
    """
    onnx = _onnx()
    if device is not None and not hasattr(device, "cl_device"):
        device = get_device(device)
    if isinstance(path, onnx.ModelProto):  # a model in memory (the ONNX backend adapter's): no external data
        model, path = path, f"<in-memory ONNX model {path.graph.name!r}>"
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in _all_tensors(model.graph)):
            raise OnnxImportError(f"{path}: a model in memory with external data: load it from its file")
        _check_sizes(onnx, path, model, device)
        try:
            onnx.checker.check_model(model)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OnnxImportError(f"{path}: not a valid ONNX model ({first})") from e
    else:
        path, model = _read(onnx, path, device)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise OnnxImportError(f"{path}: the model imports no version of the default ONNX operator set")
    if opset > NEWEST_OPSET:
        warnings.warn(f"{path}: opset {opset} is newer than the newest clnet's importer was checked against "
                      f"({NEWEST_OPSET}); operators whose meaning changed since may run with opset "
                      f"{NEWEST_OPSET}'s", OnnxOpsetWarning, stacklevel=2)
    from onnx import numpy_helper
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    outputs = [o.name for o in graph.output]

    nodes = []
    for i, node in enumerate(graph.node):
        name = node.name or f"#{i}"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"{path}: ONNX node {name!r} ({node.op_type}, domain {node.domain!r}, opset "
                                  f"{opset}): operators outside the default ONNX domain are not supported")
        if node.op_type not in DEVICE_OPS and node.op_type not in HOST_OPS:
            raise OnnxImportError(
                f"{path}: ONNX operator {node.op_type} (node {name!r}, opset {opset}) is not supported by clnet; "
                f"it runs {', '.join(sorted(set(DEVICE_OPS)))} and, on constants and shapes, "
                f"{', '.join(sorted(set(HOST_OPS) - set(DEVICE_OPS)))}")
        nodes.append(_Node(node.op_type, name, list(node.input), list(node.output), _attributes(onnx, node),
                           _dispatch(node.op_type)))
    consumers = {}
    for n in nodes:
        for name in n.inputs:
            consumers.setdefault(name, []).append(n)
    for n in nodes:
        _check_node(path, n, opset, consumers, set(outputs))

    training = any(n.op == "BatchNormalization" and n.attrs.get("training_mode", 0) for n in nodes)
    if fuse and training:
        raise OnnxImportError(f"{path}: fuse=True folds batch norms for inference only, and this file was exported "
                              "in training mode; load it with fuse=False to train it")
    shapes = _inferred_shapes(onnx, model, initializers)
    renamed = _module_names(nodes, initializers)
    if fuse:
        nodes, initializers = _fuse_conv_bn(nodes, initializers, consumers, set(outputs))

    # Which float initializers are trained, which kept as buffers; the rest are host constants.
    roles = {}
    for n in nodes:
        for slots, role in ((_BUFFER_INPUTS.get(n.op, ()), "buffer"), (_PARAMETER_INPUTS.get(n.op, ()), "param")):
            for s in slots:
                if s < len(n.inputs) and n.inputs[s] in initializers:
                    a = initializers[n.inputs[s]]
                    if a.dtype.kind == "f" and (a.size > 1 or n.op in ("Conv", "Gemm", "BatchNormalization")):
                        roles.setdefault(n.inputs[s], role)
    transposed = set()
    for n in nodes:  # MatMul and Gemm(transB=0) weights: held as (out, in)
        if len(n.inputs) > 1 and roles.get(n.inputs[1]) == "param" and (
                n.op == "MatMul" or (n.op == "Gemm" and not n.attrs.get("transB", 0))):
            if initializers[n.inputs[1]].ndim == 2:  # (a batched weight stays as it is, for the batched matmul)
                transposed.add(n.inputs[1])
    for n in nodes:  # a transposed weight is read by MatMul/Gemm only
        for s, name in enumerate(n.inputs):
            if name in transposed and not (s == 1 and (n.op == "MatMul" or (n.op == "Gemm" and
                                                                          not n.attrs.get("transB", 0)))):
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}) reads the weight "
                                      f"{name!r} that a MatMul also reads; clnet cannot share it")

    constants = {k: v for k, v in initializers.items() if k not in roles}
    nodes = _fold_constants(path, nodes, constants, opset)
    training = training or any(n.op == "Dropout" and len(n.inputs) > 2 and n.inputs[2] in constants and  # its
                               bool(np.asarray(constants[n.inputs[2]]).reshape(-1)[0]) for n in nodes)  # training_mode
    _check_flow(path, nodes, opset, constants, {k: initializers[k].shape for k in roles}, inputs, shapes)
    for k in transposed:
        n = next(n for n in nodes if len(n.inputs) > 1 and n.inputs[1] == k)
        n.attrs = dict(n.attrs, transB=1)
    nodes = _linear_layers(nodes, roles, initializers, set(outputs))
    nodes = _gelus(nodes, constants, set(outputs))
    nodes = _silus(nodes, set(outputs))
    net = OnnxModule(path, opset, inputs, outputs, nodes, constants, sorted(transposed))
    for k, role in roles.items():
        a = np.asarray(initializers[k], np.float32)
        if k in transposed:
            a = np.ascontiguousarray(a.T)
        host = Tensor(a.shape, _host=a)  # the array is this load's own: no copy
        if role == "param":
            net.register_parameter(k, Parameter(host))
        else:
            net.register_buffer(k, host)
    net.__dict__["exported_training"] = training
    net.__dict__["file_names"] = renamed
    net.__dict__["fused"] = bool(fuse)
    net.train(training)
    if device is not None:
        net.to(device)
    return net


def _linear_layers(nodes, roles, initializers, outputs):
    """torch.onnx's export of a Linear over more than two dimensions (ConvNeXt's and ViT's MLPs): Transpose(W), then
    MatMul(x, W^T), then Add(b, product). Such a MatMul reads the trained weight W itself, held (out, in) as a
    Linear's (transB), with the Transpose dropped, and takes the Add's bias where that Add is the product's only
    reader: one product with its bias in the epilogue, where the file's nodes copy W and its gradient each step and
    add the bias in a pass of its own. Only where the transposed weight is read by MatMuls alone, as their B."""
    readers = _readers(nodes)
    dropped = set()
    for t in nodes:
        if t.op != "Transpose" or len(t.inputs) != 1 or roles.get(t.inputs[0]) != "param" or \
                initializers[t.inputs[0]].ndim != 2 or tuple(t.attrs.get("perm", (1, 0))) != (1, 0):
            continue
        users = readers.get(t.outputs[0], [])
        if not users or t.outputs[0] in outputs or any(u.op != "MatMul" or u.inputs != [u.inputs[0], t.outputs[0]]
                                                       or u.inputs[0] == t.outputs[0] for u in users):
            continue
        dropped.add(id(t))
        out_features = initializers[t.inputs[0]].shape[0]
        for u in users:
            u.inputs, u.attrs = [u.inputs[0], t.inputs[0]], dict(u.attrs, transB=1)
            after = readers.get(u.outputs[0], [])
            if len(after) != 1 or u.outputs[0] in outputs or after[0].op != "Add" or len(after[0].inputs) != 2:
                continue
            add = after[0]
            bias = add.inputs[0] if add.inputs[1] == u.outputs[0] else add.inputs[1]
            if bias == u.outputs[0] or roles.get(bias) != "param" or \
                    initializers[bias].shape != (out_features,) or len(readers.get(bias, [])) != 1:
                continue
            u.inputs.append(bias)
            u.outputs = list(add.outputs)
            dropped.add(id(add))
    return [n for n in nodes if id(n) not in dropped]


def _gelus(nodes, constants, outputs):
    """GELU as exporters spell it, x * 0.5 * (1 + erf(x / sqrt 2)) (torch.onnx: Div, Erf, Add, Mul by x, Mul by
    0.5; clnet's own export: Mul by 1/sqrt 2, Erf, Add, Mul of x by 0.5, Mul), runs as one Gelu: one launch and one
    pass over the activations forward and one backward, where the five nodes launch five forward and more backward
    (ConvNeXt's and ViT's MLPs).
    Only where each value inside is read by the next node alone and is no graph output."""
    def scalar(name, value):  # a 0-d constant: one of higher rank could raise the result's rank (ONNX broadcasts)
        c = constants.get(name)
        return c is not None and np.asarray(c).ndim == 0 and abs(float(np.asarray(c)) - value) < 1e-6

    def other(n, name):  # the input of a two-input node that is not `name` (None if both or neither are)
        if len(n.inputs) != 2 or n.inputs.count(name) != 1:
            return None
        return n.inputs[1] if n.inputs[0] == name else n.inputs[0]

    producer = {name: n for n in nodes for name in n.outputs}
    readers = _readers(nodes)

    def only_reader(n, op):  # the one node reading n's output, if it is an `op` and n's output is no graph output
        after = readers.get(n.outputs[0], []) if n.outputs else []
        return after[0] if len(after) == 1 and after[0].op == op and n.outputs[0] not in outputs else None

    dropped = set()
    for erf in nodes:
        scaled = producer.get(erf.inputs[0]) if erf.op == "Erf" and erf.inputs else None
        if scaled is None or scaled.op not in ("Div", "Mul") or len(scaled.inputs) != 2 or \
                only_reader(scaled, "Erf") is not erf:
            continue
        x = scaled.inputs[0]
        if not scalar(scaled.inputs[1], 2 ** 0.5 if scaled.op == "Div" else 0.5 ** 0.5):
            x = scaled.inputs[1] if scaled.op == "Mul" and scalar(x, 0.5 ** 0.5) else None
        one = only_reader(erf, "Add")
        if x is None or one is None or not scalar(other(one, erf.outputs[0]), 1.0):
            continue
        times = only_reader(one, "Mul")
        by = other(times, one.outputs[0]) if times is not None else None
        if by == x:  # torch: (x * (1 + erf)) * 0.5
            last = only_reader(times, "Mul")
            if last is None or not scalar(other(last, times.outputs[0]), 0.5):
                continue
            inside = (scaled, erf, one, times)
        else:  # clnet: (x * 0.5) * (1 + erf)
            half, last = producer.get(by), times
            if half is None or half.op != "Mul" or only_reader(half, "Mul") is not times or \
                    other(half, x) is None or not scalar(other(half, x), 0.5):
                continue
            inside = (scaled, erf, one, half)
        dropped.update(id(n) for n in inside)
        last.op, last.inputs, last.attrs, last.run = "Gelu", [x], {}, _dispatch("Gelu")
    return [n for n in nodes if id(n) not in dropped]


def _silus(nodes, outputs):
    """SiLU as exporters spell it, Mul(x, Sigmoid(x)) (EfficientNet's 49 activations), runs as one op: one launch and
    pass forward and one backward, where the two nodes took two forward and four backward (efficientnet_b0's step:
    1211 launches against 1015, bench/NOTES.md v64). Only where the Mul is the Sigmoid's one reader and multiplies
    by the Sigmoid's own input (a squeeze-excite's gate multiplies another)."""
    readers = _readers(nodes)
    dropped = set()
    for sig in nodes:
        if sig.op != "Sigmoid" or len(sig.inputs) != 1 or not sig.outputs or sig.outputs[0] in outputs:
            continue
        after = readers.get(sig.outputs[0], [])
        mul = after[0] if len(after) == 1 else None
        if mul is None or mul.op != "Mul" or sorted(mul.inputs) != sorted([sig.inputs[0], sig.outputs[0]]):
            continue
        dropped.add(id(sig))
        mul.op, mul.inputs, mul.attrs, mul.run = "SiLU (Sigmoid, Mul)", [sig.inputs[0]], {}, _d_silu
    return [n for n in nodes if id(n) not in dropped]


def _scope(node_name):
    """The module a TorchScript-exported node belongs to, from its name: "/layer1/layer1.0/conv1/Conv" is
    layer1.0.conv1 (each segment is the module's qualified name where it extends its parent's, else its attribute
    name in the parent); None for a name without a scope."""
    parts = node_name.split("/")
    if len(parts) < 3 or parts[0]:
        return None
    full = ""
    for seg in parts[1:-1]:
        if not seg:
            return None
        full = seg if not full or seg.startswith(full + ".") else f"{full}.{seg}"
    return full


def _module_names(nodes, initializers):
    """Renames, in place, the initializers PyTorch's TorchScript exporter leaves unnamed ("onnx::Conv_193": a
    convolution's weight with its batch norm folded in, in an eval-mode export) after the module their one reader
    belongs to (its node name's scope) and PyTorch's name of that input (OnnxOp.names): layer1.0.conv1.weight.
    Returns {new name: the file's name}."""
    readers = {}
    for n in nodes:
        for s, name in enumerate(n.inputs):
            readers.setdefault(name, []).append((n, s))
    renamed = {}
    for old in [k for k in initializers if k.startswith("onnx::")]:
        uses = readers.get(old, [])
        if len(uses) != 1:
            continue
        n, s = uses[0]
        entry, scope = OPS.get(n.op), _scope(n.name)
        names = entry.names if entry is not None else ()
        if scope is None or s >= len(names) or not names[s]:
            continue
        new = f"{scope}.{names[s]}"
        if new in initializers or new in renamed:
            continue
        initializers[new] = initializers.pop(old)
        n.inputs = [new if i == old else i for i in n.inputs]
        renamed[new] = old
    return renamed


class _Folder:
    """The part of an OnnxModule that host evaluation at load time reads."""

    def __init__(self, opset):
        self.opset = opset


def _fold_constants(path, nodes, constants, opset):
    """Evaluates at load the nodes whose inputs are all constants (their outputs become constants)."""
    kept, folder = [], _Folder(opset)
    for n in nodes:
        if n.op in HOST_OPS and all(not name or name in constants for name in n.inputs) and n.op != "Dropout":
            try:
                results = HOST_OPS[n.op](folder, n, [constants[name] if name else None for name in n.inputs])
            except OnnxImportError:
                raise
            except ValueError as e:  # what the host op refuses (a size past host.FOLD_LIMIT), in its words
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}): {e}") from None
            except Exception as e:
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}): cannot evaluate it on "
                                      f"its constant inputs ({type(e).__name__}: {e})") from None
            for name, v in zip(n.outputs, results):
                constants[name] = np.asarray(v)
            continue
        kept.append(n)
    return kept


def _fuse_conv_bn(nodes, initializers, consumers, graph_outputs):
    """Conv -> BatchNormalization (inference mode, the conv's only reader, weights from initializers read nowhere
    else): one Conv with w * gamma / sqrt(var + eps) and (b - mean) * gamma / sqrt(var + eps) + beta."""
    initializers = dict(initializers)
    producer = {o: n for n in nodes for o in n.outputs}
    uses = {}
    for n in nodes:
        for name in n.inputs:
            uses[name] = uses.get(name, 0) + 1
    dropped = set()
    for bn in nodes:
        if bn.op != "BatchNormalization" or bn.attrs.get("training_mode", 0):
            continue
        conv = producer.get(bn.inputs[0])
        if conv is None or conv.op != "Conv" or uses.get(bn.inputs[0]) != 1 or bn.inputs[0] in graph_outputs:
            continue
        names = bn.inputs[1:5] + conv.inputs[1:3]
        if any(n not in initializers or uses.get(n) != 1 for n in names):
            continue
        if any(o for o in bn.outputs[1:] if o in consumers or o in graph_outputs):
            continue
        gamma, beta, mean, var = (initializers[k].astype(np.float64) for k in bn.inputs[1:5])
        w = initializers[conv.inputs[1]].astype(np.float64)
        b = initializers[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        initializers[conv.inputs[1]] = (w * scale.reshape(-1, 1, 1, 1)).astype(np.float32)
        bias_name = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else bn.inputs[2]
        initializers[bias_name] = ((b - mean) * scale + beta).astype(np.float32)
        for k in bn.inputs[1:5]:
            if k != bias_name:
                initializers.pop(k, None)
        conv.inputs = conv.inputs[:2] + [bias_name]
        conv.outputs = [bn.outputs[0]]
        dropped.add(id(bn))
    return [n for n in nodes if id(n) not in dropped], initializers
