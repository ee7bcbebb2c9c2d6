"""clnet: a portable neural-network engine whose kernels are OpenCL C; every buffer stays on the device."""
import numpy as _np

from .errors import Error
from .devices import Device, DeviceNotFound, device, list_devices  # registers vendor libraries at first use
from .rng import manual_seed
from .tensor import Parameter, Tensor, TooLarge, reset_transfer_stats, tensor, transfer_stats
from .autograd import is_grad_enabled, no_grad  # (installs Tensor.grad, backward and the hooks)
from .graph import CaptureError, Graph
from .kernels import OutOfMemory
from . import ops  # noqa: E402
from . import methods  # noqa: E402,F401  (installs Tensor's methods and operators)
from .creation import (arange, empty, empty_like, eye, full, full_like, linspace, ones, ones_like,  # noqa: E402
                       rand, rand_like, randint, randn, randn_like, zeros, zeros_like)
from .products import baddbmm, bmm, matmul, mm  # noqa: E402
from .pointwise import (abs, add, ceil, clamp, cos, div, erf, exp, floor, log, log1p, logical_not,  # noqa: E402
                        maximum, minimum, mul, neg, pow, reciprocal, relu, round, rsqrt, sigmoid, sign, sin, sqrt,
                        square, sub, tanh, where)
from .reduce import (amax, amin, argmax, argmin, cumsum, logsumexp, max, mean, min, norm, prod,  # noqa: E402
                     std, sum, var)
from .views import (cat, chunk, gather, index_select, narrow, permute, split, squeeze, stack,  # noqa: E402
                    transpose, unsqueeze)
from . import data, nn, optim  # noqa: E402
from .train import evaluate, fit  # noqa: E402
from .tune import autotune  # noqa: E402
from . import onnx  # noqa: E402  (clnet.onnx; the onnx package itself is imported only when a file is read or written)

from .version import __version__

# PyTorch's dtype names, as NumPy dtypes (what Tensor.dtype holds): clnet.float32, clnet.long, dtype=clnet.bool, ...
# An int64 (long) tensor is held as int32, clnet's integer type.
float32 = float = _np.dtype(_np.float32)
int32 = int = _np.dtype(_np.int32)
int64 = long = _np.dtype(_np.int64)
bool = _np.dtype(_np.bool_)  # noqa: A001  (torch.bool: the builtin is shadowed here only, not by `import *`)

__all__ = ["__version__", "abs", "add", "amax", "amin", "arange", "argmax", "argmin", "autotune", "baddbmm",
           "bmm", "CaptureError", "cat", "ceil", "chunk", "clamp", "cos", "cumsum", "data", "device",
           "Device", "DeviceNotFound", "div", "empty", "empty_like", "erf", "Error", "evaluate", "exp",
           "eye", "fit", "floor", "full", "full_like", "gather", "Graph", "index_select", "is_grad_enabled",
           "linspace", "list_devices", "log", "log1p", "logical_not", "logsumexp", "manual_seed", "matmul",
           "max", "maximum", "mean", "min", "minimum", "mm", "mul", "narrow", "neg", "nn", "no_grad",
           "norm", "ones", "ones_like", "onnx", "optim", "OutOfMemory", "Parameter", "permute", "pow",
           "prod", "rand", "rand_like", "randint", "randn", "randn_like", "reciprocal", "relu",
           "reset_transfer_stats", "round", "rsqrt", "sigmoid", "sign", "sin", "split", "sqrt", "square",
           "squeeze", "stack", "std", "sub", "sum", "tanh", "Tensor", "tensor", "TooLarge", "float32", "int32", "int64",
           "transfer_stats", "transpose", "unsqueeze", "var", "where", "zeros", "zeros_like"]
