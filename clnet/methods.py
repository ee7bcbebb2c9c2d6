"""Tensor's PyTorch methods and operators, installed from every op family in one place.

tensor.py holds the class that owns device memory and knows no op; each family (pointwise, reduce, views, matmul,
creation) lists the functions that are also Tensor methods in its TENSOR_METHODS, and this module binds them to Tensor
with the Python operators (`+`, `@`, `x[...]`, `<`, ...). In-place forms (`add_`, `mul_`, `clamp_`, ...) compute the
result and copy it over the tensor's memory; they are refused on a tensor that autograd would need (one that
requires a gradient while gradients are recorded), as PyTorch refuses them on leaves.
"""
import numpy as np

from . import autograd, ops, pointwise, products, reduce, views
from .creation import full
from .devices import Device
from .tensor import Tensor, note_in_place, tensor


def _reshape(self, *shape):
    """A tensor of another shape over the same device memory (differentiable)."""
    shape = self._resolve_shape(shape)
    if shape == self.shape:
        return self
    if self.requires_grad and autograd._enabled:
        return ops.Reshape.apply(self, shape=shape)
    return self._alias(shape)


def _bool(self):
    if self.size != 1:
        raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous: use .any() or .all() "
                           "(or compare one element)")
    return bool(self.item())


def _index(self):
    if self.size != 1 or self.dtype == np.float32:
        raise TypeError(f"only a one-element integer tensor converts to an index, not shape {self.shape} "
                        f"{self.dtype}")
    return int(self.item())


def _records(self, args):
    """Whether an op of self and args would be recorded by autograd: gradients are recorded, and self or a tensor
    argument requires one."""
    return autograd.is_grad_enabled() and (self.requires_grad or any(getattr(a, "requires_grad", False)
                                                                     for a in args))


# the dtypes an in-place result may be cast back to, as PyTorch's can_cast: never a float into int32 or bool, nor an
# int32 into bool
_CASTS = {(np.dtype(np.float32), np.dtype(np.int32)), (np.dtype(np.float32), np.dtype(np.bool_)),
          (np.dtype(np.int32), np.dtype(np.bool_))}


def _in_place(name, compute):
    def method(self, *args, **kwargs):
        views.refuse_write_to_copy(self, name)
        if _records(self, args):
            raise RuntimeError(f"{name}: an in-place op where autograd records (the tensor of shape {self.shape} or "
                               f"an operand requires a gradient) is not supported: the old values autograd needs "
                               f"would be lost, or the gradient dropped; use the out-of-place {name.rstrip('_=')} "
                               "or run it under clnet.no_grad()")
        with autograd.no_grad():
            out = compute(self, *args, **kwargs)
            if out.shape != self.shape:
                raise ValueError(f"{name}: the result has shape {out.shape}, the tensor {self.shape}; an in-place "
                                 "op cannot change the shape")
            if (out.dtype, self.dtype) in _CASTS:
                raise TypeError(f"{name}: the result is {out.dtype}, which cannot be cast back into the {self.dtype} "
                                f"tensor (shape {self.shape}) in place, as in PyTorch; use the out-of-place form")
            if out.dtype != self.dtype:
                out = pointwise.cast(out, self.dtype)
            if out is not self:
                self.copy_from(out)
        note_in_place(self)
        return self
    method.__name__ = name
    return method


