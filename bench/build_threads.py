"""Whether a driver builds OpenCL programs in parallel: the autotuner builds every candidate of a shape before timing
any (clnet/tune.py), one at a time under kernels' build lock, and a fresh GPU's first-run budget (10 s) ran out on
lenet's first shape (bench/NOTES.md v62). Here the GEMM candidates of one 512^3 product (their gemm.cl define sets,
as the tuner's runs would build them) are built serially, then again (with another salt define, so that no cache
answers) from --threads threads, straight through pyopencl (clBuildProgram), timed by wall clock.

    PYOPENCL_NO_CACHE=1 CUDA_CACHE_DISABLE=1 python3 bench/build_threads.py --device gpu
"""
import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pyopencl as cl

import clnet
from clnet import gemm, kernels, tuning
from clnet.gemm import Mat
from clnet.sources import source


def candidate_builds(dev, n=512):
    """(filename, defines) of each GEMM candidate of an n^3 product, collected without building (kernels.kernel is
    swapped for a recorder while gemm._gemm_kernel computes each candidate's defines)."""
    seen = []
    real = kernels.kernel
    kernels.kernel = lambda d, filename, name, defines=None: seen.append((filename, dict(defines or {})))
    try:
        a, b, c = Mat(bs=n * n, rs=n, cs=1), Mat(bs=n * n, rs=n, cs=1), Mat(bs=n * n, rs=n, cs=1)
        for choice in tuning.gemm_candidates(dev, n, n, n, 1):
            gemm._gemm_kernel(dev, choice["cfg"], a, b, c, (0, 0))
    finally:
        kernels.kernel = real
    unique = []
    for item in seen:
        if item not in unique:
            unique.append(item)
    return unique


def build(dev, filename, defines, salt):
    options = kernels.program_options(dev, sorted(dict(defines, CLNET_BUILD_SALT=salt).items()))
    cl.Program(dev.context, source(filename)).build(options=options)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=8)
    args = p.parse_args()
    dev = clnet.device(args.device)
    builds = candidate_builds(dev)
    salt = int(time.time())
    print(f"{dev.name}: {len(builds)} GEMM candidate programs of a 512^3 product; PYOPENCL_NO_CACHE="
          f"{os.environ.get('PYOPENCL_NO_CACHE')}, CUDA_CACHE_DISABLE={os.environ.get('CUDA_CACHE_DISABLE')}")
    t0 = time.perf_counter()
    for filename, defines in builds:
        build(dev, filename, defines, salt)
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lambda item: build(dev, item[0], item[1], salt + 1), builds))
    threaded = time.perf_counter() - t0
    print(f"serial {serial:.2f} s ({serial / len(builds) * 1e3:.0f} ms a program); {args.threads} threads "
          f"{threaded:.2f} s: {serial / threaded:.2f}x")


if __name__ == "__main__":
    main()
