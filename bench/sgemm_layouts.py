"""SGEMM 4096 by operand layout: does the direction that consecutive work-items load (along k, or along m / n)
decide the speed of large products? Times C = A @ B with A stored (M, K) or (K, M), B stored (K, N) or (N, K),
for a few tile shapes, by profiling events; cuBLAS on the same sizes for scale.

    python bench/sgemm_layouts.py --device gpu --n 4096
"""
import argparse
import json

import numpy as np

import clnet
from clnet import kernels, ops, tuning
from clnet.ops import Mat

SHAPES = [dict(tuning.GEMM_TILED_LARGE, TK=16, LBUF=2), dict(tuning.GEMM_TILED_LARGE, TK=32, LBUF=1),
          dict(tuning.GEMM_TILED_SMALL, TK=32)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="gpu")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    dev, n = clnet.device(args.device), args.n
    gen = np.random.default_rng(0)
    A = clnet.tensor(gen.standard_normal((n, n), dtype=np.float32), dev)
    B = clnet.tensor(gen.standard_normal((n, n), dtype=np.float32), dev)
    C = clnet.tensor(np.zeros((n, n), np.float32), dev)
    layouts = {"A(M,K) k-fast": Mat(rs=n, cs=1), "A(K,M) m-fast": Mat(rs=1, cs=n)}
    blayouts = {"B(K,N) n-fast": Mat(rs=n, cs=1), "B(N,K) k-fast": Mat(rs=1, cs=n)}
    rows = []
    for cfg in SHAPES:
        if not tuning.fits(dev, cfg):
            continue
        choice = dict(cfg=cfg, ksplit=tuning.k_splits(dev, cfg, n, n, n))
        for an, a in layouts.items():
            for bn, b in blayouts.items():
                def run():
                    ops._gemm_choice(dev, choice, n, n, n, A, a, B, b, C, Mat(rs=n, cs=1), 1.0, 0.0, 1, None, 0, 0,
                                     False, "sgemm")
                run()  # builds the kernels
                ms = kernels.device_ms(dev, run, args.repeat)
                row = dict(config=tuning.describe(choice), a=an, b=bn, ms=ms, tflops=2.0 * n ** 3 / ms / 1e9)
                rows.append(row)
                print(f"{row['config']:28s} {an:14s} {bn:14s} {ms:7.3f} ms {row['tflops']:6.2f} TFLOP/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev.name, driver=dev.driver_version, n=n, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
