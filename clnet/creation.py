"""Tensors made on the device with PyTorch's names and arguments: zeros, ones, full, empty, arange, linspace, eye,
rand, randn, randint and their *_like forms (cl_kernels/creation.cl; nothing is copied from the host).

`device` is anything clnet.device takes (default "auto"); `dtype` float32 (the default for floats), int32 (also
what int64 means: clnet's integer type) or bool. Random draws come from clnet's random stream (clnet.manual_seed
makes them repeatable), and inside a captured Graph each replay draws afresh, as an eager step would.
"""
import numpy as np

from . import kernels, rng
from .devices import device as _device
from .pointwise import BOOL, CL_TYPE, FLOAT, INT, _dtype
from .tensor import Tensor, empty as _empty, too_large


def _shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise ValueError(f"clnet: a tensor cannot have a negative size, got {shape}")
    return shape


def _new(what, shape, dtype, device):
    dev = _device(device if device is not None else "auto")
    n = int(np.prod(shape, dtype=np.int64))
    if n > kernels.INDEX_LIMIT:
        raise too_large(what, shape, "make it in parts")
    return _empty(shape, dev, dtype)


def _launch(t, name, defines, *args, what):
    if t.size:
        k = kernels.kernel(t.device, "creation.cl", name, defines)
        kernels.launch(t.device, k, (t.size,), kernels.ANY_GROUP, t, *args, what=what)
    return t


def _finish(t, requires_grad):
    if requires_grad:
        t.requires_grad_(True)
    return t


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """A tensor of `size` holding fill_value (its dtype: float32 for a float, int32 for an int, bool for a bool)."""
    if dtype is None:
        dtype = BOOL if isinstance(fill_value, (bool, np.bool_)) else (
            INT if isinstance(fill_value, (int, np.integer)) else FLOAT)
    dtype = _dtype(dtype)
    t = _new("full", tuple(size), dtype, device)
    if dtype == FLOAT:
        return _finish(_launch(t, "fill_value", dict(T="float"), float(fill_value), t.size, what="full"),
                       requires_grad)
    return _finish(_launch(t, "fill_value", dict(T=CL_TYPE[dtype], INT_VALUE=1), int(fill_value), t.size,
                           what="full"), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return full(_shape(size), 0, _dtype(FLOAT if dtype is None else dtype), device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return full(_shape(size), 1, _dtype(FLOAT if dtype is None else dtype), device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False):
    """A tensor whose contents are whatever its memory held (as torch.empty)."""
    return _finish(_new("empty", _shape(size), _dtype(FLOAT if dtype is None else dtype), device), requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """[start, end) in steps of `step` (arange(n) is 0 .. n-1); int32 when all three are integers, as PyTorch."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    integral = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    dtype = _dtype((INT if integral else FLOAT) if dtype is None else dtype)
    n = max(0, int(np.ceil((end - start) / step)))
    t = _new("arange", (n,), dtype, device)
    if dtype == INT and integral:
        return _launch(t, "arange_int", None, int(start), int(step), n, what="arange")
    return _finish(_launch(t, "arange_fwd", dict(T=CL_TYPE[dtype]), float(start), float(step), float(end), n,
                           what="arange"), requires_grad)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """`steps` evenly spaced values from start to end, both included."""
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"linspace: steps must be non-negative, got {steps}")
    t = _new("linspace", (steps,), _dtype(FLOAT if dtype is None else dtype), device)
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    return _finish(_launch(t, "arange_fwd", dict(T=CL_TYPE[t.dtype], LAST_EXACT=1), float(start), float(step),
                           float(end), steps, what="linspace"), requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    m = n if m is None else m
    t = _new("eye", (int(n), int(m)), _dtype(FLOAT if dtype is None else dtype), device)
    if t.size:
        k = kernels.kernel(t.device, "creation.cl", "eye_fwd", dict(T=CL_TYPE[t.dtype]))
        kernels.launch(t.device, k, (t.size,), kernels.ANY_GROUP, t, int(n), int(m), what="eye")
    return _finish(t, requires_grad)


def _seed():
    """A seed that a captured Graph draws again at each replay (as dropout's)."""
    seed = kernels.Live(None)

    def draw():
        seed.value = np.uint32(rng.generator().integers(0, 2**32))
    kernels.per_step(draw)
    return seed


def rand(*size, dtype=None, device=None, requires_grad=False):
    """Uniform draws in [0, 1)."""
    t = _new("rand", _shape(size), _dtype(FLOAT if dtype is None else dtype), device)
    if t.dtype != FLOAT:
        raise TypeError(f"rand: draws are float32, not {t.dtype}")
    return _finish(_launch(t, "rand_uniform", None, _seed(), 0.0, 1.0, t.size, what="rand"), requires_grad)


def randn(*size, dtype=None, device=None, requires_grad=False):
    """Standard normal draws."""
    t = _new("randn", _shape(size), _dtype(FLOAT if dtype is None else dtype), device)
    if t.dtype != FLOAT:
        raise TypeError(f"randn: draws are float32, not {t.dtype}")
    return _finish(_launch(t, "rand_normal", None, _seed(), 0.0, 1.0, t.size, what="randn"), requires_grad)


def randint(low, high=None, size=None, dtype=None, device=None):
    """Integers uniform in [low, high) (randint(high, size) draws from [0, high)), as torch.randint."""
    if size is None:
        raise ValueError("randint: give the size, e.g. randint(0, 10, (3, 4))")
    if high is None:
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be above low ({low})")
    t = _new("randint", tuple(size), _dtype(INT if dtype is None else dtype), device)
    if t.dtype != INT:
        raise TypeError(f"randint: draws are integers, not {t.dtype}")
    return _launch(t, "randint_fwd", None, _seed(), int(low), np.uint32(high - low), t.size, what="randint")


def _like(fn):
    def like(input, *args, dtype=None, device=None, requires_grad=False, **kwargs):
        if not isinstance(input, Tensor):
            raise TypeError(f"{fn.__name__}_like: expected a clnet tensor, got {type(input).__name__}")
        return fn(input.shape, *args, dtype=input.dtype if dtype is None else dtype,
                  device=input.device if device is None else device, requires_grad=requires_grad, **kwargs)
    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like, ones_like, empty_like, rand_like, randn_like = (_like(f) for f in (zeros, ones, empty, rand, randn))


def full_like(input, fill_value, dtype=None, device=None, requires_grad=False):
    return full(input.shape, fill_value, dtype=input.dtype if dtype is None else dtype,
                device=input.device if device is None else device, requires_grad=requires_grad)


__all__ = ["arange", "empty", "empty_like", "eye", "full", "full_like", "linspace", "ones", "ones_like", "rand",
           "rand_like", "randint", "randn", "randn_like", "zeros", "zeros_like"]
