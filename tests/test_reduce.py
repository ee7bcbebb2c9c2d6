"""The reduction family (clnet/reduce.py, cl_kernels/reduce.cl): forward and backward against PyTorch in float64, on
odd shapes, empty and size-1 dimensions, every dim (negative ones too), keepdim both ways, and both launch shapes
(a work-group tree per output and a loop per output), split into parts and not."""
import importlib
import math

import numpy as np
import pytest

import clnet
from clnet import reduce

from conftest import assert_close, assert_close_to_terms, no_launch

torch = pytest.importorskip("torch")


def torch64(a, grad=True):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def compare(dev, rng, ours, theirs, x, name, tol=2e-5, grad=True):
    """ours(device tensor) and theirs(float64 torch tensor), forward and (with grad) backward under a random
    upstream gradient."""
    t = clnet.tensor(x, dev, requires_grad=grad)
    y = ours(t)
    tx = torch64(x, grad)
    ty = theirs(tx)
    assert y.shape == tuple(ty.shape), f"{name}: shape {y.shape}, expected {tuple(ty.shape)}"
    assert_close(y.numpy(), ty.detach().numpy(), f"{name} output", tol)
    if not grad:
        return
    dy = rng.standard_normal(ty.shape).astype(np.float32)
    y.backward(clnet.tensor(dy, dev))
    ty.backward(torch64(dy, False))
    assert_close(t.grad.numpy(), tx.grad.numpy(), f"{name} gradient", tol)


