"""ONNX in and out: `load` turns an ONNX file into a clnet module that runs and trains on any OpenCL device, `export`
writes a clnet module (the zoo's included) as an ONNX file.

Import. The graph becomes an `OnnxModule` whose forward walks the file's nodes in order, calling nn.functional and
the op table, so autograd records it as it records any clnet network and `loss.backward()` trains it. Float
initializers that are weights (a convolution's or a Gemm's, batch norm's scale and bias, a tensor added or
multiplied in) become Parameters named by their initializer names, which PyTorch's exporters take from the
state_dict keys; batch norm's mean and variance become buffers. So `state_dict()` has the file's names and values,
unchanged, and `load_state_dict` takes a PyTorch state_dict. Nodes whose inputs are all constants are evaluated once
at load; Shape-driven subgraphs (`x.view(x.size(0), -1)`) run in NumPy on the host from the shapes of each call's
tensors, without a kernel or a copy, so a file exported at batch 1 also runs at batch 64. Batch normalization runs
with the batch's statistics in train() and the stored ones in eval(), as in PyTorch; the module starts in the mode
the file was exported in. `fuse=True` (an inference-only optimisation, off by default) folds each inference-mode
batch norm that follows a convolution into the convolution's weights and bias at load; such a module refuses train().

ONNX's semantics where they differ from PyTorch's: training-mode BatchNormalization moves running_var towards the
batch's population variance (ONNX's BatchNormalization-14/15), not PyTorch's unbiased one (_d_batchnorm corrects
clnet's update); Gemm and MatMul multiply as ONNX says whatever B is (a file's weight, a constant, a computed tensor).

Refusals come at load, before any kernel runs. Every node is checked twice: its operator and attributes
(_check_node), then, following the graph from its inputs, what each handler needs of its inputs (_check_flow: which
values are constants, which are computed on the host from shapes, which are computed tensors, and their shapes as
ONNX's shape inference finds them). What clnet cannot run raises `OnnxImportError` naming the node, the operator,
the opset and the reason; a damaged or truncated file raises it naming the file. Only what depends on a dimension
unknown at load (a free batch size) is decided by the call, with the same error naming the node. An opset newer than
NEWEST_OPSET loads with an OnnxOpsetWarning.

Files. External data is read only from files inside the model's folder (no absolute paths, no "..", no symbolic link
leading out), and the initializers' declared sizes are checked against the device's memory (the host's when no device
is named) before anything is read or allocated.

Export. `export(model, path, example_input)` runs the model once in eval mode on the example with every op recorded
(autograd's Function.apply, wrapped for the duration), and writes each recorded op as its ONNX node; parameters and
buffers become initializers named by their state_dict keys, so the file loads back into the same names.

The `onnx` package is optional (`pip install 'clnet[onnx]'`); without it `load` and `export` say so.
"""
import math
import os
import warnings

import numpy as np

from . import autograd, ops
from .nn import functional as F
from .nn.module import Module
from .shapes import conv_shape
from .tensor import Parameter, Tensor
from .tensor import tensor as _to_device
from .errors import Error

INSTALL_HINT = "pip install 'clnet[onnx]'"
EXPORT_OPSET = 17
NEWEST_OPSET = 21  # the newest default-domain opset whose operator changes the importer was checked against


class OnnxImportError(Error, ValueError):
    """An ONNX file clnet cannot read or run: names the file, and the node, operator type and opset where one is at
    fault."""


class OnnxOpsetWarning(UserWarning):
    """A file of an opset newer than the importer was checked against (NEWEST_OPSET)."""


def _onnx():
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError(f"clnet.onnx needs the onnx package, which is not installed: {INSTALL_HINT}") from e
    return onnx


# ---- attributes and host values ------------------------------------------------------------------------------------

def _attributes(onnx, node):
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif a.type == onnx.AttributeProto.TENSOR:
            v = onnx.numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _host_int_list(v):
    return [int(i) for i in np.asarray(v).reshape(-1)]


def _is_host(v):
    return isinstance(v, np.ndarray)


# ---- the imported network ------------------------------------------------------------------------------------------

class _Node:
    __slots__ = ("op", "name", "inputs", "outputs", "attrs", "run", "frees")

    def __init__(self, op, name, inputs, outputs, attrs, run):
        self.op, self.name, self.inputs, self.outputs, self.attrs, self.run = op, name, inputs, outputs, attrs, run
        self.frees = ()

    def where(self, module):
        return f"ONNX node {self.name!r} ({self.op}, opset {module.opset})"


_COMPARED = 4096  # the size up to which device_constant compares a constant with the one it holds


class OnnxModule(Module):
    """A network read from an ONNX file (made by `clnet.onnx.load`): forward takes the graph's inputs and returns its
    outputs, in the file's order (one output: the tensor itself).

    ``state_dict()`` is keyed by initializer names. Weights that a MatMul or a Gemm with transB=0 reads as (in, out)
    are held as (out, in) for the dense kernels; state_dict and load_state_dict give and take them in the file's
    layout."""

    def __init__(self, path, opset, inputs, outputs, nodes, constants, transposed):
        super().__init__()
        d = self.__dict__
        d["path"], d["opset"], d["input_names"], d["output_names"] = path, opset, inputs, outputs
        d["_nodes"], d["_constants"], d["_transposed"] = nodes, constants, transposed
        d["_device_constants"] = {}
        last_use = {}
        for i, n in enumerate(nodes):
            for name in n.inputs:
                if name:
                    last_use[name] = i
        keep = set(outputs)
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
        fixed = dict(state_dict)
        for k in self._transposed:
            if k in fixed:
                v = fixed[k]
                a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
                fixed[k] = np.ascontiguousarray(a.T)
        return super().load_state_dict(fixed, strict)

    # -- running -------------------------------------------------------------------------------------------------
    def device_constant(self, key, array):
        """A host constant as a tensor on this module's device, uploaded once. A small one is compared with what was
        uploaded under its key and uploaded again where it differs: host values computed from a call's shapes (a
        mean's 1 / N) may change from call to call."""
        dev = self.device
        k = (key, id(dev))
        array = np.asarray(array, np.float32)
        held = self._device_constants.get(k)
        if held is not None and (array.size > _COMPARED or np.array_equal(held[1], array)):
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


# ---- host (NumPy) evaluation: constants and shape arithmetic -------------------------------------------------------

def _host_binary(fn):
    def run(m, n, a):
        x, y = a
        if x.dtype.kind in "iu" and y.dtype.kind in "iu" and fn is np.divide:
            return [np.trunc(x / y).astype(np.result_type(x, y))]
        return [fn(x, y)]
    return run


