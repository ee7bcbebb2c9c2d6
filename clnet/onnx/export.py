"""clnet.onnx.export: a clnet module, traced once, as an ONNX file."""

import math
import os

import numpy as np

from .. import autograd
from ..files import write_atomically
from ..pointwise import BINARY, UNARY
from ..reduce import MAX as _MAX
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
        self.traced = {}  # id(storage) -> the traced value (an input or a node's output) that holds it
        self.merged = {}  # names whose dimension 0 is the input's batch times a known factor (attention's heads)
        self.batch_size = 1
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
            src = self.traced.get(id(t.storage)) if getattr(t, "storage", None) is not None else None
            if src is not None and src.size == t.size and id(src) in self.names:  # an alias of a traced value made
                # without an op (a reshape of an int32 input): its value, reshaped, not a constant of the example's
                self.names[k] = self.node("Reshape", [self.names[id(src)],
                                                      self.constant(np.array(t.shape, np.int64), "shape")])
            else:
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
            if getattr(out, "storage", None) is not None:
                self.traced[id(out.storage)] = out
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
        elif xn in w.merged:
            w.merged[output] = w.merged[xn]
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
        k = 1 if keeps_batch else w.merged.get(xn)
        B = w.batch_size
        out_k = None
        if k is not None and shape:
            lead = B * k  # the input's dimension 0: the batch times k
            if shape[0] == x.shape[0] and k == 1:
                shape[0], out_k = 0, 1  # copy the batch dimension: the file takes any batch
            elif shape[0] % lead == 0:  # more dimensions merged into the batch's
                out_k, shape[0] = k * shape[0] // lead, -1
            elif shape[0] % B == 0 and k % (shape[0] // B) == 0 and any(
                    math.prod(shape[:i]) == lead for i in range(2, len(shape) + 1)):  # the batch split from k
                out_k, shape[0] = shape[0] // B, -1
        y = w.node("Reshape", [xn, w.constant(np.array(shape, np.int64), "shape")], result)
        if out_k == 1:
            batch_names.add(y)
        elif out_k is not None:
            w.merged[y] = out_k
    elif name == "Axpby":
        a, b = xn, w.name(inputs[1])
        alpha, beta = options["alpha"], options["beta"]
        if alpha == 1.0 and beta in (1.0, -1.0):
            y = w.node("Add" if beta == 1.0 else "Sub", [a, b], result)
        else:
            sa = w.node("Mul", [a, w.constant(np.array(alpha, np.float32))])
            sb = w.node("Mul", [b, w.constant(np.array(beta, np.float32))])
            y = w.node("Add", [sa, sb], result)
        _carry(w, batch_names, y, result, inputs[:2])
    elif name == "AddRelu":  # an imported file's Add whose one reader was a Relu (onnx/module._fuse_relus)
        y = w.node("Relu", [w.node("Add", [xn, w.name(inputs[1])])], result)
        _carry(w, batch_names, y, result, inputs[:2])
    elif name == "Affine":
        alpha, beta = options["alpha"], options["beta"]
        y = xn
        if alpha != 1.0 or beta == 0.0:
            y = w.node("Mul", [y, w.constant(np.array(alpha, np.float32))], None if beta else result)
        if beta != 0.0:
            y = w.node("Add", [y, w.constant(np.array(beta, np.float32))], result)
        done(y)
    elif name == "Mul":
        _carry(w, batch_names, w.node("Mul", [xn, w.name(inputs[1])], result), result, inputs[:2])
    elif name == "Cat":
        out_name = w.node("Concat", [w.name(t) for t in inputs], result, axis=options["dim"])
        if options["dim"] != 0 and all(w.name(t) in batch_names for t in inputs):
            batch_names.add(out_name)
    elif name == "Dropout":
        raise ValueError("export: dropout ran although the model was in eval mode")
    elif name == "Unary":
        _export_unary(w, xn, options, result, done)
    elif name == "Binary":
        a, b = inputs
        an, bn = w.name(a), w.name(b)
        op = options["op"]
        out_shape = tuple(options["out_shape"])
        wider = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape))) != out_shape  # broadcast_to's
        last = None if wider else result
        if op == "ne":
            y = w.node("Not", [w.node("Equal", [an, bn])], last)
        elif op == "floor_divide":
            y = w.node("Floor", [w.node("Div", [an, bn])], last)
        elif op in ("maximum", "minimum"):
            y = w.node("Max" if op == "maximum" else "Min", [an, bn], last)
        elif BINARY[op].onnx and op != "remainder":
            y = w.node(BINARY[op].onnx, [an, bn], last)
        else:
            raise ValueError(f"export: the elementwise op {op} has no ONNX translation")
        if wider:
            y = _expand(w, y, out_shape, result, batch_names, False)
        _carry(w, batch_names, y, result, inputs)
    elif name == "Cast":
        to = {np.dtype(np.float32): 1, np.dtype(np.int32): 6, np.dtype(np.bool_): 9}[np.dtype(result.dtype)]
        done(w.node("Cast", [xn], result, to=to))
    elif name == "Where":
        c, a, b = inputs
        y = w.node("Where", [w.name(c), w.name(a), w.name(b)], result)
        _carry(w, batch_names, y, result, inputs)
    elif name == "Extreme" or (name == "Sum" and options["dims"] != ()):
        dims = list(options["dims"])
        keep = int(bool(options["keepdim"]))
        if name == "Extreme":
            op = "ReduceMax" if options["comb"] == _MAX else "ReduceMin"
            y = w.node(op, [xn], result, axes=dims, keepdims=keep)
        else:
            total = w.node("ReduceSum", [xn, w.constant(np.array(dims, np.int64), "axes")],
                           None if options["scale"] != 1.0 else result, keepdims=keep)
            y = total if options["scale"] == 1.0 else \
                w.node("Mul", [total, w.constant(np.array(options["scale"], np.float32))], result)
        if 0 not in dims:
            done(y)
    elif name == "Sum":  # over nothing: a copy
        done(w.node("Identity", [xn], result))
    elif name == "BatchedMatMul":
        y = w.node("MatMul", [xn, w.name(inputs[1])], None if options.get("alpha", 1.0) != 1.0 else result)
        if options.get("alpha", 1.0) != 1.0:
            y = w.node("Mul", [y, w.constant(np.array(options["alpha"], np.float32))], result)
        _carry(w, batch_names, y, result, inputs[:2])
    elif name == "SoftmaxRows":
        done(w.node("LogSoftmax" if options["log"] else "Softmax", [xn], result, axis=-1))
    elif name == "View":
        _export_view(w, x, xn, options, result, batch_names)
    elif name == "IndexSelect":  # index_select (the import's Gather, a Slice with a negative step)
        y = w.node("Gather", [xn, w.name(inputs[1], "indices")], result, axis=int(options["dim"]))
        if options["dim"] != 0:
            done(y)
        elif w.name(inputs[1]) in batch_names and not keeps_batch:  # rows picked by batch-sized indices (an
            batch_names.add(y)  # Embedding's): the result's first dimension is the indices' batch
    elif name == "Gather":  # views.gather: ONNX's GatherElements
        y = w.node("GatherElements", [xn, w.name(inputs[1], "indices")], result, axis=int(options["dim"]))
        if options["dim"] != 0 and inputs[1].shape[:1] == x.shape[:1]:
            done(y)
    elif name == "ConstantPad":  # views.pad in mode constant (negative begins crop)
        begins = list(options["begins"])
        ends = [o - s - b for o, s, b in zip(options["out_shape"], x.shape, begins)]
        value = options["value"] if result.dtype == np.float32 else int(options["value"])
        done(w.node("Pad", [xn, w.constant(np.array(begins + ends, np.int64), "pads"),
                            w.constant(np.array(value, result.dtype))], result, mode="constant"))
    else:
        raise ValueError(f"export: clnet op {name} has no ONNX translation")


