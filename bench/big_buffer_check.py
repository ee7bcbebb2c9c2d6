"""Which copies work in a buffer past 8 GiB on this driver? (NVIDIA 580, v14c: a convolution past 2**31 elements
crashed in the driver, and writes through sub-buffers of a 8.1 GiB buffer ended in CL_OUT_OF_RESOURCES.) pyopencl
only, no clnet kernels.

A buffer of N floats, blocks of 2**26 floats, block i written from the host as i + 1 (through the parent at an
offset, which v14c showed to work). Each check prints PASS/FAIL and its time:
  d2d-out every block copied device to device into a small buffer (source offset), read back;
  d2d-in  a small buffer holding -(i + 1) copied into every block (destination offset), read through the parent;
  sub     one sub-buffer of the last block, copied out device to device;
  sub-writes  every block written from the host through a sub-buffer of its own, read through the parent (on
          NVIDIA 580 this took 90 s and ended in CL_OUT_OF_RESOURCES: h200-v14c, then as bench/subbuffer_check.py);
  fill    each block filled in place (clEnqueueFillBuffer at its offset): last, since on NVIDIA 580 it left the
          queue invalid (h200-v15), which ends the script.

    python3 bench/big_buffer_check.py --device gpu
"""
import sys
import time

import click
import numpy as np
import pyopencl as cl

import clnet
from clnet.tensor import region_alignment

failures = []


def check(name, bad, t0):
    print(f"{'FAIL' if bad else 'PASS'}  {name}: {len(bad)} wrong blocks {bad[:8]}, {time.perf_counter() - t0:.1f} s",
          flush=True)
    if bad:
        failures.append(name)


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--n", type=int, default=2**31 + 2**25 + 4099)
@click.option("--block", type=int, default=2**26)
def main(device_spec, n, block):
    dev = clnet.device(device_spec)
    ctx, q = dev.context, dev.queue
    print(f"{dev.name} ({dev.platform_name}, driver {dev.driver_version}): {n} floats ({n * 4 / 2**30:.2f} GiB)")
    big = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * 4)
    small = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, block * 4)
    starts = [(s, min(block, n - s)) for s in range(0, n, block)]
    probe = np.empty(1024, np.float32)

    def probes_ok(buf, base, s, c, value):
        for at in (0, c // 2, c - len(probe)):
            cl.enqueue_copy(q, probe, buf, src_offset=(base + max(at, 0)) * 4, is_blocking=True)
            if not np.all(probe[:min(len(probe), c)] == value):
                return False
        return True

    host = np.empty(block, np.float32)
    for i, (s, c) in enumerate(starts):
        host[:c] = i + 1
        cl.enqueue_copy(q, big, host[:c], dst_offset=s * 4, is_blocking=True)

    t0, bad = time.perf_counter(), []
    for i, (s, c) in enumerate(starts):
        cl.enqueue_copy(q, small, big, byte_count=c * 4, src_offset=s * 4)
        if not probes_ok(small, 0, s, c, i + 1):
            bad.append(i)
    check("d2d-out", bad, t0)

    t0 = time.perf_counter()
    for i, (s, c) in enumerate(starts):
        cl.enqueue_fill_buffer(q, small, np.float32(-(i + 1)), 0, c * 4)
        cl.enqueue_copy(q, big, small, byte_count=c * 4, dst_offset=s * 4)
    q.finish()
    check("d2d-in", [i for i, (s, c) in enumerate(starts) if not probes_ok(big, s, s, c, -(i + 1))], t0)

    t0 = time.perf_counter()
    s, c = starts[-1]
    align = region_alignment(dev) // 4
    base = s // align * align
    sub = big.get_sub_region(base * 4, (s + c - base) * 4)
    cl.enqueue_copy(q, small, sub, byte_count=c * 4, src_offset=(s - base) * 4)
    check("sub", [] if probes_ok(small, 0, s, c, -len(starts)) else [len(starts) - 1], t0)

    t0 = time.perf_counter()
    for i, (s, c) in enumerate(starts):  # blocks start at multiples of 2**26 floats: where sub-buffers may
        host[:c] = 1000 + i
        cl.enqueue_copy(q, big.get_sub_region(s * 4, c * 4), host[:c], is_blocking=True)
    check("sub-writes", [i for i, (s, c) in enumerate(starts) if not probes_ok(big, s, s, c, 1000 + i)], t0)

    t0 = time.perf_counter()
    for i, (s, c) in enumerate(starts):
        cl.enqueue_fill_buffer(q, big, np.float32(i + 1), s * 4, c * 4)
    q.finish()
    check("fill", [i for i, (s, c) in enumerate(starts) if not probes_ok(big, s, s, c, i + 1)], t0)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