def _h_shape(m, n, a):
    shape = np.array(a[0].shape, np.int64)
    start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
    return [shape[start:end]]


def _h_gather(m, n, a):
    return [np.take(a[0], a[1].astype(np.int64), axis=n.attrs.get("axis", 0))]


def _axes(m, n, a, index):
    if "axes" in n.attrs:
        return _host_int_list(n.attrs["axes"])
    if len(a) > index and a[index] is not None:
        v = a[index]
        if not _is_host(v):
            raise OnnxImportError(f"{n.where(m)}: the axes must be constants")
        return _host_int_list(v)
    return None


def _unsqueezed_shape(shape, axes):
    rank = len(shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    out = list(shape)
    for ax in axes:
        out.insert(ax, 1)
    return tuple(out)


def _squeezed_shape(shape, axes):
    if axes is None:
        return tuple(s for s in shape if s != 1)
    axes = {a % len(shape) for a in axes}
    for ax in axes:
        if shape[ax] != 1:
            raise ValueError(f"cannot squeeze axis {ax} of shape {tuple(shape)}")
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _h_unsqueeze(m, n, a):
    return [a[0].reshape(_unsqueezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _h_squeeze(m, n, a):
    return [a[0].reshape(_squeezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _h_concat(m, n, a):
    return [np.concatenate([x.reshape(-1) if x.ndim == 0 else x for x in a], axis=n.attrs["axis"])]


_ONNX_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
                10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _h_cast(m, n, a):
    to = n.attrs["to"]
    if to not in _ONNX_DTYPES:
        raise OnnxImportError(f"{n.where(m)}: Cast to ONNX type {to} is not supported")
    return [a[0].astype(_ONNX_DTYPES[to])]


def _h_slice(m, n, a):
    x = a[0]
    if "starts" in n.attrs:  # opset < 10
        starts, ends, axes, steps = n.attrs["starts"], n.attrs["ends"], n.attrs.get("axes"), None
    else:
        starts, ends = _host_int_list(a[1]), _host_int_list(a[2])
        axes = _host_int_list(a[3]) if len(a) > 3 and a[3] is not None else None
        steps = _host_int_list(a[4]) if len(a) > 4 and a[4] is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        index[ax % x.ndim] = slice(max(min(s, 2**62), -2**62), max(min(e, 2**62), -2**62), st)
    return [x[tuple(index)]]


def _h_constant(m, n, a):
    at = n.attrs
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in at:
            v = at[key]
            dtype = np.float32 if "float" in key else (np.int64 if "int" in key else None)
            return [np.array(v, dtype=dtype) if dtype is not None else np.asarray(v)]
    raise OnnxImportError(f"{n.where(m)}: a Constant of this kind ({', '.join(at)}) is not supported")


def _h_constant_of_shape(m, n, a):
    value = n.attrs.get("value", np.zeros(1, np.float32))
    return [np.full(_host_int_list(a[0]), value.reshape(-1)[0], dtype=value.dtype)]


def _h_reshape(m, n, a):
    return [a[0].reshape(_reshape_target(a[0].shape, _reshape_shape(n, a), n.attrs.get("allowzero", 0)))]


def _reshape_target(shape, target, allowzero=0):
    target = _host_int_list(target)
    if not allowzero:
        target = [shape[i] if t == 0 else t for i, t in enumerate(target)]
    return tuple(target)


def _h_flatten(m, n, a):
    return [a[0].reshape(_flatten_shape(a[0].shape, n.attrs.get("axis", 1)))]


def _flatten_shape(shape, axis):
    axis = axis + len(shape) if axis < 0 else axis
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def _h_transpose(m, n, a):
    return [np.transpose(a[0], n.attrs.get("perm"))]


def _h_range(m, n, a):
    return [np.arange(a[0].item(), a[1].item(), a[2].item()).astype(a[0].dtype)]


def _h_where(m, n, a):
    return [np.where(a[0], a[1], a[2])]


def _h_expand(m, n, a):
    return [a[0] * np.ones(_host_int_list(a[1]), a[0].dtype)]


def _h_reduce(fn):
    def run(m, n, a):
        axes = _axes(m, n, a, 1)
        keep = bool(n.attrs.get("keepdims", 1))
        return [fn(a[0], axis=None if axes is None else tuple(axes), keepdims=keep)]
    return run


def _h_unary(fn):
    return lambda m, n, a: [fn(a[0])]


def _h_variadic(fn, mean=False):
    def run(m, n, a):
        y = a[0]
        for v in a[1:]:
            y = fn(y, v)
        return [y / len(a) if mean else y]
    return run


HOST_OPS = {
    "Shape": _h_shape, "Gather": _h_gather, "Unsqueeze": _h_unsqueeze, "Squeeze": _h_squeeze, "Concat": _h_concat,
    "Cast": _h_cast, "Slice": _h_slice, "Constant": _h_constant, "ConstantOfShape": _h_constant_of_shape,
    "Reshape": _h_reshape, "Flatten": _h_flatten, "Transpose": _h_transpose, "Range": _h_range, "Where": _h_where,
    "Expand": _h_expand, "Identity": lambda m, n, a: [a[0]],
    "Add": _host_binary(np.add), "Sub": _host_binary(np.subtract), "Mul": _host_binary(np.multiply),
    "Div": _host_binary(np.divide), "Equal": _host_binary(np.equal), "Less": _host_binary(np.less),
    "Greater": _host_binary(np.greater), "Pow": _host_binary(np.power), "Min": _h_variadic(np.minimum),
    "Max": _h_variadic(np.maximum), "Sum": _h_variadic(np.add), "Mean": _h_variadic(np.add, mean=True),
    "Neg": _h_unary(np.negative), "Floor": _h_unary(np.floor), "Ceil": _h_unary(np.ceil), "Sqrt": _h_unary(np.sqrt),
    "Abs": _h_unary(np.abs), "Not": _h_unary(np.logical_not), "Size": lambda m, n, a: [np.array(a[0].size, np.int64)],
    "ReduceProd": _h_reduce(np.prod), "ReduceSum": _h_reduce(np.sum), "ReduceMax": _h_reduce(np.max),
    "ReduceMin": _h_reduce(np.min),
}


# ---- device ops ----------------------------------------------------------------------------------------------------

def _tensor_arg(m, n, v, i):
    """Input i as a device tensor (a host constant uploaded once)."""
    if _is_host(v):
        return m.device_constant((n.name, i), v)
    return v


def _as_2d(at):
    """A 1-D Conv's or pooling's attributes as those of a 2-D one over (N, C, 1, L)."""
    out = dict(at)
    for key, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if key in at:
            out[key] = [one] + list(at[key])
    if "pads" in at:
        out["pads"] = [0, at["pads"][0], 0, at["pads"][1]]
    return out


def _d_conv(m, n, a):
    x, w, b = a[0], a[1], (a[2] if len(a) > 2 else None)
    w, b = _tensor_arg(m, n, w, 1), (None if b is None else _tensor_arg(m, n, b, 2))
    at = n.attrs
    if x.ndim == 3 and w.ndim == 3:  # 1-D: a 2-D convolution of height 1
        y = _d_conv(m, _Node1d(n), [x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]),
                                    w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]), b])[0]
        return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]
    if x.ndim != 4:
        raise ValueError(f"clnet convolves 4-D (N, C, H, W) inputs, got shape {x.shape}")
    kh, kw = w.shape[2:]
    stride = tuple(at.get("strides", (1, 1)))
    dilation = tuple(at.get("dilations", (1, 1)))
    begin, total = _padding(at, x.shape[2:], (kh, kw), stride, dilation)
    s = conv_shape(n.name, x.shape, w.shape, stride, begin, total, dilation, int(at.get("group", 1)))
    return [ops.Conv2d.apply(x, w, b, s=s, what=f"Conv {n.name}")]


