"""The pointwise family: unary, binary (broadcasting), comparison and `where` ops, each one launch of a kernel of
cl_kernels/pointwise.cl whose formula its op number selects (one build per type combination serves every op).

One table each (UNARY, BINARY) describes the ops: the kernel's op number, whether the op is differentiable, its ONNX
name. Binary operands broadcast as NumPy's and PyTorch's do (any ranks, either operand computed or constant); a
broadcast operand's gradient is the output gradient's sum over the dimensions it was stretched along
(reduce.sum_to). Types promote as PyTorch's: bool < int32 < float32, a Python float makes an integer op float, and
comparisons give bool tensors. A Python number operand becomes a cached one-element constant on the device (made
outside any capture), so `x > 0.5` is one launch and replays unchanged.
"""
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from . import autograd, chain, kernels, layout, ops, reduce
from .autograd import Function
from .chain import BINARY_FWD, CAST, UNARY_BWD, UNARY_FWD, WHERE_FWD, ChainStep
from .chain import read_layout as _read
from .tensor import Tensor, empty, too_large

FLOAT, INT, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)
CL_TYPE = {FLOAT: "float", INT: "int", BOOL: "uchar"}
_RANK = {BOOL: 0, INT: 1, FLOAT: 2}


class UnaryOp(NamedTuple):
    number: int
    onnx: str = None
    params: int = 0         # scalar parameters p0, p1 the formula reads
    grad: bool = True       # its gradient is not zero everywhere (sign, floor: zero, recorded as PyTorch records)
    keeps_int: bool = False  # an int32 input gives an int32 output (else int inputs are promoted to float)
    onnx_attrs: tuple = ()  # ONNX's (attribute, default) that give p0, p1, in order


UNARY = {
    "neg": UnaryOp(1, "Neg"), "exp": UnaryOp(2, "Exp"), "log": UnaryOp(3, "Log"), "log1p": UnaryOp(4),
    "sqrt": UnaryOp(5, "Sqrt"), "rsqrt": UnaryOp(6), "abs": UnaryOp(7, "Abs"), "sign": UnaryOp(8, "Sign", grad=False),
    "erf": UnaryOp(9, "Erf"), "sin": UnaryOp(10, "Sin"), "cos": UnaryOp(11, "Cos"), "tanh": UnaryOp(12, "Tanh"),
    "sigmoid": UnaryOp(13, "Sigmoid"), "relu": UnaryOp(14, "Relu"), "gelu": UnaryOp(15),
    "gelu_tanh": UnaryOp(16), "silu": UnaryOp(17), "mish": UnaryOp(18, "Mish"),
    "hardswish": UnaryOp(19, "HardSwish"), "hardsigmoid": UnaryOp(20), "leaky_relu": UnaryOp(21, "LeakyRelu", 1, onnx_attrs=(("alpha", 0.01),)),
    "elu": UnaryOp(22, "Elu", 1, onnx_attrs=(("alpha", 1.0),)), "softplus": UnaryOp(23, "Softplus", 2), "clamp": UnaryOp(24, "Clip", 2),
    "pow_scalar": UnaryOp(25, None, 1), "rpow_scalar": UnaryOp(26, None, 1), "rdiv_scalar": UnaryOp(27, None, 1),
    "selu": UnaryOp(28, "Selu"), "celu": UnaryOp(29, "Celu", 1, onnx_attrs=(("alpha", 1.0),)), "relu6": UnaryOp(30),
    "floor": UnaryOp(31, "Floor", grad=False), "ceil": UnaryOp(32, "Ceil", grad=False),
    "round": UnaryOp(33, "Round", grad=False), "reciprocal": UnaryOp(34, "Reciprocal"),
    "hardtanh": UnaryOp(36, "Clip", 2),  # clamp's values, with a gradient of 0 at the bounds (clamp's passes there)
}


class BinaryOp(NamedTuple):
    number: int
    symbol: str
    onnx: str = None
    result: str = "promote"  # "promote" (PyTorch's type promotion), "float" (true division), "bool" (comparisons)
    grad: bool = True
    saves: bool = True       # backward reads the operands (add and sub only need the shapes)


