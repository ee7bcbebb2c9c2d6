"""clnet.pointwise, creation and matmul against PyTorch in float64: every unary op forward and backward, binary ops
broadcasting across ranks (either operand computed, numbers on either side), type promotion and comparisons, where
and masked_fill, in-place forms, creation on the device, and matmul from 1-D to 4-D with batch broadcasting."""
import numpy as np
import pytest

import clnet
from clnet import creation, pointwise, products
from conftest import assert_close, assert_close_to_terms

torch = pytest.importorskip("torch")


def _leaf(dev, a, grad=True):
    return (clnet.tensor(a, dev, requires_grad=grad and a.dtype.kind == "f"),
            torch.tensor(a, dtype=torch.float64 if a.dtype.kind == "f" else None,
                         requires_grad=grad and a.dtype.kind == "f"))


def _check(dev, rng, arrays, ours, theirs, name, tol=2e-5, terms=None, broadcast=False):
    """ours(*clnet leaves) against theirs(*float64 torch leaves): the forward, and every float input's gradient
    for a random output gradient. With terms (theirs of the inputs' magnitudes), the forward's error is judged
    against the size of the terms each output sums (a few sums can cancel to far below their terms). broadcast: an
    element-wise op whose inputs broadcast to the output, each broadcast input's gradient a sum over its copies."""
    pairs = [_leaf(dev, a) for a in arrays]
    y, ty = ours(*(p[0] for p in pairs)), theirs(*(p[1] for p in pairs))
    assert y.shape == tuple(ty.shape), f"{name}: shape {y.shape}, expected {tuple(ty.shape)}"
    if ty.dtype == torch.bool:
        assert y.dtype == np.bool_, f"{name}: dtype {y.dtype}, expected bool"
        np.testing.assert_array_equal(y.numpy(), ty.numpy(), err_msg=name)
        return
    if terms is None:
        assert_close(y.numpy(), ty.detach().numpy(), name, tol)
    else:
        mags = [torch.tensor(np.abs(a), dtype=torch.float64) for a in arrays]
        assert_close_to_terms(y.numpy(), ty.detach().numpy(), terms(*mags).numpy(), name, tol / 10)
    if not ty.requires_grad:
        return
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(g, dev))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    # A broadcast input's gradient sums its output elements' terms, which can cancel (six of them did on one seed: an
    # 8e-5 relative error): judged against the terms, each output element's share from theirs on the inputs expanded
    if broadcast:
        expanded = [torch.tensor(np.broadcast_to(a, y.shape), dtype=torch.float64, requires_grad=a.dtype.kind == "f")
                    for a in arrays]
        theirs(*expanded).backward(torch.tensor(g, dtype=torch.float64))
    for i, ((x, tx), a) in enumerate(zip(pairs, arrays)):
        if a.dtype.kind != "f":
            continue
        what = f"{name}: gradient of input {i}"
        if not broadcast or a.shape == y.shape:
            assert_close(x.grad.numpy(), tx.grad.numpy(), what, tol)
        else:
            e = expanded[i]
            terms = e.grad.abs().sum_to_size(a.shape) if a.ndim else e.grad.abs().sum()
            assert_close_to_terms(x.grad.numpy(), tx.grad.numpy(), terms.numpy(), what, tol / 4)