def _padding(at, size, kernel, stride, dilation):
    """(begin, total) padding per spatial axis from ONNX's pads or auto_pad."""
    mode = at.get("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        begin, total = [], []
        for i, k, s, d in zip(size, kernel, stride, dilation):
            t = max((-(-i // s) - 1) * s + d * (k - 1) + 1 - i, 0)
            total.append(t)
            begin.append(t // 2 if mode == "SAME_UPPER" else t - t // 2)
        return tuple(begin), tuple(total)
    if mode == "VALID":
        return (0, 0), (0, 0)
    pads = list(at.get("pads", (0, 0, 0, 0)))
    return (pads[0], pads[1]), (pads[0] + pads[2], pads[1] + pads[3])


def _pool_geometry(at, shape):
    """(kernel, strides, begin pads, (OH, OW)) of an ONNX MaxPool or AveragePool over a 4-D shape: pads may differ at
    the two ends (Caffe's ceil rounding exported as [0, 0, 1, 1], auto_pad SAME with an odd total); the kernels take
    the pads at the start and the output's size, and clip each window to the input."""
    k = tuple(int(i) for i in at["kernel_shape"])
    s = tuple(int(i) for i in at.get("strides", (1, 1)))
    begin, total = _padding(at, shape[2:], k, s, (1, 1))
    ceil = bool(at.get("ceil_mode", 0))
    out = []
    for size, ki, si, b, t in zip(shape[2:], k, s, begin, total):
        span = size + t - ki
        if span < 0:
            raise ValueError(f"the window {k} is larger than the padded input ({size + t}) of shape {tuple(shape)}")
        o = (-(-span // si) if ceil else span // si) + 1
        if ceil and (o - 1) * si >= size + b:  # a window that would start in the end padding is dropped
            o -= 1
        out.append(o)
    return k, s, tuple(begin), tuple(out)


class _Node1d:
    """A node seen as its 2-D counterpart (name, op and inputs kept; attributes from _as_2d)."""

    def __init__(self, n):
        self.name, self.op, self.inputs, self.attrs = n.name, n.op, n.inputs, _as_2d(n.attrs)


def _pool_1d(handler):
    def run(m, n, a):
        x = a[0]
        if x.ndim != 3:
            return handler(m, n, a)
        y = handler(m, _Node1d(n), [x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])])[0]
        return [y.reshape(y.shape[0], y.shape[1], y.shape[3])]
    return run


def _d_maxpool(m, n, a):
    x = a[0]
    k, s, p, out = _pool_geometry(n.attrs, x.shape)
    return [ops.MaxPool2d.apply(x, out_shape=tuple(x.shape[:2]) + out, k=k, s=s, p=p)]


def _d_avgpool(m, n, a):
    x = a[0]
    k, s, p, out = _pool_geometry(n.attrs, x.shape)
    return [ops.AvgPool2d.apply(x, out_shape=tuple(x.shape[:2]) + out, k=k, s=s, p=p,
                                count_include_pad=bool(n.attrs.get("count_include_pad", 0)))]


def _d_global_maxpool(m, n, a):
    x = a[0]
    return [ops.MaxPool2d.apply(x, out_shape=tuple(x.shape[:2]) + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0))]


def _d_global_avgpool(m, n, a):
    x = a[0]
    if x.ndim != 4:
        raise ValueError(f"GlobalAveragePool: clnet pools 4-D inputs, got shape {x.shape}")
    if x.shape[2:] == (1, 1):
        return [x]
    return [ops.AvgPool2d.apply(x, out_shape=x.shape[:2] + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0),
                                count_include_pad=True)]


def _reduce_plan(rank, axes, noop):
    """The runs of adjacent axes [start, end) that a reduction over `axes` of a tensor of `rank` reduces (all axes
    when none are given, unless noop_with_empty_axes); None for no reduction. Raises ValueError for an axis out of
    range."""
    if not axes:
        if noop:
            return None
        axes = list(range(rank))
    for ax in axes:
        if not -rank <= ax < rank:
            raise ValueError(f"axis {ax} is out of range for a {rank}-D tensor")
    runs = []
    for ax in sorted({ax % rank for ax in axes}):
        if runs and runs[-1][1] == ax:
            runs[-1][1] = ax + 1
        else:
            runs.append([ax, ax + 1])
    return [tuple(r) for r in runs]


def _reduce_run(m, n, x, start, end, kind):
    """x reduced over axes [start, end), kept as size 1: with (L, K, T) the sizes before, in and after the run, a sum
    or mean is a product with a vector of ones (T = 1) or a 1x1 convolution of the (L, K, T, 1) image with a weight
    of ones (K channels into 1); a max a max pooling of the (L, 1, K, T) image with a (K, 1) window (of -x for a
    min). Each has its gradient through that op."""
    shape = tuple(x.shape)
    L, K, T = math.prod(shape[:start]), math.prod(shape[start:end]), math.prod(shape[end:])
    out = shape[:start] + (1,) * (end - start) + shape[end:]
    if K == 1:
        return x.reshape(out)
    if kind in ("sum", "mean"):
        scale = 1.0 / K if kind == "mean" else 1.0
        if T == 1:
            ones = m.device_constant(("reduce", K, scale), np.full((1, K), scale, np.float32))
            return F.linear(x.reshape(L, K), ones).reshape(out)
        w = m.device_constant(("reduce conv", K, scale), np.full((1, K, 1, 1), scale, np.float32))
        x4 = x.reshape(L, K, T, 1)
        s = conv_shape(n.name, x4.shape, w.shape, (1, 1), (0, 0), (0, 0), (1, 1), 1)
        return ops.Conv2d.apply(x4, w, None, s=s, what=f"{n.op} {n.name} (a sum over axes {start}..{end - 1})"
                                ).reshape(out)
    x4 = x.reshape(L, 1, K, T)
    if kind == "min":
        x4 = ops.Affine.apply(x4, alpha=-1.0, beta=0.0)
    y = ops.MaxPool2d.apply(x4, out_shape=(L, 1, 1, T), k=(K, 1), s=(K, 1), p=(0, 0))
    if kind == "min":
        y = ops.Affine.apply(y, alpha=-1.0, beta=0.0)
    return y.reshape(out)


def _d_reduce(kind):
    def run(m, n, a):
        x = a[0]
        keep = bool(n.attrs.get("keepdims", 1))
        runs = _reduce_plan(x.ndim, _axes(m, n, a, 1), n.attrs.get("noop_with_empty_axes", 0))
        if runs is None:
            return [x]
        axes = {i for s, e in runs for i in range(s, e)}
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i not in axes)
        if kind == "mean" and x.ndim == 4 and runs == [(2, 3 + 1)]:  # over H and W: global average pooling
            return [_d_global_avgpool(m, n, [x])[0].reshape(out_shape)]
        y = x
        for start, end in reversed(runs):
            y = _reduce_run(m, n, y, start, end, kind)
        return [y.reshape(out_shape)]
    return run


def _copy(t):
    with autograd.no_grad():
        return ops.Affine.apply(t, alpha=1.0, beta=0.0)


def _d_batchnorm(m, n, a):
    """ONNX's BatchNormalization. In train() the batch's statistics normalise and the running ones are updated as
    ONNX specifies (BatchNormalization-14/15, training_mode): running_var = momentum * running_var + (1 - momentum) *
    the batch's population variance. clnet's batch norm (PyTorch's) adds the unbiased variance (times n / (n - 1)), so
    the update is corrected here: with r0 the value before and r the unbiased update over n values per channel,
    ONNX's is ((n - 1) r + momentum r0) / n. Statistics that are module buffers (the file's initializers) are updated
    in place, as training does; others (graph inputs, constants) are copied first, as ONNX returns new ones."""
    x, scale, bias, mean, var = a[:5]
    scale, bias = _tensor_arg(m, n, scale, 1), _tensor_arg(m, n, bias, 2)
    mean, var = _tensor_arg(m, n, mean, 3), _tensor_arg(m, n, var, 4)
    eps = float(n.attrs.get("epsilon", 1e-5))
    keep = float(n.attrs.get("momentum", 0.9))  # ONNX weighs the running value; PyTorch the batch's
    shape = tuple(x.shape)
    if x.ndim == 3 or x.ndim > 4:  # (N, C, ...) normalises per channel over all else, as a 4-D (N, C, P, 1)
        x = x.reshape(shape[0], shape[1], math.prod(shape[2:]), 1)
    if not m.training:
        return [F.batch_norm(x, mean, var, scale, bias, training=False, eps=eps).reshape(shape), mean, var]
    if n.inputs[3] not in m._buffers:
        mean = _copy(mean)
    if n.inputs[4] not in m._buffers:
        var = _copy(var)
    before = _copy(var)
    y = F.batch_norm(x, mean, var, scale, bias, training=True, momentum=1.0 - keep, eps=eps)
    count = x.size // x.shape[1]
    with autograd.no_grad():
        var.copy_from(ops.Axpby.apply(var, before, alpha=(count - 1) / count, beta=keep / count))
    return [y.reshape(shape), mean, var]


def _transposed2d(m, x):
    """x (R, C) transposed, for a computed 2-D x: linear(I_C, x) = I_C x^T, with x's gradient through the product
    (clnet has no transpose kernel for computed matrices)."""
    eye = m.device_constant(("eye", x.shape[1]), np.eye(x.shape[1], dtype=np.float32))
    return F.linear(eye, x)


def _d_gemm(m, n, a):
    """Y = alpha op(A) op(B) + beta C. F.linear computes x w^T, so a B read as (in, out) (transB=0) is transposed
    first: a file's weight once, at load (held as (out, in)); a constant once, on upload; a computed B each call."""
    x, w = a[0], a[1]
    c = a[2] if len(a) > 2 else None
    at = n.attrs
    x = _tensor_arg(m, n, x, 0)
    if at.get("transA", 0):
        x = _transposed2d(m, x)
    if _is_host(w):
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w if at.get("transB", 0) else w.T))
    elif not at.get("transB", 0):
        w = _transposed2d(m, w)
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    N = w.shape[0]
    bias = None
    if c is not None:
        if tuple(c.shape) in ((N,), (1, N)) and beta == 1.0 and alpha == 1.0:
            bias = _tensor_arg(m, n, c, 2)
            bias = bias if bias.shape == (N,) else bias.reshape(N)
        elif beta != 1.0:
            c = c * beta
    y = F.linear(x, w, bias)
    if alpha != 1.0:
        y = ops.Affine.apply(y, alpha=alpha, beta=0.0)
    if c is not None and bias is None:
        y = _broadcast(m, n, "Add", y, c)
    return [y]


