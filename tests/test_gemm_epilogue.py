"""The GEMM epilogue (alpha * A @ B + beta * C, a bias per row or per column, a ReLU) both ways it is built: read
from kernel arguments (one program for every epilogue: CPUs, tuning.EPILOGUE_AT_BUILD) and fixed by defines at
build time (GPUs, where the run-time form cost SGEMM at 1024 a fifth of its speed). Run here on every device with
the GPU-shaped tiled kernel, its split-K sum and the CPU-shaped block kernel, against NumPy in float64."""
import numpy as np
import pytest

import clnet
from clnet import tuning
from clnet.gemm import Mat, _gemm_choice


EPILOGUES = [(0, False, 1.0, 0.0), (1, True, 0.5, 1.0), (2, True, 1.0, 0.0), (2, False, -1.5, 0.25)]


# Built in only where GPUs build it (the tiled kernel and its split-K sum; the block kernel is the CPUs'), with the
# two epilogues that take each define's every value: a program per epilogue, so few of them
@pytest.mark.parametrize("built, kernel, epilogues", [
    (False, "tiled", EPILOGUES), (False, "tiled-split-k", EPILOGUES), (False, "block", EPILOGUES),
    (True, "tiled", EPILOGUES[1::2]), (True, "tiled-split-k", EPILOGUES[1::2])],
    ids=["arguments-tiled", "arguments-split-k", "arguments-block", "defines-tiled", "defines-split-k"])
def test_gemm_epilogue(dev, rng, monkeypatch, built, kernel, epilogues):
    monkeypatch.setitem(tuning.EPILOGUE_AT_BUILD, tuning.device_class(dev), built)
    M, N, K = 37, 45, 70
    cfg = dict(tuning.GEMM_BLOCK if kernel == "block" else tuning.GEMM_TILED_SMALL)
    choice = dict(cfg=cfg, ksplit=2 if kernel == "tiled-split-k" else 1)
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    row, col = rng.standard_normal(M).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    A, B = clnet.tensor(a, dev), clnet.tensor(b, dev)
    for bias_mode, relu, alpha, beta in epilogues:
        bias = clnet.tensor(row if bias_mode == 1 else col, dev) if bias_mode else None
        C = clnet.tensor(c0, dev)
        _gemm_choice(dev, choice, M, N, K, A, Mat(rs=K, cs=1), B, Mat(rs=N, cs=1), C, Mat(rs=N, cs=1), alpha, beta,
                     1, bias, bias_mode, 0, relu, "test product")
        want = alpha * (a.astype(np.float64) @ b) + beta * c0
        if bias_mode:
            want += row[:, None] if bias_mode == 1 else col[None, :]
        if relu:
            want = np.maximum(want, 0)
        err = np.abs(C.numpy() - want).max() / np.abs(want).max()
        assert err < 2e-6, f"{kernel}, epilogue {'built in' if built else 'from arguments'}: bias mode {bias_mode}, " \
                           f"relu {relu}, alpha {alpha}, beta {beta}: relative error {err:.1e}"
