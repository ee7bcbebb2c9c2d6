"""Batch normalisation and local response normalisation kernels (clnet/normalization.py) against float64 NumPy references
written from the definitions, and against PyTorch where installed; both kernel shapes on every device."""
import numpy as np
import pytest

import clnet
from clnet import normalization as norm, tuning
from conftest import HAVE_TORCH, assert_close, assert_close_to_terms, no_launch

if HAVE_TORCH:
    import torch
    import torch.nn.functional as F

# (N, C, H, W) and (N, C): batch 1 and 3, channels 1, 3 and 17, planes of 1 pixel, fewer than a work-group's 256
# (a work-item's stride crosses several planes), more (P = 1089: the CPU shape's 512-value blocks end mid-plane).
# The CPU shape gives a work-item whole small planes, up to 512 values, in blocks of 64 planes under 8 values: 600
# images of 1 value are 2 runs of 9 and 8 blocks; 70 of 6 values 2 blocks; 40 of 49 values 4 runs; 600 channels of 1
# value are 2 groups of channels in the element-wise passes.
BN_SHAPES = [(1, 3, 5, 7), (3, 17, 1, 1), (3, 1, 33, 7), (2, 3, 33, 33), (1, 17, 7, 5), (5, 17), (3, 1), (600, 3),
             (70, 3, 2, 3), (40, 2, 7, 7), (4, 600)]
EPS = 1e-5


# ---- float64 references, from the definitions ----------------------------------------------------------------------

def _planes(a):
    return a.reshape(a.shape[0], a.shape[1], -1).astype(np.float64)


def bn_stats_ref(x):
    """(mean, biased variance, unbiased variance) per channel."""
    x3 = _planes(x)
    n = x3.shape[0] * x3.shape[2]
    mean = x3.mean(axis=(0, 2))
    ss = ((x3 - mean[None, :, None]) ** 2).sum(axis=(0, 2))
    return mean, ss / n, ss / (n - 1)


def bn_apply_ref(x, mean, invstd, w, b):
    C = x.shape[1]
    w = np.ones(C) if w is None else w.astype(np.float64)
    b = np.zeros(C) if b is None else b.astype(np.float64)
    y = (_planes(x) - mean[None, :, None]) * (invstd * w)[None, :, None] + b[None, :, None]
    return y.reshape(x.shape)


def bn_backward_ref(dy, x, w, mean, invstd):
    """(dx, dweight, dbias) of training mode: dx = w invstd / n (n dy - sum dy - xhat sum dy xhat)."""
    C = x.shape[1]
    w = np.ones(C) if w is None else w.astype(np.float64)
    g, x3 = _planes(dy), _planes(x)
    n = x3.shape[0] * x3.shape[2]
    xhat = (x3 - mean[None, :, None]) * invstd[None, :, None]
    sum_dy, sum_dy_xhat = g.sum(axis=(0, 2)), (g * xhat).sum(axis=(0, 2))
    dx = (w * invstd / n)[None, :, None] * (n * g - sum_dy[None, :, None] - xhat * sum_dy_xhat[None, :, None])
    return dx.reshape(x.shape), sum_dy_xhat, sum_dy