def _d_matmul(m, n, a):
    """ONNX's (NumPy's) matmul, where B is 1-D or 2-D: a weight of the file (held as (out, in), transB set at load), a
    constant, or a computed matrix; A computed of any rank, or a 2-D constant when B is computed."""
    x, w = a
    if _is_host(x):  # A constant, B computed: A B = (B^T A^T)^T
        return [_transposed2d(m, F.linear(_transposed2d(m, w), m.device_constant((n.name, 0), x)))]
    vector = x.ndim == 1
    if vector:
        x = x.reshape(1, x.shape[0])
    if w.ndim == 1:  # (K,): the product drops the last axis
        wt = m.device_constant((n.name, 1), w.reshape(1, -1)) if _is_host(w) else w.reshape(1, w.shape[0])
        y = F.linear(x, wt)
        return [y.reshape(y.shape[:-1]) if not vector else y.reshape(())]
    if _is_host(w):
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w.T))
    elif not n.attrs.get("transB", 0):
        w = _transposed2d(m, w)
    y = F.linear(x, w)
    return [y.reshape(y.shape[1:]) if vector else y]


# Per-channel operands of Add, Sub, Mul, Div run as an evaluation-mode batch norm with mean 0, variance 1 and eps 0
# (y = x * weight + bias exactly): one elementwise pass with the gradients of x, weight and bias.

