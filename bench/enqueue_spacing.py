"""What one event-free enqueue of a tiny kernel costs the host as a function of the host time between enqueues
(issue 26's eager steps). On the H200 (h200-eager-cost-v26) a replay enqueues an add in 0.6-0.8 us, but the same
call made inside an eager add costs about 6.5 us more than the Python around it. The eager loop leaves a few
microseconds of Python between enqueues; if the device going idle in them is the cost (a hypothesis, not yet
measured), the enqueue grows with the gap and bursts of launches pay it once. This times the enqueue call alone
after a busy-wait of each gap, and the same launches enqueued in bursts after the same total wait.

    python3 bench/enqueue_spacing.py --device gpu
"""
import argparse
import statistics
import time

import numpy as np

import clnet
from clnet import kernels


def spin(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--count", type=int, default=4000)
    args = parser.parse_args(argv)
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    print(f"device: {dev.name} ({dev.cl_device.platform.name}, driver {dev.cl_device.driver_version})")
    a = clnet.tensor(np.ones(1024, np.float32), dev)
    out = clnet.tensor(np.zeros(1024, np.float32), dev)
    k = kernels.kernel(dev, "elementwise.cl", "axpby")
    clone, _, handle = kernels._with_args(k, (a, a, out, 1.0, 1.0, a.size))
    queue, dims, grid = k.queue, kernels._DIMS[1], kernels._grid((1024,))
    raw, none = kernels._enqueue_raw, kernels._NO_EVENTS
    clock = time.perf_counter
    for burst in (1, 8):
        for gap in (0, 1, 2, 4, 8, 16, 32):
            dev.synchronize()
            calls = []
            start = clock()
            for _ in range(args.count // burst):
                spin(gap * burst)
                for _ in range(burst):
                    t0 = clock()
                    raw(queue, handle, dims, None, grid, None, none, None, None)
                    calls.append(clock() - t0)
            dev.synchronize()
            wall = (clock() - start) / args.count * 1e6
            print(f"burst {burst}  gap {gap:3d} us: enqueue median {statistics.median(calls) * 1e6:6.2f} us, "
                  f"mean {statistics.fmean(calls) * 1e6:6.2f} us; wall {wall:6.2f} us a launch")


if __name__ == "__main__":
    main()
