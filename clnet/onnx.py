"""ONNX in and out: `load` turns an ONNX file into a clnet module that runs and trains on any OpenCL device, `export`
writes a clnet module (the zoo's included) as an ONNX file.

Import. The graph becomes an `OnnxModule` whose forward walks the file's nodes in order, calling nn.functional and
the op table, so autograd records it as it records any clnet network and `loss.backward()` trains it. Float
initializers that are weights (a convolution's or a Gemm's, batch norm's scale and bias, a tensor added or
multiplied in) become Parameters named by their initializer names, which PyTorch's exporters take from the
state_dict keys; batch norm's mean and variance become buffers. So `state_dict()` has the file's names and
`load_state_dict` takes a PyTorch state_dict. Nodes whose inputs are all constants are evaluated once at load;
Shape-driven subgraphs (`x.view(x.size(0), -1)`) run in NumPy on the host from the shapes of each call's tensors,
without a kernel or a copy, so a file exported at batch 1 also runs at batch 64. Batch normalization runs with the
batch's statistics in train() and the stored ones in eval(), as in PyTorch; the module starts in the mode the file
was exported in. With `fuse=True` (the default) an inference-mode batch norm that follows a convolution is folded
into the convolution's weights and bias at load.

Every node is checked at load, before any kernel runs: an operator outside the table below, or an attribute clnet
does not implement, raises `OnnxImportError` naming the operator type, the node and the opset. A damaged or
truncated file raises it naming the file.

Export. `export(model, path, example_input)` runs the model once in eval mode on the example with every op recorded
(autograd's Function.apply, wrapped for the duration), and writes each recorded op as its ONNX node; parameters and
buffers become initializers named by their state_dict keys, so the file loads back into the same names.

The `onnx` package is optional (`pip install 'clnet[onnx]'`); without it `load` and `export` say so.
"""
import math
import os

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


class OnnxImportError(Error, ValueError):
    """An ONNX file clnet cannot read or run: names the file, and the node, operator type and opset where one is at
    fault."""


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
        """A host constant as a tensor on this module's device, uploaded once."""
        dev = self.device
        k = (key, id(dev))
        t = self._device_constants.get(k)
        if t is None:
            t = self._device_constants[k] = _to_device(np.asarray(array, np.float32), dev)
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
            except OnnxImportError:
                raise
            except (ValueError, TypeError) as e:
                raise ValueError(f"{n.where(self)}: {e}") from None
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
    return [a[0].reshape(_reshape_target(a[0].shape, a[1], n.attrs.get("allowzero", 0)))]


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