def _away(rng, shape, lo=0.2, hi=2.0):
    """Values whose magnitudes lie in [lo, hi) with random signs: away from the kinks at 0."""
    return (rng.uniform(lo, hi, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


F = torch.nn.functional
UNARY = [  # (clnet name, params, torch function, input domain)
    ("neg", (), torch.neg, "any"), ("exp", (), torch.exp, "any"), ("log", (), torch.log, "positive"),
    ("log1p", (), torch.log1p, "positive"), ("sqrt", (), torch.sqrt, "positive"),
    ("rsqrt", (), torch.rsqrt, "positive"), ("abs", (), torch.abs, "any"), ("erf", (), torch.erf, "any"),
    ("sin", (), torch.sin, "any"), ("cos", (), torch.cos, "any"), ("tanh", (), torch.tanh, "any"),
    ("sigmoid", (), torch.sigmoid, "any"), ("relu", (), torch.relu, "any"), ("gelu", (), F.gelu, "any"),
    ("gelu_tanh", (), lambda x: F.gelu(x, approximate="tanh"), "any"), ("silu", (), F.silu, "any"),
    ("mish", (), F.mish, "any"), ("hardswish", (), F.hardswish, "wide"), ("hardsigmoid", (), F.hardsigmoid, "wide"),
    ("leaky_relu", (0.1,), lambda x: F.leaky_relu(x, 0.1), "any"), ("elu", (0.7,), lambda x: F.elu(x, 0.7), "any"),
    ("softplus", (2.0, 3.0), lambda x: F.softplus(x, 2.0, 3.0), "any"),
    ("clamp", (-0.5, 0.9), lambda x: torch.clamp(x, -0.5, 0.9), "any"),
    ("hardtanh", (-0.5, 0.9), lambda x: F.hardtanh(x, -0.5, 0.9), "any"),
    ("pow_scalar", (3.0,), lambda x: x ** 3, "any"), ("pow_scalar", (0.5,), lambda x: x ** 0.5, "positive"),
    ("rpow_scalar", (1.7,), lambda x: 1.7 ** x, "any"), ("rdiv_scalar", (2.5,), lambda x: 2.5 / x, "any"),
    ("selu", (), F.selu, "any"), ("celu", (1.3,), lambda x: F.celu(x, 1.3), "any"), ("relu6", (), F.relu6, "wide"),
    ("reciprocal", (), torch.reciprocal, "any"), ("sign", (), torch.sign, "any"), ("floor", (), torch.floor, "any"),
    ("ceil", (), torch.ceil, "any"), ("round", (), torch.round, "any"),
]


def test_unary_ops(dev, rng):
    """Every op of the UNARY table, forward and backward, on 33 elements (one launch shape per op)."""
    done = set()
    for name, params, fn, domain in UNARY:
        a = {"any": _away(rng, (3, 11)), "positive": rng.uniform(0.2, 3.0, (3, 11)).astype(np.float32),
             "wide": _away(rng, (3, 11), 0.3, 7.0)}[domain]
        a[a % 1 == 0.5] += 0.01  # round's ties
        _check(dev, rng, [a], lambda x: pointwise.unary(name, x, *params), fn, f"{name}{params}", tol=1e-5)
        done.add(name)
    assert done == set(pointwise.UNARY), f"untested unary ops: {set(pointwise.UNARY) - done}"


def test_nan_kinks_and_saturation_as_pytorch(dev):
    """NaN passes through clamp (number bounds: OpenCL's fmin and fmax drop it), hardtanh and hardsigmoid, as in
    PyTorch; the gradients at the kinks are PyTorch's (hardtanh's is 0 at its bounds where clamp's passes, hardswish's
    0 at -3 and 1 at 3); the tanh GELU's gradient is 0 and 1 far out (1 - tanh^2 from a saturated tanh was not)."""
    from clnet.nn import functional as CF
    v = np.array([np.nan, -80.0, -25.0, -3.0, -1.0, -0.5, 0.75, 1.0, 3.0, 25.0, 80.0], np.float32)
    for name, ours, theirs in [
            ("clamp", lambda x: x.clamp(-0.5, 0.75), lambda x: x.clamp(-0.5, 0.75)),
            ("clamp(min=0)", lambda x: x.clamp(min=0), lambda x: x.clamp(min=0)),
            ("hardtanh", CF.hardtanh, F.hardtanh), ("hardtanh(-0.5, 0.75)", lambda x: CF.hardtanh(x, -0.5, 0.75),
                                                    lambda x: F.hardtanh(x, -0.5, 0.75)),
            ("hardsigmoid", CF.hardsigmoid, F.hardsigmoid), ("hardswish", CF.hardswish, F.hardswish),
            ("relu6", CF.relu6, F.relu6),
            ("gelu tanh", lambda x: CF.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"))]:
        x, t = clnet.tensor(v, dev, requires_grad=True), torch.tensor(v, dtype=torch.float64, requires_grad=True)
        y, ty = ours(x), theirs(t)
        y.sum().backward()
        ty.sum().backward()
        # float32's rounding, and at x = -3 the tanh GELU's gradient sums terms of 0.015 to -0.0116
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-6, atol=3e-7, err_msg=name)
        # (NaN's gradient left out: PyTorch's hardtanh gives 1 in float32 and 0 in float64)
        np.testing.assert_allclose(x.grad.numpy()[1:], t.grad.numpy()[1:], rtol=1e-5, atol=3e-7,
                                   err_msg=f"{name}'s gradient")


@pytest.mark.parametrize("sa, sb", [((3, 1, 5), (4, 1)), ((1,), (2, 3)), ((), (31,)), ((2, 0, 3), (3,)),
                                    ((33, 1), (1, 33)), ((2, 3, 4, 5), (2, 1, 4, 1))])
def test_binary_broadcasting(dev, rng, sa, sb):
    ops = [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
           ("div", lambda a, b: a / b), ("maximum", None), ("minimum", None)]
    for name, fn in ops:
        a, b = _away(rng, sa), _away(rng, sb)
        ours = fn or (lambda x, y: x.maximum(y) if name == "maximum" else x.minimum(y))
        _check(dev, rng, [a, b], ours, fn or getattr(torch, name), f"{name} of {sa} and {sb}", broadcast=True)
    a, b = rng.uniform(0.5, 2.0, sa).astype(np.float32), _away(rng, sb)
    _check(dev, rng, [a, b], lambda x, y: x ** y, lambda x, y: x ** y, f"pow of {sa} and {sb}", broadcast=True)


def test_maximum_ties_split_the_gradient(dev, rng):
    a = _away(rng, (4, 5))
    b = a.copy()
    b[::2] = _away(rng, (2, 5))
    _check(dev, rng, [a, b], pointwise.TENSOR_METHODS["maximum"], torch.maximum, "maximum with ties")


def test_numbers_on_either_side(dev, rng):
    a = _away(rng, (3, 7))
    for fn, name in [(lambda x: 2.5 - x, "2.5 - x"), (lambda x: 3 / x, "3 / x"), (lambda x: x / 4, "x / 4"),
                     (lambda x: 2 ** x, "2 ** x"), (lambda x: x ** 2, "x ** 2"), (lambda x: -x, "-x"),
                     (lambda x: 1 + x * 3 - 2, "1 + x * 3 - 2"), (lambda x: abs(x), "abs")]:
        _check(dev, rng, [a], fn, fn, name)
    for fn, name in [(lambda x: x > 0.5, ">"), (lambda x: x <= -0.3, "<="), (lambda x: x == x, "=="),
                     (lambda x: x != 0.7, "!="), (lambda x: (x > 0) & (x < 1), "&"), (lambda x: ~(x > 0), "~")]:
        _check(dev, rng, [a], fn, fn, name)


def test_signed_zeros_as_pytorch(dev, rng):
    """Products and quotients by numbers keep the sign of a zero result as IEEE (and PyTorch) do, and the constants
    -0.0 and 0.0 are two: x * -0.0 is -0.0 where x > 0 (an added +0.0 made it +0.0; a shared cache entry gave 0.0)."""
    import torch
    v = np.concatenate([rng.standard_normal(5), [0.0, -0.0]]).astype(np.float32)
    x, t = clnet.tensor(v, dev), torch.from_numpy(v)
    for name, f in [("x * 0.0", lambda a: a * 0.0), ("x * -0.0", lambda a: a * -0.0), ("-0.0 * x", lambda a: -0.0 * a),
                    ("x / -7.0", lambda a: a / -7.0), ("x - x", lambda a: a - a), ("x + -0.0", lambda a: a + -0.0),
                    ("x * -0.0 + x * 0.0", lambda a: a * -0.0 + a * 0.0)]:
        ours, theirs = f(x).numpy(), f(t).numpy()
        np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs), err_msg=name)
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=name)


