"""SGEMM n^3 by gemm_tiled variant: tile shape, float4 fetches on or off, operand layout, and an optional register cap,
each with the registers and spill bytes the driver reports (NVIDIA: -cl-nv-verbose), so that a speed difference can
be told apart from an occupancy one. cuBLAS (torch.mm, TF32 off) on the same operands for scale.

    python bench/sgemm_variants.py --device gpu --n 4096 --json bench/results/sgemm-variants.json

--tiles occupancy times OCCUPANCY_TILES instead (bench/NOTES.md v57: all slower); --quick only float4 fetches with A
k-fast, no register cap.
"""
import argparse
import json
import re
import statistics

import numpy as np
import pyopencl as cl

import clnet
from clnet import gemm, kernels, tuning
from clnet.gemm import Mat

TILES = [dict(kernel="gemm_tiled", TM=128, TN=128, TK=32, WM=8, WN=8, LBUF=1),
         dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8),
         dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8, LBUF=1),
         dict(kernel="gemm_tiled", TM=128, TN=128, TK=8, WM=8, WN=8),
         dict(kernel="gemm_tiled", TM=128, TN=64, TK=16, WM=8, WN=4),
         dict(kernel="gemm_tiled", TM=64, TN=128, TK=16, WM=4, WN=8),
         dict(kernel="gemm_tiled", TM=64, TN=64, TK=16, WM=4, WN=4)]
# Tiles that trade the 128x128/8x8 default's one work-group a multiprocessor for more (--tiles occupancy): smaller
# tiles of 8x8 outputs a work-item (several work-groups share a multiprocessor, so one's barrier does not idle it),
# or 128x128 over 512 work-items of fewer registers each.
OCCUPANCY_TILES = [dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8),
                   dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8, WARP_8X4=1),
                   dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8, LBUF=1, WARP_8X4=1),
                   dict(kernel="gemm_tiled", TM=128, TN=128, TK=32, WM=8, WN=8, LBUF=1, WARP_8X4=1),
                   dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=4, WN=8),
                   dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=4),
                   dict(kernel="gemm_tiled", TM=128, TN=64, TK=16, WM=8, WN=8),
                   dict(kernel="gemm_tiled", TM=64, TN=128, TK=16, WM=8, WN=8),
                   dict(kernel="gemm_tiled", TM=128, TN=64, TK=32, WM=8, WN=8, LBUF=1),
                   dict(kernel="gemm_tiled", TM=64, TN=64, TK=16, WM=8, WN=8),
                   dict(kernel="gemm_tiled", TM=64, TN=64, TK=32, WM=8, WN=8)]
REG_CAPS = [None, 128]  # -cl-nv-maxrregcount: 128 registers let two 256-item work-groups share a multiprocessor

extra_options = []
_build = cl.Program.build


def _build_with_extra(self, options=None, *args, **kwargs):
    return _build(self, options=list(options or []) + extra_options, *args, **kwargs)


cl.Program.build = _build_with_extra


def build_report(dev):
    """Registers and spill stores of the gemm_tiled programs built since the last call, from the build logs."""
    out = []
    for prog in list(kernels._programs.values()):
        log = prog.get_build_info(dev.cl_device, cl.program_build_info.LOG) or ""
        regs = re.findall(r"Used (\d+) registers", log)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        if regs:
            out.append(dict(registers=int(regs[-1]), spill_stores=int(spills[-1]) if spills else None))
    kernels._programs.clear()
    kernels._kernels.clear()
    return out


def time_cublas(a, b, repeat):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    A, B = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    times = []
    for _ in range(repeat + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.mm(A, B)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times[1:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="gpu")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--json")
    p.add_argument("--tiles", choices=["all", "occupancy"], default="all")
    p.add_argument("--quick", action="store_true", help="float4 fetches, A k-fast, no register cap only")
    args = p.parse_args()
    dev, n = clnet.device(args.device), args.n
    gen = np.random.default_rng(0)
    a, b = gen.standard_normal((n, n), dtype=np.float32), gen.standard_normal((n, n), dtype=np.float32)
    A, At, B = clnet.tensor(a, dev), clnet.tensor(np.ascontiguousarray(a.T), dev), clnet.tensor(b, dev)
    C = clnet.tensor(np.zeros((n, n), np.float32), dev)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    layouts = {"A(M,K) k-fast": (A, Mat(rs=n, cs=1)), "A(K,M) m-fast": (At, Mat(rs=1, cs=n))}
    cublas = time_cublas(a, b, args.repeat)
    if cublas:
        print(f"cuBLAS {cublas:.3f} ms {2 * n ** 3 / cublas / 1e9:.2f} TFLOP/s", flush=True)
    rows = []
    vec_a, vec_b = gemm._vec_a, gemm._vec_b  # switched off below to time scalar fetches
    for cfg in TILES if args.tiles == "all" else OCCUPANCY_TILES:
        if not tuning.fits(dev, cfg):
            continue
        for cap in REG_CAPS if dev.is_gpu and not args.quick else [None]:
            if cap and cfg["WM"] * cfg["WN"] < 64:
                continue
            extra_options[:] = ["-cl-nv-verbose"] + ([f"-cl-nv-maxrregcount={cap}"] if cap else []) \
                if dev.is_gpu else []
            for vec in (True,) if args.quick else (False, True):
                gemm._vec_a = vec_a if vec else (lambda m: False)
                gemm._vec_b = vec_b if vec else (lambda m: False)
                for lname, (X, x) in list(layouts.items())[:1 if args.quick else 2]:
                    def run():
                        gemm._gemm(dev, cfg, n, n, n, X, x, B, Mat(rs=n, cs=1), C, Mat(rs=n, cs=1), 1.0, 0.0, 1,
                                  None, 0, (0, 0), 1, n, "sgemm")
                    try:
                        run()
                    except kernels.KernelError as e:
                        print(f"{cfg} cap={cap} vec={vec}: {str(e)[:300]}", flush=True)
                        continue
                    err = float(np.max(np.abs(C.numpy() - expected)) / np.max(np.abs(expected)))
                    ms = kernels.device_ms(dev, run, args.repeat)
                    report = build_report(dev)
                    row = dict(config=tuning.describe(dict(cfg=cfg, ksplit=1)), reg_cap=cap, vec=vec, a=lname,
                               ms=ms, tflops=2.0 * n ** 3 / ms / 1e9, vs_cublas=cublas / ms if cublas else None,
                               error=err, build=report)
                    rows.append(row)
                    print(f"{row['config']:26s} cap={str(cap):4s} vec={vec!s:5s} {lname:14s} {ms:7.3f} ms "
                          f"{row['tflops']:6.2f} TFLOP/s x{row['vs_cublas'] or 0:.2f} err {err:.1e} {report}",
                          flush=True)
    gemm._vec_a, gemm._vec_b = vec_a, vec_b
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev.name, driver=dev.driver_version, n=n, cublas_ms=cublas, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
