"""clnet: a portable neural-network engine whose kernels are OpenCL C; every buffer stays on the device."""
from .devices import Device, DeviceNotFound, device, list_devices  # first: registers vendor OpenCL libraries
from .rng import manual_seed
from .tensor import Tensor, reset_transfer_stats, tensor, transfer_stats
from . import data, nn, optim  # noqa: E402
from .train import evaluate, fit  # noqa: E402
from .tune import autotune  # noqa: E402

from .version import __version__

__all__ = ["Device", "DeviceNotFound", "Tensor", "autotune", "data", "device", "evaluate", "fit", "list_devices",
           "manual_seed", "nn", "optim", "reset_transfer_stats", "tensor", "transfer_stats", "__version__"]