BINARY = {
    "add": BinaryOp(1, "+", "Add", saves=False), "sub": BinaryOp(2, "-", "Sub", saves=False),
    "mul": BinaryOp(3, "*", "Mul"), "div": BinaryOp(4, "/", "Div", result="float"),
    "pow": BinaryOp(5, "**", "Pow"), "maximum": BinaryOp(6, "maximum", "Max"),
    "minimum": BinaryOp(7, "minimum", "Min"),
    "lt": BinaryOp(8, "<", "Less", "bool", False), "le": BinaryOp(9, "<=", "LessOrEqual", "bool", False),
    "gt": BinaryOp(10, ">", "Greater", "bool", False), "ge": BinaryOp(11, ">=", "GreaterOrEqual", "bool", False),
    "eq": BinaryOp(12, "==", "Equal", "bool", False), "ne": BinaryOp(13, "!=", None, "bool", False),
    "logical_and": BinaryOp(14, "&", "And", "bool", False), "logical_or": BinaryOp(15, "|", "Or", "bool", False),
    "floor_divide": BinaryOp(16, "//", None, grad=False), "remainder": BinaryOp(17, "%", "Mod"),
    "bitwise_and": BinaryOp(18, "&", None, grad=False), "bitwise_or": BinaryOp(19, "|", None, grad=False),
    "bitwise_xor": BinaryOp(20, "^", None, grad=False),
}


def _kernel(dev, name, defines):
    return kernels.kernel(dev, "pointwise.cl", name, defines)


def _launch(dev, k, n, *args, what, step=None):
    """One launch of n work-items, one an element (`step`: what it is as a chain step, chain.launch)."""
    if n > kernels.INDEX_LIMIT:
        raise too_large(what, (n,), "split the tensor into parts first")
    chain.launch(dev, k, (n,), args, what, step, n)


def _check(what, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a clnet tensor, got {type(x).__name__}; wrap host data with "
                        "clnet.tensor(array, device=...)")
    if x.storage is None:
        raise RuntimeError(f"{what}: a tensor of shape {x.shape} is not on a device yet; move it with .to(device)")
    return x


# ---- unary ---------------------------------------------------------------------------------------------------------

class Unary(Function):
    """y = f(x) for an op of UNARY; backward from the saved input."""
    __slots__ = ("op", "params")

    def forward(self, x, op, p0=0.0, p1=0.0):
        self.op, self.params = op, (float(p0), float(p1))
        spec = UNARY[op]
        out_dtype = x.dtype if spec.keeps_int else FLOAT
        y = empty(x.shape, x.device, out_dtype)
        if x.size:
            k = _kernel(x.device, "unary_fwd", dict(TA=CL_TYPE[x.dtype], TO=CL_TYPE[out_dtype]))
            _launch(x.device, k, x.size, x, y, x.size, spec.number, *self.params, what=op,
                    step=lambda: ChainStep(UNARY_FWD, spec.number, 1, ((0, None),), None, *self.params))
        self.save(x)
        return y

    def backward(self, dy):
        x, = self.saved
        dx = empty(x.shape, x.device)
        if x.size:
            k = _kernel(x.device, "unary_bwd", None)
            number = UNARY[self.op].number
            _launch(x.device, k, x.size, x, dy, dx, x.size, number, *self.params, what=self.op + " backward",
                    step=lambda: ChainStep(UNARY_BWD, number, 2, ((0, None), (1, None)), None, *self.params))
        return dx


def unary(op, x, p0=0.0, p1=0.0):
    """The UNARY op `op` of x (int32 and bool inputs are promoted to float, as PyTorch's math functions do, except
    for the ops PyTorch keeps integer, which an int32 input runs exactly in int32: _INT_FORMS)."""
    _check(op, x)
    if x.dtype == INT and op in _INT_FORMS:
        return _INT_FORMS[op](x)
    return Unary.apply(x, op=op, p0=p0, p1=p1)


# int32 in, int32 out, as PyTorch's: computed by the integer binary kernels, exactly (the float formulas would round
# values past 2^24)
_INT_FORMS = {
    "neg": lambda x: binary("sub", 0, x), "abs": lambda x: binary("maximum", x, binary("sub", 0, x)),
    "relu": lambda x: binary("maximum", x, 0),
    "sign": lambda x: binary("sub", cast(binary("gt", x, 0), INT), cast(binary("lt", x, 0), INT)),
    **dict.fromkeys(("floor", "ceil", "round"), lambda x: binary("add", x, 0)),  # an integer's own value
}