def test_pytorch_dtype_names(dev):
    """clnet.float32/float, int32/int, int64/long and bool name the dtypes as torch's do: in creation, in .to(), and
    compared with a tensor's dtype (an int64 tensor is held as int32)."""
    x = clnet.tensor(np.array([-1.5, 0.0, 2.0], np.float32), dev)
    assert x.dtype == clnet.float32 == clnet.float and (x > 0).dtype == clnet.bool
    assert x.to(clnet.long).dtype == x.to(clnet.int32).dtype == clnet.int32 == clnet.int
    np.testing.assert_array_equal(x.to(clnet.long).numpy(), [-1, 0, 2])
    np.testing.assert_array_equal(x.to(clnet.bool).numpy(), [True, False, True])
    assert clnet.zeros(2, dtype=clnet.int64, device=dev).dtype == clnet.int32
    assert clnet.ones(2, dtype=clnet.bool, device=dev).numpy().all()


def test_comparisons_with_ties(dev, rng):
    a = rng.integers(-2, 3, (5, 6)).astype(np.float32)
    b = rng.integers(-2, 3, (6,)).astype(np.float32)
    for fn, name in [(lambda x, y: x < y, "<"), (lambda x, y: x <= y, "<="), (lambda x, y: x > y, ">"),
                     (lambda x, y: x >= y, ">="), (lambda x, y: x == y, "=="), (lambda x, y: x != y, "!=")]:
        _check(dev, rng, [a, b], fn, fn, name)


