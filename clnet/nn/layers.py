"""Layers with the semantics, argument names, defaults and state_dict layouts of their PyTorch namesakes. Each stores
its configuration and parameters; its forward calls the op table (clnet/ops.py) through the checked geometry."""
import math
from collections import OrderedDict

import numpy as np

from .. import kernels, ops, rng, tuning
from ..shapes import check_image, conv_padding, conv_shape, pair, pool_geometry, pool_output
from ..tensor import Parameter, Tensor
from . import functional as F
from .module import Module


def _uniform(shape, bound):
    return rng.generator().uniform(-bound, bound, size=shape).astype(np.float32)


class Conv2d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True):
        super().__init__()
        name = f"Conv2d({in_channels}, {out_channels}, {kernel_size})"
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = pair(kernel_size, "kernel_size", name)
        self.stride = pair(stride, "stride", name)
        self.dilation = pair(dilation, "dilation", name)
        self.groups = int(groups)
        if min(self.kernel_size + self.stride + self.dilation) < 1 or self.in_channels < 1 or self.out_channels < 1:
            raise ValueError(f"{name}: sizes, stride and dilation must be positive")
        if self.groups < 1 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{name}: in_channels and out_channels must both be divisible by groups={groups}")
        self._pad_begin, self._pad_total = conv_padding(padding, self.kernel_size, self.stride, self.dilation, name)
        self.padding = padding if isinstance(padding, str) else pair(padding, "padding", name)
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)  # PyTorch: kaiming_uniform(a=sqrt(5)) and its bias rule
        self.weight = Parameter(_uniform((self.out_channels, fan_in // (kh * kw), kh, kw), bound))
        self.bias = Parameter(_uniform((self.out_channels,), bound)) if bias else None

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s

    def conv_shape(self, input_shape):
        """The ConvShape of this layer on an input of input_shape, kept by the input's and the weight's shapes (a
        training step asks once a pass; the module drops them when an attribute is set)."""
        d = self.__dict__
        key = (tuple(input_shape), d["_parameters"]["weight"].shape)
        shapes = d.get("_shapes")
        s = shapes.get(key) if shapes is not None else None
        if s is None:
            s = conv_shape(repr(self), input_shape, key[1], self.stride, self._pad_begin, self._pad_total,
                           self.dilation, self.groups)
            if shapes is None or len(shapes) >= 64:  # (a few input shapes a layer)
                shapes = d["_shapes"] = {}
            shapes[key] = s
        return s

    def output_shape(self, input_shape):
        s = self.conv_shape(input_shape)
        return (s.N, s.O, s.OH, s.OW)

    def forward(self, x, relu=False):
        """relu: a ReLU fused after the bias (nn.Sequential passes it for a ReLU that follows)."""
        return ops.Conv2d.apply(x, self.weight, self.bias, s=self.conv_shape(x.shape), what=repr(self), relu=relu)

    def forward_pooled(self, x, s, pool, relu):
        """This layer (of shape s on x), a ReLU (if relu) and the MaxPool2d pool as one op, whose pooling backward
        takes the bias gradient (ops.Conv2dMaxPool): nn.Sequential runs them so where ops.pool_takes_bias_grad
        holds."""
        return ops.Conv2dMaxPool.apply(x, self.weight, self.bias, s=s, what=repr(self),
                                       out_shape=pool.output_shape((s.N, s.O, s.OH, s.OW)), k=pool.kernel_size,
                                       st=pool.stride, p=pool.padding, relu=relu)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        if self.in_features < 1 or self.out_features < 1:
            raise ValueError(f"Linear({in_features}, {out_features}): sizes must be positive")
        bound = 1.0 / math.sqrt(self.in_features)
        self.weight = Parameter(_uniform((self.out_features, self.in_features), bound))
        self.bias = Parameter(_uniform((self.out_features,), bound)) if bias else None

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}" + \
            (", bias=False" if self.bias is None else "")

    def output_shape(self, input_shape):
        if len(input_shape) < 1 or input_shape[-1] != self.in_features:
            hint = " (add nn.Flatten() before it)" if len(input_shape) > 2 else ""
            raise ValueError(f"{self!r}: expected input of shape (*, {self.in_features}), got shape "
                             f"{tuple(input_shape)}{hint}")
        return tuple(input_shape[:-1]) + (self.out_features,)

    def forward(self, x, relu=False):
        """relu: a ReLU fused after the bias (nn.Sequential passes it for a ReLU that follows). Leading dimensions
        other than one batch dimension are folded into it and back (a view: no copy)."""
        out_shape = self.output_shape(x.shape)
        if x.ndim != 2:
            x = x.reshape(-1, self.in_features)
        y = ops.Linear.apply(x, self.weight, self.bias, what=repr(self), relu=relu)
        return y if y.shape == out_shape else y.reshape(out_shape)


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False):
        super().__init__()
        name = f"{type(self).__name__}({kernel_size})"
        self.kernel_size, self.stride, self.padding = pool_geometry(kernel_size, stride, padding, name)
        self.ceil_mode = bool(ceil_mode)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}")

    def output_shape(self, input_shape):
        return pool_output(repr(self), input_shape, self.kernel_size, self.stride, self.padding, self.ceil_mode)


