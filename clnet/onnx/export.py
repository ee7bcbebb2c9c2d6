"""clnet.onnx.export: a clnet module, traced once, as an ONNX file."""

import os

import numpy as np

from .. import autograd
from ..tensor import Tensor, tensor as _to_device
from .common import EXPORT_OPSET, _onnx


# ---- export --------------------------------------------------------------------------------------------------------

class _Trace:
    """Records every op that runs (autograd.Function.apply wrapped) while a model runs once."""

    def __init__(self):
        self.records, self.depth = [], 0

    def __enter__(self):
        original = autograd.Function.__dict__["apply"]
        self.original, self.grad_was = original, autograd._enabled
        trace = self

        def apply(cls, *inputs, **options):
            trace.depth += 1
            try:
                out = original.__func__(cls, *inputs, **options)
            finally:
                trace.depth -= 1
            if trace.depth == 0:
                trace.records.append((cls, inputs, options, out))
            return out
        autograd.Function.apply = classmethod(apply)
        autograd._enabled = True  # reshapes of tensors that need a gradient go through the op table
        return self

    def __exit__(self, *exc):
        autograd.Function.apply = self.original
        autograd._enabled = self.grad_was


class _Writer:
    def __init__(self, onnx, names):
        self.onnx, self.h = onnx, onnx.helper
        self.nodes, self.initializers = [], []
        self.names = dict(names)  # id(tensor) -> value name
        self.keep = []  # tensors whose ids name values: kept alive while writing
        self.batch = set()  # names whose dimension 0 is the input's batch
        self.count = 0
        self.constants = {}

    def fresh(self, hint):
        self.count += 1
        return f"/{hint}_{self.count}"

    def name(self, t, hint="const"):
        """The value name of a tensor: a traced value, a parameter or buffer (initializer named by its key), or a
        constant tensor made inside forward (an initializer of its own)."""
        k = id(t)
        if k not in self.names:
            self.names[k] = self.constant(t.numpy(), hint)
            self.keep.append(t)
        n = self.names[k]
        if isinstance(n, tuple):  # a parameter or buffer not yet written
            key, arr = n
            self.initializers.append(self.onnx.numpy_helper.from_array(arr, key))
            self.names[k] = key
            return key
        return n

    def constant(self, array, hint="const"):
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.constants:
            name = self.fresh(hint)
            self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
            self.constants[key] = name
        return self.constants[key]

    def node(self, op, inputs, out=None, **attrs):
        name = self.fresh(op)
        output = name + "_output"
        self.nodes.append(self.h.make_node(op, inputs, [output], name=name, **attrs))
        if out is not None:
            self.names[id(out)] = output
            self.keep.append(out)
        return output