def test_type_promotion_and_integers(dev, rng):
    i = rng.integers(-9, 9, (3, 4)).astype(np.int32)
    i[i == 0] = 5
    f = _away(rng, (4,))
    ti, tf = clnet.tensor(i, dev), clnet.tensor(f, dev)
    cases = [(ti + 1, i + 1, np.int32), (ti * 2.5, i * 2.5, np.float32), (ti + tf, i + f, np.float32),
             (ti // 4, i // 4, np.int32), (ti % 4, i % 4, np.int32), (ti / 4, i / 4, np.float32),
             (-ti, -i, np.int32), (ti > 2, i > 2, np.bool_), (tf.int(), f.astype(np.int32), np.int32)]
    for k, (out, expected, dtype) in enumerate(cases):
        assert out.dtype == dtype, f"case {k}: dtype {out.dtype}, expected {np.dtype(dtype)}"
        np.testing.assert_allclose(out.numpy(), expected.astype(dtype), rtol=1e-6, err_msg=f"case {k}")
    # the ops PyTorch keeps integer, exact past float32's 2^24 (they ran in float and came back float32)
    big = np.array([-(2 ** 24) - 1, -3, 0, 5, 2 ** 24 + 1, 2 ** 31 - 1], np.int32)
    for name in ("abs", "neg", "relu", "sign", "floor", "ceil", "round", "square"):
        values = big if name != "square" else np.array([-46340, -4097, 0, 3, 4097, 46340], np.int32)  # no overflow
        got, want = getattr(clnet.tensor(values, dev), name)(), getattr(torch, name)(torch.tensor(values))
        assert got.dtype == np.int32, f"{name} of int32 gave {got.dtype}"
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)
    # Python's floor division and remainder of floats, signs included
    a = np.array([-7.5, 7.5, -7.5, 7.5], np.float32)
    b = np.array([2.0, -2.0, -2.0, 2.0], np.float32)
    ta, tb = clnet.tensor(a, dev), clnet.tensor(b, dev)
    np.testing.assert_array_equal((ta // tb).numpy(), np.floor_divide(a, b))
    np.testing.assert_array_equal((ta % tb).numpy(), np.remainder(a, b))


def test_where_and_masked_fill(dev, rng):
    a, b = _away(rng, (3, 1, 5)), _away(rng, (4, 1))
    c = rng.random((4, 5)) > 0.5
    tc = clnet.tensor(c, dev)
    assert tc.dtype == np.bool_
    _check(dev, rng, [a, b], lambda x, y: pointwise.where(tc, x, y),
           lambda x, y: torch.where(torch.tensor(c), x, y), "where")
    _check(dev, rng, [a], lambda x: pointwise.where(tc, x, 0.0),
           lambda x: torch.where(torch.tensor(c), x, torch.tensor(0.0, dtype=torch.float64)), "where with a number")
    m = rng.random((1, 5)) > 0.5
    _check(dev, rng, [a], lambda x: x.masked_fill(clnet.tensor(m, dev), -1.5),
           lambda x: x.masked_fill(torch.tensor(m), -1.5), "masked_fill")
    with pytest.raises(TypeError, match="masked_fill: the mask must be a bool tensor"):
        clnet.tensor(a, dev).masked_fill(clnet.tensor(m.astype(np.float32), dev), 0)
    n = rng.integers(-9, 9, (3, 5)).astype(np.int32)  # the tensor's dtype kept, the value cast to it, as PyTorch's
    for value in (2.5, clnet.tensor(np.array([-3.5], np.float32), dev)):
        got = clnet.tensor(n, dev).masked_fill(clnet.tensor(m, dev), value)
        want = torch.tensor(n).masked_fill(torch.tensor(m), value if isinstance(value, float) else -3.5)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_in_place(dev, rng):
    a = _away(rng, (3, 4))
    x = clnet.tensor(a, dev)
    x.add_(1).mul_(clnet.tensor(a[:1], dev)).clamp_(-1, 1)
    np.testing.assert_allclose(x.numpy(), np.clip((a + 1) * a[:1], -1, 1), rtol=1e-6)
    x.zero_()
    assert not x.numpy().any()
    w = clnet.tensor(a, dev, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"add_: an in-place op where autograd records \(the tensor of shape "
                                           r"\(3, 4\) or an operand requires a gradient\)"):
        w.add_(1)
    with clnet.no_grad():
        w.mul_(2)
    np.testing.assert_allclose(w.numpy(), 2 * a)
    with pytest.raises(ValueError, match="an in-place op cannot change the shape"):
        clnet.tensor(a[:1], dev).add_(x)


def test_augmented_assignment_is_in_place(dev, rng):
    """x += y, -=, *=, /= write x's memory, as PyTorch's: a hand-written SGD step under no_grad moves the parameter,
    and a view of x sees the change (Python's fallback, x = x + y, rebound the name and left both as they were). A
    leaf that requires a gradient is refused while gradients are recorded; a computed tensor gets the recorded op."""
    a, b = _away(rng, (3, 5)), _away(rng, (5,))
    w = clnet.tensor(a, dev, requires_grad=True)
    (w * w).sum().backward()
    with clnet.no_grad():
        w -= 0.1 * w.grad
    assert_close(w.numpy(), a - 0.1 * 2 * a.astype(np.float64), "w after w -= 0.1 * w.grad", tol=1e-6)
    assert w.grad_fn is None and w.requires_grad
    moved = w.numpy().astype(np.float64)
    w.data -= 0.1 * w.grad  # the older spelling: in place through .data, then Python's w.data = (it had no setter)
    assert_close(w.numpy(), moved - 0.2 * a, "w after w.data -= 0.1 * w.grad", tol=1e-6)
    with pytest.raises(ValueError, match=r"t.data = v: v has shape \(2,\) .* clnet keeps a tensor's shape"):
        w.data = clnet.zeros(2, device=dev)
    x = clnet.tensor(a, dev)
    view = x.view(5, 3)
    expected = a.astype(np.float64)
    for op, y in (("+", clnet.tensor(b, dev)), ("*", clnet.tensor(b, dev)), ("-", 2.5), ("/", clnet.tensor(b, dev))):
        before = x
        x = _iop(x, op, y)
        assert x is before, f"{op}= made a new tensor"
        yy = y.numpy() if isinstance(y, clnet.Tensor) else y
        expected = {"+": expected + yy, "*": expected * yy, "-": expected - yy, "/": expected / yy}[op]
        assert_close(view.numpy(), expected.reshape(5, 3), f"a view after {op}=", tol=1e-6)
    with pytest.raises(RuntimeError, match=r"\+=: a leaf tensor that requires a gradient \(shape \(3, 5\)\)"):
        w += 1
    h = w * 2.0
    h += clnet.tensor(b, dev)
    h.sum().backward()
    assert_close(h.numpy(), 2 * w.numpy().astype(np.float64) + b, "h += b of a computed h", tol=1e-6)
    i = clnet.tensor(np.array([1, 2], np.int32), dev)
    i += 3
    assert i.dtype == np.int32 and i.numpy().tolist() == [4, 5]
    with pytest.raises(TypeError, match=r"/=: the result is float32, which cannot be cast back into the int32"):
        i /= 2  # as PyTorch's
    # a total that needs no gradient, plus one that does (a regulariser, a summed loss): recorded, the gradient kept
    w.grad = None
    total = clnet.zeros((), device=dev)
    total += (w * w).sum()
    total.backward()
    assert_close(w.grad.numpy(), 2 * w.numpy().astype(np.float64), "the gradient through total += loss", tol=1e-6)
    with pytest.raises(RuntimeError, match=r"add_: an in-place op where autograd records .* or the gradient dropped"):
        clnet.zeros(5, device=dev).add_(w[0])


def _iop(x, op, y):
    """x op= y, the augmented assignment itself."""
    if op == "+":
        x += y
    elif op == "-":
        x -= y
    elif op == "*":
        x *= y
    else:
        x /= y
    return x


def test_bitwise_operators_as_pytorch(dev, rng):
    """& | ^ ~ are bitwise on int32 (they were logical: 6 & 3 gave True), logical on bool, with broadcasting and
    numbers on either side, as NumPy's and PyTorch's; refused on float32, naming the operator and the fix."""
    a = rng.integers(-50, 50, (3, 5)).astype(np.int32)
    b = rng.integers(-50, 50, (5,)).astype(np.int32)
    x, y = clnet.tensor(a, dev), clnet.tensor(b, dev)
    for got, want in [(x & y, a & b), (x | y, a | b), (x ^ y, a ^ b), (~x, ~a), (x & 6, a & 6), (6 | x, 6 | a),
                      (13 ^ x, 13 ^ a)]:
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got.numpy(), want)
    p, q = a > 0, b % 2 == 0
    m, n = clnet.tensor(p, dev), clnet.tensor(q, dev)
    for got, want in [(m & n, p & q), (m | n, p | q), (m ^ n, p ^ q), (~m, ~p)]:
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got.numpy(), want)
    f = clnet.tensor(a.astype(np.float32), dev)
    with pytest.raises(TypeError, match=r"'&': bitwise and of float32 operands.*\(x > 0\) & \(y > 0\)"):
        f & f
    with pytest.raises(TypeError, match=r"'~': bitwise not of a float32 tensor \(shape \(3, 5\)\)"):
        ~f