def _export_unary(w, xn, options, result, done):
    """One of pointwise.UNARY's ops: its ONNX operator (the table names it), with the kernel's parameters as ONNX's
    attributes or inputs, or its formula in ONNX's operators."""
    op, p0, p1 = options["op"], float(options.get("p0", 0.0)), float(options.get("p1", 0.0))
    c = w.constant

    def f(v):
        return c(np.array(v, np.float32))
    if UNARY[op].onnx_attrs:  # the kernel's p0, p1 as the ONNX attributes the table names
        done(w.node(UNARY[op].onnx, [xn], result, **{a: p for (a, _), p in zip(UNARY[op].onnx_attrs, (p0, p1))}))
    elif op in ("clamp", "hardtanh"):
        done(w.node("Clip", [xn, f(p0), f(p1)], result))
    elif op == "relu6":
        done(w.node("Clip", [xn, f(0.0), f(6.0)], result))
    elif op == "pow_scalar":
        done(w.node("Pow", [xn, f(p0)], result))
    elif op == "rpow_scalar":
        done(w.node("Pow", [f(p0), xn], result))
    elif op == "rdiv_scalar":
        done(w.node("Div", [f(p0), xn], result))
    elif op == "rsqrt":
        done(w.node("Reciprocal", [w.node("Sqrt", [xn])], result))
    elif op == "log1p":
        done(w.node("Log", [w.node("Add", [xn, f(1.0)])], result))
    elif op == "silu":
        done(w.node("Mul", [xn, w.node("Sigmoid", [xn])], result))
    elif op == "hardsigmoid":  # relu6(x + 3) / 6
        done(w.node("HardSigmoid", [xn], result, alpha=1.0 / 6.0, beta=0.5))
    elif op == "gelu":  # x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
        inner = w.node("Add", [w.node("Erf", [w.node("Mul", [xn, f(0.5 ** 0.5)])]), f(1.0)])
        done(w.node("Mul", [w.node("Mul", [xn, f(0.5)]), inner], result))
    elif op == "gelu_tanh":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        cube = w.node("Mul", [w.node("Pow", [xn, f(3.0)]), f(0.044715)])
        t = w.node("Tanh", [w.node("Mul", [w.node("Add", [xn, cube]), f((2.0 / math.pi) ** 0.5)])])
        done(w.node("Mul", [w.node("Mul", [xn, f(0.5)]), w.node("Add", [t, f(1.0)])], result))
    elif op == "mish":  # x tanh(softplus(x)) (Mish itself is opset 18)
        done(w.node("Mul", [xn, w.node("Tanh", [w.node("Softplus", [xn])])], result))
    elif op == "softplus" and p0 == 1.0:  # (PyTorch's linear tail past the threshold is within float32's eps)
        done(w.node("Softplus", [xn], result))
    elif UNARY[op].onnx and not UNARY[op].params and op != "softplus":
        done(w.node(UNARY[op].onnx, [xn], result))
    else:
        raise ValueError(f"export: the elementwise op {op} (parameters {p0}, {p1}) has no ONNX translation")


