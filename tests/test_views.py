"""clnet.views against PyTorch in float64: permutations, slicing and indexing, expand and repeat, narrow, split and
chunk, index_select, gather, cat and stack, pad and assignment, forward and backward, on odd, size-1 and empty
dimensions and negative dims; the aliases launch nothing, and a channel shuffle and a head split launch once."""
import numpy as np
import pytest

import clnet
from clnet import views as V
from conftest import assert_close, assert_close_to_terms, launched, needs_torch, no_launch

torch = pytest.importorskip("torch")
pytestmark = needs_torch


def _pair(dev, rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    return (clnet.tensor(a, dev, requires_grad=True),
            torch.tensor(a, dtype=torch.float64, requires_grad=True))


def _check(dev, rng, shapes, ours, theirs, name):
    """ours(*clnet leaves) against theirs(*torch float64 leaves): the forward exactly (elements are moved, not
    computed), every input's gradient for a random output gradient."""
    pairs = [_pair(dev, rng, s) for s in shapes]
    y, ty = ours(*(p[0] for p in pairs)), theirs(*(p[1] for p in pairs))
    assert y.shape == tuple(ty.shape), f"{name}: shape {y.shape}, expected {tuple(ty.shape)}"
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy().astype(np.float32), err_msg=name)
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(g, dev))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    # a gradient element sums dy over the places its input went (an expand to (33, 3) sums 99, which can cancel far
    # below them): its error is measured against those terms' sizes, the same backward of |dy|
    sizes = [torch.tensor(p[1].detach().numpy(), requires_grad=True) for p in pairs]
    theirs(*sizes).backward(torch.tensor(np.abs(g), dtype=torch.float64))
    for i, ((x, tx), t) in enumerate(zip(pairs, sizes)):
        assert_close_to_terms(x.grad.numpy(), tx.grad.numpy(), t.grad.numpy(), f"{name}: gradient of input {i}",
                              tol=1e-6)


# ---- permutations ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, dims", [((3, 1, 31, 2), (2, 0, 3, 1)), ((33, 5), (-1, 0)), ((2, 0, 3), (1, 2, 0)),
                                         ((4, 3, 5), (0, 1, 2))])
def test_permute(dev, rng, shape, dims):
    _check(dev, rng, [shape], lambda x: V.permute(x, *dims), lambda x: x.permute(dims), f"permute{dims}")


def test_transpose_t_swapaxes(dev, rng):
    _check(dev, rng, [(3, 4, 5)], lambda x: V.transpose(x, -1, 0), lambda x: x.transpose(-1, 0), "transpose")
    _check(dev, rng, [(31, 3)], V.t, lambda x: x.t(), "t")
    _check(dev, rng, [(3, 4, 5)], lambda x: V.swapaxes(x, 1, 2), lambda x: x.swapaxes(1, 2), "swapaxes")
    x = clnet.tensor(np.ones(5, np.float32), dev)
    assert V.t(x) is x and V.contiguous(x) is x
    with pytest.raises(ValueError, match=r"t: expects a tensor of at most 2 dimensions, got shape \(2, 3, 4\)"):
        V.t(clnet.tensor(np.ones((2, 3, 4), np.float32), dev))
    with no_launch():
        with pytest.raises(ValueError, match="permute: dims .* name a dimension twice"):
            V.permute(clnet.tensor(np.ones((2, 3), np.float32), dev), 1, -1)
        with pytest.raises(IndexError, match="permute: dim 2 is out of range"):
            V.permute(clnet.tensor(np.ones((2, 3), np.float32), dev), 0, 2)


def test_movedim(dev, rng):
    _check(dev, rng, [(2, 3, 4, 5)], lambda x: V.movedim(x, (0, -1), (2, 0)), lambda x: x.movedim((0, -1), (2, 0)),
           "movedim")
    _check(dev, rng, [(2, 3, 4)], lambda x: V.moveaxis(x, 0, -1), lambda x: x.moveaxis(0, -1), "moveaxis")


