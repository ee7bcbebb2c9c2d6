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
from clnet import kernels, ops, tuning
from clnet.ops import Mat


def time_clnet(dev, n, repeat, variant=None):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    A, B, C = clnet.tensor(a, dev), clnet.tensor(b, dev), clnet.tensor(np.zeros((n, n), np.float32), dev)
    saved = tuning.gemm_config
    if variant:
        tuning.gemm_config = lambda *args, **kwargs: variant
    try:
        def run():
            ops.gemm(n, n, n, A, Mat(rs=n, cs=1), B, Mat(rs=n, cs=1), C, Mat(rs=n, cs=1))
        run()
        dev.synchronize()
        kernels.profiler = prof = kernels.Profiler()
        for _ in range(repeat):
            run()
        dev.synchronize()
        kernels.profiler = None
    finally:
        tuning.gemm_config = saved
    ms = statistics.median(t for _, _, t in prof.times_ms())
    return ms, a, b, C.numpy()


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
        ms, a, b, c = time_clnet(dev, n, args.repeat)
        if use_cuda:
            ref_ms, ref_c = time_torch_cuda(a, b, args.repeat)
            ref_name = "cuBLAS (torch.mm, TF32 off)"
        else:
            ref_ms, ref_c = time_numpy(a, b, args.repeat)
            ref_name = "NumPy BLAS"
        err = float(np.linalg.norm(c - ref_c) / np.linalg.norm(ref_c))
        row = dict(n=n, clnet_ms=ms, clnet_tflops=flop / ms / 1e9, reference=ref_name, reference_ms=ref_ms,
                   reference_tflops=flop / ref_ms / 1e9, speed_ratio=ref_ms / ms, rel_err=err,
                   config=tuning.gemm_config(dev, n, n, n))
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