def logical_not(x):
    _check("logical_not", x)
    y = empty(x.shape, x.device, BOOL)
    if x.size:
        k = _kernel(x.device, "unary_fwd", dict(TA=CL_TYPE[x.dtype], TO="uchar"))
        _launch(x.device, k, x.size, x, y, x.size, 35, 0.0, 0.0, what="logical_not",
                step=lambda: ChainStep(UNARY_FWD, 35, 1, ((0, None),)))
    return y


# ---- constants, casts, promotion -----------------------------------------------------------------------------------

_constants = OrderedDict()
_arrays = OrderedDict()
_cache_lock = threading.Lock()  # threads share both caches (as kernels' and layout's caches are shared)


def cached_constant(cache, limit, key, dev, make):
    """cache[key] (an OrderedDict), made on first use from the host array make() returns, outside any capture's
    recording (a replay reads the same tensor); the oldest entry leaves past `limit`. Every cache of device constants
    (numbers, small arrays, nn.functional's interpolation matrices) is made here, under one lock."""
    with _cache_lock:
        t = cache.get(key)
        if t is None:
            value = make()
            with kernels.set_up():
                t = Tensor(value.shape, value.dtype, dev).write(value)
            cache[key] = t
            if len(cache) > limit:
                cache.popitem(last=False)
        return t


def constant(dev, value, dtype):
    """A cached one-element device tensor holding `value`."""
    dtype = np.dtype(dtype)
    number = float(value) if dtype == FLOAT else int(value)
    key = (id(dev), dtype, number if number or dtype != FLOAT else number.hex())  # -0.0 is not 0.0
    return cached_constant(_constants, 1024, key, dev, lambda: np.array(value, dtype))


def constant_array(dev, array):
    """A cached device copy of a small host array (a mask, a table)."""
    array = np.ascontiguousarray(array)
    key = (id(dev), array.dtype.str, array.shape, array.tobytes())
    return cached_constant(_arrays, 256, key, dev, lambda: array)


def scalar_dtype(value):
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer)):
        return INT
    if isinstance(value, (float, np.floating)):
        return FLOAT
    raise TypeError(f"expected a clnet tensor or a Python number, got {type(value).__name__}")


def result_type(a, b):
    """PyTorch's promotion for two operands (tensors or numbers): a number takes part only when it is of a higher
    kind than the tensor (int tensor + 0.5 is float; float tensor + 2 stays float; bool tensor + 1 is int)."""
    ta = a.dtype if isinstance(a, Tensor) else None
    tb = b.dtype if isinstance(b, Tensor) else None
    if ta is None and tb is None:
        ta, tb = scalar_dtype(a), scalar_dtype(b)
    elif ta is None:
        ta = scalar_dtype(a) if _RANK[scalar_dtype(a)] > _RANK[tb] else tb
    elif tb is None:
        tb = scalar_dtype(b) if _RANK[scalar_dtype(b)] > _RANK[ta] else ta
    return ta if _RANK[ta] >= _RANK[tb] else tb


class Cast(Function):
    __slots__ = ("in_dtype",)

    def forward(self, x, dtype):
        self.in_dtype = x.dtype
        y = empty(x.shape, x.device, dtype)
        if x.size:
            k = _kernel(x.device, "cast", dict(TA=CL_TYPE[x.dtype], TO=CL_TYPE[np.dtype(dtype)]))
            _launch(x.device, k, x.size, x, y, x.size, what="cast",
                    step=lambda: ChainStep(CAST, 0, 1, ((0, None),)))
        return y

    def backward(self, dy):
        return dy  # float to float only: an integer result has no gradient


def cast(x, dtype):
    """x as `dtype` (float32, int32 or bool; int64 means int32, clnet's integer type): x itself when it is one."""
    dtype = _dtype(dtype)
    _check("cast", x)
    if x.dtype == dtype:
        return x
    if dtype == BOOL:
        return binary("ne", x, 0)
    with autograd.no_grad():
        return Cast.apply(x, dtype=dtype)


def _dtype(dtype):
    if dtype in (bool, "bool"):
        return BOOL
    d = np.dtype(dtype)
    if d.kind == "f":
        if d != FLOAT:
            raise TypeError(f"clnet holds float32 tensors, not {d}: use float32")
        return FLOAT
    if d.kind in "iu":
        return INT  # int64 (PyTorch's default integer type) is held as int32 (clnet.tensor checks the range)
    if d.kind == "b":
        return BOOL
    raise TypeError(f"clnet tensors hold float32, int32 or bool, not {d}")


