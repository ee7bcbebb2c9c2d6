"""The reduction family (clnet/reduce.py, cl_kernels/reduce.cl): forward and backward against PyTorch in float64, on
odd shapes, empty and size-1 dimensions, every dim (negative ones too), keepdim both ways, and both launch shapes
(a work-group tree per output and a loop per output), split into parts and not."""
import math

import numpy as np
import pytest

import clnet
from clnet import reduce

from conftest import assert_close, no_launch

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


@pytest.fixture(params=["chosen", "tree", "loop"])
def plan(request, monkeypatch):
    """Each case runs with the launch reduce.py chooses, then forced to lanes sharing each output (a tree) and to a
    work-item per output, each with the reduction split into parts (the passes that large reductions take, down to
    one part), so both kernels' paths and the later passes run on small shapes."""
    if request.param == "chosen":
        return request.param

    def forced(outputs, R, contiguous, dev):
        lanes = 1
        if request.param == "tree":
            lanes = builtin_min(reduce._lsize(dev), 1 << (builtin_max(R // 8, 2).bit_length() - 1))
        return lanes, builtin_max(1, builtin_min(-(-R // (2 * lanes)), 7))
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
    x = rng.standard_normal(x_shape).astype(np.float32)
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


def test_sum_to_of_a_large_reduction_splits_into_parts(dev, rng):
    """(5, 2000) -> (1,): the launch reduce.py plans itself, with a lowered threshold for the split."""
    x = rng.standard_normal((5, 2000)).astype(np.float32)
    out = reduce.sum_to(clnet.tensor(x, dev), (1,))
    assert_close(out.numpy(), x.astype(np.float64).sum().reshape(1), "sum_to (1,)")


# ---- sum, mean -----------------------------------------------------------------------------------------------------

def every(dim, ndim):
    """torch's dim argument for clnet's dim None (every dimension)."""
    return tuple(range(ndim)) if dim is None else dim


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean(dev, rng, plan, shape, dim, keepdim):
    x = rng.standard_normal(shape).astype(np.float32)
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