def test_bad_operands_name_the_op_and_shapes(dev):
    a = clnet.tensor(np.zeros((2, 3), np.float32), dev)
    with pytest.raises(ValueError, match=r"'\*': shapes \(2, 3\) and \(4,\) do not broadcast \(dimension -1 has "
                                         r"sizes \[3, 4\]\)"):
        a * clnet.tensor(np.zeros(4, np.float32), dev)
    with pytest.raises(TypeError, match="got str"):
        a + "x"
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(a > 0)


def test_creation(dev):
    np.testing.assert_array_equal(creation.zeros(2, 3, device=dev).numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(creation.ones((4,), device=dev, dtype=np.int64).numpy(), np.ones(4, np.int32))
    np.testing.assert_array_equal(creation.full((2, 2), 7, device=dev).numpy(), np.full((2, 2), 7, np.int32))
    assert creation.full((2,), True, device=dev).dtype == np.bool_
    np.testing.assert_array_equal(creation.arange(2, 11, 3, device=dev).numpy(), np.arange(2, 11, 3))
    np.testing.assert_allclose(creation.arange(0, 1, 0.125, device=dev).numpy(), np.arange(0, 1, 0.125))
    np.testing.assert_allclose(creation.linspace(-1, 2, 7, device=dev).numpy(), np.linspace(-1, 2, 7), atol=1e-6)
    assert creation.linspace(-1, 2, 7, device=dev).numpy()[-1] == 2.0
    np.testing.assert_array_equal(creation.eye(3, 5, device=dev).numpy(), np.eye(3, 5))
    x = creation.zeros(0, 4, device=dev)
    assert x.shape == (0, 4) and creation.ones_like(x).shape == (0, 4)
    clnet.manual_seed(5)
    u, n = creation.rand(20000, device=dev).numpy(), creation.randn(20000, device=dev).numpy()
    clnet.manual_seed(5)
    assert (creation.rand(20000, device=dev).numpy() == u).all(), "manual_seed repeats the draws"
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.std() - 12 ** -0.5) < 0.01
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03 and abs(np.mean(n ** 3)) < 0.1
    r = creation.randint(-3, 4, (5000,), device=dev).numpy()
    assert r.dtype == np.int32 and set(np.unique(r)) == set(range(-3, 4))
    like = creation.randn_like(creation.zeros(3, 2, device=dev))
    assert like.shape == (3, 2) and like.dtype == np.float32
    with pytest.raises(ValueError, match="negative size"):
        creation.zeros(-1, device=dev)