class MaxPool2d(_Pool2d):
    def forward(self, x, relu=False):
        """relu: x is what a ReLU would get, applied here after the max (nn.Sequential asks for it)."""
        return ops.MaxPool2d.apply(x, out_shape=self.output_shape(x.shape), k=self.kernel_size, s=self.stride,
                                   p=self.padding, relu=relu)


class AvgPool2d(_Pool2d):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        return ops.AvgPool2d.apply(x, out_shape=self.output_shape(x.shape), k=self.kernel_size, s=self.stride,
                                   p=self.padding, count_include_pad=self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def extra_repr(self):
        return f"output_size={self.output_size}"

    def output_shape(self, input_shape):
        return tuple(input_shape[:2]) + F.adaptive_output_size(repr(self), input_shape, self.output_size)

    def forward(self, x):
        self.output_shape(x.shape)
        return F.adaptive_avg_pool2d(x, self.output_size)


class _Activation(Module):
    keeps_shape = True
    kind = None

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, x):
        return ops.Activation.apply(ops._float(repr(self), x), kind=self.kind)


class ReLU(_Activation):
    kind = "relu"


class ReLU6(_Activation):
    kind = "relu6"


class Sigmoid(_Activation):
    kind = "sigmoid"

    def __init__(self):
        super().__init__()


class Tanh(_Activation):
    kind = "tanh"

    def __init__(self):
        super().__init__()


class Identity(Module):
    keeps_shape = True

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def output_shape(self, input_shape):
        n = len(input_shape)
        s, e = self.start_dim % n, self.end_dim % n
        if s > e:
            raise ValueError(f"{self!r}: start_dim {self.start_dim} is after end_dim {self.end_dim} for shape "
                             f"{tuple(input_shape)}")
        return tuple(input_shape[:s]) + (int(np.prod(input_shape[s:e + 1])),) + tuple(input_shape[e + 1:])

    def forward(self, x):
        return x.reshape(self.output_shape(x.shape))


class Dropout(Module):
    keeps_shape = True

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class _SoftmaxBase(Module):
    log = False

    def __init__(self, dim=1):
        super().__init__()
        self.dim = dim

    def extra_repr(self):
        return f"dim={self.dim}"

    def output_shape(self, input_shape):
        if not -len(input_shape) <= self.dim < len(input_shape):
            raise ValueError(f"{self!r}: dim {self.dim} is out of range for input shape {tuple(input_shape)}")
        return tuple(input_shape)

    def forward(self, x):
        self.output_shape(x.shape)
        return ops.Softmax.apply(x, dim=self.dim % x.ndim, log=self.log)


class Softmax(_SoftmaxBase):
    log = False


class LogSoftmax(_SoftmaxBase):
    log = True


class BatchNorm2d(Module):
    """Batch normalisation over (N, H, W) per channel: batch statistics in training (running statistics updated
    with `momentum`, or as a cumulative average when it is None), the running ones in eval."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        if self.num_features < 1:
            raise ValueError(f"BatchNorm2d({num_features}): num_features must be positive")
        C = self.num_features
        self.weight = Parameter(np.ones(C, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(C, np.float32)) if affine else None
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor((C,), _host=np.zeros(C, np.float32)))
            self.register_buffer("running_var", Tensor((C,), _host=np.ones(C, np.float32)))
            # A count the host keeps (no launch per step to increment it); state_dict reads it like any buffer.
            count = Tensor((), np.int32, _host=np.zeros((), np.int32))
            count.stays_on_host = True
            self.register_buffer("num_batches_tracked", count)
            self._momentum_arg = kernels.Live(None)  # one per layer: its launches keep their argument sets
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")

    def output_shape(self, input_shape):
        check_image(repr(self), input_shape, self.num_features)
        return tuple(input_shape)

    def forward(self, x):
        self.output_shape(x.shape)
        return self._normalize(x)

    def _normalize(self, x):
        """x (N, C, H, W) or (N, C) normalised, the running statistics and the batch count updated in training."""
        momentum = 0.0 if self.momentum is None else self.momentum
        counting = self.training and self.track_running_stats
        if counting:
            momentum = self._momentum_arg

            def count():  # host state of a step: a replayed graph counts its batches too
                n = self.num_batches_tracked._host = self.num_batches_tracked._host + 1
                momentum.value = np.float32(1.0 / float(n) if self.momentum is None else self.momentum)
            kernels.per_step(count)
        try:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or self.running_mean is None, momentum, self.eps)
        except BaseException as e:  # a batch that did not run is not counted
            if counting:
                self.num_batches_tracked._host -= 1
            if isinstance(e, ValueError):
                raise ValueError(str(e).replace("batch_norm", repr(self), 1)) from None
            raise


class LocalResponseNorm(Module):
    keeps_shape = True

    def __init__(self, size, alpha=1e-4, beta=0.75, k=1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = int(size), float(alpha), float(beta), float(k)

    def extra_repr(self):
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"

    def forward(self, x):
        return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)


def _watched(*modules):
    """Whether a hook watches any of the modules (their run must then be their own: the benchmark's per-layer
    times)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