def test_channel_shuffle_and_head_split_launch_once(dev, rng):
    """ShuffleNet's shuffle (a reshape-transpose-reshape) and attention's head split are one launch each way."""
    N, C, H, W, g = 2, 6, 3, 5, 3
    x, tx = _pair(dev, rng, (N, C, H, W))
    with launched() as names:
        y = V.transpose(x.reshape(N, g, C // g, H, W), 1, 2).reshape(N, C, H, W)
    assert names == ["strided_copy"]
    ty = tx.reshape(N, g, C // g, H, W).transpose(1, 2).reshape(N, C, H, W)
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy().astype(np.float32))
    np.testing.assert_array_equal(V.channel_shuffle(x, g).numpy(),
                                  torch.nn.functional.channel_shuffle(tx.detach().float(), g).numpy())
    B, T, h, d = 2, 7, 3, 4
    q, tq = _pair(dev, rng, (B, T, h * d))
    with launched() as names:
        heads = V.permute(q.reshape(B, T, h, d), 0, 2, 1, 3)
    assert names == ["strided_copy"]
    np.testing.assert_array_equal(heads.numpy(), tq.reshape(B, T, h, d).permute(0, 2, 1, 3).detach().numpy()
                                  .astype(np.float32))
    g_out = clnet.tensor(rng.standard_normal(heads.shape).astype(np.float32), dev)
    with launched() as names:
        heads.backward(g_out)
    assert names == ["strided_copy"]  # a permutation's gradient writes every element: no zero fill


# ---- aliases ---------------------------------------------------------------------------------------------------

def test_aliases_share_storage_and_launch_nothing(dev, rng):
    x, tx = _pair(dev, rng, (3, 1, 4, 1))
    with launched() as names:
        cases = [(V.squeeze(x), tx.squeeze()), (V.squeeze(x, -1), tx.squeeze(-1)), (V.squeeze(x, (1, 3)),
                 tx.squeeze((1, 3))), (V.squeeze(x, 0), tx.squeeze(0)), (V.unsqueeze(x, -5), tx.unsqueeze(-5)),
                 (V.unsqueeze(x, 4), tx.unsqueeze(4)), (V.unflatten(x, 2, (2, -1)), tx.unflatten(2, (2, -1))),
                 (V.flatten(x, 1), tx.flatten(1)), (V.getitem(x, (None, Ellipsis)), tx[None, ...]),
                 (V.permute(x, 0, 3, 2, 1), tx.permute(0, 3, 2, 1)), (V.expand(x, 3, 1, 4, -1), tx.expand(3, 1, 4, -1)),
                 (V.narrow(x, 2, 0, 4), tx.narrow(2, 0, 4))]
    assert names == []  # a view that is x's own layout (size-1 dims moved) is an alias too
    for y, ty in cases:
        assert y.shape == tuple(ty.shape) and y.storage is x.storage
    y = V.unflatten(V.squeeze(x), 0, (1, 3))
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(g, dev))
    np.testing.assert_array_equal(x.grad.numpy(), g.reshape(x.shape))
    with pytest.raises(ValueError, match=r"unflatten: sizes \(3, 2\) multiply to 6, dimension 2 of shape"):
        V.unflatten(x, 2, (3, 2))


# ---- indexing --------------------------------------------------------------------------------------------------

KEYS = [0, -1, (slice(1, None), 2), (Ellipsis, slice(None, None, 2)), (slice(None), None, slice(-3, -1), -2),
        (1, Ellipsis, None, slice(0, 7, 3)), (slice(5, 2),), (slice(None), slice(None), 4, slice(1, 2)),
        (slice(None), [2, 0, 2, -1]), (1, slice(None), np.array([[0, 1], [4, 4]])), (Ellipsis, [1])]


@pytest.mark.parametrize("key", KEYS, ids=[str(k) for k in KEYS])
def test_getitem(dev, rng, key):
    def theirs(x):
        k = tuple(torch.tensor(v) if isinstance(v, (list, np.ndarray)) else v for v in key) \
            if isinstance(key, tuple) else key
        return x[k]
    _check(dev, rng, [(3, 4, 5, 2)], lambda x: V.getitem(x, key), theirs, f"x[{key}]")


def test_getitem_index_tensor_and_int_data(dev, rng):
    a = rng.integers(-50, 50, (4, 6)).astype(np.int32)
    x = clnet.tensor(a, dev)
    index = clnet.tensor(np.array([5, 0, -6, 5]), dev)
    for key in [(slice(None), index), (slice(1, 3), 2), (None, -1, slice(None, None, 4))]:
        ta = torch.tensor(a)
        tk = tuple(torch.tensor(index.numpy()).long() if isinstance(v, clnet.Tensor) else v for v in key)
        np.testing.assert_array_equal(V.getitem(x, key).numpy(), ta[tk].numpy())


def test_getitem_refusals(dev):
    x = clnet.tensor(np.ones((3, 4), np.float32), dev)
    with no_launch():
        with pytest.raises(ValueError, match=r"slice\(None, None, -1\) has step -1: .*positive steps only \(flip is "
                                             r"not supported\)"):
            V.getitem(x, (slice(None), slice(None, None, -1)))
        with pytest.raises(IndexError, match=r"index 3 is out of range for dimension 0 of size 3 \(shape \(3, 4\)\)"):
            V.getitem(x, 3)
        with pytest.raises(IndexError, match="too many indices"):
            V.getitem(x, (0, 0, 0))
        with pytest.raises(clnet.Error, match="boolean masks are not supported"):
            V.getitem(x, np.array([True, False, True]))
        with pytest.raises(clnet.Error, match="more than one index list"):
            V.getitem(x, ([0, 1], [1, 2]))
        with pytest.raises(IndexError, match=r"index values in \[-4, 0\] are out of range for a dimension of size 3"):
            V.getitem(x, [-4, 0])
        with pytest.raises(TypeError, match="indices must be ints"):
            V.getitem(x, 1.5)


def test_setitem(dev, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    v = rng.standard_normal((4, 1)).astype(np.float32)
    x, expected = clnet.tensor(a, dev), a.copy()
    V.setitem(x, (slice(None), 1), 2.5)
    expected[:, 1] = 2.5
    V.setitem(x, (Ellipsis, slice(1, 5, 3)), clnet.tensor(v, dev))
    expected[..., 1:5:3] = v
    V.setitem(x, (-1, None, slice(None), 0), clnet.tensor(v[:, 0], dev))
    expected[-1, None, :, 0] = v[:, 0]
    np.testing.assert_array_equal(x.numpy(), expected)
    flat = x.reshape(60)  # an alias: assignment through it writes x
    V.setitem(flat, slice(0, 2), -1.0)
    expected.reshape(60)[:2] = -1.0
    np.testing.assert_array_equal(x.numpy(), expected)
    n = clnet.tensor(np.arange(10), dev)
    V.setitem(n, slice(2, 8, 2), 7)
    np.testing.assert_array_equal(n.numpy(), [0, 1, 7, 3, 7, 5, 7, 7, 8, 9])
    w, ints = clnet.tensor(a, dev, requires_grad=True), clnet.tensor(np.arange(5), dev)
    with no_launch():
        with pytest.raises(RuntimeError, match=r"x\[...\] = value: in-place assignment where autograd records"):
            V.setitem(w, 0, 1.0)
        with pytest.raises(ValueError, match=r"a value of shape \(2,\) does not broadcast to the indexed shape"):
            V.setitem(x, 0, clnet.tensor(np.ones(2, np.float32), dev))
        with pytest.raises(TypeError, match="the value is int32, the tensor float32"):
            V.setitem(x, (0, 0), ints)
    with clnet.no_grad():
        V.setitem(w, 0, 1.0)
    assert (w.numpy()[0] == 1.0).all()


def test_writes_to_a_copy_standing_for_a_view_are_refused(dev, rng):
    """x[0], x[:, 1:3], x.t(), chunk, narrow, expand are copies in clnet where PyTorch's are views of x's memory: an
    in-place write to one (a method, or assignment into it) is refused, since it would leave x as it is, where
    PyTorch's changes x. x[i] += y still writes x (Python's getitem, iadd, setitem), and the copies PyTorch makes
    too (repeat, an index list), reshape's aliases, contiguous() and clone() may be written."""
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = clnet.tensor(a, dev)
    for what, write in [("add_", lambda: x[0].add_(1.0)), ("fill_", lambda: x[:, 1:3].fill_(5.0)),
                        ("mul_", lambda: x.t().mul_(0.0)), ("fill_", lambda: x.chunk(2, dim=1)[1].fill_(7.0)),
                        ("zero_", lambda: x.narrow(0, 1, 2).zero_()), ("copy_", lambda: x.expand(2, 3, 4).copy_(
                            clnet.zeros(2, 3, 4, device=dev))),
                        (r"x\[...\] = value", lambda: V.setitem(x[0], 1, 5.0)),
                        ("fill_", lambda: x[0].contiguous().fill_(1.0)),  # PyTorch's x[0] is contiguous: a view still
                        ("add_", lambda: x[1:].reshape(8).add_(1.0)), ("add_", lambda: x.t().unsqueeze(0).add_(1.0)),
                        ("zero_", lambda: x[:, 0].reshape(3, 1).zero_())]:
        with pytest.raises(RuntimeError, match=rf"{what}: this tensor of shape .* is the result of .*, a copy in "
                                               r"clnet where PyTorch's is a view"):
            write()
    np.testing.assert_array_equal(x.numpy(), a)
    x[1:3] += 1.0
    expected = a.copy()
    expected[1:3] += 1.0
    np.testing.assert_array_equal(x.numpy(), expected)
    for own in (x.repeat(2, 1), x[[0, 2]], x.t().contiguous(), x.t().clone(), x.t().reshape(12), x.reshape(12)):
        own.add_(1.0)
    expected += 1.0  # the reshape's alias wrote x
    np.testing.assert_array_equal(x.numpy(), expected)
    # results that are new tensors in PyTorch, written in place: x unchanged (some were x itself)
    from clnet.nn import functional as F
    for new in (lambda: clnet.cat([x]), lambda: clnet.stack([x])[0], lambda: F.pad(x, (0, 0)), lambda: x ** 1,
                lambda: x.repeat(1, 1), lambda: x.tile((1, 1))):
        y = new()
        y += 1.0
        np.testing.assert_array_equal(x.numpy(), expected)


# ---- expand, repeat, narrow, split, chunk ----------------------------------------------------------------------

@pytest.mark.parametrize("shape, sizes", [((3, 1, 5), (2, 3, 31, -1)), ((1,), (0,)), ((1, 1), (33, 3))])
def test_expand(dev, rng, shape, sizes):
    _check(dev, rng, [shape], lambda x: V.expand(x, *sizes), lambda x: x.expand(*sizes), f"expand{sizes}")


def test_expand_as_and_refusal(dev, rng):
    _check(dev, rng, [(4, 1)], lambda x: V.expand_as(x, clnet.tensor(np.ones((2, 4, 3)), dev)),
           lambda x: x.expand_as(torch.ones(2, 4, 3)), "expand_as")
    with pytest.raises(ValueError, match=r"expand: cannot expand shape \(4, 2\) to \(4, 3\)"):
        V.expand(clnet.tensor(np.ones((4, 2), np.float32), dev), 4, 3)


@pytest.mark.parametrize("shape, sizes", [((3, 1, 5), (2, 1, 3, 2)), ((2, 3), (1, 1)), ((4,), (0, 2)),
                                          ((2, 1), (3, 33))])
def test_repeat(dev, rng, shape, sizes):
    _check(dev, rng, [shape], lambda x: V.repeat(x, *sizes), lambda x: x.repeat(*sizes), f"repeat{sizes}")


def test_narrow_split_chunk(dev, rng):
    shape = (3, 31, 4)
    _check(dev, rng, [shape], lambda x: V.narrow(x, -2, 29, 2), lambda x: x.narrow(-2, 29, 2), "narrow")
    _check(dev, rng, [shape], lambda x: V.narrow(x, 1, -3, 0), lambda x: x.narrow(1, -3, 0), "narrow empty")
    _check(dev, rng, [shape], lambda x: V.select(x, 2, -1), lambda x: x.select(2, -1), "select")
    for ours, theirs, name in [(lambda x: V.split(x, 10, 1), lambda x: x.split(10, 1), "split 10"),
                               (lambda x: V.split(x, [0, 30, 1], -2), lambda x: x.split([0, 30, 1], -2), "sections"),
                               (lambda x: V.chunk(x, 4, 1), lambda x: x.chunk(4, 1), "chunk 4"),
                               (lambda x: V.chunk(x, 5, 0), lambda x: x.chunk(5, 0), "chunk 5 of 3")]:
        x, tx = _pair(dev, rng, shape)
        ys, tys = ours(x), theirs(tx)
        assert [y.shape for y in ys] == [tuple(t.shape) for t in tys], name
        # every piece but one takes part in the loss: the unused piece's rows get no gradient
        weights = [rng.standard_normal(y.shape).astype(np.float32) for y in ys]
        loss, tloss = None, 0
        for i, (y, ty, w) in enumerate(zip(ys, tys, weights)):
            np.testing.assert_array_equal(y.numpy(), ty.detach().numpy().astype(np.float32), err_msg=name)
            if i == 1 or not y.size:
                continue
            tloss = tloss + (ty * torch.tensor(w, dtype=torch.float64)).sum()
            y.backward(clnet.tensor(w, dev))
        tloss.backward()
        assert_close(x.grad.numpy(), tx.grad.numpy(), f"{name}: gradient", tol=1e-6)
    _check(dev, rng, [(3, 4)], lambda x: V.stack(V.unbind(x, 1)[::-2], 0), lambda x: torch.stack(x.unbind(1)[::-2]),
           "unbind")
    _check(dev, rng, [(2, 3)], lambda x: V.tile(x, (2,)), lambda x: x.tile((2,)), "tile")
    empty = clnet.tensor(np.ones((0, 2), np.float32), dev)
    assert [y.shape for y in V.chunk(empty, 3)] == [tuple(t.shape) for t in torch.ones(0, 2).chunk(3)]
    with pytest.raises(ValueError, match=r"narrow: start 30 \+ length 2 exceeds dimension 1 of size 31"):
        V.narrow(clnet.tensor(np.ones(shape, np.float32), dev), 1, 30, 2)
    with pytest.raises(ValueError, match=r"split: sections \(1, 2\) sum to 3, dimension 1 of shape"):
        V.split(clnet.tensor(np.ones(shape, np.float32), dev), [1, 2], 1)


# ---- index_select, gather --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, -1, 1])
def test_index_select(dev, rng, dim):
    shape = (5, 3, 33)
    size = shape[dim]
    index = rng.integers(0, size, 7)
    index[:3] = size - 1  # repeats: their gradients add up
    index_big = rng.integers(0, 40, 300)
    index_big[-5:] = index_big[0]
    _check(dev, rng, [shape], lambda x: V.index_select(x, dim, clnet.tensor(np.zeros(0, np.int32), dev)),
           lambda x: x.index_select(dim, torch.zeros(0, dtype=torch.long)), "index_select of no indices")
    with launched() as names:  # a few indices: each gradient element scans them
        _check(dev, rng, [shape], lambda x: V.index_select(x, dim, index),
               lambda x: x.index_select(dim, torch.tensor(index)), f"index_select dim {dim}")
    assert "index_select_bwd" in names and "index_select_bwd_chain" not in names
    if dim == 0:
        with launched() as names:  # a table of 40 rows and 300 indices: linked chains, not 300 scans per element
            _check(dev, rng, [(40, 33)], lambda x: V.index_select(x, 0, index_big),
                   lambda x: x.index_select(0, torch.tensor(index_big)), "index_select of a large table")
        assert "index_select_bwd_chain" in names and "index_select_bwd" not in names
    with no_launch(), pytest.raises(IndexError, match=r"index_select: index values in \[-1, 0\] are out of range"):
        V.index_select(clnet.tensor(np.ones(shape, np.float32), dev), dim, [0, -1])


@pytest.mark.parametrize("dim", [0, -1])
def test_gather(dev, rng, dim):
    shape = (4, 3, 5)
    ishape = (6, 2, 5) if dim == 0 else (3, 3, 9)  # smaller than x in the other dims, repeats along dim
    index = rng.integers(0, shape[dim], ishape)
    _check(dev, rng, [shape], lambda x: V.gather(x, dim, index), lambda x: x.gather(dim, torch.tensor(index)),
           f"gather dim {dim}")
    with pytest.raises(ValueError, match=r"gather: the index of shape \(5, 3, 5\) is larger than the tensor"):
        V.gather(clnet.tensor(np.ones(shape, np.float32), dev), 1, np.zeros((5, 3, 5), np.int64))


def test_unknown_out_of_range_index_reads_nan(dev):
    """An index tensor whose values clnet cannot know (a computed one) reads NaN outside the dimension, never memory
    outside the tensor."""
    x = clnet.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), dev)
    index = clnet.tensor(np.array([0, 2, -3]), dev)
    index.value_range = None
    V.setitem(index, 1, 7)
    y = V.index_select(x, 1, index).numpy()
    np.testing.assert_array_equal(y[:, [0, 2]], [[0, 0], [3, 3]])
    assert np.isnan(y[:, 1]).all()