def _operand(what, v, dev, dtype):
    """A tensor operand (cast to dtype if it is of another) or a number (a cached constant)."""
    if isinstance(v, Tensor):
        if v.device is not dev:
            raise ValueError(f"'{what}': the tensors are on different devices ({v.device.name} and {dev.name}); move "
                             "them to one with .to(device)")
        return v if v.dtype == dtype else cast(v, dtype)
    return constant(dev, v, dtype)


# ---- binary --------------------------------------------------------------------------------------------------------

def _layout(out_shape, *shapes):
    """(coalesced sizes, per-operand strides) for reading operands of `shapes` at every index of out_shape."""
    return layout.coalesce(out_shape, *(layout.broadcast_strides(s, out_shape) for s in shapes))


class Binary(Function):
    """out = a (op) b for tensors a, b of one dtype whose shapes broadcast; backward sums each operand's gradient
    over the dimensions it was broadcast along."""
    __slots__ = ("op", "shapes")

    def forward(self, a, b, op, out_shape, out_dtype):
        spec = BINARY[op]
        self.op, self.shapes = op, (a.shape, b.shape)
        out = empty(out_shape, a.device, out_dtype)
        if out.size:
            sizes, sa, sb = _layout(out_shape, a.shape, b.shape)
            work = FLOAT if spec.result == "float" else a.dtype
            defines = dict(NDIM=len(sizes), TA=CL_TYPE[a.dtype], TB=CL_TYPE[b.dtype], TO=CL_TYPE[out_dtype],
                           TW=CL_TYPE[work], TW_FLOAT=int(work == FLOAT))

            def step():
                return ChainStep(BINARY_FWD, spec.number, 2, ((0, _read(sizes, sa)), (1, _read(sizes, sb))), work)
            _launch(a.device, _kernel(a.device, "binary_fwd", defines), out.size, a, b, out,
                    layout.meta(a.device, sizes, sa, sb), out.size, spec.number, what=spec.symbol, step=step)
        if spec.saves:
            self.save(a, b)
        return out

    def backward(self, dy):
        (sa, sb), spec = self.shapes, BINARY[self.op]
        need_a, need_b = self.needs
        if not spec.saves:  # add, sub
            da = reduce.sum_to(dy, sa) if need_a else None
            db = reduce.sum_to(dy, sb) if need_b else None
            if db is not None and self.op == "sub":
                db = ops._affine(db, -1.0, 0.0)
            return da, db
        a, b = self.saved
        shape = dy.shape
        da_full = empty(shape, dy.device) if need_a else None
        db_full = empty(shape, dy.device) if need_b else None
        if dy.size:
            sizes, st_a, st_b = _layout(shape, sa, sb)
            defines = dict(NDIM=len(sizes), NEED_A=int(bool(need_a)), NEED_B=int(bool(need_b)))
            _launch(dy.device, _kernel(dy.device, "binary_bwd", defines), dy.size, a, b, dy,
                    da_full if need_a else dy, db_full if need_b else dy, layout.meta(dy.device, sizes, st_a, st_b),
                    dy.size, spec.number, what=spec.symbol + " backward")
        return (reduce.sum_to(da_full, sa) if need_a else None), (reduce.sum_to(db_full, sb) if need_b else None)


def binary(op, a, b):
    """a (op) b for the BINARY op `op`: tensors of broadcastable shapes on one device, or one of them a number."""
    spec = BINARY[op]
    what = spec.symbol
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"'{what}': expected at least one clnet tensor, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    t = a if isinstance(a, Tensor) else b
    _check(what, t)
    for v in (a, b):
        if not isinstance(v, Tensor):
            scalar_dtype(v)  # a TypeError naming what was given
    work = result_type(a, b)
    if spec.number >= 14 and spec.number <= 15:  # logical: operands as bool
        work = BOOL
    if spec.number >= 18 and work == FLOAT:
        raise TypeError(f"'{what}': bitwise {op[8:]} of float32 operands; it takes int32 or bool tensors (for a mask, "
                        f"compare first: (x > 0) {what} (y > 0), or use logical_{op[8:]})")
    if op == "pow" and work != FLOAT:
        work = FLOAT  # clnet computes integer powers in float (PyTorch keeps them integer)
    out_dtype = BOOL if spec.result == "bool" else (FLOAT if spec.result == "float" else work)
    dev = t.device
    a_shape = a.shape if isinstance(a, Tensor) else ()
    b_shape = b.shape if isinstance(b, Tensor) else ()
    out_shape = layout.broadcast_shapes(f"'{what}'", a_shape, b_shape)
    a, b = _operand(what, a, dev, work), _operand(what, b, dev, work)
    if spec.grad and work == FLOAT:
        return Binary.apply(a, b, op=op, out_shape=out_shape, out_dtype=out_dtype)
    with autograd.no_grad():
        return Binary.apply(a, b, op=op, out_shape=out_shape, out_dtype=out_dtype)


