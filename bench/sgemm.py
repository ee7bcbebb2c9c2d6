"""SGEMM: clnet's matrix product against cuBLAS (torch.mm, TF32 off) or NumPy's BLAS, side by side in one run.

    python bench/sgemm.py --device gpu --sizes 1024 4096 8192 --json bench/results/sgemm-h200.json

clnet is timed by OpenCL profiling events, cuBLAS by CUDA events, NumPy by wall clock; each the median of --repeat.
"""
import argparse
import json
import statistics
import time

import numpy as np

import clnet
from clnet import kernels, tuning
from clnet.gemm import Mat, _gemm_choice, gemm


class Product:
    """C = A @ B on fresh random n x n operands on dev; `run(choice)` runs one given (cfg, ksplit, ...) choice, `run()`
    the tuned or default one, as every op does."""

    def __init__(self, dev, n):
        gen = np.random.default_rng(n)
        self.dev, self.n = dev, n
        self.a, self.b = gen.standard_normal((n, n), dtype=np.float32), gen.standard_normal((n, n), dtype=np.float32)
        self.A, self.B = clnet.tensor(self.a, dev), clnet.tensor(self.b, dev)
        self.C = clnet.tensor(np.zeros((n, n), np.float32), dev)
        self.mat = Mat(rs=n, cs=1)

    def run(self, choice=None):
        n, m = self.n, self.mat
        if choice is None:
            gemm(n, n, n, self.A, m, self.B, m, self.C, m)
        else:
            _gemm_choice(self.dev, choice, n, n, n, self.A, m, self.B, m, self.C, m, 1.0, 0.0, 1, None, 0, 0, False,
                         "sgemm")

    def time(self, repeat, choice=None):
        """Median device time (ms) of the choice's kernels, after one untimed run that builds them."""
        self.run(choice)
        return kernels.device_ms(self.dev, lambda: self.run(choice), repeat)


def sweep(product, repeat):
    """Every candidate tile shape of the device's class at its default split (the autotuner's menu), fastest first."""
    dev, n = product.dev, product.n
    out = []
    for cfg in tuning.GEMM_CANDIDATES[tuning.device_class(dev)]:
        if tuning.fits(dev, cfg):
            choice = dict(cfg=cfg, ksplit=tuning.k_splits(dev, cfg, n, n, n))
            ms = product.time(repeat, choice)
            out.append(dict(config=tuning.describe(choice), ms=ms, tflops=2.0 * n ** 3 / ms / 1e9))
    return sorted(out, key=lambda r: r["ms"])


def time_torch_cuda(a, b, repeat):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    A, B = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    torch.mm(A, B)
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        C = torch.mm(A, B)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), C.cpu().numpy()


def time_numpy(a, b, repeat):
    a @ b
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        c = a @ b
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--json")
    p.add_argument("--sweep", action="store_true", help="also time every candidate tile shape at its default split")
    args = p.parse_args()
    dev = clnet.device(args.device)
    try:
        import torch
        use_cuda = torch.cuda.is_available() and dev.is_gpu
    except ImportError:
        use_cuda = False
    rows = []
    for n in args.sizes:
        flop = 2.0 * n ** 3
        product = Product(dev, n)
        if dev.is_gpu:  # as `clnet bench` does: tune this product's shape first (kept in the cache)
            from clnet import tune
            tuned = tune.tune_sites(dev, tune.record(product.run))
            print(f"n={n}: tuned in {tuned['seconds']:.1f} s: "
                  + ", ".join(f"{r['choice']} {r['ms']:.3f} ms (default {r['default_ms']:.3f})"
                              for r in tuned["tuned"].values()), flush=True)
        tuning.used = used = {}
        try:
            ms = product.time(args.repeat)
        finally:
            tuning.used = None
        a, b, c = product.a, product.b, product.C.numpy()
        if use_cuda:
            ref_ms, ref_c = time_torch_cuda(a, b, args.repeat)
            ref_name = "cuBLAS (torch.mm, TF32 off)"
        else:
            ref_ms, ref_c = time_numpy(a, b, args.repeat)
            ref_name = "NumPy BLAS"
        err = float(np.linalg.norm(c - ref_c) / np.linalg.norm(ref_c))
        row = dict(n=n, clnet_ms=ms, clnet_tflops=flop / ms / 1e9, reference=ref_name, reference_ms=ref_ms,
                   reference_tflops=flop / ref_ms / 1e9, speed_ratio=ref_ms / ms, rel_err=err,
                   config=", ".join(sorted(set(used[None].values()))))
        if args.sweep:
            row["sweep"] = sweep(product, args.repeat)
            for r in row["sweep"]:
                print(f"    {r['config']:24s} {r['ms']:.3f} ms  {r['tflops']:.2f} TFLOP/s", flush=True)
        rows.append(row)
        print(f"n={n}: clnet {ms:.3f} ms ({row['clnet_tflops']:.2f} TFLOP/s), {ref_name} {ref_ms:.3f} ms "
              f"({row['reference_tflops']:.2f} TFLOP/s), clnet speed {row['speed_ratio']:.2f}x, rel err {err:.1e}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev.name, driver=dev.driver_version, platform=dev.platform_name, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