def _as_channels(m, n, v, C, key, transform=None):
    if _is_host(v):
        arr = v.reshape(C).astype(np.float32)
        return m.device_constant((n.name, key), transform(arr) if transform else arr)
    t = v.reshape(C)
    if transform is not None:
        t = transform(t)
    return t


def _per_channel(m, C, weight, bias, x):
    zeros = m.device_constant(("zeros", C), np.zeros(C, np.float32))
    ones = m.device_constant(("ones", C), np.ones(C, np.float32))
    return ops.BatchNormEval.apply(x, weight, bias, zeros, ones, eps=0.0)


def _dim_eq(x, y):
    """Whether two dimensions are equal: True or False where known, None where one is unknown at load (a free
    dimension's name, or None)."""
    if isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer)):
        return int(x) == int(y)
    if isinstance(x, str) and x == y:
        return True
    return None


def _all3(values):
    """False if any is False, else None if any is unknown (None), else True."""
    values = list(values)
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _fits(small, big):
    """Whether shape `small` broadcasts to exactly shape `big` (three-valued, as _dim_eq)."""
    if len(small) > len(big):
        return False
    full = (1,) * (len(big) - len(small)) + tuple(small)
    return _all3(True if s == 1 else _dim_eq(s, b) for s, b in zip(full, big))


def _channel_of(small, big):
    """Whether `small` broadcasts to `big` as a per-channel vector: (1, C, 1, ...) against a 4-D (N, C, H, W), or
    (C,) / (1, C) against (N, C) (three-valued)."""
    if len(big) not in (2, 4) or len(small) > len(big):
        return False
    full = (1,) * (len(big) - len(small)) + tuple(small)
    return _all3([_dim_eq(full[1], big[1])] + [_dim_eq(s, 1) for i, s in enumerate(full) if i != 1])


def _binary_plan(op, a_dev, a_shape, b_dev, b_shape):
    """How clnet runs `a op b` (Add, Sub, Mul, Div) under ONNX's broadcasting, from which operands are computed (on
    the device) and their shapes. Returns (plan, swapped): plan "host" (NumPy), "same" (equal shapes), "scalar" (a
    constant of one element) or "channel" (a per-channel vector), swapped when b sets the result's shape; None where
    load cannot tell (an unknown dimension: the call decides). Raises ValueError with what clnet lacks."""
    if not a_dev and not b_dev:
        return "host", False
    if a_shape is None or b_shape is None:
        return None
    shapes = f"shapes {tuple(a_shape)} and {tuple(b_shape)}"
    candidates = []
    for big_dev, big, small, swapped in ((a_dev, a_shape, b_shape, False), (b_dev, b_shape, a_shape, True)):
        if big_dev:
            candidates.append((_fits(small, big), swapped, big, small))
    fit = next((c for c in candidates if c[0]), None)
    if fit is None:
        if any(c[0] is None for c in candidates):
            return None
        raise ValueError(f"{op} of {shapes}: clnet broadcasts a scalar, a per-channel vector or a tensor of the "
                         "same shape against a computed tensor; this broadcast needs general broadcasting")
    known, swapped, big, small = fit
    small_dev = a_dev if swapped else b_dev
    if known is None:
        return None
    if _all3(_dim_eq(s, b) for s, b in zip(small, big)) and len(small) == len(big):
        if op == "Div" and (swapped or small_dev):
            raise ValueError(f"Div of {shapes} with a computed divisor: clnet has no elementwise division of "
                             "tensors (it divides by constants)")
        return "same", swapped
    if not small_dev and math.prod(s for s in small) == 1 and all(isinstance(s, (int, np.integer)) for s in small):
        if op == "Div" and swapped:
            raise ValueError(f"Div of {shapes}: clnet divides a computed tensor by a constant, not a constant by a "
                             "computed tensor")
        return "scalar", swapped
    channel = _channel_of(small, big)
    if channel is None:
        return None
    if op == "Div" and (swapped or small_dev):
        raise ValueError(f"Div of {shapes}: clnet divides a computed tensor by constants, not by a computed tensor "
                         "nor a constant by a computed tensor")
    if channel:
        return "channel", swapped
    if not small_dev:  # a constant broadcast on the host to the result's shape
        return "expand", swapped
    first, last = _block(small, len(big))
    block = _all3(_dim_eq(s, b) for s, b in zip(((1,) * (len(big) - len(small)) + tuple(small))[first:last],
                                                 big[first:last]))
    if block is None:
        return None
    if block:  # repeated along the axes before and after one block of its own: products with columns of ones
        return "expand", swapped
    raise ValueError(f"{op} of {shapes}: clnet repeats a computed tensor along the axes before and after one block "
                     "of its dimensions; this broadcast needs general broadcasting")


def _block(small, rank):
    """[first, last) of the axes where `small`, aligned to `rank` axes, is not 1 (a shape, its unknown dimensions
    counted as not 1)."""
    full = (1,) * (rank - len(small)) + tuple(small)
    inside = [i for i, s in enumerate(full) if s != 1]
    return (inside[0], inside[-1] + 1) if inside else (rank, rank)


def _expanded(m, n, small, shape, key):
    """`small` repeated to `shape` (ONNX's broadcasting): a constant on the host (uploaded once per shape); a
    computed tensor whose dimensions other than 1 form one block, as products with columns of ones (repeats after
    the block, then before it), so its gradient is the sum over the repeats."""
    shape = tuple(shape)
    if _is_host(small):
        wide = np.ascontiguousarray(np.broadcast_to(np.asarray(small, np.float32), shape))
        return m.device_constant((n.name, "expand", key, shape), wide)
    first, last = _block(small.shape, len(shape))
    K, T = small.size, math.prod(shape[last:])
    L = math.prod(shape) // (K * T)
    y = small.reshape(K, 1)
    if T > 1:  # each value repeated T times: (K, 1) (T, 1)^T
        y = F.linear(y, m.device_constant(("ones column", T), np.ones((T, 1), np.float32))).reshape(K * T, 1)
    if L > 1:  # the whole repeated L times: (L, 1) (K T, 1)^T
        y = F.linear(m.device_constant(("ones column", L), np.ones((L, 1), np.float32)), y)
    return y.reshape(shape)