HOST_OPS = {
    "Shape": _h_shape, "Gather": _h_gather, "Unsqueeze": _h_unsqueeze, "Squeeze": _h_squeeze, "Concat": _h_concat,
    "Cast": _h_cast, "Slice": _h_slice, "Constant": _h_constant, "ConstantOfShape": _h_constant_of_shape,
    "Reshape": _h_reshape, "Flatten": _h_flatten, "Transpose": _h_transpose, "Range": _h_range, "Where": _h_where,
    "Expand": _h_expand, "Identity": lambda m, n, a: [a[0]],
    "Add": _host_binary(np.add), "Sub": _host_binary(np.subtract), "Mul": _host_binary(np.multiply),
    "Div": _host_binary(np.divide), "Equal": _host_binary(np.equal), "Less": _host_binary(np.less),
    "Greater": _host_binary(np.greater), "Pow": _host_binary(np.power), "Min": _host_binary(np.minimum),
    "Max": _host_binary(np.maximum),
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


def _d_conv(m, n, a):
    x, w, b = a[0], a[1], (a[2] if len(a) > 2 else None)
    w, b = _tensor_arg(m, n, w, 1), (None if b is None else _tensor_arg(m, n, b, 2))
    at = n.attrs
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


def _pool_window(m, n, x):
    at = n.attrs
    k = tuple(at["kernel_shape"])
    s = tuple(at.get("strides", (1, 1)))
    begin, total = _padding(at, x.shape[2:], k, s, (1, 1))
    if any(2 * b != t for b, t in zip(begin, total)):
        raise ValueError(f"clnet pools with the same padding at both ends, got pads begin {begin}, total {total}")
    return k, s, begin


def _d_maxpool(m, n, a):
    x = a[0]
    k, s, p = _pool_window(m, n, x)
    return [F.max_pool2d(x, k, s, p, ceil_mode=bool(n.attrs.get("ceil_mode", 0)))]


def _d_avgpool(m, n, a):
    x = a[0]
    k, s, p = _pool_window(m, n, x)
    return [F.avg_pool2d(x, k, s, p, ceil_mode=bool(n.attrs.get("ceil_mode", 0)),
                         count_include_pad=bool(n.attrs.get("count_include_pad", 0)))]


def _d_global_avgpool(m, n, a):
    x = a[0]
    if x.ndim != 4:
        raise ValueError(f"GlobalAveragePool: clnet pools 4-D inputs, got shape {x.shape}")
    if x.shape[2:] == (1, 1):
        return [x]
    return [ops.AvgPool2d.apply(x, out_shape=x.shape[:2] + (1, 1), k=x.shape[2:], s=x.shape[2:], p=(0, 0),
                                count_include_pad=True)]


def _d_reduce_mean(m, n, a):
    x = a[0]
    axes = _axes(m, n, a, 1)
    axes = None if axes is None else sorted(ax % x.ndim for ax in axes)
    if x.ndim != 4 or axes != [2, 3]:
        raise ValueError(f"clnet runs ReduceMean over H and W of a 4-D tensor (axes [2, 3]), got axes {axes} of "
                         f"shape {x.shape}")
    y = _d_global_avgpool(m, n, [x])[0]
    return [y if n.attrs.get("keepdims", 1) else y.reshape(x.shape[:2])]


def _d_batchnorm(m, n, a):
    x, scale, bias, mean, var = a[:5]
    scale, bias = _tensor_arg(m, n, scale, 1), _tensor_arg(m, n, bias, 2)
    mean, var = _tensor_arg(m, n, mean, 3), _tensor_arg(m, n, var, 4)
    eps = float(n.attrs.get("epsilon", 1e-5))
    momentum = 1.0 - float(n.attrs.get("momentum", 0.9))  # ONNX weighs the running value; PyTorch the batch's
    y = F.batch_norm(x, mean, var, scale, bias, training=m.training, momentum=momentum, eps=eps)
    return [y, mean, var]


def _d_gemm(m, n, a):
    x, w = a[0], a[1]
    c = a[2] if len(a) > 2 else None
    at = n.attrs
    if _is_host(x) or x.ndim != 2:
        raise ValueError(f"Gemm needs a 2-D computed input A, got {getattr(x, 'shape', x)}")
    if _is_host(w) and not at.get("transB", 0):  # a constant (in, out) matrix that is not a parameter
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w.T))
    elif not isinstance(w, Tensor):
        raise ValueError("Gemm: clnet multiplies by a weight matrix B from the file, not a computed one")
    else:
        w = _tensor_arg(m, n, w, 1)
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    bias = None
    if c is not None:
        if c.size == w.shape[0] and beta == 1.0:
            bias = _tensor_arg(m, n, c, 2)
            bias = bias if bias.shape == (w.shape[0],) else bias.reshape(w.shape[0])
        elif beta != 1.0:
            c = c * beta
    y = F.linear(x, w, bias if alpha == 1.0 else None)
    if alpha != 1.0:
        y = y * alpha
        if bias is not None:
            y = _broadcast(m, n, "Add", y, bias)
    if c is not None and bias is None:
        y = _broadcast(m, n, "Add", y, c)
    return [y]


def _d_matmul(m, n, a):
    x, w = a
    if not isinstance(x, Tensor) or _is_host(x):
        raise ValueError("MatMul: clnet needs the left operand computed and the right one a weight of the file")
    if _is_host(w):
        w = m.device_constant((n.name, 1), np.ascontiguousarray(w.T))
    elif w.grad_fn is not None or w.ndim != 2:
        raise ValueError("MatMul: clnet multiplies by a 2-D weight from the file, not by a computed tensor")
    return [F.linear(x, w)]


# Per-channel operands of Add, Sub, Mul, Div run as an evaluation-mode batch norm with mean 0, variance 1 and eps 0
# (y = x * weight + bias exactly): one elementwise pass with the gradients of x, weight and bias.

def _channel_vector(shape, target):
    """The channel count C when `shape` broadcasts to `target` as (1, C, 1, ...) (or (C,) against (N, C)), else
    None."""
    if len(target) not in (2, 4) or len(shape) > len(target):
        return None
    full = (1,) * (len(target) - len(shape)) + tuple(shape)
    C = target[1]
    if full[1] == C and all(s == 1 for i, s in enumerate(full) if i != 1):
        return C
    return None


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