def _augmented(symbol, compute):
    """x += y and the like, in place as PyTorch's: x's memory takes the result, and every reference to x (a
    hand-written update `p -= lr * p.grad` under no_grad) sees it. A leaf that requires a gradient is refused while
    gradients are recorded, as PyTorch refuses it; a computed tensor that requires one gets the result as a new
    tensor, recorded by autograd (the name rebound, as Python's fallback to `x = x + y` would), as does a tensor to
    which an operand that requires a gradient is added (`total += loss`), and so does a copy
    that stands for a view (Tensor.copy_for_view), which `x[i] += y` writes back through x's setitem."""
    in_place = _in_place(f"{symbol}=", compute)

    def method(self, other):
        if self.copy_for_view is not None:  # x[i] += y: Python's getitem, iadd, setitem; the setitem writes x
            return compute(self, other)
        if _records(self, (other,)):
            if self.requires_grad and self.grad_fn is None:
                raise RuntimeError(f"{symbol}=: a leaf tensor that requires a gradient (shape {self.shape}) cannot be "
                                   f"changed in place while gradients are recorded; update it under clnet.no_grad() "
                                   f"(as an optimizer does), or write x = x {symbol} y")
            return compute(self, other)  # recorded (`total += loss`: the gradient reaches the loss's inputs)
        return in_place(self, other)
    method.__name__ = {"+": "__iadd__", "-": "__isub__", "*": "__imul__", "/": "__itruediv__"}[symbol]
    return method


def _fill(self, value):
    return full(self.shape, value, dtype=self.dtype, device=self.device)


def _copy(self, src):
    if not isinstance(src, Tensor):
        src = tensor(np.asarray(src), self.device)
    return pointwise.broadcast_to(src, self.shape) if src.shape != self.shape else src


def _reflected(fn, name):
    def method(self, other):
        return fn(other, self)
    method.__name__ = method.__qualname__ = name
    return method


def _neg(self):
    return pointwise.unary("neg", self) if self.dtype == np.float32 else pointwise.mul(self, -1)


def _abs(self):
    return pointwise.unary("abs", self)


def _bitwise(op):
    """& | ^ as PyTorch's: bitwise on int32, logical on bool (the same on 0 and 1), refused on float32."""
    def method(a, b):
        return pointwise.binary(op, a, b)
    method.__name__ = op
    return method


def _invert(self):
    """~x as PyTorch's: logical not of a bool tensor, bitwise not (-x - 1) of an int32 one; refused on float32."""
    if self.dtype == np.bool_:
        return pointwise.logical_not(self)
    if self.dtype == np.int32:
        return pointwise.sub(-1, self)
    raise TypeError(f"'~': bitwise not of a float32 tensor (shape {self.shape}); it takes int32 or bool tensors (for "
                    "a mask, compare first: ~(x > 0), or use logical_not)")


def _floordiv(a, b):
    return pointwise.binary("floor_divide", a, b)


def _mod(a, b):
    return pointwise.binary("remainder", a, b)


_OPERATORS = {
    "__add__": pointwise.add, "__radd__": _reflected(pointwise.add, "__radd__"),
    "__sub__": pointwise.sub, "__rsub__": _reflected(pointwise.sub, "__rsub__"),
    "__mul__": pointwise.mul, "__rmul__": _reflected(pointwise.mul, "__rmul__"),
    "__truediv__": pointwise.div, "__rtruediv__": _reflected(pointwise.div, "__rtruediv__"),
    "__floordiv__": _floordiv, "__rfloordiv__": _reflected(_floordiv, "__rfloordiv__"),
    "__mod__": _mod, "__rmod__": _reflected(_mod, "__rmod__"),
    "__pow__": pointwise.pow, "__rpow__": _reflected(pointwise.pow, "__rpow__"),
    "__neg__": _neg, "__abs__": _abs,
    "__lt__": pointwise.TENSOR_METHODS["lt"], "__le__": pointwise.TENSOR_METHODS["le"],
    "__gt__": pointwise.TENSOR_METHODS["gt"], "__ge__": pointwise.TENSOR_METHODS["ge"],
    "__eq__": pointwise.TENSOR_METHODS["eq"], "__ne__": pointwise.TENSOR_METHODS["ne"],
    "__and__": _bitwise("bitwise_and"), "__rand__": _reflected(_bitwise("bitwise_and"), "__rand__"),
    "__or__": _bitwise("bitwise_or"), "__ror__": _reflected(_bitwise("bitwise_or"), "__ror__"),
    "__xor__": _bitwise("bitwise_xor"), "__rxor__": _reflected(_bitwise("bitwise_xor"), "__rxor__"),
    "__invert__": _invert,
    "__matmul__": products.matmul, "__rmatmul__": _reflected(products.matmul, "__rmatmul__"),
    "__getitem__": views.getitem, "__bool__": _bool, "__index__": _index,
    "__hash__": object.__hash__,  # tensors stay hashable by identity beside an element-wise ==, as PyTorch's
    "__iadd__": _augmented("+", pointwise.add), "__isub__": _augmented("-", pointwise.sub),
    "__imul__": _augmented("*", pointwise.mul), "__itruediv__": _augmented("/", pointwise.div),
}