@pytest.mark.parametrize("sa, sb", [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((3, 5), (5, 4)),
                                    ((2, 3, 5), (5, 4)), ((1, 3, 5), (2, 5, 4)), ((2, 1, 3, 5), (1, 3, 5, 4)),
                                    ((2, 3, 0), (0, 4)), ((1, 33), (33, 1)), ((2, 3, 7, 5), (5, 4)),
                                    ((3, 7, 5), (1, 5, 4)), ((2, 3, 7, 5), (1, 1, 5, 4)), ((3, 7, 5), (1, 1, 5, 4)),
                                    ((0, 3, 5), (5, 4)), ((2, 0, 5), (5, 4)), ((2, 3, 5), (5, 0)),
                                    ((0, 3, 5), (1, 5, 4)), ((3, 5), (2, 0, 5, 4))])
def test_matmul(dev, rng, sa, sb):
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    # each output a dot product, which can cancel ((1, 33) @ (33, 1) is one): judged against |a| @ |b|
    _check(dev, rng, [a, b], lambda x, y: x @ y, lambda x, y: x @ y, f"matmul of {sa} and {sb}", tol=1e-5,
           terms=lambda x, y: x @ y)


def test_matmul_over_a_permuted_input(dev, rng):
    """A channels-last product as ONNX exports ConvNeXt's MLP (a Linear over a permuted (N, H, W, C) view): the batch
    folds into the rows of an input that is not contiguous."""
    a, b = rng.standard_normal((2, 5, 3, 7)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    _check(dev, rng, [a, b], lambda x, y: x.permute(0, 2, 3, 1) @ y, lambda x, y: x.permute(0, 2, 3, 1) @ y,
           "matmul of a permuted (2, 3, 7, 5) and (5, 4)", tol=1e-5, terms=lambda x, y: x.permute(0, 2, 3, 1) @ y)


def test_bmm_baddbmm_and_errors(dev, rng):
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 4), (3, 4, 5), (1, 5)))
    _check(dev, rng, [a, b], products.bmm, torch.bmm, "bmm", tol=1e-5)
    _check(dev, rng, [c, a, b], lambda z, x, y: products.baddbmm(z, x, y, beta=0.5, alpha=2.0),
           lambda z, x, y: torch.baddbmm(z, x, y, beta=0.5, alpha=2.0), "baddbmm", tol=1e-5)
    with pytest.raises(ValueError, match=r"matmul: shapes \(3, 2, 4\) and \(3, 5, 4\) cannot be multiplied"):
        clnet.tensor(a, dev) @ clnet.tensor(b.transpose(0, 2, 1).copy(), dev)
    with pytest.raises(ValueError, match=r"batch dimensions\): shapes \(3,\) and \(2,\) do not broadcast"):
        clnet.tensor(a, dev) @ clnet.tensor(b[:2], dev)