# SUMS_AWAY_FROM_ZERO: the sums' data has a mean of 1, so a sum of n terms is about n (33 terms: 33 +- 5.7, six
# standard deviations from 0), not a cancelling sum near 0 whose float32 rounding alone exceeds the tolerance relative
# to it (seed 3163679202: 10,000 zero-mean values summed to -0.53, rounded by 1.3e-4 of that; with a mean of 0.5, seed
# 317260431 summed 33 values to a small fraction of their size); a dropped or doubled term is still an error of 1/n.
@pytest.fixture(params=["chosen", "tree", "loop"])
def plan(request, monkeypatch):
    """Each case runs with the launch reduce.py chooses, then forced to lanes sharing each output (a tree) and to a
    work-item per output, each with the reduction split into parts (the passes that large reductions take, down to
    one part), so both kernels' paths and the later passes run on small shapes; the gradients run GPU-shaped with
    the tree and CPU-shaped with the loop."""
    if request.param == "chosen":
        return request.param
    from clnet import tuning
    # gradients: a GPU's element per work-item, or a CPU's runs of 3 elements (runs that end inside a line)
    monkeypatch.setattr(tuning, "cpu_shaped", lambda d: request.param == "loop")
    monkeypatch.setattr(reduce, "BWD_RUN", 3)

    def forced(outputs, R, contiguous, columns, dev):
        lanes = 1
        if request.param == "tree":
            lanes = builtin_min(reduce._lsize(dev), 1 << (builtin_max(R // 8, 2).bit_length() - 1))
        return lanes, builtin_max(1, builtin_min(-(-R // (2 * lanes)), 7)), 1
    monkeypatch.setattr(reduce, "_plan", forced)
    return request.param


builtin_min, builtin_max = min, max

SHAPES_DIMS = [
    ((31, 33), 1), ((31, 33), 0), ((31, 33), -1), ((3, 1, 33), (0, 2)), ((2, 3, 5, 7), (0, 2, 3)),
    ((2, 3, 5, 7), (-1, 1)), ((33,), 0), ((1,), None), ((4, 0, 3), 1), ((4, 0, 3), 2), ((), None), ((5, 1), 1),
]


# ---- sum_to --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape,shape", [
    ((2, 3, 4, 5), (3, 1, 5)), ((31, 33), (1,)), ((33, 31), (33, 1)), ((31, 33), ()), ((3, 1, 5), (1, 5)),
    ((0, 3), (1, 3)), ((4, 0, 3), (3,)), ((1, 33), (33,)), ((2, 1, 33), (2, 1, 1)),
])
def test_sum_to(dev, rng, x_shape, shape):
    x = (rng.standard_normal(x_shape) + 1.0).astype(np.float32)  # sums away from 0: SUMS_AWAY_FROM_ZERO
    out = reduce.sum_to(clnet.tensor(x, dev), shape)
    expected = torch64(x, False).sum_to_size(shape).numpy()
    assert out.shape == shape and out.grad_fn is None
    assert_close(out.numpy(), expected, f"sum_to {x_shape} -> {shape}")


def test_sum_to_same_shape_is_the_tensor_and_bad_shapes_are_refused(dev, rng):
    t = clnet.tensor(rng.standard_normal((3, 4)).astype(np.float32), dev)
    assert reduce.sum_to(t, (3, 4)) is t
    with no_launch():
        for bad in ((5,), (2, 3, 4), (3, 2), (2, 4)):
            with pytest.raises(ValueError, match=r"sum_to: shape .* does not broadcast"):
                reduce.sum_to(t, bad)


def test_sum_to_of_a_large_reduction_splits_into_parts(dev, rng, monkeypatch):
    """(5, 2000) -> (1,): the launch reduce.py plans itself, with a lowered threshold for the split (10 parts of
    1024 elements, then one tree over the parts)."""
    monkeypatch.setattr(reduce, "PER_LANE", 4)
    monkeypatch.setattr(reduce, "CPU_PER_ITEM", 1024)
    lanes, parts, _ = reduce._plan(1, 10000, True, False, dev)
    assert parts == -(-10000 // (1024 * lanes // (256 if lanes > 1 else 1)))  # 10 parts of 1024
    x = rng.standard_normal((5, 2000)).astype(np.float32) + 1.0  # SUMS_AWAY_FROM_ZERO; a part dropped: a 10% error
    out = reduce.sum_to(clnet.tensor(x, dev), (1,))
    assert_close(out.numpy(), x.astype(np.float64).sum().reshape(1), "sum_to (1,)")


# ---- sum, mean -----------------------------------------------------------------------------------------------------

def every(dim, ndim):
    """torch's dim argument for clnet's dim None (every dimension)."""
    return tuple(range(ndim)) if dim is None else dim


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean(dev, rng, plan, shape, dim, keepdim):
    x = (rng.standard_normal(shape) + 1.0).astype(np.float32)  # SUMS_AWAY_FROM_ZERO
    tdim = every(dim, len(shape))
    compare(dev, rng, lambda t: reduce.sum(t, dim, keepdim), lambda t: torch.sum(t, tdim, keepdim), x,
            f"sum {shape} dim {dim}")
    if math.prod(shape[d] for d in clnet.layout.normalize_dims("", dim, len(shape))) == 0:
        # the mean of nothing is NaN, which assert_close refuses: compare the NaNs themselves
        y = reduce.mean(clnet.tensor(x, dev), dim, keepdim).numpy()
        assert y.shape == tuple(torch.mean(torch64(x, False), tdim, keepdim).shape) and np.isnan(y).all()
        return
    compare(dev, rng, lambda t: reduce.mean(t, dim, keepdim), lambda t: torch.mean(t, tdim, keepdim), x,
            f"mean {shape} dim {dim}")


LAUNCH_CASES = {
    "var": (lambda t, d: reduce.var(t, d), lambda t, d: torch.var(t, d)),
    "std": (lambda t, d: reduce.std(t, d, keepdim=True), lambda t, d: torch.std(t, d, keepdim=True)),
    "max": (lambda t, d: reduce.max(t, d[0]).values, lambda t, d: torch.max(t, d[0]).values),
    "amin": (lambda t, d: reduce.amin(t, d), lambda t, d: torch.amin(t, d)),
    "logsumexp": (lambda t, d: reduce.logsumexp(t, d), lambda t, d: torch.logsumexp(t, d)),
    "prod": (lambda t, d: reduce.prod(t, d[0]), lambda t, d: torch.prod(t, d[0])),
    "norm": (lambda t, d: reduce.norm(t, 2, d), lambda t, d: torch.norm(t, 2, d)),
    "norm inf": (lambda t, d: reduce.norm(t, math.inf, d), lambda t, d: torch.norm(t, math.inf, d)),
    "norm 3": (lambda t, d: reduce.norm(t, 3, d), lambda t, d: torch.norm(t, 3, d)),
}


@pytest.mark.parametrize("kind", LAUNCH_CASES)
def test_every_reduction_in_every_launch_shape(dev, rng, plan, kind):
    """What each reduction adds to the sum's launch (a map before combining, a finishing step after the last pass,
    a per-output value, indices carried through the passes) in the tree, the loop and the split passes."""
    ours, theirs = LAUNCH_CASES[kind]
    for shape, dim in (((31, 33), (1,)), ((31, 33), (0,)), ((3, 5, 7), (0, 2)), ((2, 67), (1,))):
        x = rng.uniform(0.5, 1.5, shape).astype(np.float32) * rng.choice([-1.0, 1.0], shape).astype(np.float32)
        if kind == "max":
            x[:, -1] = x.max()  # a maximum at the last index: the first maximum's index travels through the passes
            x[:, 0] = x.max()
        compare(dev, rng, lambda t: ours(t, dim), lambda t: theirs(t, dim), x, f"{kind} {shape} dim {dim}",
                tol=1e-4)
    if kind == "max":
        x = ties(rng, (5, 67))
        assert np.array_equal(reduce.argmax(clnet.tensor(x, dev), 1).numpy(), torch.tensor(x).argmax(1).numpy())


# ---- var, std ------------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*degrees of freedom")  # PyTorch's, for an empty output (0 / 0 elements)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["var", "std"])
def test_var_and_std(dev, rng, shape, dim, keepdim, kind):
    x = (rng.standard_normal(shape) + 3.0).astype(np.float32)  # a mean away from 0: the two-pass form matters
    tdim = every(dim, len(shape))
    R = math.prod(shape[d] for d in clnet.layout.normalize_dims("", dim, len(shape)))
    ours, theirs = getattr(reduce, kind), getattr(torch, kind)
    for correction in (1, 0, 2):
        if R - correction <= 0:  # inf or NaN, as PyTorch's (which warns)
            y = ours(clnet.tensor(x, dev), dim, keepdim=keepdim, correction=correction).numpy()
            with pytest.warns(UserWarning):
                expected = theirs(torch64(x, False), tdim, keepdim=keepdim, correction=correction).numpy()
            assert y.shape == expected.shape and np.array_equal(np.isnan(y), np.isnan(expected))
            assert np.array_equal(y[~np.isnan(y)], expected[~np.isnan(expected)])
            continue
        compare(dev, rng, lambda t: ours(t, dim, keepdim=keepdim, correction=correction),
                lambda t: theirs(t, tdim, keepdim=keepdim, correction=correction), x,
                f"{kind} {shape} dim {dim} correction {correction}", tol=1e-4)
    if R > 1:
        compare(dev, rng, lambda t: ours(t, dim, False, keepdim), lambda t: theirs(t, tdim, False, keepdim), x,
                f"{kind} unbiased=False", tol=1e-4)


def test_std_of_constant_rows_has_zero_gradient(dev, rng):
    """Rows of 4 equal quarters: their float32 mean is exact, so the deviations are exactly 0 (as in float64)."""
    x = np.repeat(rng.integers(-8, 8, (3, 1)) / 4, 4, axis=1).astype(np.float32)
    compare(dev, rng, lambda t: reduce.std(t, 1), lambda t: torch.std(t, 1), x, "std of constant rows")


# ---- max, min, amax, amin, argmax, argmin --------------------------------------------------------------------------

def ties(rng, shape):
    """Small integers: many ties, which the first-index rule and the even split of gradients must handle."""
    return rng.integers(-2, 3, shape).astype(np.float32)


EXTREME_CASES = [((31, 33), 1), ((31, 33), 0), ((3, 1, 33), -1), ((2, 3, 5, 7), 2), ((2, 3, 5, 7), -4), ((33,), 0),
                 ((4, 0, 3), 2), ((5, 1), 1), ((), 0)]


@pytest.mark.parametrize("shape,dim", EXTREME_CASES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_over_a_dim(dev, rng, shape, dim, keepdim, kind):
    for x in (rng.standard_normal(shape).astype(np.float32), ties(rng, shape)):
        t = clnet.tensor(x, dev, requires_grad=True)
        values, indices = getattr(reduce, kind)(t, dim, keepdim)
        tx = torch64(x)
        tv, ti = getattr(torch, kind)(tx, dim, keepdim)
        assert indices.dtype == np.int32 and indices.shape == tuple(ti.shape)
        assert np.array_equal(indices.numpy(), ti.numpy()), f"{kind} indices"
        assert_close(values.numpy(), tv.detach().numpy(), f"{kind} values")
        dy = rng.standard_normal(tv.shape).astype(np.float32)
        values.backward(clnet.tensor(dy, dev))
        tv.backward(torch64(dy, False))
        assert_close(t.grad.numpy(), tx.grad.numpy(), f"{kind} gradient")


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS[:8] + [((5, 1), 1), ((), None)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["amax", "amin"])
def test_amax_amin_split_the_gradient_among_ties(dev, rng, shape, dim, keepdim, kind):
    tdim = every(dim, len(shape))
    for x in (rng.standard_normal(shape).astype(np.float32), ties(rng, shape)):
        compare(dev, rng, lambda t: getattr(reduce, kind)(t, dim, keepdim),
                lambda t: getattr(torch, kind)(t, tdim, keepdim), x, f"{kind} {shape} dim {dim}")


@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_min_of_everything(dev, rng, kind):
    for shape in ((31, 33), (1,), ()):
        compare(dev, rng, getattr(reduce, kind), getattr(torch, kind), ties(rng, shape), f"{kind} of {shape}")


@pytest.mark.parametrize("shape,dim", EXTREME_CASES + [((31, 33), None), ((2, 3, 5, 7), None), ((), None)])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_argmin(dev, rng, shape, dim, keepdim, kind):
    if dim is None and 0 in shape:
        return
    x = ties(rng, shape)
    out = getattr(reduce, kind)(clnet.tensor(x, dev), dim, keepdim)
    expected = getattr(torch, kind)(torch64(x, False), dim, keepdim)
    assert out.dtype == np.int32 and out.shape == tuple(expected.shape)
    assert np.array_equal(out.numpy(), expected.numpy()), f"{kind} {shape} dim {dim}"


def test_nan_wins_max_and_argmax_as_in_pytorch(dev, rng):
    x = rng.standard_normal((5, 33)).astype(np.float32)
    x[1, 7] = x[1, 20] = x[3, 0] = np.nan
    t, tx = clnet.tensor(x, dev), torch64(x, False)
    for kind in ("max", "min"):
        values, indices = getattr(reduce, kind)(t, 1)
        tv, ti = getattr(torch, kind)(tx, 1)
        assert np.array_equal(indices.numpy(), ti.numpy())
        assert np.array_equal(np.isnan(values.numpy()), np.isnan(tv.numpy()))
        assert np.array_equal(getattr(reduce, "arg" + kind)(t, 1).numpy(), ti.numpy())
        assert np.isnan(getattr(reduce, "a" + kind)(t).numpy())


@pytest.mark.parametrize("kind", ["max", "min", "amax", "amin", "argmax", "argmin"])
def test_extremes_of_nothing_are_refused(dev, kind):
    t = clnet.tensor(np.zeros((4, 0, 3), np.float32), dev)
    with no_launch():
        with pytest.raises(IndexError, match=rf"{kind}: dimension 1 of the input, shape \(4, 0, 3\), is empty"):
            getattr(reduce, kind)(t, 1)
        with pytest.raises(IndexError, match=rf"{kind}: .*empty"):
            getattr(reduce, kind)(t)


# ---- logsumexp, prod, norm -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(dev, rng, shape, dim, keepdim):
    x = (rng.standard_normal(shape) * 30).astype(np.float32)  # exp() of these overflows float32 unshifted
    tdim = every(dim, len(shape))
    if math.prod(shape[d] for d in clnet.layout.normalize_dims("", dim, len(shape))) == 0:
        y = reduce.logsumexp(clnet.tensor(x, dev), dim, keepdim).numpy()
        assert y.shape == tuple(torch.logsumexp(torch64(x, False), tdim, keepdim).shape) and np.all(y == -np.inf)
        return
    compare(dev, rng, lambda t: reduce.logsumexp(t, dim, keepdim), lambda t: torch.logsumexp(t, tdim, keepdim), x,
            f"logsumexp {shape} dim {dim}")


def test_logsumexp_of_infinities(dev):
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 2.0]], np.float32)
    y = reduce.logsumexp(clnet.tensor(x, dev), 1).numpy()
    assert np.array_equal(y, torch.logsumexp(torch64(x, False), 1).numpy().astype(np.float32))


@pytest.mark.parametrize("shape,dim", [((31, 33), 1), ((31, 33), 0), ((3, 1, 33), -1), ((2, 3, 5, 7), 1),
                                       ((4, 0, 3), 1), ((5, 1), 1), ((7,), None), ((), None)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_with_zeros(dev, rng, shape, dim, keepdim):
    x = rng.uniform(0.8, 1.25, shape).astype(np.float32)
    x *= rng.choice([-1.0, 1.0], shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 8:  # lines with one zero, with two zeros, and none
        flat[rng.choice(flat.size, flat.size // 8, replace=False)] = 0.0
    tkw = {} if dim is None else dict(dim=dim, keepdim=keepdim)
    compare(dev, rng, lambda t: reduce.prod(t, dim, keepdim if dim is not None else False),
            lambda t: torch.prod(t, **tkw), x, f"prod {shape} dim {dim}", tol=1e-4)


def test_prod_gradient_at_one_and_two_zeros(dev, rng):
    x = np.array([[2.0, 0.0, 3.0, -1.5], [0.0, 2.0, 0.0, 4.0], [1.5, 2.0, -3.0, 0.5]], np.float32)
    compare(dev, rng, lambda t: reduce.prod(t, 1), lambda t: torch.prod(t, 1), x, "prod at zeros")


@pytest.mark.parametrize("p", [2, 1, math.inf, -math.inf, 3, 0.5, "fro"])
@pytest.mark.parametrize("shape,dim", [((31, 33), 1), ((31, 33), (0, 1)), ((2, 3, 5, 7), (0, 2)), ((33,), None),
                                       ((4, 0, 3), 1), ((5, 1), -1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_norm(dev, rng, p, shape, dim, keepdim):
    x = rng.standard_normal(shape).astype(np.float32)
    if math.isinf(p) if not isinstance(p, str) else False:
        x = np.round(x * 2) / 2  # ties among the largest |x|, of either sign
        if x.size:
            x.reshape(-1)[0] = 0.0
    x[np.abs(x) < 1e-3] = 0.5  # away from the kink at 0 (p < 1: an infinite slope)
    if p in (1, 2) and x.ndim == 2:
        x[0] = 0.0  # a zero line: its gradient is 0
    R = math.prod(shape[d] for d in clnet.layout.normalize_dims("", dim, len(shape)))
    if R == 0 and p in (math.inf, -math.inf):  # no identity: refused, as PyTorch does
        with no_launch(), pytest.raises(IndexError, match=r"norm: dimension 1 of the input, shape \(4, 0, 3\)"):
            reduce.norm(clnet.tensor(x, dev), p, dim, keepdim)
        return
    compare(dev, rng, lambda t: reduce.norm(t, p, dim, keepdim), lambda t: torch.norm(t, p, dim, keepdim), x,
            f"norm p={p} {shape} dim {dim}", tol=1e-4)


def test_norm_refuses_an_unsupported_p(dev, rng):
    t = clnet.tensor(rng.standard_normal(3).astype(np.float32), dev)
    with no_launch():
        for p in (0, -1, "nuc", True):
            with pytest.raises(ValueError, match="norm: p="):
                reduce.norm(t, p)


# ---- cumsum, softmax, log_softmax ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(31, 33), (2, 3, 5, 7), (33,), (4, 0, 3), (5, 1), ()])
def test_cumsum_every_dim(dev, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    for dim in range(-max(len(shape), 1), max(len(shape), 1)):
        compare(dev, rng, lambda t: reduce.cumsum(t, dim), lambda t: torch.cumsum(t, dim), x,
                f"cumsum {shape} dim {dim}")


@pytest.mark.parametrize("shape", [(31, 33), (2, 3, 5, 7), (33,), (4, 0, 3), (5, 1), (), (3, 300), (2, 0)])
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_every_dim(dev, rng, kernel_shape, shape, kind):
    """In both kernel shapes (a GPU's last dimension: lanes per row, from 32 elements); the gradient, y (dy -
    sum(dy y)) (softmax) or dy - exp(y) sum(dy), can cancel to far below its terms: each element is compared with
    the size of the terms it sums."""
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    for dim in range(-max(len(shape), 1), max(len(shape), 1)):
        t = clnet.tensor(x, dev, requires_grad=True)
        y = getattr(reduce, kind)(t, dim)
        tx = torch64(x)
        ty = getattr(torch, kind)(tx, dim)
        assert_close(y.numpy(), ty.detach().numpy(), f"{kind} {shape} dim {dim}")
        dy = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(clnet.tensor(dy, dev))
        ty.backward(torch64(dy, False))
        p = ty.detach().numpy() if kind == "softmax" else np.exp(ty.detach().numpy())
        spread = (np.abs(dy) * p).sum(dim, keepdims=True) if kind == "softmax" else np.abs(dy).sum(dim, keepdims=True)
        terms = p * (np.abs(dy) + spread) if kind == "softmax" else np.abs(dy) + p * spread
        assert_close_to_terms(t.grad.numpy(), tx.grad.numpy(), terms, f"{kind} {shape} dim {dim} gradient", 1e-5)


# ---- int32 inputs, errors ------------------------------------------------------------------------------------------

def test_int32_reductions(dev, rng):
    x = rng.integers(-50, 50, (5, 33)).astype(np.int32)
    t, tx = clnet.tensor(x, dev), torch.tensor(x)
    for ours, theirs in [
            (reduce.sum(t, 1), tx.sum(1)), (reduce.sum(t), tx.sum()), (reduce.amax(t, 0), tx.amax(0)),
            (reduce.amin(t, (0, 1)), tx.amin((0, 1))), (reduce.max(t), tx.max()), (reduce.argmax(t, 1), tx.argmax(1)),
            (reduce.argmin(t), tx.argmin()), (reduce.max(t, 0).indices, tx.max(0).indices),
            (reduce.min(t, 1).values, tx.min(1).values), (reduce.cumsum(t, 1), tx.cumsum(1)),
            (reduce.prod(clnet.tensor(x[:, :4] % 5, dev), 1), torch.tensor(x[:, :4] % 5).prod(1))]:
        assert ours.dtype == np.int32 and np.array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_any_all(dev, rng, plan, dtype):
    if np.dtype(dtype) not in importlib.import_module("clnet.tensor").DTYPES:
        pytest.skip("this checkout's tensors hold no bool yet")
    x = (rng.random((5, 67)) < 0.97).astype(dtype)  # rows with zeros and rows without, some all zero
    x[1] = 0
    x[2] = 1
    if dtype == np.float32:
        x[3, 5], x[1, 7] = np.nan, -0.0  # a NaN is nonzero; -0.0 is zero
    t, tx = clnet.tensor(x, dev), torch.tensor(x)
    for dim in (None, 0, 1, (0, 1)):
        for kind in ("any", "all"):
            out = getattr(reduce, kind)(t, dim, keepdim=dim == 1)
            expected = getattr(torch, kind)(tx, dim=every(dim, 2), keepdim=dim == 1)
            assert out.dtype == np.bool_ and np.array_equal(out.numpy(), expected.numpy()), f"{kind} dim {dim}"
    empty = clnet.tensor(np.zeros((3, 0), dtype), dev)
    assert reduce.any(empty, 1).numpy().tolist() == [False] * 3 and reduce.all(empty, 1).numpy().tolist() == [True] * 3


def test_bool_sums_count(dev, rng, plan):
    """A mask's count, (pred == labels).sum(): int32, over any dims, through every launch shape and its passes."""
    if np.dtype(np.bool_) not in importlib.import_module("clnet.tensor").DTYPES:
        pytest.skip("this checkout's tensors hold no bool yet")
    x = rng.random((5, 67)) < 0.3
    t = clnet.tensor(x, dev)
    assert t.dtype == np.bool_
    for dim in (None, 0, 1, (0, 1)):
        out = reduce.sum(t, dim)
        assert out.dtype == np.int32 and np.array_equal(out.numpy(), x.sum(axis=dim)), f"dim {dim}"


def test_bad_arguments_are_refused_before_any_launch(dev, rng):
    t = clnet.tensor(rng.standard_normal((3, 4)).astype(np.float32), dev)
    i = clnet.tensor(np.arange(12, dtype=np.int32).reshape(3, 4), dev)
    with no_launch():
        for fn in (reduce.mean, reduce.var, reduce.std, reduce.norm, lambda x: reduce.logsumexp(x, 0),
                   lambda x: reduce.softmax(x, 0)):
            with pytest.raises(TypeError, match="expected a float32 tensor, got int32"):
                fn(i)
        with pytest.raises(IndexError, match=r"sum: dim 2 is out of range for a tensor of 2 dimensions"):
            reduce.sum(t, 2)
        with pytest.raises(IndexError, match=r"max: dim -3 is out of range"):
            reduce.max(t, -3)
        with pytest.raises(ValueError, match=r"mean: dim \(1, -1\) names a dimension twice"):
            reduce.mean(t, (1, -1))
        with pytest.raises(TypeError, match="softmax: pass the dimension"):
            reduce.softmax(t, None)
        with pytest.raises(ValueError, match="var: pass unbiased or correction, not both"):
            reduce.var(t, 1, True, correction=0)
        with pytest.raises(TypeError, match="sum: expected a clnet tensor"):
            reduce.sum(np.zeros(3))


def test_a_replayed_graph_repeats_the_reductions(dev, rng):
    """Reductions inside a captured step (layouts made once, per-output intermediates from the pool, split passes)
    replay on the next batch written into the same input, forward and (accumulated) gradient as eager runs give."""
    def step(x):
        total = reduce.sum(reduce.var(x, 0)) + reduce.sum(reduce.logsumexp(x, (0, 2)))
        total = total + reduce.sum(reduce.max(x, 1).values) + reduce.sum(reduce.norm(x, 2, -1))
        total.backward()
        return total, reduce.sum_to(x.grad, (1, 5, 1))

    batches = [rng.standard_normal((3, 5, 67)).astype(np.float32) for _ in range(3)]
    eager_x = clnet.tensor(batches[0], dev, requires_grad=True)
    expected = []
    for b in batches:
        eager_x.write(b)
        total, grad_sum = step(eager_x)
        expected.append((total.numpy(), eager_x.grad.numpy(), grad_sum.numpy()))
    x = clnet.tensor(batches[0], dev, requires_grad=True)
    graph = clnet.Graph()
    with graph.capture():
        total, grad_sum = step(x)
    for i, b in enumerate(batches):
        if i:
            x.write(b)
            graph.replay()
        for got, want, name in zip((total.numpy(), x.grad.numpy(), grad_sum.numpy()), expected[i],
                                   ("output", "gradient", "sum_to of the gradient")):
            assert np.array_equal(got, want), f"replay {i}: {name} differs from the eager step's"


def test_tensor_methods(dev, rng):
    """The family's functions as Tensor methods (methods.py installs TENSOR_METHODS), PyTorch's spellings."""
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    t, tx = clnet.tensor(x, dev), torch64(x, False)
    for ours, theirs in [
            (t.sum(1), tx.sum(1)), (t.mean(dim=(1, 2)), tx.mean(dim=(1, 2))),
            (t.var(0, keepdim=True), tx.var(0, keepdim=True)),
            (t.std(), tx.std()), (t.max(), tx.max()), (t.max(1).values, tx.max(1).values), (t.amin(-1), tx.amin(-1)),
            (t.logsumexp(2), tx.logsumexp(2)), (t.prod(0), tx.prod(0)), (t.norm(dim=1), tx.norm(dim=1)),
            (t.cumsum(1), tx.cumsum(1)), (t.softmax(-1), tx.softmax(-1)), (t.log_softmax(0), tx.log_softmax(0)),
            (t.sum_to_size(5, 1), tx.sum_to_size(5, 1))]:
        assert_close(ours.numpy(), theirs.numpy(), "method", tol=1e-4)
    compare(dev, rng, lambda a: a.sum_to_size((5, 1)), lambda a: a.sum_to_size((5, 1)), x, "sum_to_size")
    assert np.array_equal(t.argmax(1).numpy(), tx.argmax(1).numpy())
    assert np.array_equal(t.max(2).indices.numpy(), tx.max(2).indices.numpy())
    assert (t > 0).any().item() == bool((tx > 0).any())