def _broadcast(m, n, op, a, b):
    """a op b with ONNX's broadcasting, where clnet has a kernel for it (_binary_plan)."""
    a_dev, b_dev = isinstance(a, Tensor), isinstance(b, Tensor)
    plan, swapped = _binary_plan(op, a_dev, tuple(a.shape), b_dev, tuple(b.shape))
    if plan == "host":
        return HOST_OPS[op](m, n, [a, b])[0]
    big, small = (b, a) if swapped else (a, b)
    if plan == "same":
        if op == "Div":  # big / constant: times the constant's reciprocal
            return ops.product(big, m.device_constant((n.name, "1/"), 1.0 / small.astype(np.float64)))
        a, b = _tensor_arg(m, n, a, 0), _tensor_arg(m, n, b, 1)
        return a + b if op == "Add" else a - b if op == "Sub" else ops.product(a, b)
    if plan == "scalar":
        c = float(small.reshape(-1)[0])
        if op == "Add":
            return ops.Affine.apply(big, alpha=1.0, beta=c)
        if op == "Sub":
            return ops.Affine.apply(big, alpha=-1.0 if swapped else 1.0, beta=c if swapped else -c)
        if op == "Mul":
            return ops.Affine.apply(big, alpha=c, beta=0.0)
        return ops.Affine.apply(big, alpha=1.0 / c, beta=0.0)
    if plan == "expand":
        wide = _expanded(m, n, 1.0 / small.astype(np.float64) if op == "Div" else small, big.shape,
                         0 if swapped else 1)
        if op == "Add":
            return big + wide
        if op == "Sub":
            return wide - big if swapped else big - wide
        return ops.product(big, wide)
    C = big.shape[1]
    if op == "Add":
        return _per_channel(m, C, None, _as_channels(m, n, small, C, "bias"), big)
    if op == "Mul":
        return _per_channel(m, C, _as_channels(m, n, small, C, "weight"), None, big)
    if op == "Div":
        return _per_channel(m, C, _as_channels(m, n, small, C, "weight", lambda t: 1.0 / t), None, big)
    # Sub: big - small, or small - big
    if swapped:
        ones = m.device_constant(("-ones", C), -np.ones(C, np.float32))
        return _per_channel(m, C, ones, _as_channels(m, n, small, C, "bias"), big)
    neg = (lambda t: -t) if _is_host(small) else (lambda t: t * -1.0)
    return _per_channel(m, C, None, _as_channels(m, n, small, C, "-bias", neg), big)


def _d_binary(op):
    return lambda m, n, a: [_broadcast(m, n, op, a[0], a[1])]


def _activation(kind):
    return lambda m, n, a: [ops.Activation.apply(a[0], kind=kind)]


def _clip_bounds(m, n, a):
    if "min" in n.attrs or "max" in n.attrs:  # opset < 11
        return n.attrs.get("min"), n.attrs.get("max")
    lo = float(a[1].reshape(-1)[0]) if len(a) > 1 and a[1] is not None else None
    hi = float(a[2].reshape(-1)[0]) if len(a) > 2 and a[2] is not None else None
    return lo, hi


def _d_clip(m, n, a):
    x = a[0]
    if any(isinstance(v, Tensor) for v in a[1:3]):  # computed bounds: max(x, lo) = x + relu(lo - x), then
        y = x                                        # min(y, hi) = y - relu(y - hi) (min > max gives max, as ONNX)
        if len(a) > 1 and a[1] is not None:
            y = y + ops.Activation.apply(_expanded(m, n, a[1], x.shape, 1) - y, kind="relu")
        if len(a) > 2 and a[2] is not None:
            y = y - ops.Activation.apply(y - _expanded(m, n, a[2], x.shape, 2), kind="relu")
        return [y]
    lo, hi = _clip_bounds(m, n, a)
    if lo is None and hi is None:
        return [x]
    if lo == 0.0 and hi == 6.0:
        return [ops.Activation.apply(x, kind="relu6")]
    if hi is None:  # lo + relu(x - lo)
        return [ops.Affine.apply(ops.Activation.apply(ops.Affine.apply(x, alpha=1.0, beta=-lo), kind="relu"),
                                 alpha=1.0, beta=lo)]
    if lo is None:  # hi - relu(hi - x)
        return [ops.Affine.apply(ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=hi), kind="relu"),
                                 alpha=-1.0, beta=hi)]
    if hi <= lo:
        raise ValueError(f"Clip with min {lo} >= max {hi} is not supported")
    scale = 6.0 / (hi - lo)  # lo + relu6((x - lo) * scale) / scale
    inner = ops.Affine.apply(x, alpha=scale, beta=-lo * scale)
    return [ops.Affine.apply(ops.Activation.apply(inner, kind="relu6"), alpha=1.0 / scale, beta=lo)]


def _hard_sigmoid(x, alpha, beta):
    """max(0, min(1, alpha x + beta)) = relu6(6 alpha x + 6 beta) / 6."""
    inner = ops.Affine.apply(x, alpha=6.0 * alpha, beta=6.0 * beta)
    return ops.Affine.apply(ops.Activation.apply(inner, kind="relu6"), alpha=1.0 / 6.0, beta=0.0)


def _d_hard_sigmoid(m, n, a):
    return [_hard_sigmoid(a[0], float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5)))]


def _d_hard_swish(m, n, a):
    return [ops.product(a[0], _hard_sigmoid(a[0], 1.0 / 6.0, 0.5))]


def _d_leaky_relu(m, n, a):
    x, alpha = a[0], float(n.attrs.get("alpha", 0.01))  # relu(x) - alpha relu(-x)
    neg = ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=0.0), kind="relu")
    return [ops.Axpby.apply(ops.Activation.apply(x, kind="relu"), neg, alpha=1.0, beta=-alpha)]


def _d_lrn(m, n, a):
    at = n.attrs
    return [F.local_response_norm(a[0], int(at["size"]), float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)),
                                  float(at.get("bias", 1.0)))]


def _d_softmax(log):
    def run(m, n, a):
        x = a[0]
        default = -1 if m.opset >= 13 else 1
        axis = int(n.attrs.get("axis", default)) % x.ndim
        if m.opset < 13 and axis != x.ndim - 1:  # softmax over the flattened trailing dimensions
            y = ops.Softmax.apply(x.reshape(_flatten_shape(x.shape, axis)), dim=1, log=log)
            return [y.reshape(x.shape)]
        return [ops.Softmax.apply(x, dim=axis, log=log)]
    return run


def _d_dropout(m, n, a):
    x = a[0]
    ratio = n.attrs.get("ratio", 0.5)
    if len(a) > 1 and a[1] is not None:
        ratio = float(a[1].reshape(-1)[0])
    return [F.dropout(x, float(ratio), m.training), None]


