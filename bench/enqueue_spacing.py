"""What one event-free enqueue of a tiny kernel costs the host as a function of the host time between enqueues
(issue 26's eager steps). On the H200 (h200-eager-cost-v26) a replay enqueues an add in 0.6-0.8 us, but the same
call made inside an eager add costs about 6.5 us more than the Python around it. The eager loop leaves a few
microseconds of Python between enqueues; if the device going idle in them is the cost (a hypothesis, not yet
measured), the enqueue grows with the gap and bursts of launches pay it once. A second hypothesis: the eager loop
enqueues the same cl_kernel object again while its last launch is in flight (a cached clone), where a replay enqueues a
clone of its own for each launch. This times the enqueue call alone after a busy-wait of each gap, the same launches
enqueued in bursts after the same total wait, and both with one clone against a cycle of distinct clones.

    python3 bench/enqueue_spacing.py --device gpu
"""
import argparse
import ctypes
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
    parser.add_argument("--clones", type=int, default=64, help="distinct clones cycled in the second pass")
    args = parser.parse_args(argv)
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    print(f"device: {dev.name} ({dev.cl_device.platform.name}, driver {dev.cl_device.driver_version})")
    a = clnet.tensor(np.ones(1024, np.float32), dev)
    out = clnet.tensor(np.zeros(1024, np.float32), dev)
    k = kernels.kernel(dev, "elementwise.cl", "axpby")
    args_ = (a, a, out, 1.0, 1.0, a.size)
    clone, _, handle = kernels._with_args(k, args_)
    own = [kernels.own_clone(k, args_)[0] for _ in range(args.clones)]
    handles = {1: [handle], args.clones: [ctypes.c_void_p(c.int_ptr) for c in own]}
    queue, dims, grid = k.queue, kernels._DIMS[1], kernels._grid((1024,))
    raw, none = kernels._enqueue_raw, kernels._NO_EVENTS
    clock = time.perf_counter
    variants(dev, args.count)
    argument_cost(dev, args.count)
    for kinds, cycle in handles.items():
        for burst in (1, 8):
            for gap in (0, 1, 2, 4, 8, 16, 32):
                dev.synchronize()
                calls = []
                start = clock()
                i = 0
                for _ in range(args.count // burst):
                    spin(gap * burst)
                    for _ in range(burst):
                        h = cycle[i % kinds]
                        i += 1
                        t0 = clock()
                        raw(queue, h, dims, None, grid, None, none, None, None)
                        calls.append(clock() - t0)
                dev.synchronize()
                wall = (clock() - start) / args.count * 1e6
                print(f"clones {kinds:3d}  burst {burst}  gap {gap:3d} us: enqueue median "
                      f"{statistics.median(calls) * 1e6:6.2f} us, mean {statistics.fmean(calls) * 1e6:6.2f} us; "
                      f"wall {wall:6.2f} us a launch")


def variants(dev, count):
    """What the replay's enqueue does differently: a replay of `count` captured adds (host time alone, then with
    the queue finished), each of its raw calls timed alone, and the eager probe's raw call with an explicit
    work-group and on a queue without profiling."""
    import pyopencl as cl
    clock = time.perf_counter
    c = clnet.tensor(np.ones(1024, np.float32), dev)
    d = clnet.tensor(np.ones(1024, np.float32), dev)
    g = clnet.Graph()
    with g.capture():
        for _ in range(count):
            c + d
    items = [i for i in g._items if type(i) is tuple]
    print(f"replay: {g.launches} launches recorded, {len(items)} launch items, {len(g._items)} items; first "
          f"{items[0][0].function_name} global {items[0][1]} local {items[0][2]}")
    g.replay()
    dev.synchronize()
    host, whole = [], []
    for _ in range(5):
        t0 = clock()
        g.replay()
        t1 = clock()
        dev.synchronize()
        host.append((t1 - t0) / count * 1e6)
        whole.append((clock() - t0) / count * 1e6)
    print(f"replay: host {statistics.median(host):6.2f} us a launch, with the queue finished "
          f"{statistics.median(whole):6.2f}")
    raw, none, handle = kernels._enqueue_raw, kernels._NO_EVENTS, ctypes.c_void_p(g._queue.int_ptr)
    plain = cl.CommandQueue(dev.context)
    for name, q in (("profiling queue", handle), ("plain queue", ctypes.c_void_p(plain.int_ptr))):
        calls = []
        for item in items:
            kernel, dims, sizes, local = item[4:8]
            t0 = clock()
            raw(q, kernel, dims, None, sizes, local, none, None, None)
            calls.append(clock() - t0)
        dev.synchronize()
        plain.finish()
        print(f"replay items by hand, {name}: enqueue median {statistics.median(calls) * 1e6:6.2f} us")
    k = kernels.kernel(dev, "elementwise.cl", "axpby")
    out = clnet.tensor(np.zeros(1024, np.float32), dev)
    _, _, h = kernels._with_args(k, (c, c, out, 1.0, 1.0, c.size))
    for name, q, local in (("profiling queue, local NULL", k.queue, None),
                           ("profiling queue, local 256", k.queue, kernels._grid((256,))),
                           ("plain queue, local NULL", ctypes.c_void_p(plain.int_ptr), None),
                           ("plain queue, local 256", ctypes.c_void_p(plain.int_ptr), kernels._grid((256,)))):
        calls = []
        for _ in range(count):
            t0 = clock()
            raw(q, h, kernels._DIMS[1], None, kernels._grid((1024,)), local, none, None, None)
            calls.append(clock() - t0)
        dev.synchronize()
        plain.finish()
        print(f"eager probe, {name}: enqueue median {statistics.median(calls) * 1e6:6.2f} us")


def argument_cost(dev, count):
    """The enqueue's cost by the kernel's buffer arguments (1, 3, 4 and 13; the same buffer each time against
    distinct ones) and by the buffers alive in the context (2000 more), every kernel given n = 0 (no work)."""
    import pyopencl as cl
    clock = time.perf_counter
    bufs = [clnet.tensor(np.zeros(1024, np.float32), dev) for _ in range(13)]
    code = clnet.tensor(np.zeros(16, np.int32), dev)
    cases = {
        "fill, 1 buffer": ("elementwise.cl", "fill", (bufs[0], 0.0, 0)),
        "axpby, 3 distinct buffers": ("elementwise.cl", "axpby", (bufs[0], bufs[1], bufs[2], 1.0, 1.0, 0)),
        "axpby, one buffer thrice": ("elementwise.cl", "axpby", (bufs[0], bufs[0], bufs[0], 1.0, 1.0, 0)),
        "adam_step, 4 buffers": ("adam.cl", "adam_step", (*bufs[:4], 0, 0.1, 0.1, 1.0, 0.9, 0.99, 1e-8, 0.0)),
        "pointwise_chain, 13 distinct buffers": ("chain.cl", "pointwise_chain", (*bufs[:12], code, 0)),
        "pointwise_chain, one buffer 12 times": ("chain.cl", "pointwise_chain", (*[bufs[0]] * 12, code, 0)),
    }

    def timed(name):
        filename, kname, kargs = cases[name]
        k = kernels.kernel(dev, filename, kname)
        _, _, h = kernels._with_args(k, kargs)
        grid = kernels._grid((1024,))
        calls = []
        for _ in range(count):
            t0 = clock()
            kernels._enqueue_raw(k.queue, h, kernels._DIMS[1], None, grid, None, kernels._NO_EVENTS, None, None)
            calls.append(clock() - t0)
        dev.synchronize()
        return statistics.median(calls) * 1e6

    for name in cases:
        print(f"arguments: {name}: enqueue median {timed(name):6.2f} us")
    extra = [cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 4096) for _ in range(2000)]
    for b in extra:  # each made resident once (a fill of its own)
        cl.enqueue_fill_buffer(dev.queue, b, np.float32(0), 0, 4096)
    dev.synchronize()
    for name in ("fill, 1 buffer", "axpby, 3 distinct buffers"):
        print(f"arguments, 2000 more buffers alive: {name}: enqueue median {timed(name):6.2f} us")
    del extra


if __name__ == "__main__":
    main()
