"""A dense layer's batch-1 products on a CPU: gemm_block (what CPUs run) against gemv.cl (what GPUs run, called
directly), alternating, on lenet-wide's 2048 x 2048 layer:

    python3 bench/gemv_cpu_ab.py --device 1

forward y = x W^T (one row, B k-contiguous), input gradient dx = dy W (one row, B n-contiguous), weight gradient
dW += dy^T x (depth one). Prints each product's medians per variant over alternating rounds and whether their results
agree (to float32 rounding; the two sum in different orders).
"""
import statistics
import sys
import time

import numpy as np

import clnet
from clnet import gemm
from clnet.gemm import Mat


def main():
    dev = clnet.device(sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu")
    O = I = 2048
    rng = np.random.default_rng(0)
    w = clnet.tensor(rng.standard_normal((O, I)).astype(np.float32), dev)
    x = clnet.tensor(rng.standard_normal((1, I)).astype(np.float32), dev)
    dy = clnet.tensor(rng.standard_normal((1, O)).astype(np.float32), dev)
    products = {  # name: (M, N, K, A, a, B, b, c, beta)
        "forward": (1, O, I, x, Mat(rs=I, cs=1), w, Mat(rs=1, cs=I), Mat(rs=O, cs=1), 0.0),
        "input gradient": (1, I, O, dy, Mat(rs=O, cs=1), w, Mat(rs=I, cs=1), Mat(rs=I, cs=1), 0.0),
        "weight gradient": (O, I, 1, dy, Mat(rs=1, cs=O), x, Mat(rs=I, cs=1), Mat(rs=I, cs=1), 1.0),
    }
    variants = {
        "gemm_block": lambda M, N, K, A, a, B, b, C, c, beta: gemm.gemm(M, N, K, A, a, B, b, C, c, beta=beta),
        "gemv.cl": lambda M, N, K, A, a, B, b, C, c, beta: gemm._skinny(dev, M, N, K, A, a, B, b, C, c, 1.0, beta,
                                                                       None, 0, False, "gemv"),
    }
    print(f"{dev.name}: medians of 20 runs, 6 alternating rounds")
    for name, (M, N, K, A, a, B, b, c, beta) in products.items():
        times, results = {v: [] for v in variants}, {}
        for _ in range(6):
            for v, run in variants.items():
                C = clnet.tensor(np.zeros((M, N), np.float32), dev)
                run(M, N, K, A, a, B, b, C, c, beta)
                dev.synchronize()
                ts = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    run(M, N, K, A, a, B, b, C, c, beta)
                    dev.synchronize()
                    ts.append(time.perf_counter() - t0)
                times[v].append(statistics.median(ts) * 1e3)
                C = clnet.tensor(np.zeros((M, N), np.float32), dev)
                run(M, N, K, A, a, B, b, C, c, beta)
                results[v] = C.numpy()
        ref, other = results.values()
        err = np.linalg.norm(ref - other) / np.linalg.norm(ref)
        print(f"{name:16s} " + "  ".join(f"{v} {statistics.median(t):.2f} ms" for v, t in times.items())
              + f"  (difference {err:.1e})")


if __name__ == "__main__":
    main()