# ---- arithmetic with the fast paths kept -------------------------------------------------------------------------

def _is_number(v):
    return isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))


def add(a, b, alpha=1):
    """a + alpha * b, as torch.add."""
    if alpha != 1:
        b = mul(b, alpha)
    if isinstance(a, Tensor) and a.dtype == FLOAT:  # two tensors first: the common case
        if isinstance(b, Tensor):
            if b.shape == a.shape and b.dtype == FLOAT and b.device is a.device:
                return ops.Axpby.apply(a, b, alpha=1.0, beta=1.0)
        elif _is_number(b):
            return ops.Affine.apply(a, alpha=1.0, beta=float(b))
    if isinstance(b, Tensor) and b.dtype == FLOAT and _is_number(a):
        return ops.Affine.apply(b, alpha=1.0, beta=float(a))
    return binary("add", a, b)


def sub(a, b, alpha=1):
    """a - alpha * b, as torch.sub."""
    if alpha != 1:
        b = mul(b, alpha)
    if isinstance(a, Tensor) and a.dtype == FLOAT:  # two tensors first: the common case
        if isinstance(b, Tensor):
            if b.shape == a.shape and b.dtype == FLOAT and b.device is a.device:
                return ops.Axpby.apply(a, b, alpha=1.0, beta=-1.0)
        elif _is_number(b):
            return ops.Affine.apply(a, alpha=1.0, beta=-float(b))
    if isinstance(b, Tensor) and b.dtype == FLOAT and _is_number(a):
        return ops.Affine.apply(b, alpha=-1.0, beta=float(a))
    return binary("sub", a, b)


def mul(a, b):
    # a product by a number adds -0.0, which leaves every value as it is (adding +0.0 turned a -0.0 product into +0.0)
    if isinstance(a, Tensor):  # two tensors first: the common case
        if isinstance(b, Tensor):
            if a.shape == b.shape and a.dtype == b.dtype == FLOAT and a.device is b.device:
                return ops.Mul.apply(a, b)
        elif a.dtype == FLOAT and _is_number(b):
            return ops.Affine.apply(a, alpha=float(b), beta=-0.0)
    elif isinstance(b, Tensor) and b.dtype == FLOAT and _is_number(a):
        return ops.Affine.apply(b, alpha=float(a), beta=-0.0)
    return binary("mul", a, b)


def div(a, b, rounding_mode=None):
    """a / b (true division), or with rounding_mode "floor" (and "trunc" for non-negative quotients), as torch.div."""
    if rounding_mode == "floor":
        return binary("floor_divide", a, b)
    if rounding_mode == "trunc":
        q = binary("div", a, b)
        return where(q < 0, unary("ceil", q), unary("floor", q))
    if rounding_mode is not None:
        raise ValueError(f"div: rounding_mode must be None, 'floor' or 'trunc', not {rounding_mode!r}")
    if isinstance(a, Tensor) and a.dtype == FLOAT and _is_number(b):
        return ops.Affine.apply(a, alpha=1.0 / float(b), beta=-0.0) if b != 0 else binary("div", a, b)
    if isinstance(b, Tensor) and b.dtype == FLOAT and _is_number(a):
        return unary("rdiv_scalar", b, float(a))
    return binary("div", a, b)


def pow(a, b):
    """a ** b: tensor to a number, a number to a tensor, or two tensors (broadcast)."""
    if isinstance(a, Tensor) and _is_number(b):
        if b == 1:  # a new tensor, as PyTorch's
            return a.clone() if a.dtype == FLOAT else cast(a, FLOAT)
        return unary("pow_scalar", a, float(b))
    if isinstance(b, Tensor) and _is_number(a):
        if a <= 0:
            return binary("pow", a, b)
        return unary("rpow_scalar", b, float(a))
    return binary("pow", a, b)