def lrn_ref(x, size, alpha, beta, k):
    """(y, scale): scale[c] = k + alpha/size * sum of x^2 over channels c - size//2 .. c + (size-1)//2 (zero padded)."""
    x3 = _planes(x)
    N, C, P = x3.shape
    padded = np.zeros((N, C + size - 1, P))
    padded[:, size // 2:size // 2 + C] = x3 ** 2
    window = sum(padded[:, j:j + C] for j in range(size))
    scale = k + alpha / size * window
    return (x3 * scale ** -beta).reshape(x.shape), scale.reshape(x.shape)


def lrn_backward_ref(x, dy, size, alpha, beta, k):
    """dx: each output channel j scatters dy y / scale back to the channels of its window (the kernels gather)."""
    y, scale = lrn_ref(x, size, alpha, beta, k)
    x3, g, y3, s3 = _planes(x), _planes(dy), _planes(y), _planes(scale)
    C = x3.shape[1]
    t = np.zeros_like(x3)
    for j in range(C):
        lo, hi = max(0, j - size // 2), min(C - 1, j + (size - 1) // 2)
        t[:, lo:hi + 1] += (g[:, j] * y3[:, j] / s3[:, j])[:, None]
    dx = g * s3 ** -beta - 2 * alpha * beta / size * x3 * t
    return dx.reshape(x.shape)


def test_references_by_finite_differences(rng):
    """The analytic backward references agree with central differences of the forward references (float64)."""
    x = rng.standard_normal((2, 5, 2, 3))
    dy = rng.standard_normal(x.shape)
    w, b = rng.standard_normal(5), rng.standard_normal(5)

    def bn(xv):
        mean, var, _ = bn_stats_ref(xv)
        return (bn_apply_ref(xv, mean, 1 / np.sqrt(var + EPS), w, b) * dy).sum()

    def lrn(xv):
        return (lrn_ref(xv, 4, 0.7, 0.75, 1.5)[0] * dy).sum()

    def numeric(f):
        grad, h = np.zeros_like(x), 1e-6
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = h
            grad[i] = (f(x + e) - f(x - e)) / (2 * h)
        return grad

    mean, var, _ = bn_stats_ref(x)
    dx = bn_backward_ref(dy, x, w, mean, 1 / np.sqrt(var + EPS))[0]
    np.testing.assert_allclose(dx, numeric(bn), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lrn_backward_ref(x, dy, 4, 0.7, 0.75, 1.5), numeric(lrn), rtol=1e-5, atol=1e-7)


# ---- helpers -------------------------------------------------------------------------------------------------------

def _up(a, dev):
    return None if a is None else clnet.tensor(np.ascontiguousarray(a, dtype=np.float32), device=dev)


def _f32(rng, *shape, offset=0.0):
    return (rng.standard_normal(shape) + offset).astype(np.float32)


def _channel_sum(a):
    return _planes(a).sum(axis=(0, 2))


def _xhat(x, mean, invstd):
    return (_planes(x) - mean[None, :, None]) * invstd[None, :, None]


def _xhat_scale(x, mean, invstd):
    """The size xhat's float32 error scales with: |xhat| plus (|x| + |mean|) invstd, since x - mean is rounded at the
    size of x. A channel of a few nearly equal values has a large invstd and an xhat far less certain than its size."""
    return np.abs(_xhat(x, mean, invstd)) + (np.abs(_planes(x)) + np.abs(mean)[None, :, None]) * invstd[None, :, None]


# Per-channel sums of few channels can cancel far below their terms, so they are compared with the size of the terms
# they add (float32's error bound scales with it): 1e-5 of it is about 170 ulps.
SUM_TOL = 1e-5


def check_channel_sums(actual, expected, terms, name):
    assert_close_to_terms(actual, expected, terms, name, SUM_TOL)


def check_dx(dx, expected, dy, x, w, mean, invstd, name):
    """dx = w invstd (dy - mean dy - xhat mean(dy xhat)) cancels where dy is nearly in the span of 1 and xhat (with
    few values per channel): each element is compared with the size of its terms."""
    C = x.shape[1]
    w = np.ones(C) if w is None else np.abs(w.astype(np.float64))
    g, xhat = np.abs(_planes(dy)), _xhat_scale(x, mean, invstd)
    mean_g, mean_gx = g.mean(axis=(0, 2)), (g * xhat).mean(axis=(0, 2))
    terms = (w * invstd)[None, :, None] * (g + mean_g[None, :, None] + xhat * mean_gx[None, :, None])
    assert_close_to_terms(dx, expected, terms.reshape(x.shape), name, 1e-5)


def _torch_bn(x, w, b, rm, rv, training, momentum, dy):
    """PyTorch in float64: (y, running_mean, running_var, dx, dweight, dbias); dweight/dbias None without w."""
    X = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    W = None if w is None else torch.tensor(w, dtype=torch.float64, requires_grad=True)
    B = None if b is None else torch.tensor(b, dtype=torch.float64, requires_grad=True)
    RM, RV = torch.tensor(rm, dtype=torch.float64), torch.tensor(rv, dtype=torch.float64)
    y = F.batch_norm(X, RM, RV, W, B, training, momentum, EPS)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    grads = [None if t is None else t.grad.numpy() for t in (W, B)]
    return y.detach().numpy(), RM.numpy(), RV.numpy(), X.grad.numpy(), *grads


# ---- batch normalisation -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batch_norm_train(dev, rng, kernel_shape, shape, affine):
    """Forward (y, mean, invstd, one running-statistics update) and backward (dx, and dweight/dbias accumulated into
    non-zero gradients) in training mode."""
    C = shape[1]
    x, dy = _f32(rng, *shape, offset=0.5), _f32(rng, *shape)
    w, b = (_f32(rng, C), _f32(rng, C)) if affine else (None, None)
    rm0, rv0 = _f32(rng, C), np.abs(_f32(rng, C)) + 0.5
    rm, rv = _up(rm0, dev), _up(rv0, dev)
    momentum = 0.3

    y, mean, invstd = norm.batch_norm_train_forward(_up(x, dev), _up(w, dev), _up(b, dev), rm, rv, momentum, EPS)
    m_ref, var_ref, unbiased_ref = bn_stats_ref(x)
    inv_ref = 1 / np.sqrt(var_ref + EPS)
    mean_abs = _channel_sum(np.abs(x)) / (x.size // C)
    check_channel_sums(mean.numpy(), m_ref, mean_abs, "mean")
    assert_close(invstd.numpy(), inv_ref, "invstd")
    assert_close(y.numpy(), bn_apply_ref(x, m_ref, inv_ref, w, b), "y")
    rm_terms = (1 - momentum) * np.abs(rm0) + momentum * mean_abs
    check_channel_sums(rm.numpy(), (1 - momentum) * rm0 + momentum * m_ref, rm_terms, "running_mean")
    assert_close(rv.numpy(), (1 - momentum) * rv0 + momentum * unbiased_ref, "running_var")

    dw0, db0 = (_f32(rng, C), _f32(rng, C)) if affine else (None, None)
    dweight, dbias = _up(dw0, dev), _up(db0, dev)
    dx = norm.batch_norm_backward(_up(dy, dev), _up(x, dev), _up(w, dev), mean, invstd, True, dweight, dbias)
    dx_ref, dw_ref, db_ref = bn_backward_ref(dy, x, w, m_ref, inv_ref)
    check_dx(dx.numpy(), dx_ref, dy, x, w, m_ref, inv_ref, "dx")
    dw_scale = _channel_sum(np.abs(dy) * _xhat_scale(x, m_ref, inv_ref).reshape(shape))
    dw_terms = np.abs(dw0) + dw_scale if affine else None
    db_terms = np.abs(db0) + _channel_sum(np.abs(dy)) if affine else None
    if affine:
        check_channel_sums(dweight.numpy(), dw0 + dw_ref, dw_terms, "dweight")
        check_channel_sums(dbias.numpy(), db0 + db_ref, db_terms, "dbias")

    if HAVE_TORCH:
        t_y, t_rm, t_rv, t_dx, t_dw, t_db = _torch_bn(x, w, b, rm0, rv0, True, momentum, dy)
        assert_close(y.numpy(), t_y, "y against torch")
        check_channel_sums(rm.numpy(), t_rm, rm_terms, "running_mean against torch")
        assert_close(rv.numpy(), t_rv, "running_var against torch")
        check_dx(dx.numpy(), t_dx, dy, x, w, m_ref, inv_ref, "dx against torch")
        if affine:
            check_channel_sums(dweight.numpy(), dw0 + t_dw, dw_terms, "dweight against torch")
            check_channel_sums(dbias.numpy(), db0 + t_db, db_terms, "dbias against torch")


@pytest.mark.parametrize("act", ["relu", "relu6"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (2, 3, 33, 33)])
def test_batch_norm_with_its_activation(dev, rng, kernel_shape, act, shape):
    """A training batch norm that applies its activation in its own pass (ops.BatchNormTrain act=, for ONNX's
    BatchNormalization -> Relu): bit for bit the batch norm and then the activation, forward, running statistics and
    every gradient, and against float64 (the activation's mask taken from clnet's output)."""
    from clnet import ops
    C = shape[1]
    x0, dy = _f32(rng, *shape, offset=0.5), _f32(rng, *shape)
    # |weight| 3-5 and bias 0.5-2.5 put every channel's outputs below 0 and, for all but the unluckiest draws, past 6
    w0 = (rng.uniform(3, 5, C) * rng.choice([-1, 1], C)).astype(np.float32)
    b0 = rng.uniform(0.5, 2.5, C).astype(np.float32)
    runs = {}
    for fused in (True, False):
        x, w, b = (clnet.tensor(a, dev, requires_grad=True) for a in (x0, w0, b0))
        rm, rv = _up(np.zeros(C), dev), _up(np.ones(C), dev)
        if fused:
            y = ops.BatchNormTrain.apply(x, w, b, rm, rv, momentum=0.3, eps=EPS, act=act)
        else:
            y = ops.Activation.apply(ops.BatchNormTrain.apply(x, w, b, rm, rv, momentum=0.3, eps=EPS), kind=act)
        (y * _up(dy, dev)).sum().backward()
        runs[fused] = [t.numpy() for t in (y, rm, rv, x.grad, w.grad, b.grad)]
    for name, a, bb in zip(("y", "running_mean", "running_var", "dx", "dweight", "dbias"), runs[True], runs[False]):
        assert np.array_equal(a, bb), f"{act} {name}: the fused pass differs from the batch norm and then {act}"
    y = runs[True][0]
    m_ref, var_ref, _ = bn_stats_ref(x0)
    inv_ref = 1 / np.sqrt(var_ref + EPS)
    pre = bn_apply_ref(x0, m_ref, inv_ref, w0, b0)
    assert (pre < 0).any() and (pre > 0).any() and (act == "relu" or (pre > 6).any())
    expected = np.maximum(pre, 0) if act == "relu" else np.clip(pre, 0, 6)
    assert_close(y, expected, "y")
    live = (y > 0) & (y < 6) if act == "relu6" else y > 0
    dx_ref, dw_ref, db_ref = bn_backward_ref(dy * live, x0, w0, m_ref, inv_ref)
    check_dx(runs[True][3], dx_ref, dy * live, x0, w0, m_ref, inv_ref, "dx")
    check_channel_sums(runs[True][5], db_ref, _channel_sum(np.abs(dy * live)), "dbias")


def test_batch_norm_refuses_an_activation_its_pass_cannot_apply(dev, rng):
    from clnet import ops
    x = _up(_f32(rng, 2, 3, 4, 4), dev)
    rm, rv = _up(np.zeros(3), dev), _up(np.ones(3), dev)
    with no_launch(), pytest.raises(ValueError, match="relu or relu6, not 'sigmoid'"):
        ops.BatchNormTrain.apply(x, None, None, rm, rv, momentum=0.1, eps=EPS, act="sigmoid")


def test_batch_norm_backward_parts(dev, rng, kernel_shape):
    """Without need_dx the parameter gradients still accumulate and None comes back; a single one of them may be
    asked for; with nothing asked, nothing runs. Without running statistics they stay untouched (None)."""
    shape, C = (3, 5, 7, 3), 5
    x, dy, w = _f32(rng, *shape), _f32(rng, *shape), _f32(rng, C)
    y, mean, invstd = norm.batch_norm_train_forward(_up(x, dev), _up(w, dev), None, None, None, 0.1, EPS)
    m_ref, var_ref, _ = bn_stats_ref(x)
    inv_ref = 1 / np.sqrt(var_ref + EPS)
    assert_close(y.numpy(), bn_apply_ref(x, m_ref, inv_ref, w, None), "y without bias")
    _, dw_ref, db_ref = bn_backward_ref(dy, x, w, m_ref, inv_ref)
    dw0, db0 = _f32(rng, C), _f32(rng, C)
    dweight, dbias = _up(dw0, dev), _up(db0, dev)
    args = (_up(dy, dev), _up(x, dev), _up(w, dev), mean, invstd)
    dw_terms = np.abs(dw0) + _channel_sum(np.abs(dy * _xhat(x, m_ref, inv_ref).reshape(shape)))
    db_terms = np.abs(db0) + _channel_sum(np.abs(dy))
    assert norm.batch_norm_backward(*args, False, dweight, dbias) is None
    check_channel_sums(dweight.numpy(), dw0 + dw_ref, dw_terms, "dweight")
    check_channel_sums(dbias.numpy(), db0 + db_ref, db_terms, "dbias")
    assert norm.batch_norm_backward(*args, False, None, dbias) is None
    check_channel_sums(dbias.numpy(), db0 + 2 * db_ref, 2 * db_terms, "dbias accumulated twice")
    assert norm.batch_norm_backward(*args, False, None, None) is None


def test_running_stats_three_calls(dev, rng, kernel_shape):
    """Three successive training calls move the running statistics as PyTorch's BatchNorm2d does (default
    momentum 0.1, running_var updated with the unbiased variance)."""
    C, momentum = 3, 0.1
    rm_ref, rv_ref = np.zeros(C), np.ones(C)
    rm, rv = _up(np.zeros(C), dev), _up(np.ones(C), dev)
    t_rm, t_rv = np.zeros(C), np.ones(C)
    for step in range(3):
        x = _f32(rng, 4, C, 5, 3, offset=step + 1.0) * (step + 1)  # means well away from 0
        norm.batch_norm_train_forward(_up(x, dev), None, None, rm, rv, momentum, EPS)
        mean, _, unbiased = bn_stats_ref(x)
        rm_ref = (1 - momentum) * rm_ref + momentum * mean
        rv_ref = (1 - momentum) * rv_ref + momentum * unbiased
        if HAVE_TORCH:
            _, t_rm, t_rv, *_ = _torch_bn(x, None, None, t_rm, t_rv, True, momentum, np.zeros_like(x))
    assert_close(rm.numpy(), rm_ref, "running_mean after 3 calls")
    assert_close(rv.numpy(), rv_ref, "running_var after 3 calls")
    if HAVE_TORCH:
        assert_close(rm.numpy(), t_rm, "running_mean after 3 calls against torch")
        assert_close(rv.numpy(), t_rv, "running_var after 3 calls against torch")


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (3, 17, 1, 1), (2, 3, 33, 33), (5, 17)])
def test_batch_norm_eval(dev, rng, kernel_shape, shape):
    """Evaluation mode: y from the running statistics; backward with them as constants (dx = dy weight invstd)."""
    C = shape[1]
    x, dy = _f32(rng, *shape), _f32(rng, *shape)
    w, b = _f32(rng, C), _f32(rng, C)
    rm0, rv0 = _f32(rng, C), np.abs(_f32(rng, C)) + 0.5
    rv0[::2] *= 2e-5  # variances of eps's order: a lost or doubled eps is an O(1) error there
    inv = 1 / np.sqrt(rv0.astype(np.float64) + EPS)
    rm, rv = _up(rm0, dev), _up(rv0, dev)
    y = norm.batch_norm_eval_forward(_up(x, dev), _up(w, dev), _up(b, dev), rm, rv, EPS)
    assert_close(y.numpy(), bn_apply_ref(x, rm0.astype(np.float64), inv, w, b), "y")
    dw0, db0 = _f32(rng, C), _f32(rng, C)
    dweight, dbias = _up(dw0, dev), _up(db0, dev)
    dx = norm.batch_norm_eval_backward(_up(dy, dev), _up(x, dev), _up(w, dev), rm, rv, EPS, True, dweight, dbias)
    gx = dy * _xhat(x, rm0.astype(np.float64), inv).reshape(shape)
    dw_terms, db_terms = np.abs(dw0) + _channel_sum(np.abs(gx)), np.abs(db0) + _channel_sum(np.abs(dy))
    dx_ref = (_planes(dy) * (w * inv)[None, :, None]).reshape(shape)
    assert_close(dx.numpy(), dx_ref, "dx")
    check_channel_sums(dweight.numpy(), dw0 + _channel_sum(gx), dw_terms, "dweight")
    check_channel_sums(dbias.numpy(), db0 + _channel_sum(dy), db_terms, "dbias")
    assert_close(rm.numpy(), rm0, "running_mean unchanged", 1e-30)
    assert_close(rv.numpy(), rv0, "running_var unchanged", 1e-30)
    dx_only = norm.batch_norm_eval_backward(_up(dy, dev), _up(x, dev), None, rm, rv, EPS, True, None, None)
    assert_close(dx_only.numpy(), (_planes(dy) * inv[None, :, None]).reshape(shape), "dx without weight")
    if HAVE_TORCH:
        t_y, _, _, t_dx, t_dw, t_db = _torch_bn(x, w, b, rm0, rv0, False, 0.1, dy)
        assert_close(y.numpy(), t_y, "y against torch")
        assert_close(dx.numpy(), t_dx, "dx against torch")
        check_channel_sums(dweight.numpy(), dw0 + t_dw, dw_terms, "dweight against torch")
        check_channel_sums(dbias.numpy(), db0 + t_db, db_terms, "dbias against torch")


@pytest.mark.parametrize("merged_run", [None, 40])
@pytest.mark.parametrize("runs,shape", [(3, (5, 2, 11, 13)), (7, (5, 2, 11, 13)), (1, (40, 3, 1, 2)),
                                        (1, (700, 7))])
def test_batch_norm_in_runs(dev, rng, monkeypatch, runs, shape, merged_run):
    """The GPU shape's two-pass reductions with each channel cut into runs whose ends fall inside planes (as on GPUs
    for few channels over many pixels), and, for planes under 8 values, into runs of whole images (on inputs this
    small, one or two images a run: 40 runs, or hundreds, more than a finishing work-group's 256 work-items):
    statistics, running statistics and gradients as one run gives. merged_run 40: the passes that merge the records
    themselves (apply, dx) walk runs of their own, 40 pairs, more than the records."""
    monkeypatch.setattr(tuning, "cpu_shaped", lambda dev: False)  # the runs are the GPU shape's
    monkeypatch.setattr(tuning, "reduction_runs", lambda dev, n, groups, lsize: runs)
    if merged_run:
        monkeypatch.setattr(norm, "MERGED_RUN", merged_run)
    C = shape[1]
    x, dy, w, b = _f32(rng, *shape, offset=3.0), _f32(rng, *shape), _f32(rng, C), _f32(rng, C)
    rm, rv = _up(np.zeros(C), dev), _up(np.ones(C), dev)
    y, mean, invstd = norm.batch_norm_train_forward(_up(x, dev), _up(w, dev), _up(b, dev), rm, rv, 0.1, EPS)
    m_ref, var_ref, unbiased_ref = bn_stats_ref(x)
    inv_ref = 1 / np.sqrt(var_ref + EPS)
    assert_close(mean.numpy(), m_ref, "mean", 1e-6)
    assert_close(invstd.numpy(), inv_ref, "invstd")
    assert_close(y.numpy(), bn_apply_ref(x, m_ref, inv_ref, w, b), "y")
    assert_close(rv.numpy(), 0.9 + 0.1 * unbiased_ref, "running_var")
    dweight, dbias = _up(np.zeros(C), dev), _up(np.zeros(C), dev)
    dx = norm.batch_norm_backward(_up(dy, dev), _up(x, dev), _up(w, dev), mean, invstd, True, dweight, dbias)
    dx_ref, dw_ref, db_ref = bn_backward_ref(dy, x, w, m_ref, inv_ref)
    check_dx(dx.numpy(), dx_ref, dy, x, w, m_ref, inv_ref, "dx")
    check_channel_sums(dweight.numpy(), dw_ref, _channel_sum(np.abs(dy * _xhat(x, m_ref, inv_ref).reshape(shape))),
                       "dweight")
    check_channel_sums(dbias.numpy(), db_ref, _channel_sum(np.abs(dy)), "dbias")


def test_batch_norm_large_offset_channel(dev, rng, kernel_shape):
    """80,000 values per channel around 100 with a spread of 1: the variance stays accurate (E[x^2] - E[x]^2 in
    float32 would lose all of it: 100^2 / 1 times float32's 6e-8 is 6e-4 of the variance, times the sums' error
    growth), and so do y and the gradients."""
    shape, C = (8, 2, 100, 100), 2
    x, dy = _f32(rng, *shape, offset=100.0), _f32(rng, *shape)
    w, b = _f32(rng, C), _f32(rng, C)
    rv = _up(np.ones(C), dev)
    y, mean, invstd = norm.batch_norm_train_forward(_up(x, dev), _up(w, dev), _up(b, dev), None, rv, 1.0, EPS)
    m_ref, var_ref, unbiased_ref = bn_stats_ref(x)
    inv_ref = 1 / np.sqrt(var_ref + EPS)
    assert_close(mean.numpy(), m_ref, "mean", 5e-7)  # float32 rounds 100 to within 4e-8 of itself
    assert_close(invstd.numpy(), inv_ref, "invstd", 2e-6)
    assert_close(rv.numpy(), unbiased_ref, "running_var (momentum 1: the batch's unbiased variance)", 2e-6)
    # the float32 mean is at best within half an ulp of 100 (4e-6) of the true one, which shifts every y by that
    assert_close(y.numpy(), bn_apply_ref(x, m_ref, inv_ref, w, b), "y")
    dweight, dbias = _up(np.zeros(C), dev), _up(np.zeros(C), dev)
    dx = norm.batch_norm_backward(_up(dy, dev), _up(x, dev), _up(w, dev), mean, invstd, True, dweight, dbias)
    dx_ref, dw_ref, db_ref = bn_backward_ref(dy, x, w, m_ref, inv_ref)
    assert_close(dx.numpy(), dx_ref, "dx", 5e-6)
    check_channel_sums(dweight.numpy(), dw_ref, _channel_sum(np.abs(dy * _xhat(x, m_ref, inv_ref).reshape(shape))),
                       "dweight")
    check_channel_sums(dbias.numpy(), db_ref, _channel_sum(np.abs(dy)), "dbias")


def test_batch_norm_errors(dev):
    """One value per channel cannot be normalised in training (as PyTorch); per-channel tensors must have C
    values; inputs need a channel axis."""
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        norm.batch_norm_train_forward(_up(np.ones((1, 3)), dev), None, None, None, None, 0.1, EPS)
    with pytest.raises(ValueError, match=r"weight of shape \(3,\)"):
        norm.batch_norm_train_forward(_up(np.ones((2, 3, 2, 2)), dev), _up(np.ones(4), dev), None, None, None, 0.1,
                                      EPS)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\) or \(N, C\)"):
        norm.batch_norm_eval_forward(_up(np.ones(3), dev), None, None, _up(np.ones(3), dev), _up(np.ones(3), dev),
                                     EPS)
    with pytest.raises(ValueError, match="window size"):
        norm.lrn_forward(_up(np.ones((2, 3, 2, 2)), dev), 0)