def _broadcast(m, n, op, a, b):
    """a op b with ONNX's broadcasting, where clnet has a kernel for it: equal shapes, a scalar, or a per-channel
    vector."""
    a_dev, b_dev = isinstance(a, Tensor), isinstance(b, Tensor)
    if not a_dev and not b_dev:
        return HOST_OPS[op](m, n, [a, b])[0]
    if a_dev and b_dev and a.shape == b.shape:
        if op == "Add":
            return a + b
        if op == "Sub":
            return a - b
        if op == "Mul":
            return ops.product(a, b)
        raise ValueError(f"Div of two computed tensors of shape {a.shape} is not supported by clnet")
    # one operand sets the shape; the other is a scalar or a per-channel vector
    big, small, swapped = (a, b, False) if a_dev and (not b_dev or a.size >= b.size) else (b, a, True)
    if _is_host(small) and small.size == 1 and op != "Div" or (op == "Div" and not swapped and _is_host(small)
                                                               and small.size == 1):
        c = float(small.reshape(-1)[0])
        if op == "Add":
            return ops.Affine.apply(big, alpha=1.0, beta=c)
        if op == "Sub":
            return ops.Affine.apply(big, alpha=-1.0 if swapped else 1.0, beta=c if swapped else -c)
        if op == "Mul":
            return ops.Affine.apply(big, alpha=c, beta=0.0)
        return ops.Affine.apply(big, alpha=1.0 / c, beta=0.0)
    C = _channel_vector(small.shape, big.shape)
    if C is None or (op == "Div" and (swapped or not _is_host(small))):
        raise ValueError(f"{op} of shapes {tuple(a.shape)} and {tuple(b.shape)}: clnet broadcasts a scalar or a "
                         "per-channel vector (1, C, 1, 1) against a tensor; other broadcasts are not supported")
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


def _d_reshape(m, n, a):
    x = a[0]
    if not _is_host(a[1]):
        raise ValueError("Reshape: the target shape must be computable on the host (a constant or from Shape)")
    return [x.reshape(_reshape_target(x.shape, a[1], n.attrs.get("allowzero", 0)))]


def _d_flatten(m, n, a):
    return [a[0].reshape(_flatten_shape(a[0].shape, n.attrs.get("axis", 1)))]