# ---- cat, stack ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_stack(dev, rng, dim):
    shapes = [(3, 2, 5), (3, 2, 5), (3, 2, 5)]
    shapes[1] = tuple(0 if d == dim % 3 else s for d, s in enumerate(shapes[1]))  # an empty input
    shapes[2] = tuple(4 if d == dim % 3 else s for d, s in enumerate(shapes[2]))
    _check(dev, rng, shapes, lambda *xs: V.cat(xs, dim), lambda *xs: torch.cat(xs, dim), f"cat dim {dim}")
    _check(dev, rng, [(3, 1, 2)] * 2, lambda *xs: V.stack(xs, dim), lambda *xs: torch.stack(xs, dim),
           f"stack dim {dim}")
    for dtype in (np.int32, np.bool_):
        arrays = [rng.integers(-9, 9, s).astype(dtype) for s in shapes]
        out = V.cat([clnet.tensor(a, dev) for a in arrays], dim)
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.numpy(), np.concatenate(arrays, dim))


def test_cat_refusals(dev):
    a, b = clnet.tensor(np.ones((2, 3), np.float32), dev), clnet.tensor(np.ones((2, 4), np.float32), dev)
    with no_launch():
        with pytest.raises(ValueError, match=r"cat: tensor 1 has shape \(2, 4\), tensor 0 has \(2, 3\); all sizes "
                                             "but dimension 0 must match"):
            V.cat([a, b])
        with pytest.raises(TypeError, match="cat: tensor 1 is int32, the others float32"):
            V.cat([a, clnet.tensor(np.ones((2, 3), np.int32), dev)], 1)
        with pytest.raises(ValueError, match=r"stack: tensor 1 has shape \(2, 4\)"):
            V.stack([a, b])