class Sequential(Module):
    """Modules applied in order. A ReLU right before a MaxPool2d runs inside the pooling, one right after a Conv2d or
    Linear inside that layer's kernels; a small Conv2d with a bias and the MaxPool2d after it (a ReLU between or not)
    run as one op on GPUs (Conv2d.forward_pooled); none of these where a hook watches, or where `fuse_relu` is False
    (on the class or on one instance)."""

    fuse_relu = True

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (dict, OrderedDict)):
            layers = list(layers[0].items())
        else:
            layers = [(str(i), m) for i, m in enumerate(layers)]
        for i, (name, layer) in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: item {i} is a {type(layer).__name__}, not a clnet module")
            self._modules[name] = layer

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*list(self._modules.values())[i])
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def output_shape(self, input_shape):
        shape = tuple(input_shape)
        for i, layer in enumerate(self):
            try:
                shape = layer.output_shape(shape)
            except ValueError as e:
                raise ValueError(f"layer {i}: {e}") from None
        return shape

    def add_module(self, name, module):
        self.__dict__.pop("_checked_input", None)
        super().add_module(name, module)

    def forward(self, x):
        d = self.__dict__
        shape = getattr(x, "shape", None)
        if shape is not None and d.get("_checked_input") != shape:  # once per input shape, not per step
            if all(m.keeps_shape or type(m).output_shape is not Module.output_shape for m in self.modules()):
                self.output_shape(shape)  # a misfit anywhere in the chain is named before any kernel runs
            d["_checked_input"] = shape
        layers, names = list(self._modules.values()), list(self._modules)
        i = 0
        while i < len(layers):
            pooled = self._pooled_conv(*(layers[i:i + 3] + [None, None])[:3], x)
            if pooled is not None:
                s, relu = pooled
                try:
                    x = layers[i].forward_pooled(x, s, layers[i + 1 + relu], relu)
                except ValueError as e:
                    raise ValueError(f"layer {names[i]}: {e}") from None
                i += 2 + relu
                continue
            fused = self._fused_relu(*(layers[i:i + 3] + [None, None])[:3])
            at = i + 1 if fused == "into the pooling" else i  # the layer that runs (a fused ReLU runs inside it)
            try:
                x = layers[at](x, relu=True) if fused else layers[at](x)
            except ValueError as e:  # say where in the chain the shapes stopped fitting
                raise ValueError(f"layer {names[at]}: {e}") from None
            i += 2 if fused else 1
        return x

    def _pooled_conv(self, layer, nxt, after, x):
        """(ConvShape of layer on x, whether a ReLU comes between) where layer (a Conv2d with a bias), maybe a ReLU, and
        a MaxPool2d run as one op (Conv2d.forward_pooled: ops.pool_takes_bias_grad holds, no hook watches); else
        None."""
        relu = type(nxt) is ReLU
        pool = after if relu else nxt
        if (not self.fuse_relu or type(layer) is not Conv2d or layer.bias is None or type(pool) is not MaxPool2d
                or _watched(layer, nxt, pool) or not isinstance(x, Tensor) or tuning.cpu_shaped(x.device)):
            return None  # (a CPU never fuses: no ConvShape made for it, which the layer would make again)
        s = layer.conv_shape(x.shape)
        return (s, relu) if ops.pool_takes_bias_grad(x.device, s) else None

    def _fused_relu(self, layer, nxt, after):
        """How a ReLU runs fused here: "into the pooling" when layer is a ReLU and nxt a MaxPool2d (ReLU commutes
        with the max, so the pooling applies it to its smaller output and takes its gradient in its own backward);
        "into the layer" when nxt is a ReLU that layer, a Conv2d or Linear, applies in its kernels' epilogue (unless
        a MaxPool2d after takes it); None otherwise, and wherever a hook watches (the benchmark's per-layer times)."""
        def bare(*ms):
            return not _watched(*ms)
        if not self.fuse_relu or nxt is None:
            return None
        if type(layer) is ReLU and type(nxt) is MaxPool2d and bare(layer, nxt):
            return "into the pooling"
        if type(layer) in (Conv2d, Linear) and type(nxt) is ReLU and bare(layer, nxt):
            if type(after) is MaxPool2d and bare(after):
                return None  # the pooling takes the ReLU
            return "into the layer"
        return None
