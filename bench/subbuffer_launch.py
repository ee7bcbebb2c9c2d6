"""What a launch costs when its arguments are sub-buffers (bench/NOTES.md v34: on an H100 the arena's sub-buffers left
every kernel's device time as it was, yet resnet50's replayed step took 10 ms more). A chain of copies through 8
buffers, each launch's arguments set beforehand (as a replay's): whole buffers, sub-buffers of one parent, and
sub-buffers each of a parent of its own; host time to enqueue the chain and time to its end, medians of 5.

    python3 bench/subbuffer_launch.py --device gpu
"""
import statistics
import time

import click
import pyopencl as cl

import clnet
from clnet.sources import source



def launch_times(q, kernels_, global_size, launches, enqueue=None):
    """(enqueue, to the end): medians of 5 (after one warm-up) of the host time a launch takes to enqueue and the time
    a launch to the queue's end, over `launches` launches cycling through kernels_ (their arguments set beforehand).
    enqueue(j): launch j made another way (kernels_ and global_size unused), in place of pyopencl's enqueue."""
    enq, total = [], []
    for rep in range(6):
        q.finish()
        t0 = time.perf_counter()
        for j in range(launches):
            if enqueue is None:
                cl.enqueue_nd_range_kernel(q, kernels_[j % len(kernels_)], global_size, None)
            else:
                enqueue(j)
        t1 = time.perf_counter()
        q.finish()
        t2 = time.perf_counter()
        if rep:
            enq.append((t1 - t0) / launches * 1e6)
            total.append((t2 - t0) / launches * 1e6)
    return statistics.median(enq), statistics.median(total)


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--launches", default=400)
def main(device_spec, launches):
    dev = clnet.device(device_spec)
    ctx, q = dev.context, dev.queue
    prog = cl.Program(ctx, source("driver_cost.cl")).build()
    print(f"{dev.name}: {launches} launches through 8 buffers, arguments set beforehand; medians of 5")
    for nbytes in (4096, 1 << 20, 32 << 20):
        step = -(-nbytes // 4096) * 4096 + 65536
        parent = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 8 * step)
        layouts = {
            "whole buffers": [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, nbytes) for _ in range(8)],
            "sub-buffers of one parent": [parent.get_sub_region(i * step, nbytes) for i in range(8)],
            "the same, flags given": [parent.get_sub_region(i * step, nbytes, cl.mem_flags.READ_WRITE)
                                      for i in range(8)],
            "sub-buffers at offset 0, a parent each": [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, step).get_sub_region(
                0, nbytes) for _ in range(8)],
            "sub-buffers overlapping their neighbours": [parent.get_sub_region(i * step // 2, nbytes)
                                                         for i in range(8)],
            "of one parent beside 2000 others unused": [parent.get_sub_region(i * step, nbytes) for i in range(8)],
            "sub-buffers, a parent each": [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, step).get_sub_region(4096, nbytes)
                                           for _ in range(8)],
        }
        unused = []
        for name, bufs in layouts.items():
            if "unused" in name:
                unused = [parent.get_sub_region(4096 * i % (7 * step), step) for i in range(2000)]
            ks = []
            for i in range(8):
                k = cl.Kernel(prog, "copy4")
                k.set_args(bufs[i], bufs[(i + 1) % 8])
                ks.append(k)
            enq, total = launch_times(q, ks, (nbytes // 16,), launches)
            print(f"  {nbytes:>9d} B  {name:42s} enqueue {enq:7.2f} us a launch, to the end {total:7.2f} us a launch")
        del unused


if __name__ == "__main__":
    main()
