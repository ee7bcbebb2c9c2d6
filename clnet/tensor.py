"""The one class that owns device memory, its buffer pool, and every host<->device copy (counted)."""
import math

import numpy as np
import pyopencl as cl

from . import kernels
from .devices import device as _device

_stats = dict(host_to_device_bytes=0, host_to_device_count=0, device_to_host_bytes=0, device_to_host_count=0)


def transfer_stats():
    """Copies between host and device since the last reset: counts and bytes each way."""
    return dict(_stats)


def reset_transfer_stats():
    for k in _stats:
        _stats[k] = 0


class BufferPool:
    """Device buffers kept for reuse, keyed by rounded size, so a training loop allocates only in its first step."""

    def __init__(self, dev):
        self.device = dev
        self.free = {}
        self.allocated_bytes = 0

    @staticmethod
    def rounded(nbytes):
        # Round to 1/8 of the next power of two: at most 12.5% waste, few distinct sizes.
        nbytes = max(int(nbytes), 4)
        step = max(256, 1 << max(0, nbytes.bit_length() - 4))
        return -(-nbytes // step) * step

    def take(self, nbytes):
        size = self.rounded(nbytes)
        bucket = self.free.get(size)
        if bucket:
            return bucket.pop(), size
        try:
            buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
        except cl.Error:
            self.release_cached()
            try:
                buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
            except cl.Error as e:
                raise MemoryError(
                    f"clnet: cannot allocate {size / 2**20:.1f} MiB on {self.device.name} "
                    f"({self.allocated_bytes / 2**20:.1f} MiB already in use): use a smaller batch") from e
        self.allocated_bytes += size
        return buf, size

    def give(self, buf, size):
        self.free.setdefault(size, []).append(buf)

    def release_cached(self):
        kernels.forget_arguments()  # kept argument sets may name these buffers
        for bucket in self.free.values():
            for buf in bucket:
                self.allocated_bytes -= buf.size
                buf.release()
        self.free.clear()


_pools = {}


def pool(dev):
    if dev not in _pools:
        _pools[dev] = BufferPool(dev)
    return _pools[dev]


class _Storage:
    """A pooled buffer shared by a tensor and its reshaped views; back to the pool when the last one goes."""
    __slots__ = ("buffer", "size", "pool")

    def __init__(self, dev, nbytes):
        self.pool = pool(dev)
        self.buffer, self.size = self.pool.take(nbytes)

    def __del__(self):
        try:
            self.pool.give(self.buffer, self.size)
        except Exception:  # interpreter shutdown: the context goes anyway
            pass


class _Region:
    """A sub-buffer over part of another tensor's storage (which it keeps alive); never pooled itself."""
    __slots__ = ("buffer", "size", "parent")

    def __init__(self, parent, offset_bytes, nbytes):
        self.parent = parent
        self.buffer = parent.buffer.get_sub_region(offset_bytes, nbytes)
        self.size = nbytes


DTYPES = {np.dtype(np.float32), np.dtype(np.int32)}


class Tensor:
    """A float32 or int32 array in device memory.

    Attributes: ``shape``, ``dtype``, ``device``; ``numpy()`` is the way back to the host.  Integer tensors made from
    host data remember their value range, so a loss can check labels without reading them back.
    """

    def __init__(self, shape, dtype=np.float32, device=None, _storage=None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPES:
            raise TypeError(f"clnet tensors hold float32 or int32, not {self.dtype}")
        if math.prod(self.shape) >= 2**31:
            raise ValueError(f"clnet tensors hold fewer than 2**31 elements (kernels index with 32-bit integers); "
                             f"shape {self.shape} has {math.prod(self.shape)}: use a smaller batch")
        self.device = _device(device if device is not None else "auto")
        self.storage = _storage if _storage is not None else _Storage(self.device, self.nbytes)
        self.value_range = None

    @property
    def buffer(self):
        return self.storage.buffer

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def ndim(self):
        return len(self.shape)

    def reshape(self, *shape):
        """A view with another shape over the same device memory."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) == 1:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // max(known, 1)
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} to {tuple(shape)}")
        view = Tensor(shape, self.dtype, self.device, _storage=self.storage)
        view.value_range = self.value_range
        return view

    def region(self, offset, shape):
        """A tensor of `shape` over elements [offset, offset + size) of this one's memory, as an OpenCL sub-buffer:
        kernels see an ordinary buffer. offset * itemsize must be a multiple of `region_alignment(device)`."""
        view = Tensor(shape, self.dtype, self.device, _storage=_Region(self.storage, offset * self.dtype.itemsize,
                                                                      max(math.prod(shape), 1) * self.dtype.itemsize))
        return view

    def copy_from(self, other):
        """Device-to-device copy of a tensor of the same size (queued; no host memory involved)."""
        if other.size != self.size or other.dtype != self.dtype:
            raise ValueError(f"cannot copy a tensor of shape {other.shape} into one of shape {self.shape}")
        if self.size:
            cl.enqueue_copy(self.device.queue, self.buffer, other.buffer, byte_count=self.nbytes)
        return self

    def numpy(self):
        out = np.empty(self.shape, self.dtype)
        if out.size:
            cl.enqueue_copy(self.device.queue, out, self.buffer, is_blocking=True)
            _stats["device_to_host_bytes"] += out.nbytes
            _stats["device_to_host_count"] += 1
        return out

    def write(self, array, blocking=True):
        """Copy a host array of the same size into this tensor.

        With blocking=False the copy is only queued (pyopencl keeps the host array alive until it is done), so a
        feeder can upload the next batch while the device still computes the current one.
        """
        array = np.ascontiguousarray(array, dtype=self.dtype)
        if array.size != self.size:
            raise ValueError(f"cannot write an array of shape {array.shape} into a tensor of shape {self.shape}")
        if array.size:
            cl.enqueue_copy(self.device.queue, self.buffer, array, is_blocking=blocking)
            _stats["host_to_device_bytes"] += array.nbytes
            _stats["host_to_device_count"] += 1
        if self.dtype == np.int32 and array.size:
            self.value_range = (int(array.min()), int(array.max()))
        return self

    def item(self):
        if self.size != 1:
            raise ValueError(f"only a one-element tensor converts to a Python number, not shape {self.shape}")
        return self.numpy().reshape(()).item()

    def __float__(self):
        return float(self.item())

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={self.device.name!r})"


def tensor(data, device=None):
    """Copy host data to the device: floats become float32, integers int32."""
    if isinstance(data, Tensor):
        return data
    array = np.asarray(data)
    if array.dtype.kind in "iub":
        if array.size and (array.min() < -2**31 or array.max() >= 2**31):
            raise ValueError("integer data does not fit in int32")
        dtype = np.int32
    elif array.dtype.kind == "f":
        dtype = np.float32
    else:
        raise TypeError(f"clnet.tensor takes numeric data, not {array.dtype}")
    return Tensor(array.shape, dtype, device).write(array)


def region_alignment(dev):
    """Bytes a sub-buffer's start must be a multiple of on dev."""
    return max(dev.cl_device.mem_base_addr_align // 8, 4)


def empty(shape, device, dtype=np.float32):
    return Tensor(shape, dtype, device)