def _reshape_shape(n, a):
    """The target shape: the input (opset 5 on), or the attribute `shape` (opsets 1 to 4)."""
    return a[1] if len(a) > 1 and a[1] is not None else np.asarray(n.attrs["shape"], np.int64)


def _d_reshape(m, n, a):
    x = a[0]
    return [x.reshape(_reshape_target(x.shape, _reshape_shape(n, a), n.attrs.get("allowzero", 0)))]


def _d_flatten(m, n, a):
    return [a[0].reshape(_flatten_shape(a[0].shape, n.attrs.get("axis", 1)))]


def _d_squeeze(m, n, a):
    return [a[0].reshape(_squeezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_unsqueeze(m, n, a):
    return [a[0].reshape(_unsqueezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_concat(m, n, a):
    xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
    return [ops.cat(xs, dim=int(n.attrs["axis"]) % xs[0].ndim)]


def _transpose_plan(perm, shape):
    """How clnet transposes a computed tensor: "view" (only axes of size 1 move: the memory order is unchanged), "2d"
    (a matrix: a product with the identity), "channels" (the batch axis stays first and the permuted axes precede
    unmoved trailing ones: a 1x1 convolution with a permutation matrix), "small" (the batch axis moves too, in a
    tensor whose moved axes are known and small: the same convolution over the whole tensor as one image). Unknown
    dimensions count as larger than 1 (a negative number at load). Raises ValueError otherwise."""
    moved = [p for p in perm if shape[p] != 1]
    if moved == sorted(moved):
        return "view"
    if len(perm) == 2:
        return "2d"
    j = len(perm)
    while j > 1 and perm[j - 1] == j - 1:
        j -= 1
    if perm[0] == 0 and j >= 3:
        return "channels"
    moved = shape[:j]
    if all(isinstance(d, (int, np.integer)) and d > 0 for d in moved) and math.prod(moved) <= _SMALL_PERMUTATION:
        return "small"
    raise ValueError(f"Transpose with perm {list(perm)} of shape {tuple(shape)}: clnet transposes matrices, axes "
                     "before unmoved trailing ones where the batch axis stays first (a channel shuffle), and "
                     f"tensors of known size whose moved axes hold at most {_SMALL_PERMUTATION} elements; this one "
                     "needs the tensor ops' general transpose")


_SMALL_PERMUTATION = 1024  # elements a permutation matrix may permute (a 4 MiB matrix)


def _d_transpose(m, n, a):
    x = a[0]
    perm = list(n.attrs["perm"]) if "perm" in n.attrs else list(range(x.ndim))[::-1]
    out_shape = tuple(x.shape[p] for p in perm)
    plan = _transpose_plan(perm, x.shape)
    if plan == "view":
        return [x.reshape(out_shape)]
    if plan == "2d":
        return [_transposed2d(m, x)]
    j = len(perm)
    while j > 1 and perm[j - 1] == j - 1:
        j -= 1
    # a permutation of the axes first..j-1 (first 1: the batch stays; 0: a small tensor, batch and all, as one image)
    # of a 1x1 convolution with a permutation matrix
    first = 1 if plan == "channels" else 0
    lead = x.shape[0] if first else 1
    C, P = math.prod(x.shape[first:j]), math.prod(x.shape[j:])
    key = ("perm", tuple(perm), x.shape[first:j])
    w = m._device_constants.get((key, id(m.device)))
    w = None if w is None else w[0]
    if w is None:
        source = np.arange(C).reshape(x.shape[first:j]).transpose([p - first for p in perm[first:j]]).reshape(-1)
        eye = np.zeros((C, C, 1, 1), np.float32)
        eye[np.arange(C), source, 0, 0] = 1.0
        w = m.device_constant(key, eye)
    x4 = x.reshape(lead, C, P, 1)
    s = conv_shape(n.name, x4.shape, w.shape, (1, 1), (0, 0), (0, 0), (1, 1), 1)
    y = ops.Conv2d.apply(x4, w, None, s=s, what=f"Transpose {n.name} (channel permutation)")
    return [y.reshape(out_shape)]


def _d_neg(m, n, a):
    return [ops.Affine.apply(a[0], alpha=-1.0, beta=0.0)]


def _d_abs(m, n, a):  # relu(x) + relu(-x)
    x = a[0]
    return [ops.Activation.apply(x, kind="relu") + ops.Activation.apply(ops.Affine.apply(x, alpha=-1.0, beta=0.0),
                                                                        kind="relu")]


def _d_variadic(op):
    """Sum, Max, Min, Mean of tensors of one shape (checked at load): max(a, b) = a + relu(b - a), min(a, b) =
    a - relu(a - b), each with its gradients through the ReLU (a tie sends the gradient to the earlier input)."""
    def run(m, n, a):
        xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
        y = xs[0]
        for t in xs[1:]:
            if op in ("Sum", "Mean"):
                y = y + t
            elif op == "Max":
                y = y + ops.Activation.apply(t - y, kind="relu")
            else:
                y = y - ops.Activation.apply(y - t, kind="relu")
        if op == "Mean" and len(xs) > 1:
            y = ops.Affine.apply(y, alpha=1.0 / len(xs), beta=0.0)
        return [y]
    return run


def _d_cast(m, n, a):
    if n.attrs["to"] != 1:
        raise ValueError("Cast of a computed tensor to a type other than float32 is not supported")
    return [a[0]]


DEVICE_OPS = {
    "Conv": _d_conv, "Gemm": _d_gemm, "MatMul": _d_matmul, "Add": _d_binary("Add"), "Sub": _d_binary("Sub"),
    "Mul": _d_binary("Mul"), "Div": _d_binary("Div"), "Relu": _activation("relu"), "Sigmoid": _activation("sigmoid"),
    "Tanh": _activation("tanh"), "Clip": _d_clip, "HardSigmoid": _d_hard_sigmoid, "HardSwish": _d_hard_swish,
    "LeakyRelu": _d_leaky_relu, "MaxPool": _pool_1d(_d_maxpool), "AveragePool": _pool_1d(_d_avgpool),
    "GlobalAveragePool": _d_global_avgpool, "GlobalMaxPool": _d_global_maxpool, "ReduceMean": _d_reduce("mean"),
    "ReduceSum": _d_reduce("sum"), "ReduceMax": _d_reduce("max"), "ReduceMin": _d_reduce("min"),
    "BatchNormalization": _d_batchnorm, "Sum": _d_variadic("Sum"),
    "Max": _d_variadic("Max"), "Min": _d_variadic("Min"), "Mean": _d_variadic("Mean"), "Neg": _d_neg, "Abs": _d_abs,
    "LRN": _d_lrn, "Concat": _d_concat, "Flatten": _d_flatten, "Reshape": _d_reshape, "Squeeze": _d_squeeze,
    "Unsqueeze": _d_unsqueeze, "Transpose": _d_transpose, "Softmax": _d_softmax(False),
    "LogSoftmax": _d_softmax(True), "Dropout": _d_dropout, "Identity": lambda m, n, a: [a[0]], "Cast": _d_cast,
}

# The inputs of each op that are trained (Parameters) or kept (buffers) when they are float initializers.
_PARAMETER_INPUTS = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "BatchNormalization": (1, 2),
                     "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1)}
_BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


def _dispatch(op):
    host, device = HOST_OPS.get(op), DEVICE_OPS.get(op)

    def run(m, n, a):
        if host is not None and all(v is None or _is_host(v) for v in a):
            return host(m, n, a)
        if op in ("Shape", "Size"):
            return host(m, n, a)
        if device is None:
            raise ValueError(f"{op} of a computed tensor is not supported (clnet evaluates it for constants and "
                             "shapes only)")
        return device(m, n, a)
    return run


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
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except Exception:
        itemsize = 8
    return math.prod(int(d) for d in t.dims) * itemsize


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
        from .devices import device as get_device
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
            rank = initializers[n.inputs[1]].ndim
            if rank > 2:
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}): clnet multiplies by "
                                      f"1-D or 2-D weights, {n.inputs[1]!r} has shape "
                                      f"{initializers[n.inputs[1]].shape}; batched products need the tensor ops")
            if rank == 2:
                transposed.add(n.inputs[1])
    for n in nodes:  # a transposed weight is read by MatMul/Gemm only
        for s, name in enumerate(n.inputs):
            if name in transposed and not (s == 1 and (n.op == "MatMul" or (n.op == "Gemm" and
                                                                          not n.attrs.get("transB", 0)))):
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}) reads the weight "
                                      f"{name!r} that a MatMul also reads; clnet cannot share it")

    constants = {k: v for k, v in initializers.items() if k not in roles}
    nodes = _fold_constants(path, nodes, constants, opset)
    _check_flow(path, nodes, opset, constants, {k: initializers[k].shape for k in roles}, inputs, shapes)
    for k in transposed:
        n = next(n for n in nodes if len(n.inputs) > 1 and n.inputs[1] == k)
        n.attrs = dict(n.attrs, transB=1)
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
    net.__dict__["fused"] = bool(fuse)
    net.train(training)
    if device is not None:
        net.to(device)
    return net


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


