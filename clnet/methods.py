"""Tensor's PyTorch methods and operators, installed from every op family in one place.

tensor.py holds the class that owns device memory and knows no op; each family (pointwise, reduce, views, matmul,
creation) lists the functions that are also Tensor methods in its TENSOR_METHODS, and this module binds them to Tensor
with the Python operators (`+`, `@`, `x[...]`, `<`, ...). In-place forms (`add_`, `mul_`, `clamp_`, ...) compute the
result and copy it over the tensor's memory; they are refused on a tensor that autograd would need (one that
requires a gradient while gradients are recorded), as PyTorch refuses them on leaves.
"""
import numpy as np

from . import autograd, pointwise, products, reduce, views
from .tensor import Tensor


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


def _in_place(name, compute):
    def method(self, *args, **kwargs):
        if self.requires_grad and autograd.is_grad_enabled():
            raise RuntimeError(f"{name}: an in-place op on a tensor that requires a gradient (shape {self.shape}) "
                               f"would lose the values autograd needs; use the out-of-place {name[:-1]} or run it "
                               "under clnet.no_grad()")
        with autograd.no_grad():
            out = compute(self, *args, **kwargs)
            if out.shape != self.shape:
                raise ValueError(f"{name}: the result has shape {out.shape}, the tensor {self.shape}; an in-place "
                                 "op cannot change the shape")
            if out.dtype != self.dtype:
                out = pointwise.cast(out, self.dtype)
            if out is not self:
                self.copy_from(out)
        return self
    method.__name__ = name
    return method


def _fill(self, value):
    from .creation import full
    return full(self.shape, value, dtype=self.dtype, device=self.device)


def _copy(self, src):
    if not isinstance(src, Tensor):
        from .tensor import tensor
        src = tensor(np.asarray(src), self.device)
    return pointwise.broadcast_to(src, self.shape) if src.shape != self.shape else src


_OPERATORS = {
    "__add__": pointwise.add, "__radd__": lambda a, b: pointwise.add(b, a),
    "__sub__": pointwise.sub, "__rsub__": lambda a, b: pointwise.sub(b, a),
    "__mul__": pointwise.mul, "__rmul__": lambda a, b: pointwise.mul(b, a),
    "__truediv__": pointwise.div, "__rtruediv__": lambda a, b: pointwise.div(b, a),
    "__floordiv__": lambda a, b: pointwise.binary("floor_divide", a, b),
    "__rfloordiv__": lambda a, b: pointwise.binary("floor_divide", b, a),
    "__mod__": lambda a, b: pointwise.binary("remainder", a, b),
    "__rmod__": lambda a, b: pointwise.binary("remainder", b, a),
    "__pow__": pointwise.pow, "__rpow__": lambda a, b: pointwise.pow(b, a),
    "__neg__": lambda a: pointwise.unary("neg", a) if a.dtype == np.float32 else pointwise.mul(a, -1),
    "__abs__": lambda a: pointwise.unary("abs", a),
    "__lt__": lambda a, b: pointwise.binary("lt", a, b), "__le__": lambda a, b: pointwise.binary("le", a, b),
    "__gt__": lambda a, b: pointwise.binary("gt", a, b), "__ge__": lambda a, b: pointwise.binary("ge", a, b),
    "__eq__": lambda a, b: pointwise.binary("eq", a, b), "__ne__": lambda a, b: pointwise.binary("ne", a, b),
    "__and__": lambda a, b: pointwise.binary("logical_and", a, b),
    "__or__": lambda a, b: pointwise.binary("logical_or", a, b),
    "__invert__": pointwise.logical_not,
    "__matmul__": products.matmul, "__rmatmul__": lambda a, b: products.matmul(b, a),
    "__getitem__": views.getitem, "__bool__": _bool, "__index__": _index,
    "__hash__": object.__hash__,  # tensors stay hashable by identity beside an element-wise ==, as PyTorch's
}

_IN_PLACE = {
    "add_": pointwise.add, "sub_": pointwise.sub, "mul_": pointwise.mul, "div_": pointwise.div,
    "pow_": pointwise.pow, "clamp_": pointwise.clamp, "clip_": pointwise.clamp,
    "masked_fill_": pointwise.masked_fill, "relu_": lambda x: pointwise.unary("relu", x),
    "fill_": _fill, "zero_": lambda x: _fill(x, 0), "copy_": _copy,
    "exp_": lambda x: pointwise.unary("exp", x), "sqrt_": lambda x: pointwise.unary("sqrt", x),
    "neg_": lambda x: pointwise.unary("neg", x), "abs_": lambda x: pointwise.unary("abs", x),
}


def install():
    for family in (pointwise, reduce, views, products):
        for name, fn in family.TENSOR_METHODS.items():
            setattr(Tensor, name, fn)
    for name, fn in _OPERATORS.items():
        setattr(Tensor, name, fn)
    for name, fn in _IN_PLACE.items():
        setattr(Tensor, name, _in_place(name, fn))
    Tensor.type_as = lambda self, other: pointwise.cast(self, other.dtype)
    Tensor.is_floating_point = lambda self: self.dtype == np.float32


install()