def _export_record(w, cls, inputs, options, out, batch_names):
    """Writes one recorded op as ONNX nodes."""
    name = cls.__name__
    x = inputs[0]
    xn = w.name(x) if isinstance(x, Tensor) else None
    keeps_batch = xn in batch_names
    result = out[0] if type(out) is tuple else out

    def done(output):
        if keeps_batch:
            batch_names.add(output)
        return output

    if name == "Conv2d":
        s = options["s"]
        pads = []
        for size, k, st, p, d, o in ((s.H, s.KH, s.SH, s.PH, s.DH, s.OH), (s.W, s.KW, s.SW, s.PW, s.DW, s.OW)):
            span = d * (k - 1) + 1
            pads.append(p if (size + 2 * p - span) // st + 1 == o else max(0, (o - 1) * st + span - size - p))
        args = [xn, w.name(inputs[1])] + ([w.name(inputs[2])] if inputs[2] is not None else [])
        y = done(w.node("Conv", args, None if options.get("relu") else result, kernel_shape=[s.KH, s.KW],
                        strides=[s.SH, s.SW], pads=[s.PH, s.PW, pads[0], pads[1]], dilations=[s.DH, s.DW],
                        group=s.G))
        if options.get("relu"):  # a ReLU that nn.Sequential fused into the convolution
            done(w.node("Relu", [y], result))
    elif name == "Linear":
        args = [xn, w.name(inputs[1])] + ([w.name(inputs[2])] if inputs[2] is not None else [])
        y = done(w.node("Gemm", args, None if options.get("relu") else result, transB=1))
        if options.get("relu"):
            done(w.node("Relu", [y], result))
    elif name == "Activation":
        kind = options["kind"]
        if kind == "relu6":
            lo, hi = w.constant(np.array(0, np.float32)), w.constant(np.array(6, np.float32))
            done(w.node("Clip", [xn, lo, hi], result))
        else:
            done(w.node({"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}[kind], [xn], result))
    elif name in ("MaxPool2d", "AvgPool2d"):
        k, s, p = options["k"], options["s"], options["p"]
        H, W = x.shape[2:]
        floor = tuple((size + 2 * pi - ki) // si + 1 for size, ki, si, pi in zip((H, W), k, s, p))
        attrs = dict(kernel_shape=list(k), strides=list(s), pads=[p[0], p[1], p[0], p[1]],
                     ceil_mode=int(floor != tuple(options["out_shape"][2:])))
        if name == "AvgPool2d":
            attrs["count_include_pad"] = int(options["count_include_pad"])
        relu = options.get("relu")  # a ReLU that nn.Sequential moved into the max pooling after it
        y = done(w.node("MaxPool" if name == "MaxPool2d" else "AveragePool", [xn], None if relu else result, **attrs))
        if relu:
            done(w.node("Relu", [y], result))
    elif name == "BatchNormEval":
        C = x.shape[1]
        weight = w.name(inputs[1]) if inputs[1] is not None else w.constant(np.ones(C, np.float32))
        bias = w.name(inputs[2]) if inputs[2] is not None else w.constant(np.zeros(C, np.float32))
        done(w.node("BatchNormalization", [xn, weight, bias, w.name(inputs[3]), w.name(inputs[4])], result,
                    epsilon=float(options["eps"])))
    elif name == "BatchNormTrain":
        raise ValueError("export: a batch norm without running statistics (track_running_stats=False) normalises "
                         "with batch statistics in eval mode, which ONNX inference does not express")
    elif name == "LocalResponseNorm":
        if options["size"] % 2 == 0:
            raise ValueError(f"export: LocalResponseNorm of even size {options['size']}: ONNX centres an even window "
                             "differently from clnet's (PyTorch's)")
        done(w.node("LRN", [xn], result, size=options["size"], alpha=options["alpha"], beta=options["beta"],
                    bias=options["k"]))
    elif name == "Softmax":
        done(w.node("LogSoftmax" if options["log"] else "Softmax", [xn], result, axis=options["dim"]))
    elif name == "Reshape":
        shape = list(options["shape"])
        if keeps_batch and shape and shape[0] == x.shape[0]:
            shape[0] = 0  # copy the batch dimension: the file takes any batch
            w.node("Reshape", [xn, w.constant(np.array(shape, np.int64), "shape")], result)
            batch_names.add(w.names[id(result)])
        else:
            w.node("Reshape", [xn, w.constant(np.array(shape, np.int64), "shape")], result)
    elif name == "Axpby":
        a, b = xn, w.name(inputs[1])
        alpha, beta = options["alpha"], options["beta"]
        if alpha == 1.0 and beta in (1.0, -1.0):
            done(w.node("Add" if beta == 1.0 else "Sub", [a, b], result))
        else:
            sa = w.node("Mul", [a, w.constant(np.array(alpha, np.float32))])
            sb = w.node("Mul", [b, w.constant(np.array(beta, np.float32))])
            done(w.node("Add", [sa, sb], result))
    elif name == "Affine":
        alpha, beta = options["alpha"], options["beta"]
        y = xn
        if alpha != 1.0 or beta == 0.0:
            y = w.node("Mul", [y, w.constant(np.array(alpha, np.float32))], None if beta else result)
        if beta != 0.0:
            y = w.node("Add", [y, w.constant(np.array(beta, np.float32))], result)
        done(y)
    elif name == "Mul":
        done(w.node("Mul", [xn, w.name(inputs[1])], result))
    elif name == "Cat":
        out_name = w.node("Concat", [w.name(t) for t in inputs], result, axis=options["dim"])
        if options["dim"] != 0 and all(w.name(t) in batch_names for t in inputs):
            batch_names.add(out_name)
    elif name == "Sum":
        total = w.node("ReduceSum", [xn], keepdims=0)
        w.node("Mul", [total, w.constant(np.array(options["scale"], np.float32))], result)
    elif name == "Dropout":
        raise ValueError("export: dropout ran although the model was in eval mode")
    else:
        raise ValueError(f"export: clnet op {name} has no ONNX translation")


def export(model, path, example_input, opset=EXPORT_OPSET, dynamic_batch=True):
    """Write a clnet module as an ONNX file, its weights as initializers named by their state_dict keys.

    Parameters
    ----------
    model : clnet.nn.Module
        Any clnet module (the zoo's included); it runs once, in eval mode, on the example (its mode is restored).
    path : str or os.PathLike
        Where to write the file.
    example_input : clnet.Tensor or numpy.ndarray, or a tuple of them
        An input of the shape the file is for. With `dynamic_batch` the first dimension is left free wherever every
        reshape of the network keeps it.
    opset : int
        The ONNX operator set to write (13 or later).

    Returns
    -------
    onnx.ModelProto
        The model that was written (checked by onnx.checker).
    """
    onnx = _onnx()
    examples = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    dev = model.device
    xs = []
    for e in examples:
        t = e if isinstance(e, Tensor) else _to_device(np.asarray(e, np.float32), dev)
        xs.append(t.detach().requires_grad_(True))
    names = {}
    for k, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p is not None and p.dtype == np.float32:
            names[id(p)] = (k, p.numpy())
    w = _Writer(onnx, names)
    input_names = [f"input{i}" if len(xs) > 1 else "input" for i in range(len(xs))]
    batch_names = set()
    for t, n in zip(xs, input_names):
        w.names[id(t)] = n
        w.keep.append(t)
        batch_names.add(n)
    was_training = model.training
    model.eval()
    try:
        with _Trace() as trace:
            out = model(*xs)
    finally:
        model.train(was_training)
    for cls, inputs, options, result in trace.records:
        _export_record(w, cls, inputs, options, result, batch_names)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    output_names = [f"output{i}" if len(outs) > 1 else "output" for i in range(len(outs))]
    for t, n in zip(outs, output_names):
        w.nodes.append(w.h.make_node("Identity", [w.name(t)], [n], name=f"/{n}"))
    dynamic = dynamic_batch and all(w.name(t) in batch_names for t in outs)

    def value_info(name, shape):
        dims = ["N" if dynamic else shape[0]] + list(shape[1:]) if shape else []
        return w.h.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)
    graph = w.h.make_graph(w.nodes, type(model).__name__, [value_info(n, t.shape) for t, n in zip(xs, input_names)],
                           [value_info(n, t.shape) for t, n in zip(outs, output_names)], w.initializers)
    proto = w.h.make_model(graph, opset_imports=[w.h.make_opsetid("", int(opset))], producer_name="clnet")
    proto.ir_version = min(proto.ir_version, 9)  # ONNX Runtime's readers lag the newest IR version
    onnx.save(proto, os.fspath(path))
    onnx.checker.check_model(os.fspath(path))  # from the file: no second serialisation of the weights
    return proto