# ---- the command line's work ---------------------------------------------------------------------------------------

def run_file(model_path, input_path, output_path, device="auto"):
    """`clnet run`: the network of an ONNX file on the arrays of an .npy (one input) or .npz (inputs by graph input
    name, or in order) file, in eval mode; writes .npy (one output) or .npz (outputs by name). Returns the output
    arrays."""
    from .autograd import no_grad
    from .devices import device as get_device
    dev = get_device(device)
    net = load(model_path, device=dev).eval()
    data = np.load(input_path)
    if isinstance(data, np.ndarray):
        arrays = [data]
    else:
        keys = list(data.keys())
        arrays = [data[k] for k in (net.input_names if set(net.input_names) <= set(keys) else keys)]
    if len(arrays) != len(net.input_names):
        raise ValueError(f"{input_path}: {len(arrays)} arrays for the {len(net.input_names)} graph inputs "
                         f"({', '.join(net.input_names)})")
    with no_grad():
        out = net(*[_to_device(np.asarray(a, np.float32), dev) for a in arrays])
    outs = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    if len(outs) == 1 and not str(output_path).endswith(".npz"):
        np.save(output_path, outs[0])
    else:
        np.savez(output_path, **dict(zip(net.output_names, outs)))
    return outs


def input_shape(path):
    """The shape of an ONNX file's first graph input, None for a free dimension."""
    onnx = _onnx()
    _, model = _read(onnx, path)
    init = {t.name for t in model.graph.initializer}
    first = next(i for i in model.graph.input if i.name not in init)
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in first.type.tensor_type.shape.dim)


def onnxruntime_outputs(path, *arrays):
    """ONNX Runtime's (CPU) outputs for host arrays: the reference `--compare` checks against."""
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f"comparing with ONNX Runtime needs the onnxruntime package: {INSTALL_HINT}") from e
    sess = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(a, np.float32) for i, a in zip(sess.get_inputs(), arrays)}
    return sess.run(None, feeds)


def bench_setup(path, batch=None):
    """`clnet bench model.onnx`: (module, input shape, zoo model name or None). The batch is `batch`, else the file's
    (1 where it is free); the zoo name is that of the zoo model whose state_dict keys and shapes the file's
    initializers have (then PyTorch can rebuild the network, and `--compare` times it)."""
    from . import models
    net = load(path)
    shape = input_shape(path)
    if any(d is None for d in shape[1:]):
        raise OnnxImportError(f"{path}: the input's shape {shape} has free dimensions besides the batch; clnet "
                              "bench needs them fixed")
    in_shape = (batch or shape[0] or 1,) + tuple(shape[1:])
    ours = {k: tuple(v.shape) for k, v in net._state_items()}
    for k in net._transposed:
        ours[k] = ours[k][::-1]
    zoo = None
    for name in models.MODELS:
        theirs = {k: tuple(v.shape) for k, v in models.build(name)._state_items() if "num_batches" not in k}
        if theirs == ours:
            zoo = name
            break
    return net, in_shape, zoo


def onnxruntime_agreement(path, net, x):
    """The largest relative error of the module's output against ONNX Runtime's (CPU) on host input x, in the mode
    the file was exported in (batch statistics for a training-mode file, as ONNX Runtime computes it; the module's
    mode is restored)."""
    from .autograd import no_grad
    was = net.training
    net.train(net.exported_training)
    try:
        with no_grad():
            out = net(_to_device(np.asarray(x, np.float32), net.device))
    finally:
        net.train(was)
    ours = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    worst = 0.0
    for a, b in zip(ours, onnxruntime_outputs(path, x)):
        worst = max(worst, float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30)))
    return worst


__all__ = ["OnnxImportError", "OnnxModule", "OnnxOpsetWarning", "bench_setup", "export", "input_shape", "load",
           "onnxruntime_agreement",
           "onnxruntime_outputs", "run_file"]