def clamp(x, min=None, max=None):
    """x limited to [min, max]; either bound may be None, a number or a tensor (broadcast)."""
    if min is None and max is None:
        raise ValueError("clamp: give at least one of min and max")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        out = x
        if min is not None:
            out = binary("maximum", out, min)
        if max is not None:
            out = binary("minimum", out, max)
        return out
    lo = -np.inf if min is None else float(min)
    hi = np.inf if max is None else float(max)
    if x.dtype != FLOAT:
        out = x
        if min is not None:
            out = binary("maximum", out, min)
        if max is not None:
            out = binary("minimum", out, max)
        return out
    return unary("clamp", x, lo, hi)


# ---- where and masks -----------------------------------------------------------------------------------------------

class Where(Function):
    __slots__ = ("shapes",)

    def forward(self, cond, a, b, out_shape):
        self.shapes = (a.shape, b.shape)
        out = empty(out_shape, a.device, a.dtype)
        if out.size:
            sizes, sc, sa, sb = _layout(out_shape, cond.shape, a.shape, b.shape)
            defines = dict(NDIM=len(sizes), TC=CL_TYPE[cond.dtype], TA=CL_TYPE[a.dtype], TB=CL_TYPE[b.dtype],
                           TO=CL_TYPE[a.dtype])

            def step():
                return ChainStep(WHERE_FWD, 0, 3, ((0, _read(sizes, sc)), (1, _read(sizes, sa)), (2, _read(sizes, sb))))
            _launch(a.device, _kernel(a.device, "where_fwd", defines), out.size, cond, a, b, out,
                    layout.meta(a.device, sizes, sc, sa, sb), out.size, what="where",
                    step=step if a.dtype == b.dtype == out.dtype else None)
        self.save(cond)
        return out

    def backward(self, dy):
        cond, = self.saved
        sa, sb = self.shapes
        need_a, need_b = self.needs[1], self.needs[2]
        da = empty(dy.shape, dy.device) if need_a else None
        db = empty(dy.shape, dy.device) if need_b else None
        if dy.size:
            sizes, sc = layout.coalesce(dy.shape, layout.broadcast_strides(cond.shape, dy.shape))
            defines = dict(NDIM=len(sizes), TC=CL_TYPE[cond.dtype], NEED_A=int(bool(need_a)),
                           NEED_B=int(bool(need_b)))
            _launch(dy.device, _kernel(dy.device, "where_bwd", defines), dy.size, cond, dy,
                    da if need_a else dy, db if need_b else dy, layout.meta(dy.device, sizes, sc), dy.size,
                    what="where backward")
        return None, (reduce.sum_to(da, sa) if need_a else None), (reduce.sum_to(db, sb) if need_b else None)


def where(condition, input, other):
    """input where condition is true, else other; all three broadcast (condition a bool or numeric tensor, input
    and other tensors or numbers), as torch.where."""
    _check("where", condition)
    t = next((v for v in (input, other) if isinstance(v, Tensor)), condition)
    dev = condition.device
    dtype = result_type(input, other) if isinstance(input, Tensor) or isinstance(other, Tensor) else \
        result_type(input, other)
    shapes = [condition.shape] + [v.shape for v in (input, other) if isinstance(v, Tensor)]
    out_shape = layout.broadcast_shapes("where", *shapes)
    if t.device is not dev:
        raise ValueError("where: the tensors are on different devices; move them to one with .to(device)")
    a, b = _operand("where", input, dev, dtype), _operand("where", other, dev, dtype)
    if condition.dtype == FLOAT:
        condition = binary("ne", condition, 0.0)
    if dtype == FLOAT:
        return Where.apply(condition, a, b, out_shape=out_shape)
    with autograd.no_grad():
        return Where.apply(condition, a, b, out_shape=out_shape)