def test_one_element_tensors_convert_as_pytorch(dev):
    """int() truncates a float one and f"{t:.3f}" formats its number, as PyTorch's (both raised TypeError); F.relu of
    an int32 tensor keeps it int32 (it was refused)."""
    from clnet.nn import functional as CF
    t = clnet.tensor(np.array(-2.75, np.float32), dev)
    assert int(t) == -2 and f"{t:.3f}" == "-2.750" and f"{t}" == str(t)
    assert CF.relu(clnet.tensor(np.array([-2, 3], np.int32), dev)).numpy().tolist() == [0, 3]


def test_tensor_conveniences(dev, rng):
    a = _away(rng, (3, 4, 5))
    _check(dev, rng, [a], lambda x: x.tril(), torch.tril, "tril")
    _check(dev, rng, [a], lambda x: x.triu(1), lambda x: x.triu(1), "triu(1)")
    _check(dev, rng, [a], lambda x: x.clone() * 2, lambda x: x.clone() * 2, "clone")
    _check(dev, rng, [a], lambda x: x.mT, lambda x: x.mT, "mT")
    x = clnet.tensor(a, dev)
    assert x.to(np.int32).dtype == np.int32 and x.to(dev) is x and x.to(dtype=np.float32) is x
    np.testing.assert_array_equal(x.to(np.int64).numpy(), a.astype(np.int32))
    assert x[0, 0].tolist() == a[0, 0].tolist()
    with pytest.raises(ValueError, match=r"x.T: expects a tensor of at most 2 dimensions"):
        x.T