# ---- local response normalisation ----------------------------------------------------------------------------------

# (3, 600): the CPU shape's work-items take 512 channels of 1 value, so windows straddle two work-items
LRN_SHAPES = [(1, 3, 5, 7), (3, 17, 1, 1), (2, 17, 7, 5), (1, 1, 33, 7), (5, 17), (3, 600)]
# (size, alpha, beta, k): even sizes (whose window is lopsided), AlexNet's (5, 1e-4, 0.75, 2), windows wider than
# the channels; alphas large enough that the window term shows in the gradient
LRN_PARAMS = [(1, 1.0, 0.75, 2.0), (2, 0.3, 0.6, 1.0), (3, 1.0, 0.75, 1.0), (4, 1.0, 0.75, 2.0), (5, 1e-4, 0.75, 2.0),
              (5, 2.0, 1.0, 1.5), (20, 1.0, 0.75, 1.0)]


@pytest.mark.parametrize("size,alpha,beta,k", LRN_PARAMS)
@pytest.mark.parametrize("shape", LRN_SHAPES)
def test_lrn(dev, rng, kernel_shape, shape, size, alpha, beta, k):
    """y, scale and dx against the definitions and against torch.nn.functional.local_response_norm."""
    x, dy = _f32(rng, *shape), _f32(rng, *shape)
    cx = _up(x, dev)
    y, scale = norm.lrn_forward(cx, size, alpha, beta, k)
    y_ref, scale_ref = lrn_ref(x, size, alpha, beta, k)
    assert_close(scale.numpy(), scale_ref, "scale")
    assert_close(y.numpy(), y_ref, "y")
    dx = norm.lrn_backward(cx, y, scale, _up(dy, dev), size, alpha, beta, k)
    assert_close(dx.numpy(), lrn_backward_ref(x, dy, size, alpha, beta, k), "dx")
    if HAVE_TORCH:
        # torch's local_response_norm wants 3 or more dimensions: (N, C) is (N, C, 1) to it
        X = torch.tensor(x.reshape(x.shape + (1,) * (3 - x.ndim)), dtype=torch.float64, requires_grad=True)
        t_y = F.local_response_norm(X, size, alpha, beta, k)
        t_y.backward(torch.tensor(dy.reshape(X.shape), dtype=torch.float64))
        assert_close(y.numpy(), t_y.detach().numpy().reshape(shape), "y against torch")
        assert_close(dx.numpy(), X.grad.numpy().reshape(shape), "dx against torch")