def _view_plan(in_shape, shape, strides, base):
    """A strided view of a contiguous tensor (views.View: shape, strides, base) as ONNX operators: (starts, ends of a
    Slice per input dimension, the Transpose's perm, the Reshape's target, the Expand's target or None), or None
    where the view is not a slice, permutation and broadcast of the input."""
    cs = [math.prod(in_shape[d + 1:]) for d in range(len(in_shape))]
    used, source = set(), {}
    for j, (n, st) in enumerate(zip(shape, strides)):
        if n == 1 or st == 0:
            continue
        d = next((d for d in range(len(in_shape)) if cs[d] == st and in_shape[d] > 1 and d not in used), None)
        if d is None:
            return None
        used.add(d)
        source[j] = d
    starts, rest = [0] * len(in_shape), base
    for d in sorted(range(len(in_shape)), key=lambda d: -cs[d]):
        if in_shape[d] > 1:
            starts[d], rest = divmod(rest, cs[d])[0], rest % cs[d]
    if rest:
        return None
    ends = [s + 1 for s in starts]
    for j, d in source.items():
        ends[d] = starts[d] + shape[j]
    if any(e > n for e, n in zip(ends, in_shape)):
        return None
    for d in range(len(in_shape)):
        if in_shape[d] == 1:
            ends[d] = 1
    kept = iter(source[j] for j in sorted(source))  # in the view's order, at the positions kept dimensions hold
    perm = [d if d not in used else next(kept) for d in range(len(in_shape))]  # (the others have size 1 by now)
    target = [1 if st == 0 else n for n, st in zip(shape, strides)]
    expand = list(shape) if any(st == 0 and n > 1 for n, st in zip(shape, strides)) else None
    return starts, ends, perm, target, expand


def _carry(w, batch_names, y, result, operands):
    """Marks y as holding the batch (or the batch merged with a factor) where every operand that spans its dimension 0
    (of its rank, not broadcast there) holds it the same way; one that does not (a value of a fixed size, where
    PyTorch's attention moved the batch to dimension 1) leaves y fixed."""
    spanning = [w.name(t) for t in operands if isinstance(t, Tensor) and t.ndim == result.ndim and result.ndim and
                t.shape[0] == result.shape[0] and (t.shape[0] > 1 or w.batch_size == 1)]
    if not spanning:
        return
    if all(n in batch_names for n in spanning):
        batch_names.add(y)
    elif all(n in w.merged for n in spanning) and len({w.merged[n] for n in spanning}) == 1:
        w.merged[y] = w.merged[spanning[0]]


