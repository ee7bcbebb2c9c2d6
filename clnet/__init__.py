"""clnet: a portable neural-network engine whose kernels are OpenCL C; every buffer stays on the device."""
from .errors import Error
from .devices import Device, DeviceNotFound, device, list_devices  # registers vendor libraries at first use
from .rng import manual_seed
from .tensor import Parameter, Tensor, TooLarge, reset_transfer_stats, tensor, transfer_stats
from .autograd import is_grad_enabled, no_grad
from .graph import CaptureError, Graph
from .kernels import OutOfMemory
from . import ops  # noqa: E402
from . import methods  # noqa: E402,F401  (installs Tensor's methods and operators)
from .ops import cat  # noqa: E402
from . import data, nn, optim  # noqa: E402
from .train import evaluate, fit  # noqa: E402
from .tune import autotune  # noqa: E402
from . import onnx  # noqa: E402  (clnet.onnx; the onnx package itself is imported only when a file is read or written)

from .version import __version__

__all__ = ["CaptureError", "Device", "DeviceNotFound", "Error", "Graph", "OutOfMemory", "Parameter",
           "Tensor", "autotune", "cat", "data", "device", "evaluate", "fit", "is_grad_enabled",
           "list_devices", "manual_seed", "nn", "no_grad", "onnx", "optim", "reset_transfer_stats",
           "tensor", "TooLarge", "transfer_stats", "__version__"]