def _d_squeeze(m, n, a):
    return [a[0].reshape(_squeezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_unsqueeze(m, n, a):
    return [a[0].reshape(_unsqueezed_shape(a[0].shape, _axes(m, n, a, 1)))]


def _d_concat(m, n, a):
    xs = [_tensor_arg(m, n, v, i) for i, v in enumerate(a)]
    return [ops.cat(xs, dim=int(n.attrs["axis"]) % xs[0].ndim)]


def _d_transpose(m, n, a):
    x = a[0]
    perm = list(n.attrs["perm"]) if "perm" in n.attrs else list(range(x.ndim))[::-1]
    out_shape = tuple(x.shape[p] for p in perm)
    moved = [p for p in perm if x.shape[p] != 1]
    if moved == sorted(moved):  # only axes of size 1 move: the memory order is unchanged
        return [x.reshape(out_shape)]
    j = len(perm)
    while j > 1 and perm[j - 1] == j - 1:
        j -= 1
    if perm[0] != 0 or j < 3:
        raise ValueError(f"Transpose with perm {perm} of shape {x.shape}: clnet transposes where the batch axis "
                         "stays first and the permuted axes precede unmoved trailing ones (a channel shuffle)")
    # a permutation of the channel-like axes 1..j-1: a 1x1 convolution with a permutation matrix
    C, P = math.prod(x.shape[1:j]), math.prod(x.shape[j:])
    key = ("perm", tuple(perm), x.shape[1:j])
    w = m._device_constants.get((key, id(m.device)))
    if w is None:
        source = np.arange(C).reshape(x.shape[1:j]).transpose([p - 1 for p in perm[1:j]]).reshape(-1)
        eye = np.zeros((C, C, 1, 1), np.float32)
        eye[np.arange(C), source, 0, 0] = 1.0
        w = m.device_constant(key, eye)
    x4 = x.reshape(x.shape[0], C, P, 1)
    s = conv_shape(n.name, x4.shape, w.shape, (1, 1), (0, 0), (0, 0), (1, 1), 1)
    y = ops.Conv2d.apply(x4, w, None, s=s, what=f"Transpose {n.name} (channel permutation)")
    return [y.reshape(out_shape)]


def _d_cast(m, n, a):
    if n.attrs["to"] != 1:
        raise ValueError("Cast of a computed tensor to a type other than float32 is not supported")
    return [a[0]]


DEVICE_OPS = {
    "Conv": _d_conv, "Gemm": _d_gemm, "MatMul": _d_matmul, "Add": _d_binary("Add"), "Sub": _d_binary("Sub"),
    "Mul": _d_binary("Mul"), "Div": _d_binary("Div"), "Relu": _activation("relu"), "Sigmoid": _activation("sigmoid"),
    "Tanh": _activation("tanh"), "Clip": _d_clip, "HardSigmoid": _d_hard_sigmoid, "HardSwish": _d_hard_swish,
    "LeakyRelu": _d_leaky_relu, "MaxPool": _d_maxpool, "AveragePool": _d_avgpool,
    "GlobalAveragePool": _d_global_avgpool, "ReduceMean": _d_reduce_mean, "BatchNormalization": _d_batchnorm,
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
        if op == "Shape":
            return host(m, n, a)
        if device is None:
            raise ValueError(f"{op} of a computed tensor is not supported (clnet evaluates it for constants and "
                             "shapes only)")
        return device(m, n, a)
    return run


# ---- load ----------------------------------------------------------------------------------------------------------

def _read(onnx, path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"clnet.onnx.load: no such file: {path}")
    try:
        model = onnx.load(path)
    except Exception as e:  # a truncated or damaged protobuf
        raise OnnxImportError(f"{path}: not a readable ONNX file ({type(e).__name__}: {e}); the file may be "
                              "truncated or damaged: export it again") from None
    try:
        onnx.checker.check_model(path)  # from the file (C++), not a re-serialisation of the whole model
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{path}: not a valid ONNX model ({first}); the file may be truncated or damaged: "
                              "export it again") from None
    return path, model


def _check_node(m_where, n, opset, consumers, graph_outputs):
    """Refuses, at load, what the op handlers cannot run."""
    at, op = n.attrs, n.op
    where = f"ONNX node {n.name!r} ({op}, opset {opset})"

    def refuse(why):
        raise OnnxImportError(f"{m_where}: {where}: {why}")

    if op == "Conv":
        k = at.get("kernel_shape")
        if k is not None and len(k) != 2:
            refuse(f"clnet runs 2-D convolutions, this one has a {len(k)}-D kernel {k}")
    if op in ("MaxPool", "AveragePool"):
        if len(at.get("kernel_shape", ())) != 2:
            refuse(f"clnet pools over 2-D windows, this one has kernel_shape {at.get('kernel_shape')}")
        if any(d != 1 for d in at.get("dilations", (1, 1))):
            refuse(f"dilated pooling (dilations {at['dilations']}) is not supported")
        if op == "MaxPool" and len(n.outputs) > 1 and n.outputs[1] and (n.outputs[1] in consumers or
                                                                       n.outputs[1] in graph_outputs):
            refuse("the Indices output of MaxPool is not supported")
        pads = at.get("pads")
        if pads is not None and tuple(pads[:2]) != tuple(pads[2:]):
            refuse(f"clnet pools with equal padding at both ends, got pads {pads}")
    if op == "Gemm" and at.get("transA", 0):
        refuse("Gemm with transA=1 is not supported")
    if op == "LRN" and int(at.get("size", 1)) % 2 == 0:
        refuse(f"LRN of even size {at['size']}: ONNX centres an even window differently from clnet's (PyTorch's) "
               "local_response_norm")
    if op == "Dropout" and len(n.outputs) > 1 and n.outputs[1] and (n.outputs[1] in consumers or
                                                                   n.outputs[1] in graph_outputs):
        refuse("the mask output of Dropout is not supported")
    if op == "BatchNormalization" and at.get("spatial", 1) != 1:
        refuse("BatchNormalization with spatial=0 is not supported")


def load(path, device=None, fuse=True):
    """Read an ONNX file as a clnet module.

    Parameters
    ----------
    path : str or os.PathLike
        The ONNX file.
    device : clnet.Device or str, optional
        Where to place the weights now; otherwise the first call moves them to its input's device.
    fuse : bool
        Fold each inference-mode BatchNormalization that alone reads a convolution's output into that
        convolution's weights and bias (its initializers then leave the state_dict). False keeps every initializer.

    Returns
    -------
    OnnxModule
        In train() mode when the file's batch norms were exported in training mode, else in eval().
    """
    onnx = _onnx()
    path, model = _read(onnx, path)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise OnnxImportError(f"{path}: the model imports no version of the default ONNX operator set")
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
            if initializers[n.inputs[1]].ndim != 2:
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}): clnet multiplies by "
                                      f"2-D weights, {n.inputs[1]!r} has shape {initializers[n.inputs[1]].shape}")
            transposed.add(n.inputs[1])
    for n in nodes:  # a transposed weight is read by MatMul/Gemm only
        for s, name in enumerate(n.inputs):
            if name in transposed and not (s == 1 and (n.op == "MatMul" or (n.op == "Gemm" and
                                                                          not n.attrs.get("transB", 0)))):
                raise OnnxImportError(f"{path}: ONNX node {n.name!r} ({n.op}, opset {opset}) reads the weight "
                                      f"{name!r} that a MatMul also reads; clnet cannot share it")

    constants = {k: v for k, v in initializers.items() if k not in roles}
    nodes = _fold_constants(path, nodes, constants, opset)
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


__all__ = ["OnnxImportError", "OnnxModule", "bench_setup", "export", "input_shape", "load", "onnxruntime_agreement",
           "onnxruntime_outputs", "run_file"]
