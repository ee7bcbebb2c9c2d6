"""What each extra scalar argument costs a launch (bench/NOTES.md v34's next step: kernels that take a (buffer, offset)
pair for each buffer, so that an arena's blocks need no sub-buffer, would pass one more int per buffer argument).
A copy kernel over 4 buffers with 0, 4 and 8 extra int arguments (cl_kernels/driver_cost.cl), arguments set
beforehand, launched in a chain as a replay launches; host time to enqueue and time to the end, medians of 5.

    python3 bench/arg_cost.py --device gpu
"""
import os
import sys

import click
import pyopencl as cl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clnet  # noqa: E402
from clnet.sources import source  # noqa: E402
from subbuffer_launch import launch_times  # noqa: E402


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--launches", default=400)
@click.option("--elements", default=4096)
def main(device_spec, launches, elements):
    dev = clnet.device(device_spec)
    ctx, q = dev.context, dev.queue
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, elements * 4) for _ in range(4)]
    print(f"{dev.name}: {launches} launches of a {elements}-element kernel over 4 buffers, arguments set beforehand")
    for extra in (0, 4, 8):
        k = cl.Kernel(cl.Program(ctx, source("driver_cost.cl")).build(options=[f"-DEXTRA={extra}"]), "copy_args")
        k.set_args(*bufs, *([cl.cltypes.int(0)] * extra))
        enq, total = launch_times(q, [k], (elements,), launches)
        print(f"  {extra} extra int arguments: enqueue {enq:6.2f} us a launch, to the end {total:6.2f} us a launch")


if __name__ == "__main__":
    main()