# ---- pad -------------------------------------------------------------------------------------------------------

PADS = [((2, 3, 7), (2, 1), "reflect"), ((2, 3, 7), (0, 6), "replicate"), ((1, 2, 4, 5), (1, 3, 2, 0), "reflect"),
        ((1, 2, 4, 5), (3, 1, 0, 2), "replicate"), ((2, 3, 1, 4, 5), (1, 2, 3, 1, 2, 1), "replicate"),
        ((2, 3, 2, 4, 5), (1, 2, 1, 1, 0, 1), "reflect"), ((2, 3, 4), (1, 2, -1, 3), "constant"),
        ((2, 1, 3, 4, 5), (-2, 1, 0, 1, 2, 0, 1, 1), "constant"), ((3, 0, 2), (1, 1, 2, 0), "constant")]


@pytest.mark.parametrize("shape, pad, mode", PADS, ids=[f"{m}{p}" for _, p, m in PADS])
def test_pad(dev, rng, shape, pad, mode):
    F = torch.nn.functional
    value = 1.5 if mode == "constant" else None
    _check(dev, rng, [shape], lambda x: V.pad(x, pad, mode, value), lambda x: F.pad(x, pad, mode, value),
           f"pad {pad} {mode}")


def test_pad_int_and_refusals(dev, rng):
    a = rng.integers(-5, 5, (2, 3)).astype(np.int32)
    y = V.pad(clnet.tensor(a, dev), (1, 2), "reflect")
    np.testing.assert_array_equal(y.numpy(), np.pad(a, ((0, 0), (1, 2)), "reflect"))
    y = V.pad(clnet.tensor(a, dev), (0, 1, 2, -1), value=7)
    np.testing.assert_array_equal(y.numpy(), np.pad(a, ((2, 0), (0, 1)), constant_values=7)[:-1])
    x = clnet.tensor(np.ones((2, 3), np.float32), dev)
    with no_launch():
        with pytest.raises(ValueError, match=r"reflect pads must be smaller than the dimension they pad: pad \(3, 0\)"):
            V.pad(x, (3, 0), "reflect")
        with pytest.raises(ValueError, match="negative pads crop only in mode 'constant'"):
            V.pad(x, (-1, 0), "replicate")
        with pytest.raises(ValueError, match="mode 'circular' is not supported"):
            V.pad(x, (1, 1), "circular")
        with pytest.raises(ValueError, match=r"pad \(1, 1, 1, 1, 1, 1\) pads 3 dimensions, the tensor of shape"):
            V.pad(x, (1,) * 6)


