"""A dense layer's batch-1 products on a CPU: gemm_block (what CPUs ran before v17) against gemv_cpu.cl (what they
run now), alternating, on lenet-wide's 2048 x 2048 layer with its weight read from memory as in a training step
(five copies of it rotated, 80 MB, past the 32 MB L3 cache of the CI machine kind):

    python3 bench/gemv_cpu_ab.py --device 1

forward y = x W^T (one row, B k-contiguous), input gradient dx = dy W (one row, B n-contiguous), weight gradient
dW = dy^T x (depth one, written). Prints each product's medians per variant over alternating rounds and each
variant's largest error against float64.
"""
import statistics
import sys
import time

import numpy as np

import clnet
from clnet import gemm
from clnet.gemm import Mat

COPIES = 5


def main():
    dev = clnet.device(sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu")
    O = I = 2048
    rng = np.random.default_rng(0)
    ws = [clnet.tensor(rng.standard_normal((O, I)).astype(np.float32), dev) for _ in range(COPIES)]
    x = clnet.tensor(rng.standard_normal((1, I)).astype(np.float32), dev)
    dy = clnet.tensor(rng.standard_normal((1, O)).astype(np.float32), dev)
    W, x64, dy64 = ws[0].numpy().astype(np.float64), x.numpy()[0].astype(np.float64), dy.numpy()[0].astype(np.float64)
    products = {  # name: (M, N, K, A, a, B of copy i, b, c, expected)
        "forward": (1, O, I, x, Mat(rs=I, cs=1), lambda i: ws[i], Mat(rs=1, cs=I), Mat(rs=O, cs=1), W @ x64),
        "input gradient": (1, I, O, dy, Mat(rs=O, cs=1), lambda i: ws[i], Mat(rs=I, cs=1), Mat(rs=I, cs=1),
                           dy64 @ W),
        "weight gradient": (O, I, 1, dy, Mat(rs=1, cs=O), lambda i: x, Mat(rs=I, cs=1), Mat(rs=I, cs=1),
                            np.outer(dy64, x64)),
    }
    skinny = gemm.skinny

    def block(*args):
        gemm.skinny = lambda *a: False
        try:
            gemm.gemm(*args)
        finally:
            gemm.skinny = skinny
    variants = {"gemm_block": block, "gemv_cpu.cl": gemm.gemm}
    print(f"{dev.name}: medians of 20 runs, 6 alternating rounds")
    for name, (M, N, K, A, a, B, b, c, expected) in products.items():
        times, errors = {v: [] for v in variants}, {}
        Cs = [clnet.tensor(np.zeros((M, N), np.float32), dev) for _ in range(COPIES)]
        for _ in range(6):
            for v, run in variants.items():
                run(M, N, K, A, a, B(0), b, Cs[0], c)
                dev.synchronize()
                errors[v] = np.abs(Cs[0].numpy() - expected.reshape(M, N)).max() / np.abs(expected).max()
                ts = []
                for r in range(20):
                    t0 = time.perf_counter()
                    run(M, N, K, A, a, B(r % COPIES), b, Cs[r % COPIES], c)
                    dev.synchronize()
                    ts.append(time.perf_counter() - t0)
                times[v].append(statistics.median(ts) * 1e3)
        print(f"{name:16s} " + "  ".join(f"{v} {statistics.median(t):.2f} ms (error {errors[v]:.1e})"
                                         for v, t in times.items()))


if __name__ == "__main__":
    main()
