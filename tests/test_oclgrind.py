"""Every kernel family under Oclgrind's memory, race and API checks, on tiny shapes that reach each kernel's edges.

Oclgrind interprets every work-item and reports out-of-bounds accesses, data races between work-items and
work-groups, barrier misuse and OpenCL API errors on stderr (it does not fail the call). Each family runs in a child
process (this file run as a script) with the checks switched on; any output on the child's stderr fails the test.
Results are also compared with NumPy, so a build Oclgrind was given (without `restrict`) still computes the same.
Oclgrind is some 10^4 times slower than PoCL: the shapes are the smallest that cross each tile's edge.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

OCLGRIND_LIBRARY = "/usr/lib/oclgrind/liboclgrind-rt-icd.so"  # Debian's oclgrind package
CHECKS = dict(OCLGRIND_CHECK_API="1", OCLGRIND_DATA_RACES="1")
# OCLGRIND_UNINITIALIZED stays off: Oclgrind 21.10's uninitialised-value plugin stops at LLVM's `freeze` (its own
# optimiser emits one in softmax_fwd); with OCLGRIND_BUILD_OPTIONS=-cl-opt-disable it runs, but crashes (SIGSEGV) in
# gemm_block and reports sums of host-written parameters in the optimizer case that an isolated sum does not.

FAMILIES = ("gemm_tiled", "gemm_block", "gemm_split_transposed", "linear", "im2col", "direct", "winograd_3x3",
            "winograd_5x5", "winograd_4x4", "pooling", "elementwise", "softmax", "optimizers", "batch_norm", "lrn",
            "cat", "pointwise", "reduce", "views", "depthwise", "conv1x1", "chain")


def _oclgrind_present():
    return os.path.exists(OCLGRIND_LIBRARY)


needs_oclgrind = pytest.mark.skipif(not _oclgrind_present(), reason=f"Oclgrind is not installed ({OCLGRIND_LIBRARY}: "
                                    "`apt-get install oclgrind`)")


@needs_oclgrind
def test_oclgrind_is_found_and_only_chosen_by_name():
    """Debian's package installs no ICD file; clnet registers the library, lists the device last and picks it only
    when asked for by name (it calls itself a CPU, a GPU and an accelerator at once)."""
    import clnet
    rows = [r for r in clnet.list_devices() if r["platform"] == "Oclgrind"]
    assert len(rows) == 1 and rows[0]["simulator"] and rows[0]["index"] == len(clnet.list_devices()) - 1
    dev = clnet.device("oclgrind")
    assert dev.is_simulator and dev.index == rows[0]["index"]
    assert all(clnet.device(spec) is not dev for spec in ("auto", "cpu"))
    assert "-Drestrict=" in clnet.kernels.build_options(dev)
    assert "-Drestrict=" not in clnet.kernels.build_options(clnet.device("cpu"))


@needs_oclgrind
@pytest.mark.parametrize("family", FAMILIES)
def test_family_under_oclgrind(family):
    env = dict(os.environ, **CHECKS, CLNET_CACHE_DIR=tempfile.mkdtemp(prefix="clnet-oclgrind-cache-"))
    child = subprocess.run([sys.executable, os.path.abspath(__file__), family], capture_output=True, text=True,
                           env=env, timeout=900)
    # Oclgrind's compiler prints a count of its warnings (PoCL-style unrolling notes) to stderr: not a report
    report = "\n".join(line for line in child.stderr.splitlines()
                        if line.strip() and not re.fullmatch(r"\d+ warnings? generated\.", line.strip()))
    assert child.returncode == 0 and not report, \
        f"{family} under Oclgrind (exit {child.returncode}):\n{report[-6000:]}\n{child.stdout[-2000:]}"
    assert f"ran {family}" in child.stdout


# ---- the child: runs one family on the Oclgrind device ----

def _close(actual, expected, name, tol=1e-4):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    err = np.abs(actual - expected).max(initial=0) / max(np.abs(expected).max(initial=0), 1e-30)
    assert err < tol, f"{name}: relative error {err:.2e}"


def _gemm_case(clnet, dev, rng, cfg, M, N, K, ksplit=1, ta=False, tb=False, batch=1, beta=0.0):
    from clnet import gemm
    from clnet.gemm import Mat
    A = rng.standard_normal((batch, M, K)).astype(np.float32)
    Bt = rng.standard_normal((batch, N, K)).astype(np.float32)  # B stored (N, K): k-fast, as a weight is
    C0 = rng.standard_normal((batch, M, N)).astype(np.float32)
    C = clnet.tensor(C0, dev)
    gemm._gemm_choice(dev, dict(cfg=cfg, ksplit=ksplit, ta=ta, tb=tb), M, N, K, clnet.tensor(A, dev),
                      Mat(bs=M * K, rs=K, cs=1), clnet.tensor(Bt, dev), Mat(bs=N * K, rs=1, cs=K), C,
                      Mat(bs=M * N, rs=N, cs=1), 1.0, beta, batch, None, 0, 0, False, "oclgrind")
    expected = np.einsum("gmk,gnk->gmn", A.astype(np.float64), Bt.astype(np.float64)) + beta * C0
    _close(C.numpy(), expected, f"C {M}x{N}x{K} by {cfg} ksplit {ksplit} ta {ta} tb {tb}")


def _gemm_configs(dev, kernel):
    from clnet import tuning
    configs = [c for c in tuning.GEMM_CANDIDATES["gpu"] + tuning.GEMM_CANDIDATES["cpu"] if c["kernel"] == kernel]
    return [c for c in configs if tuning.fits(dev, c)]


def _gemm_tiled(clnet, dev, rng):
    # 5x7x9: below one tile, k not a multiple of 4; 67x66x36: across a 64-wide tile's edge, k vectorisable, 3 slices
    for cfg in _gemm_configs(dev, "gemm_tiled"):
        _gemm_case(clnet, dev, rng, cfg, 5, 7, 9)
        _gemm_case(clnet, dev, rng, cfg, 67, 66, 36, beta=1.0)


def _gemm_block(clnet, dev, rng):
    for cfg in _gemm_configs(dev, "gemm_block"):
        _gemm_case(clnet, dev, rng, cfg, 5, 7, 9)
        _gemm_case(clnet, dev, rng, cfg, 49, 17, 260, beta=1.0)  # across RM=48 and a 256-deep slice


def _gemm_split_transposed(clnet, dev, rng):
    from clnet import gemm, tuning
    from clnet.gemm import Mat
    for cfg in (tuning.GEMM_TILED_SMALL, tuning.GEMM_BLOCK):
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            _gemm_case(clnet, dev, rng, cfg, 6, 5, 41, ksplit=3, ta=ta, tb=tb, batch=2)
    # B's rows split over (image, pixel), as x^T in a 1x1 layer's weight gradient: 5 pixels (scalar loads wrapping
    # within a slice) in 3 slices of 16, 8 (float4s along k) in 2 split-K parts of 2 slices; the last image ends the
    # buffer
    M, N, imgs = 6, 5, 7
    for P, ksplit in ((5, 1), (8, 2)):
        K = imgs * P
        A = rng.standard_normal((M, K)).astype(np.float32)
        x = rng.standard_normal((imgs, N, P)).astype(np.float32)
        C = clnet.tensor(np.zeros((M, N), np.float32), dev)
        gemm._gemm_choice(dev, dict(cfg=tuning.GEMM_TILED_SMALL, ksplit=ksplit), M, N, K, clnet.tensor(A, dev),
                          Mat(rs=K, cs=1), clnet.tensor(x, dev), Mat(rs=1, cs=P, cdiv=P, cso=N * P, split_rows=True),
                          C, Mat(rs=N, cs=1), 1.0, 0.0, 1, None, 0, 0, False, "oclgrind")
        _close(C.numpy(), A.astype(np.float64) @ x.transpose(0, 2, 1).reshape(K, N), f"B's rows split, P {P}")


def _backward(clnet, y, rng):
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(g, y.device))


def _param(clnet, dev, rng, *shape):
    return clnet.tensor(rng.standard_normal(shape).astype(np.float32), dev, requires_grad=True)


def _linear(clnet, dev, rng):
    import clnet.nn.functional as F
    for n, i, o in ((1, 3, 5), (3, 33, 65)):
        x, w, b = _param(clnet, dev, rng, n, i), _param(clnet, dev, rng, o, i), _param(clnet, dev, rng, o)
        y = F.relu(F.linear(x, w, b))
        _close(y.numpy(), np.maximum(x.numpy() @ w.numpy().T + b.numpy(), 0), "linear")
        _backward(clnet, y, rng)
    # a fused ReLU at batch 1: its gradient inside the products, the bias gradient in the rank-1 launch (GPU shape)
    model = clnet.nn.Sequential(clnet.nn.Linear(7, 9), clnet.nn.ReLU(), clnet.nn.Linear(9, 4)).to(dev)
    x = _param(clnet, dev, rng, 1, 7)
    _backward(clnet, model(x), rng)
    assert np.all(np.isfinite(x.grad.numpy())) and np.all(np.isfinite(model[0].bias.grad.numpy()))


def _conv_cases(clnet, dev, rng, cases, algorithm, shapes=("own", "other")):
    """Forward and every gradient of each conv case, with algorithm as the default for every pass it can run, in
    both data-movement kernel shapes."""
    import clnet.nn.functional as F
    from clnet import tuning
    default_shape = tuning.cpu_shaped
    for shape in shapes:
        tuning.cpu_shaped = default_shape if shape == "own" else (lambda d: not default_shape(d))
        tuning.conv_default = lambda d, s, options, kind=None: algorithm if algorithm in options else "im2col"
        tuning.forget()
        for xs, ws, kw in cases:
            x, w = _param(clnet, dev, rng, *xs), _param(clnet, dev, rng, *ws)
            b = _param(clnet, dev, rng, ws[0])
            y = F.conv2d(x, w, b, **kw)
            _backward(clnet, y, rng)
            assert np.all(np.isfinite(y.numpy())) and np.all(np.isfinite(x.grad.numpy()))
            assert np.all(np.isfinite(w.grad.numpy())) and np.all(np.isfinite(b.grad.numpy()))
    tuning.cpu_shaped = default_shape


def _im2col(clnet, dev, rng):
    _conv_cases(clnet, dev, rng, [((2, 4, 7, 6), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
                                  ((1, 3, 5, 5), (2, 3, 3, 3), dict(padding=2, dilation=2)),
                                  ((2, 3, 4, 5), (5, 3, 1, 1), {})], "im2col")
    # a convolution and its fused ReLU: the ReLU's gradient and the bias's in one pass (bias_grad), both shapes,
    # the GPU shape's sums in three runs
    from clnet import tuning
    default_shape, default_runs = tuning.cpu_shaped, tuning.reduction_runs
    tuning.reduction_runs = lambda d, n, groups, lsize: 3
    for shape in ("own", "other"):
        tuning.cpu_shaped = default_shape if shape == "own" else (lambda d: not default_shape(d))
        model = clnet.nn.Sequential(clnet.nn.Conv2d(3, 5, 3, padding=1), clnet.nn.ReLU()).to(dev)
        _backward(clnet, model(_param(clnet, dev, rng, 2, 3, 9, 7)), rng)
    tuning.cpu_shaped, tuning.reduction_runs = default_shape, default_runs


def _direct(clnet, dev, rng):
    from clnet import direct, tuning
    cases = [((2, 3, 7, 9), (5, 3, 3, 3), dict(padding=1)), ((1, 2, 6, 5), (3, 2, 5, 5), dict(stride=2, padding=2))]
    _conv_cases(clnet, dev, rng, cases, "direct")
    layer = clnet.nn.Conv2d(3, 9, 3, padding=1).to(dev)  # 9 channels: a partial block of 4, 8 or 16
    x = clnet.tensor(rng.standard_normal((1, 3, 5, 6)).astype(np.float32), dev)
    for cfg in (tuning.DIRECT_CPU, tuning.DIRECT_GPU, dict(tuning.DIRECT_CPU, OB=16, PX=4, ROWS=1)):
        direct.conv2d_forward(x, layer.weight.data, layer.bias.data, layer.conv_shape(x.shape), cfg=cfg).numpy()


def _winograd(clnet, dev, rng, r, algorithm):
    # odd sizes leave partial tiles at the right and bottom edges; a batch of 2 crosses images
    _conv_cases(clnet, dev, rng, [((2, 3, 7, 5), (4, 3, r, r), dict(padding=r // 2)),
                                  ((1, 2, 6, 6), (3, 2, r, r), {})], algorithm, shapes=("own",))


def _depthwise(clnet, dev, rng):
    # depthwise.cl's kernels (the GPU shape; the CPU's row kernels on the 35-wide plane) and depthwise_cpu.cl's plane
    # kernels (16- and 32-float tiles; stride 2; two output channels per input channel; rows of 15 lanes)
    _conv_cases(clnet, dev, rng, [((2, 3, 7, 7), (3, 1, 3, 3), dict(padding=1, groups=3)),
                                  ((1, 2, 9, 8), (4, 1, 3, 3), dict(stride=2, padding=1, groups=2)),
                                  ((1, 2, 6, 15), (4, 1, 3, 3), dict(padding=1, groups=2)),
                                  ((1, 2, 5, 20), (2, 1, 5, 5), dict(padding=2, groups=2)),
                                  ((1, 2, 3, 35), (2, 1, 3, 3), dict(padding=1, groups=2))], "depthwise")


def _conv1x1(clnet, dev, rng):
    # conv1x1.cl (CPU-shaped: taken where the device runs that shape): 21 pixels, less than a run of 32; 9 output
    # channels, a block of 8 and a partial one; two images (each image's share, then their sum); batch 1 in groups
    _conv_cases(clnet, dev, rng, [((2, 5, 3, 7), (9, 5, 1, 1), {}), ((1, 4, 2, 3), (6, 2, 1, 1), dict(groups=2))],
                "conv1x1")


def _pooling(clnet, dev, rng):
    import clnet.nn.functional as F
    from clnet import tuning
    default_shape, default_runs = tuning.cpu_shaped, tuning.reduction_runs
    for shape in ("own", "other"):
        tuning.cpu_shaped = default_shape if shape == "own" else (lambda d: not default_shape(d))
        # the GPU shape's channels in three runs, whose ends fall inside planes: the records merged in the passes
        # that use them (batchnorm_apply_runs, batchnorm_dx_runs) walk each run's edges
        tuning.reduction_runs = default_runs if shape == "own" else (lambda d, n, groups, lsize: 3)
        for kw in (dict(kernel_size=3, stride=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                   dict(kernel_size=2)):
            for pool in (F.max_pool2d, F.avg_pool2d):
                x = _param(clnet, dev, rng, 2, 3, 7, 6)
                _backward(clnet, pool(x, **kw), rng)
        x = _param(clnet, dev, rng, 2, 3, 7, 6)
        _backward(clnet, F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), rng)
        _backward(clnet, F.adaptive_avg_pool2d(_param(clnet, dev, rng, 1, 2, 6, 4), (3, 2)), rng)
        _backward(clnet, F.adaptive_avg_pool2d(_param(clnet, dev, rng, 2, 3, 5, 3), 1), rng)  # avgpool2d_bwd_whole
        # Conv2d, ReLU, MaxPool2d: in the GPU shape the pooling's backward writes the bias gradient
        # (maxpool2d_bwd_bias), a work-group a channel over 2 x 7 x 6 pixels, fewer than the work-group's items
        model = clnet.nn.Sequential(clnet.nn.Conv2d(3, 4, 3, padding=1), clnet.nn.ReLU(),
                                    clnet.nn.MaxPool2d(3, 2, 1, ceil_mode=True)).to(dev)
        _backward(clnet, model(_param(clnet, dev, rng, 2, 3, 7, 6)), rng)
        assert np.all(np.isfinite(model[0].bias.grad.numpy()))
    tuning.cpu_shaped = default_shape


def _elementwise(clnet, dev, rng):
    import clnet.nn.functional as F
    for n in (1, 5, 33):  # float4 kernels: a lone element, a tail of 1, a tail after 8 quads
        a, b = _param(clnet, dev, rng, n), _param(clnet, dev, rng, n)
        y = F.relu(a * b + a - b) + F.relu6(a) + F.sigmoid(b) + F.tanh(a) + a * 2.0 + 1.0
        _close(y.sum().numpy(), y.numpy().sum(dtype=np.float64), "sum")
        _backward(clnet, y, rng)
        (a * b).mean().backward()
        F.dropout(a, 0.5).numpy()
    # the loader's batches out of a block (copy_batch): 3 images of 5x3 and their labels, then a last one alone
    from clnet import data
    ds = data.Dataset(rng.integers(0, 255, (7, 5, 3)).astype(np.uint8), rng.integers(0, 10, 7), "tiny", 0.5, 0.25)
    at = 0
    for x, y, labels in data.Loader(ds, 3, dev, np.arange(7)):
        _close(x.numpy(), ds.batch(np.arange(at, at + len(labels)))[0], "a batch's images")
        assert np.array_equal(y.numpy(), labels)
        at += len(labels)


def _softmax(clnet, dev, rng):
    import clnet.nn.functional as F
    for n, c in ((1, 3), (3, 33)):
        z = _param(clnet, dev, rng, n, c)
        labels = rng.integers(0, c, n)
        loss = F.cross_entropy(z, labels)
        loss.backward()
        zz = z.numpy().astype(np.float64)
        logp = zz - zz.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        _close(loss.item(), -logp[np.arange(n), labels].mean(), "cross entropy")
        _backward(clnet, F.softmax(z, dim=1), rng)
        _backward(clnet, F.log_softmax(z, dim=0), rng)


def _optimizers(clnet, dev, rng):
    from clnet import optim
    for make in (lambda p: optim.SGD(p, lr=0.1), lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                                     weight_decay=1e-2),
                 lambda p: optim.Adam(p, lr=1e-2), lambda p: optim.AdamW(p, lr=1e-2)):
        params = [_param(clnet, dev, rng, 5), _param(clnet, dev, rng, 3, 11)]
        opt = make(params)
        for _ in range(2):
            opt.zero_grad()
            (params[0].sum() + params[1].sum()).backward()
            opt.step()
        assert all(np.all(np.isfinite(p.numpy())) for p in params)
    # a batch-1 dense weight gradient taken by its SGD step in the hook (sgd.cl rank1_sgd_rows), at every size
    from clnet import conv, kernels, nn, tuning
    conv.DEFER_MIN = 1
    default_shape, tuning.cpu_shaped = tuning.cpu_shaped, lambda d: True  # the CPU's batch-1 kernels
    names, launch = [], kernels.launch

    def spy(dev, k, *args, **kwargs):
        names.append(k.name)
        return launch(dev, k, *args, **kwargs)
    kernels.launch = spy
    for kw in (dict(lr=0.1), dict(lr=0.1, momentum=0.9, weight_decay=1e-2)):
        layer = nn.Linear(13, 9).to(dev)
        opts = {id(p): optim.SGD([p], **kw) for p in layer.parameters()}

        def hook(p, opts=opts):
            opts[id(p)].step()
            opts[id(p)].zero_grad()
        for p in layer.parameters():
            p.register_post_accumulate_grad_hook(hook)
        for _ in range(2):
            layer(_param(clnet, dev, rng, 1, 13)).sum().backward()
        assert np.all(np.isfinite(layer.weight.numpy()))
    kernels.launch, tuning.cpu_shaped = launch, default_shape
    assert names.count("rank1_sgd_rows") >= 2, names


def _batch_norm(clnet, dev, rng):
    import clnet.nn.functional as F
    from clnet import tuning
    default_shape, default_runs = tuning.cpu_shaped, tuning.reduction_runs
    for shape in ("own", "other"):
        tuning.cpu_shaped = default_shape if shape == "own" else (lambda d: not default_shape(d))
        # the GPU shape's channels in three runs, whose ends fall inside planes; (2, 2, 40, 40)'s runs are long
        # enough for its work-items' UNROLL loads together (LSIZE 256), the others' for their last few alone
        tuning.reduction_runs = lambda d, n, groups, lsize: 3
        for xs in ((2, 3, 5, 7), (3, 2, 1, 1), (1, 5, 33, 1), (2, 2, 40, 40)):
            C = xs[1]
            x, w, b = _param(clnet, dev, rng, *xs), _param(clnet, dev, rng, C), _param(clnet, dev, rng, C)
            mean, var = clnet.tensor(np.zeros(C, np.float32), dev), clnet.tensor(np.ones(C, np.float32), dev)
            _backward(clnet, F.batch_norm(x, mean, var, w, b, training=True), rng)
            _backward(clnet, F.batch_norm(x, mean, var, w, b, training=False), rng)
            for act in ("relu", "relu6"):  # the activation in the batch norm's pass (ONNX's BatchNormalization -> Relu)
                _backward(clnet, clnet.ops.BatchNormTrain.apply(x, w, b, mean, var, momentum=0.1, eps=1e-5, act=act),
                          rng)
    tuning.cpu_shaped, tuning.reduction_runs = default_shape, default_runs


def _lrn(clnet, dev, rng):
    import clnet.nn.functional as F
    for xs, size in (((2, 5, 3, 4), 3), ((1, 3, 2, 2), 5), ((1, 1, 3, 1), 2)):
        _backward(clnet, F.local_response_norm(_param(clnet, dev, rng, *xs), size), rng)


def _cat(clnet, dev, rng):
    for shapes, dim in ((((2, 3, 4), (2, 1, 4), (2, 5, 4)), 1), (((1, 3), (2, 3)), 0), (((3, 1), (3, 2)), 1)):
        parts = [_param(clnet, dev, rng, *s) for s in shapes]
        y = clnet.cat(parts, dim=dim)
        _close(y.numpy(), np.concatenate([p.numpy() for p in parts], axis=dim), "cat")
        _backward(clnet, y, rng)
    # a computed input joined twice: the second join's slice added into the first's (copy2d_add)
    h = _param(clnet, dev, rng, 2, 3, 5) * 2.0
    other = _param(clnet, dev, rng, 2, 1, 5)
    _backward(clnet, clnet.cat([h, other], dim=1) + clnet.cat([other, h], dim=1), rng)


def _pointwise(clnet, dev, rng):
    """Unary forward and backward, a broadcast binary op each way, a comparison, where, a cast and the creation
    kernels, on sizes that are not multiples of anything."""
    a, b = _param(clnet, dev, rng, 3, 1, 5), _param(clnet, dev, rng, 4, 1)
    y = clnet.nn.functional.gelu(a * b + clnet.exp(-a))
    x64, y64 = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
    t = x64 * y64 + np.exp(-x64)
    from math import erf
    _close(y.numpy(), t * 0.5 * (1 + np.vectorize(erf)(t / np.sqrt(2))), "gelu(a * b + exp(-a))")
    _backward(clnet, y, rng)
    w = clnet.where(a > 0, a, b / 2)
    _close(w.numpy(), np.where(x64 > 0, x64, y64 / 2), "where")
    _backward(clnet, w, rng)
    c = _param(clnet, dev, rng, 3, 1, 5)  # a residual sum and its ReLU in one launch (float4s and a tail)
    r = clnet.ops.AddRelu.apply(a, c)
    _close(r.numpy(), np.maximum(x64 + c.numpy().astype(np.float64), 0), "relu(a + c)")
    _backward(clnet, r, rng)
    _close((clnet.arange(7, device=dev) % 3).float().numpy(), np.arange(7) % 3, "arange % 3, cast")
    assert clnet.rand(9, device=dev).numpy().max() < 1 and clnet.eye(3, 2, device=dev).numpy().trace() == 2
    r = clnet.randint(2, 7, (11,), device=dev).numpy()
    assert r.min() >= 2 and r.max() < 7 and np.isfinite(clnet.randn(13, device=dev).numpy()).all()
    _close(clnet.linspace(-1, 2, 7, device=dev).numpy(), np.linspace(-1, 2, 7), "linspace")
    _close(clnet.full((3, 5), 2.5, device=dev).numpy(), np.full((3, 5), 2.5), "full")
    assert (clnet.zeros(5, dtype=clnet.int32, device=dev).numpy() == 0).all()


def _chain(clnet, dev, rng):
    """A fused graph chain (cl_kernels/chain.cl): float, bool and int steps, a broadcast operand, where, a cast."""
    from clnet import pointwise
    a, b = clnet.tensor(rng.standard_normal((5, 3)).astype(np.float32), dev), _param(clnet, dev, rng, 3)
    g = clnet.Graph(fuse=True)
    with g.capture():
        w = clnet.tanh(clnet.maximum(clnet.exp(a), b))
        m = w > 0.5
        q = pointwise.binary("remainder", pointwise.cast(w, np.int32), 2)
        s = clnet.where(m, w, clnet.sigmoid(a))
    assert g.chains and max(g.chains) >= 4, g.chains
    a64 = rng.standard_normal((5, 3))
    a.write(a64.astype(np.float32))
    g.replay()
    w64 = np.tanh(np.maximum(np.exp(a64), b.numpy().astype(np.float64)))
    _close(s.numpy(), np.where(w64 > 0.5, w64, 1 / (1 + np.exp(-a64))), "a fused chain")
    assert (q.numpy() == 0).all() and (m.numpy() == (w.numpy() > 0.5)).all()


def _reduce(clnet, dev, rng):
    x = _param(clnet, dev, rng, 3, 5, 7)
    x64 = x.numpy().astype(np.float64)
    for dims in ((1,), (0, 2), None):
        y = x.sum(dims) if dims is not None else x.sum()
        _close(y.numpy(), x64.sum(axis=dims), f"sum over {dims}")
        _backward(clnet, y, rng)
    v, i = x.max(1)
    _close(v.numpy(), x64.max(1), "max values")
    assert (i.numpy() == x64.argmax(1)).all()
    _backward(clnet, x.var(2).sum() + (x.softmax(0) * x).sum() + x.cumsum(1).mean(), rng)
    big = _param(clnet, dev, rng, 2, 3000)  # few outputs, long rows: the split tree
    _close(big.sum(1).numpy(), big.numpy().astype(np.float64).sum(1), "sum of long rows")


def _views(clnet, dev, rng):
    x = _param(clnet, dev, rng, 2, 3, 5)
    x64 = x.numpy()
    for y, ref, name in ((x.permute(2, 0, 1), x64.transpose(2, 0, 1), "permute"),
                         (x[:, 1:, ::2], x64[:, 1:, ::2], "slice"), (x[:, :1].expand(2, 4, 5),
                                                                       np.broadcast_to(x64[:, :1], (2, 4, 5)),
                                                                       "expand"),
                         (clnet.nn.functional.pad(x, (1, 2, 2, 0), mode="reflect"),
                          np.pad(x64, ((0, 0), (2, 0), (1, 2)), mode="reflect"), "reflect pad")):
        _close(y.numpy(), ref, name)
        _backward(clnet, y, rng)
    idx = clnet.tensor(np.array([4, 0, 4, 1]), dev)
    y = clnet.index_select(x, 2, idx)
    _close(y.numpy(), x64[:, :, [4, 0, 4, 1]], "index_select")
    _backward(clnet, y, rng)


RUN = dict(gemm_tiled=_gemm_tiled, gemm_block=_gemm_block, gemm_split_transposed=_gemm_split_transposed,
           linear=_linear, im2col=_im2col, direct=_direct,
           winograd_3x3=lambda c, d, r: _winograd(c, d, r, 3, "winograd"),
           winograd_5x5=lambda c, d, r: _winograd(c, d, r, 5, "winograd"),
           winograd_4x4=lambda c, d, r: _winograd(c, d, r, 3, "winograd4"),
           depthwise=_depthwise, conv1x1=_conv1x1, pooling=_pooling, elementwise=_elementwise, softmax=_softmax,
           optimizers=_optimizers, batch_norm=_batch_norm, lrn=_lrn, cat=_cat, pointwise=_pointwise, reduce=_reduce,
           views=_views, chain=_chain)


def _child(family):
    import importlib
    import clnet
    from clnet import tuning
    tensor = importlib.import_module("clnet.tensor")  # the module, which clnet.tensor (the function) hides
    # The buffer pool rounds sizes up (to 256 bytes and more); exact buffers let Oclgrind see a read one past the end
    tensor.BufferPool.rounded = staticmethod(lambda nbytes: max(int(nbytes), 4))
    tuning.allow_less_accurate = True  # F(4x4, 3x3) is a kernel family too
    dev = clnet.device("oclgrind")
    RUN[family](clnet, dev, np.random.default_rng(0))
    dev.synchronize()
    print(f"ran {family} on {dev.name} ({dev.platform_name})")


if __name__ == "__main__":
    _child(sys.argv[1])