# ---- capture and replay ----------------------------------------------------------------------------------------

def test_views_replay_in_a_graph(dev, rng):
    """A captured step of views (forward and backward) replays on new data as it runs eagerly: the layouts its
    launches read are made outside the capture's recording and outlive it."""
    x = clnet.tensor(np.zeros((4, 5, 6), np.float32), dev, requires_grad=True)
    index = clnet.tensor(np.array([2, 0, 2]), dev)
    g = clnet.tensor(rng.standard_normal((3, 8, 5)).astype(np.float32), dev)

    def step():
        x._mark_grad_zero()  # what an optimizer's zero_grad does
        y = V.getitem(V.permute(x, 2, 0, 1), (slice(None, None, 2), slice(1, None)))  # (3, 3, 5)
        y = V.cat([V.index_select(y, 1, index), V.pad(y, (0, 0, 1, 1), "reflect")], 1)  # (3, 8, 5)
        y.backward(g)
        return y

    # One eager step first, as a training loop runs: a layout first made inside the capture would take a pooled
    # buffer that the step itself used and freed earlier, and a replay, rewriting that buffer, would clobber the
    # layout (its upload is set-up, not replayed): layout.meta's hazard, reported to the lead
    step()
    graph, out = clnet.Graph(), {}
    with graph.capture():
        out["y"] = step()
    for _ in range(2):
        a = rng.standard_normal(x.shape).astype(np.float32)
        with clnet.no_grad():
            x.write(a)
        graph.replay()
        replayed, replayed_grad = out["y"].numpy(), x.grad.numpy()
        eager = step()
        np.testing.assert_array_equal(replayed, eager.numpy())
        np.testing.assert_array_equal(replayed_grad, x.grad.numpy())
        t = torch.tensor(a, dtype=torch.float64, requires_grad=True)
        ty = t.permute(2, 0, 1)[::2, 1:]
        ty = torch.cat([ty.index_select(1, torch.tensor([2, 0, 2])),
                        torch.nn.functional.pad(ty, (0, 0, 1, 1), "reflect")], 1)
        ty.backward(torch.tensor(g.numpy(), dtype=torch.float64))
        np.testing.assert_array_equal(replayed, ty.detach().numpy().astype(np.float32))
        assert_close(replayed_grad, t.grad.numpy(), "replayed gradient", tol=1e-6)
