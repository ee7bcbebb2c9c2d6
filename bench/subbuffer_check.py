"""Do sub-buffer copies land where they should in a buffer past 8 GiB? (bench/large_tensors.py on the H200, v14b: a
2**26-element block uploaded through a sub-buffer ending at 8 GiB read back as zeros.) pyopencl only, no clnet ops.

Fills a buffer of N floats block by block (2**26 floats each, block i holding the value i + 1) in two ways, then reads
4 KiB at the start, middle and end of every block the other way:
  A: written through sub-buffers, read through the parent at an offset;
  B: written through the parent at an offset, read through sub-buffers.
Prints the blocks that read back wrong for each, and exits 1 if any did.

    python3 bench/subbuffer_check.py --device gpu
"""
import sys

import click
import numpy as np
import pyopencl as cl

import clnet
from clnet.tensor import region_alignment


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--n", type=int, default=2**31 + 2**25 + 4099)
@click.option("--block", type=int, default=2**26)
def main(device_spec, n, block):
    dev = clnet.device(device_spec)
    ctx, q = dev.context, dev.queue
    big = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n * 4)
    host = np.empty(block, np.float32)
    probe = np.empty(1024, np.float32)
    starts = list(range(0, n, block))
    failed = 0
    for how in ("A", "B"):
        cl.enqueue_fill_buffer(q, big, np.float32(0), 0, n * 4)
        for i, s in enumerate(starts):
            c = min(block, n - s)
            host[:c] = i + 1
            if how == "A":
                cl.enqueue_copy(q, big.get_sub_region(s * 4, c * 4), host[:c], is_blocking=True)
            else:
                cl.enqueue_copy(q, big, host[:c], dst_offset=s * 4, is_blocking=True)
        bad = []
        for i, s in enumerate(starts):
            c = min(block, n - s)
            align = region_alignment(dev) // 4  # sub-buffer starts must be multiples of it
            for at in (s, s + c // 2 // align * align, s + (c - len(probe)) // align * align):
                if how == "A":
                    cl.enqueue_copy(q, probe, big, src_offset=at * 4, is_blocking=True)
                else:
                    cl.enqueue_copy(q, probe, big.get_sub_region(at * 4, probe.nbytes), is_blocking=True)
                if not np.all(probe == i + 1):
                    bad.append(f"block {i} (elements {s}..{s + c}) at element {at}: read {probe[0]:g}, not {i + 1}")
        way = ("written through sub-buffers, read through the parent" if how == "A" else
               "written through the parent, read through sub-buffers")
        print(f"{how}: {way}: " + ("every block right" if not bad else f"{len(bad)} probes wrong"), flush=True)
        for line in bad[:12]:
            print("   ", line)
        failed += len(bad)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