def masked_fill(x, mask, value):
    """x with `value` where mask (a bool tensor that broadcasts to x's shape) is true, as Tensor.masked_fill."""
    _check("masked_fill", mask)
    if mask.dtype != BOOL:
        raise TypeError(f"masked_fill: the mask must be a bool tensor, got {mask.dtype}; compare to get one "
                        "(x > 0) or cast with .bool()")
    out_shape = layout.broadcast_shapes("masked_fill", x.shape, mask.shape)
    if out_shape != x.shape:
        raise ValueError(f"masked_fill: a mask of shape {mask.shape} does not broadcast to the tensor's shape "
                         f"{x.shape}")
    if isinstance(value, Tensor) and value.size != 1:
        raise ValueError(f"masked_fill: value must be a number or a one-element tensor, got shape {value.shape}")
    if isinstance(value, Tensor):
        value = value.reshape(()) if value.dtype == x.dtype else cast(value.reshape(()), x.dtype)
    elif x.dtype == FLOAT:
        value = float(value)
    elif x.dtype == INT:  # x's dtype kept, the value cast to it, as PyTorch's (2.5 fills an int32 tensor with 2)
        value = int(value)
    else:
        value = bool(value)
    return where(mask, value, x)


# ---- PyTorch's function names ----------------------------------------------------------------------------------

def exp(input):
    return unary("exp", input)

def log(input):
    return unary("log", input)

def log1p(input):
    return unary("log1p", input)

def sqrt(input):
    return unary("sqrt", input)

def rsqrt(input):
    return unary("rsqrt", input)

def abs(input):
    return unary("abs", input)

def sign(input):
    return unary("sign", input)

def erf(input):
    return unary("erf", input)

def sin(input):
    return unary("sin", input)

def cos(input):
    return unary("cos", input)

def tanh(input):
    return unary("tanh", input)

def sigmoid(input):
    return unary("sigmoid", input)

def relu(input):
    return unary("relu", input)

def neg(input):
    return unary("neg", input)

def floor(input):
    return unary("floor", input)

def ceil(input):
    return unary("ceil", input)

def round(input):
    return unary("round", input)

def reciprocal(input):
    return unary("reciprocal", input)


def square(input):
    if isinstance(input, Tensor) and input.dtype == INT:
        return binary("mul", input, input)  # int32 kept, as PyTorch's
    return unary("pow_scalar", input, 2.0)


def maximum(input, other):
    return binary("maximum", input, other)


def minimum(input, other):
    return binary("minimum", input, other)


FUNCTIONS = ["exp", "log", "log1p", "sqrt", "rsqrt", "abs", "sign", "erf", "sin", "cos", "tanh", "sigmoid",
             "relu", "neg", "floor", "ceil", "round", "reciprocal", "square", "maximum", "minimum", "clamp",
             "where", "pow", "add", "sub", "mul", "div", "logical_not"]  # clnet.<name> as well

TENSOR_METHODS = {name: globals()[name] for name in FUNCTIONS if name != "where"}
def _method_where(self, condition, other):
    """self where condition is true, else other (Tensor.where)."""
    return where(condition, self, other)


def _binary_method(op):
    def method(self, other):
        return binary(op, self, other)
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"The element-wise {BINARY[op].symbol} of self and other (broadcast)."
    return method


def _cast_method(name, dtype):
    def method(self):
        return cast(self, dtype)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"self as {dtype} (itself when it is one)."
    return method


TENSOR_METHODS.update({"clip": clamp, "where": _method_where, "masked_fill": masked_fill})
TENSOR_METHODS.update({op: _binary_method(op) for op in ("logical_and", "logical_or", "lt", "le", "gt", "ge", "eq",
                                                         "ne")})
TENSOR_METHODS.update({name: _cast_method(name, dtype) for name, dtype in (("float", FLOAT), ("int", INT),
                                                                          ("long", INT), ("bool", BOOL))})


def broadcast_to(x, shape):
    """x materialised at a shape it broadcasts to (one launch; backward sums over the broadcast dimensions)."""
    shape = tuple(shape)
    out_shape = layout.broadcast_shapes("broadcast_to", x.shape, shape)
    if out_shape != shape:
        raise ValueError(f"broadcast_to: a tensor of shape {x.shape} does not broadcast to {shape}")
    if x.shape == shape:
        return x
    zero = constant(x.device, 0, x.dtype)
    if x.dtype == FLOAT:
        return Binary.apply(x, zero, op="add", out_shape=shape, out_dtype=x.dtype)
    with autograd.no_grad():
        return Binary.apply(x, zero, op="add", out_shape=shape, out_dtype=x.dtype)
