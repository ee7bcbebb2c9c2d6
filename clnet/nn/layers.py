"""Layers with the semantics, argument names, defaults and state_dict layouts of their PyTorch namesakes."""
import math

import numpy as np

from .. import ops, rng
from ..ops import ConvShape
from .module import Module, Parameter


def _pair(v, name, layer):
    if isinstance(v, (tuple, list)):
        if len(v) != 2 or not all(isinstance(i, (int, np.integer)) for i in v):
            raise ValueError(f"{layer}: {name} must be an int or a pair of ints, got {v!r}")
        return int(v[0]), int(v[1])
    if not isinstance(v, (int, np.integer)):
        raise ValueError(f"{layer}: {name} must be an int or a pair of ints, got {v!r}")
    return int(v), int(v)


def _uniform(shape, bound):
    return rng.generator().uniform(-bound, bound, size=shape).astype(np.float32)


def _check_image(layer, shape, channels=None):
    if len(shape) != 4:
        raise ValueError(f"{layer!r}: expected input of shape (N, C, H, W), got shape {tuple(shape)}")
    if channels is not None and shape[1] != channels:
        raise ValueError(f"{layer!r}: expected input with {channels} channels, got shape {tuple(shape)}")


class Conv2d(Module):
    takes_relu = True  # forward(x, relu=True) applies a following ReLU in the matrix product's epilogue

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True):
        super().__init__()
        name = f"Conv2d({in_channels}, {out_channels}, {kernel_size})"
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size, "kernel_size", name)
        self.stride = _pair(stride, "stride", name)
        self.dilation = _pair(dilation, "dilation", name)
        self.groups = int(groups)
        if min(self.kernel_size + self.stride + self.dilation) < 1 or self.in_channels < 1 or self.out_channels < 1:
            raise ValueError(f"{name}: sizes, stride and dilation must be positive")
        if self.groups < 1 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{name}: in_channels and out_channels must both be divisible by groups={groups}")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding must be 'same', 'valid', an int or a pair, got {padding!r}")
            if padding == "same" and self.stride != (1, 1):
                raise ValueError(f"{name}: padding='same' needs stride 1 (as in PyTorch); give explicit padding")
            self.padding = padding
            total = [d * (k - 1) if padding == "same" else 0 for d, k in zip(self.dilation, self.kernel_size)]
            # PyTorch puts the odd pixel of 'same' padding at the bottom/right.
            self._pad_begin = (total[0] // 2, total[1] // 2)
            self._pad_total = tuple(total)
        else:
            self.padding = _pair(padding, "padding", name)
            if min(self.padding) < 0:
                raise ValueError(f"{name}: padding must be non-negative")
            self._pad_begin = self.padding
            self._pad_total = (2 * self.padding[0], 2 * self.padding[1])
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)  # PyTorch: kaiming_uniform(a=sqrt(5)) and its bias rule
        self._parameters["weight"] = Parameter(_uniform((self.out_channels, fan_in // (kh * kw), kh, kw), bound))
        if bias:
            self._parameters["bias"] = Parameter(_uniform((self.out_channels,), bound))
        self._saved = None

    @property
    def weight(self):
        return self._parameters["weight"]

    @property
    def bias(self):
        return self._parameters.get("bias")

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s

    def conv_shape(self, input_shape):
        _check_image(self, input_shape, self.in_channels)
        N, C, H, W = input_shape
        (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.stride, self.dilation
        span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
        if span_h > H + self._pad_total[0] or span_w > W + self._pad_total[1]:
            raise ValueError(f"{self!r}: the kernel ({span_h}x{span_w} with dilation) is larger than the padded input "
                             f"({H + self._pad_total[0]}x{W + self._pad_total[1]}) for input shape "
                             f"{tuple(input_shape)}; use a larger input, more padding or a smaller kernel")
        oh = (H + self._pad_total[0] - span_h) // sh + 1
        ow = (W + self._pad_total[1] - span_w) // sw + 1
        return ConvShape(N, C, H, W, self.out_channels, kh, kw, sh, sw, self._pad_begin[0], self._pad_begin[1],
                         dh, dw, self.groups, oh, ow)

    def output_shape(self, input_shape):
        s = self.conv_shape(input_shape)
        return (s.N, s.O, s.OH, s.OW)

    def forward(self, x, relu=False):
        s = self.conv_shape(x.shape)
        bias = self.bias.data if self.bias is not None else None
        y = ops.conv2d_forward(x, self.weight.data, bias, s, relu=relu, what=repr(self))
        self._saved = (x, y if relu else None, s)
        return y

    def backward(self, grad_output, input_grad=True):
        x, relu_y, s = self._saved if self._saved else (None, None, None)
        self._check_grad(grad_output, None if s is None else (s.N, s.O, s.OH, s.OW))
        if relu_y is not None:
            grad_output = ops.activation_backward("relu", relu_y, grad_output)
        db = self.bias.grad if self.bias is not None else None
        return ops.conv2d_backward(x, self.weight.data, grad_output, s, self.weight.grad, db, need_dx=input_grad,
                                   what=repr(self) + " backward")


class Linear(Module):
    takes_relu = True

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        if self.in_features < 1 or self.out_features < 1:
            raise ValueError(f"Linear({in_features}, {out_features}): sizes must be positive")
        bound = 1.0 / math.sqrt(self.in_features)
        self._parameters["weight"] = Parameter(_uniform((self.out_features, self.in_features), bound))
        if bias:
            self._parameters["bias"] = Parameter(_uniform((self.out_features,), bound))
        self._saved = None

    @property
    def weight(self):
        return self._parameters["weight"]

    @property
    def bias(self):
        return self._parameters.get("bias")

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def output_shape(self, input_shape):
        if len(input_shape) != 2 or input_shape[1] != self.in_features:
            hint = " (add nn.Flatten() before it)" if len(input_shape) > 2 else ""
            raise ValueError(f"{self!r}: expected input of shape (N, {self.in_features}), got shape "
                             f"{tuple(input_shape)}{hint}")
        return (input_shape[0], self.out_features)

    def forward(self, x, relu=False):
        bias = self.bias.data if self.bias is not None else None
        y = ops.linear_forward(x, self.weight.data, bias, relu=relu, what=repr(self))
        self._saved = (x, y if relu else None)
        return y

    def backward(self, grad_output, input_grad=True):
        x, relu_y = self._saved if self._saved else (None, None)
        self._check_grad(grad_output, None if x is None else (x.shape[0], self.out_features))
        if relu_y is not None:
            grad_output = ops.activation_backward("relu", relu_y, grad_output)
        db = self.bias.grad if self.bias is not None else None
        return ops.linear_backward(x, self.weight.data, grad_output, self.weight.grad, db, need_dx=input_grad,
                                   what=repr(self) + " backward")


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False):
        super().__init__()
        name = f"{type(self).__name__}({kernel_size})"
        self.kernel_size = _pair(kernel_size, "kernel_size", name)
        self.stride = _pair(stride if stride is not None else kernel_size, "stride", name)
        self.padding = _pair(padding, "padding", name)
        self.ceil_mode = bool(ceil_mode)
        if min(self.kernel_size + self.stride) < 1 or min(self.padding) < 0:
            raise ValueError(f"{name}: kernel_size and stride must be positive, padding non-negative")
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"{name}: padding {self.padding} must be at most half the kernel size (as in PyTorch)")
        self._saved = None

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}")

    def output_shape(self, input_shape):
        _check_image(self, input_shape)
        N, C, H, W = input_shape
        out = []
        for size, k, s, p in zip((H, W), self.kernel_size, self.stride, self.padding):
            if size + 2 * p < k:
                raise ValueError(f"{self!r}: the window ({k}) is larger than the padded input ({size + 2 * p}) for "
                                 f"input shape {tuple(input_shape)}; use a smaller window or more padding")
            span = size + 2 * p - k
            o = (-(-span // s) if self.ceil_mode else span // s) + 1
            if self.ceil_mode and (o - 1) * s >= size + p:  # the last window must start inside the input
                o -= 1
            out.append(o)
        return (N, C, out[0], out[1])


class MaxPool2d(_Pool2d):
    def forward(self, x):
        out = self.output_shape(x.shape)
        y, idx = ops.maxpool_forward(x, out[2:], self.kernel_size, self.stride, self.padding)
        self._saved = (x.shape, idx)
        return y

    def backward(self, grad_output, input_grad=True):
        x_shape, idx = self._saved if self._saved else (None, None)
        self._check_grad(grad_output, None if idx is None else idx.shape)
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return ops.maxpool_backward(grad_output, idx, x_shape, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        out = self.output_shape(x.shape)
        self._saved = (x.shape, out)
        return ops.avgpool_forward(x, out[2:], self.kernel_size, self.stride, self.padding, self.count_include_pad)

    def backward(self, grad_output, input_grad=True):
        x_shape, out = self._saved if self._saved else (None, None)
        self._check_grad(grad_output, out)
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return ops.avgpool_backward(grad_output, x_shape, self.kernel_size, self.stride, self.padding,
                                    self.count_include_pad)


class _Activation(Module):
    kind = None

    def __init__(self, inplace=False):
        super().__init__()
        self._y = None

    def forward(self, x):
        self._y = ops.activation_forward(self.kind, x)
        return self._y

    def backward(self, grad_output, input_grad=True):
        self._check_grad(grad_output, None if self._y is None else self._y.shape)
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return ops.activation_backward(self.kind, self._y, grad_output)


class ReLU(_Activation):
    kind = "relu"


class Sigmoid(_Activation):
    kind = "sigmoid"

    def __init__(self):
        super().__init__()


class Tanh(_Activation):
    kind = "tanh"

    def __init__(self):
        super().__init__()


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim
        self._in_shape = None

    def output_shape(self, input_shape):
        n = len(input_shape)
        s, e = self.start_dim % n, self.end_dim % n
        if s > e:
            raise ValueError(f"{self!r}: start_dim {self.start_dim} is after end_dim {self.end_dim} for shape "
                             f"{tuple(input_shape)}")
        return tuple(input_shape[:s]) + (int(np.prod(input_shape[s:e + 1])),) + tuple(input_shape[e + 1:])

    def forward(self, x):
        self._in_shape = x.shape
        return x.reshape(self.output_shape(x.shape))

    def backward(self, grad_output, input_grad=True):
        self._check_grad(grad_output, None if self._in_shape is None else self.output_shape(self._in_shape))
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return grad_output.reshape(self._in_shape)


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)
        self._mask = None
        self._shape = None

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        self._shape = x.shape
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        seed = int(rng.generator().integers(0, 2**32))
        y, self._mask = ops.dropout_forward(x, self.p, seed)
        return y

    def backward(self, grad_output, input_grad=True):
        self._check_grad(grad_output, self._shape)
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return grad_output if self._mask is None else ops.mul(grad_output, self._mask)


class _SoftmaxBase(Module):
    log = False

    def __init__(self, dim=1):
        super().__init__()
        self.dim = dim
        self._y = None

    def extra_repr(self):
        return f"dim={self.dim}"

    def output_shape(self, input_shape):
        if not -len(input_shape) <= self.dim < len(input_shape):
            raise ValueError(f"{self!r}: dim {self.dim} is out of range for input shape {tuple(input_shape)}")
        return tuple(input_shape)

    def forward(self, x):
        self._y = ops.softmax_forward(x, self.dim % x.ndim, self.log)
        return self._y

    def backward(self, grad_output, input_grad=True):
        self._check_grad(grad_output, None if self._y is None else self._y.shape)
        if not input_grad:
            return None  # the input gradient is all this layer computes
        return ops.softmax_backward(self._y, grad_output, self.dim % self._y.ndim, self.log)


class Softmax(_SoftmaxBase):
    log = False


class LogSoftmax(_SoftmaxBase):
    log = True