def _zero(self):
    return _fill(self, 0)


_IN_PLACE = {
    "add_": pointwise.add, "sub_": pointwise.sub, "mul_": pointwise.mul, "div_": pointwise.div,
    "pow_": pointwise.pow, "clamp_": pointwise.clamp, "clip_": pointwise.clamp,
    "masked_fill_": pointwise.masked_fill, "relu_": pointwise.relu, "fill_": _fill, "zero_": _zero, "copy_": _copy,
    "exp_": pointwise.exp, "sqrt_": pointwise.sqrt, "neg_": _neg, "abs_": _abs,
}


_original_to = Tensor.to


def _to(self, *args, dtype=None, device=None):
    """x.to(device), x.to(dtype) or both, as torch.Tensor.to: self when nothing changes."""
    for a in args:
        if isinstance(a, (str, Device)) and not _is_dtype(a):
            device = a
        else:
            dtype = a
    out = self
    if dtype is not None:
        out = pointwise.cast(out, dtype)
    if device is not None:
        out = _original_to(out, device)
    return out


def _is_dtype(a):
    if isinstance(a, Device):
        return False
    try:
        np.dtype(a)
        return True
    except TypeError:
        return a in (bool, "bool")


def _clone(self):
    """A copy of self in new memory (differentiable, as torch.Tensor.clone)."""
    return pointwise.add(self, 0) if self.dtype == np.float32 else pointwise.cast(pointwise.add(self, 0), self.dtype)


def _tolist(self):
    return self.numpy().tolist()


def _triangle(lower):
    def method(self, diagonal=0):
        if self.ndim < 2:
            raise ValueError(f"{'tril' if lower else 'triu'}: expected a tensor of at least 2 dimensions, got shape "
                             f"{self.shape}")
        rows, cols = self.shape[-2:]
        keep = np.tri(rows, cols, diagonal, dtype=bool) if lower else ~np.tri(rows, cols, diagonal - 1, dtype=bool)
        mask = pointwise.constant_array(self.device, keep)
        return pointwise.where(mask, self, 0 if self.dtype != np.float32 else 0.0)
    method.__name__ = "tril" if lower else "triu"
    method.__doc__ = (f"The {'lower' if lower else 'upper'} triangle of the last two dimensions (the rest zero), "
                      "as torch.tril/triu.")
    return method


def _transposed(self):
    if self.ndim > 2:
        raise ValueError(f"x.T: expects a tensor of at most 2 dimensions, got shape {self.shape}; use "
                         "x.permute(...) or x.mT")
    return views.t(self)


def _matrix_transposed(self):
    return views.transpose(self, -2, -1)


def install():
    for family in (pointwise, reduce, views, products):
        for name, fn in family.TENSOR_METHODS.items():
            setattr(Tensor, name, fn)
    for name, fn in _OPERATORS.items():
        setattr(Tensor, name, fn)
    for name, fn in _IN_PLACE.items():
        setattr(Tensor, name, _in_place(name, fn))
    Tensor.reshape = Tensor.view = _reshape
    Tensor.to, Tensor.clone, Tensor.tolist = _to, _clone, _tolist
    Tensor.tril, Tensor.triu = _triangle(True), _triangle(False)
    Tensor.T, Tensor.mT = property(_transposed), property(_matrix_transposed)
    Tensor.type_as = _type_as
    Tensor.is_floating_point = _is_floating_point


def _type_as(self, other):
    """self cast to other's dtype."""
    return pointwise.cast(self, other.dtype)


def _is_floating_point(self):
    return self.dtype == np.float32


install()