def _expand(w, y, shape, result, batch_names, batch, first_broadcast=True):
    """y expanded to `shape`: where y has the batch, its dimension 0 kept (1 in Expand's target); where a tensor
    without it is broadcast to the batch's size along dimension 0 (ViT's class token), to the input's batch size,
    from its Shape."""
    if not batch and first_broadcast and shape[0] == w.batch_size > 1 and len(w.inputs) == 1:
        first = w.node("Slice", [w.node("Shape", [w.inputs[0]]), w.constant(np.array([0], np.int64), "starts"),
                                 w.constant(np.array([1], np.int64), "ends")])
        sizes = w.node("Concat", [first, w.constant(np.array(shape[1:], np.int64), "shape")], axis=0)
        y = w.node("Expand", [y, sizes], result)
        batch_names.add(y)
        return y
    return w.node("Expand", [y, w.constant(np.array([1 if batch and i == 0 else n for i, n in enumerate(shape)],
                                                    np.int64), "shape")], result)


def _export_view(w, x, xn, options, result, batch_names):
    shape, strides, base = options["shape"], options["strides"], options["base"]
    plan = _view_plan(tuple(x.shape), tuple(shape), tuple(strides), base)
    if plan is None:
        raise ValueError(f"export: the view {options.get('what', '')} of shape {tuple(shape)}, strides "
                         f"{tuple(strides)} from {tuple(x.shape)} is not a slice, permutation and broadcast")
    starts, ends, perm, target, expand = plan
    batch = (xn in batch_names or xn in w.merged) and perm[0] == 0 and starts[0] == 0 and ends[0] == x.shape[0] \
        and shape and shape[0] == x.shape[0] and strides[0] != 0
    y = xn
    sliced = [d for d in range(x.ndim) if (starts[d], ends[d]) != (0, x.shape[d])]
    if sliced:
        y = w.node("Slice", [y, w.constant(np.array([starts[d] for d in sliced], np.int64), "starts"),
                             w.constant(np.array([ends[d] for d in sliced], np.int64), "ends"),
                             w.constant(np.array(sliced, np.int64), "axes")])
    if perm != sorted(perm):
        y = w.node("Transpose", [y], perm=perm)
    if batch:
        target = [0] + list(target[1:])
    y = w.node("Reshape", [y, w.constant(np.array(target, np.int64), "shape")], None if expand else result)
    if expand:
        y = _expand(w, y, expand, result, batch_names, batch, strides[0] == 0)
    if batch:
        if xn in batch_names:
            batch_names.add(y)
        else:
            w.merged[y] = w.merged[xn]


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
        if not isinstance(e, Tensor):  # host data: float32, or int32 for integer data (an Embedding's indices)
            e = np.asarray(e)
            e = _to_device(e.astype(np.int32 if e.dtype.kind in "iu" else np.bool_ if e.dtype.kind == "b" else
                                    np.float32), dev)
        t = e.detach()
        xs.append(t.requires_grad_(True) if t.dtype == np.float32 else t)  # (a float input's ops are traced too)
    names = {}
    for k, p in list(model.named_parameters()) + list(model.named_buffers()):
        if p is not None and p.dtype == np.float32:
            names[id(p)] = (k, p.numpy())
    w = _Writer(onnx, names)
    w.batch_size = xs[0].shape[0] if xs[0].ndim else 1
    w.inputs = [f"input{i}" if len(xs) > 1 else "input" for i in range(len(xs))]
    input_names = [f"input{i}" if len(xs) > 1 else "input" for i in range(len(xs))]
    batch_names = set()
    for t, n in zip(xs, input_names):
        w.names[id(t)] = n
        w.keep.append(t)
        w.traced[id(t.storage)] = t
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

    def value_info(name, t):
        dims = ["N" if dynamic else t.shape[0]] + list(t.shape[1:]) if t.shape else []
        kind = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.int32): onnx.TensorProto.INT32,
                np.dtype(np.bool_): onnx.TensorProto.BOOL}[np.dtype(t.dtype)]
        return w.h.make_tensor_value_info(name, kind, dims)
    graph = w.h.make_graph(w.nodes, type(model).__name__, [value_info(n, t) for t, n in zip(xs, input_names)],
                           [value_info(n, t) for t, n in zip(outs, output_names)], w.initializers)
    proto = w.h.make_model(graph, opset_imports=[w.h.make_opsetid("", int(opset))], producer_name="clnet")
    proto.ir_version = min(proto.ir_version, 9)  # ONNX Runtime's readers lag the newest IR version
    write_atomically(path, lambda f: f.write(proto.SerializeToString()))
    onnx.checker.check_model(os.fspath(path))  # from the file: no second serialisation of the weights
    return proto
