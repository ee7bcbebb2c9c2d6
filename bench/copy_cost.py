"""What a small device-to-device copy costs the host (issue 26): the driver's copy (clEnqueueCopyBuffer, event-free,
as graph.copy_buffer makes it) against the same bytes moved by a kernel launch (elementwise.cl copy2d, its argument
set cached), for the sizes a batch-1 step copies: a step's (loss, correct) into fit's ring (8 bytes), a label (4) and
an image (3136) into a replayed step's inputs.

    python3 bench/copy_cost.py --device gpu

Each figure: microseconds a copy, the median of --repeats runs of --copies copies, the queue finished once at the end
of each run (wall-clock time: the host's cost where it is above the device's).
"""
import argparse
import statistics
import time

import numpy as np

import clnet
from clnet import kernels
from clnet.graph import copy_buffer


def timed(fn, dev, copies, repeats, host_only=False):
    """Microseconds of fn() a copy, the median of `repeats` runs: to the queue's end, or (host_only) to fn's return,
    the queue finished after the clock stops."""
    fn()
    dev.synchronize()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if not host_only:
            dev.synchronize()
        runs.append((time.perf_counter() - start) / copies * 1e6)
        dev.synchronize()
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--copies", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    print(f"{dev.name} ({dev.platform_name}, driver {dev.driver_version}): {args.copies} copies a run, medians of "
          f"{args.repeats}")
    k = kernels.kernel(dev, "elementwise.cl", "copy2d")
    for nbytes in (4, 8, 3136):
        n = nbytes // 4
        src = clnet.tensor(np.arange(n, dtype=np.float32), dev)
        dst = clnet.tensor(np.zeros(n, np.float32), dev)
        s_buf, d_buf = src.storage.buffer, dst.storage.buffer

        def driver():
            for _ in range(args.copies):
                copy_buffer(dev, d_buf, s_buf, nbytes)

        def kernel():
            for _ in range(args.copies):
                kernels.launch(dev, k, (n, 1), kernels.ANY_GROUP, src, 0, n, dst, 0, n, 1, n, what="copy")

        def tensor_copy():
            for _ in range(args.copies):
                dst.copy_from(src)

        for name, fn in (("driver's copy (graph.copy_buffer)", driver), ("Tensor.copy_from", tensor_copy),
                         ("kernel launch (copy2d)", kernel)):
            print(f"{nbytes:6d} bytes  {timed(fn, dev, args.copies, args.repeats):7.2f} us  {name}", flush=True)
        assert np.array_equal(dst.numpy(), src.numpy())


if __name__ == "__main__":
    main()
