"""The host cost of an eager op (issue 26): what a tiny `a + b` costs from Python through clnet, with autograd
recording and under no_grad, and a 40-op element-wise chain with its backward, in microseconds an op.

    python bench/eager_cost.py --device gpu     # the H200 (PyTorch there: 9.7 us an add, 11.6 with autograd)
    python bench/eager_cost.py --device 0 --stub  # a CPU: clnet's own Python time, no launch made

Each figure is the median over --repeats runs of --adds adds of two 1024-element tensors (or --chains chains), the
queue finished once at the end, in wall-clock time. --stub replaces the kernel enqueue with a no-op, which leaves the
Python around it (the op's checks, autograd, the kernel's argument look-up, the pool), and times this thread's CPU
time, the least of the runs (on a CPU, PoCL's own launch, about 56 us, hides that Python otherwise). The count of
Python calls an add makes is a figure no other load on the machine changes. --profile prints cProfile's top
functions of one run of adds with autograd. --driver-groups takes a GPU's launch path on a CPU (the driver picks the
work-group: PoCL's padded work-groups, any_group, are left out), for the Python an H200's launch runs.
"""
import argparse
import cProfile
import pstats
import statistics
import sys
import time

import numpy as np
import pyopencl as cl

import clnet
from clnet import kernels


clock = time.perf_counter  # --stub: this thread's CPU time (a shared machine's other work is not counted)


def _timed(fn, dev, count, repeats):
    fn()  # kernels built, clones set, pool filled
    dev.synchronize()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        dev.synchronize()
        times.append((clock() - start) / count * 1e6)
    return min(times) if clock is not time.perf_counter else statistics.median(times)


def measure(dev, adds=2000, chains=50, chain_ops=40, repeats=5):
    """{name: microseconds an op} for the three probes."""
    rng = np.random.default_rng(0)
    a = clnet.tensor(rng.standard_normal(1024).astype(np.float32), dev, requires_grad=True)
    b = clnet.tensor(rng.standard_normal(1024).astype(np.float32), dev, requires_grad=True)
    c, d = a.detach(), b.detach()

    def add_grad():
        for _ in range(adds):
            a + b

    def add_plain():
        for _ in range(adds):
            c + d

    def add_no_grad():
        with clnet.no_grad():
            for _ in range(adds):
                a + b

    def chain():
        for _ in range(chains):
            y = a
            for i in range(chain_ops // 4):  # four element-wise ops a round: mul, add, a unary, a scalar product
                y = (y * b + a).tanh() * 0.5
            y.sum().backward()

    # The floor: the same adds captured. Unfused, a replay is one enqueue an add; fused (a GPU's default), runs of
    # independent adds merge into launches of the pointwise chain, so its figure is per add, not per launch.
    replays = {}
    for fuse in (False, None):
        g = replays[fuse] = clnet.Graph(fuse=fuse)
        g.event_free = getattr(kernels, "event_free_launches", True)  # --stub: through the stubbed enqueue as well
        with g.capture():
            for _ in range(adds):
                c + d
    fused = replays[None]
    out = {
        "add, replayed unfused (one enqueue an add: the floor)": _timed(replays[False].replay, dev, adds, repeats),
        f"add, replayed with the device's fusion ({fused.launches} launches for {adds} adds), per add":
            _timed(fused.replay, dev, adds, repeats),
        "add, autograd recording": _timed(add_grad, dev, adds, repeats),
        "add, under no_grad": _timed(add_no_grad, dev, adds, repeats),
        "add, no tensor requires a gradient": _timed(add_plain, dev, adds, repeats),
        f"{chain_ops}-op chain + sum + backward, per forward op": _timed(chain, dev, chains * chain_ops, repeats),
    }
    return out


def measure_torch(adds=2000, chains=50, chain_ops=40, repeats=5):
    """The same probes in PyTorch, on CUDA where there is one (else its CPU), for the comparison."""
    import torch
    where = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
    a = torch.randn(1024, device=where, requires_grad=True)
    b = torch.randn(1024, device=where, requires_grad=True)
    c, d = a.detach(), b.detach()

    class _Dev:
        synchronize = staticmethod(sync)

    def add_grad():
        for _ in range(adds):
            a + b

    def add_no_grad():
        with torch.no_grad():
            for _ in range(adds):
                a + b

    def add_plain():
        for _ in range(adds):
            c + d

    def chain():
        for _ in range(chains):
            y = a
            for i in range(chain_ops // 4):
                y = (y * b + a).tanh() * 0.5
            y.sum().backward()

    return where, {
        "add, autograd recording": _timed(add_grad, _Dev, adds, repeats),
        "add, under no_grad": _timed(add_no_grad, _Dev, adds, repeats),
        "add, no tensor requires a gradient": _timed(add_plain, _Dev, adds, repeats),
        f"{chain_ops}-op chain + sum + backward, per forward op": _timed(chain, _Dev, chains * chain_ops, repeats),
    }


def breakdown(dev, number=20000, repeats=7, stub=True):
    """Microseconds of the pieces of one `a + b` (the least of `repeats` timings of `number` calls each): the whole op,
    its tensor allocation and release, its launch (argument set seen before), the argument key alone, the kernel
    look-up, and autograd's bookkeeping around a forward that does nothing. stub: the enqueue stubbed, in this
    thread's CPU time; else the real launches in wall-clock time, the queue finished after each timing (what the
    driver's enqueue adds to each piece)."""
    import timeit
    from clnet import autograd, ops
    if stub:
        _stub_enqueue()
    a = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
    b = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
    c, d = a.detach(), b.detach()
    out = ops.empty((1024,), dev)
    k = kernels.kernel(dev, "elementwise.cl", "axpby")
    args = (c, d, out, 1.0, 1.0, c.size)

    class Nothing(autograd.Function):
        def forward(self, x, y):
            return out

    pieces = {
        "a + b, autograd recording": lambda: a + b,
        "c + d, nothing requires a gradient": lambda: c + d,
        "a tensor made and freed (ops.empty)": lambda: ops.empty((1024,), dev),
        "the launch (kernels.launch, arguments seen before)": lambda: kernels.launch(dev, k, (256,), None, *args),
        "its argument key and clone (kernels._with_args)": lambda: kernels._with_args(k, args),
        "the kernel look-up (kernels.kernel)": lambda: kernels.kernel(dev, "elementwise.cl", "axpby"),
        "Function.apply recording, forward doing nothing": lambda: Nothing.apply(a, b),
        "Function.apply not recording, forward doing nothing": lambda: Nothing.apply(c, d),
    }
    if stub:
        return {name: min(timeit.repeat(fn, number=number, repeat=repeats, timer=time.thread_time)) / number * 1e6
                for name, fn in pieces.items()}

    def wall(fn):
        fn()
        dev.synchronize()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        dev.synchronize()
        return time.perf_counter() - start
    return {name: min(wall(fn) for _ in range(repeats)) / number * 1e6 for name, fn in pieces.items()}


def python_calls(dev):
    """Python and C function calls one `a + b` makes with autograd recording, and one under no_grad (counted by a
    profile hook: a figure no other load on the machine changes)."""
    a = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
    b = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
    counts = {}
    for name, grad in (("add, autograd recording", True), ("add, under no_grad", False)):
        with _grad_mode(grad):
            a + b  # warm
            calls = [0]

            def count(frame, event, arg):
                if event in ("call", "c_call"):
                    calls[0] += 1
            sys.setprofile(count)
            for _ in range(100):
                a + b
            sys.setprofile(None)
        counts[name] = (calls[0] - 1) / 100  # less the call that turns the hook off
    return counts


class _grad_mode:
    def __init__(self, enabled):
        self.inner = None if enabled else clnet.no_grad()

    def __enter__(self):
        if self.inner is not None:
            self.inner.__enter__()

    def __exit__(self, *exc):
        if self.inner is not None:
            self.inner.__exit__(*exc)


def _stub_enqueue():
    """The kernel enqueue as a no-op (results meaningless; the Python around it timed): launches through pyopencl's
    enqueue (not the event-free one), itself replaced."""
    kernels.event_free_launches = False
    cl.enqueue_nd_range_kernel = lambda *args, **kwargs: None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="a device index, 'gpu', 'cpu' or 'auto' (clnet devices)")
    parser.add_argument("--adds", type=int, default=2000)
    parser.add_argument("--chains", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stub", action="store_true", help="enqueue nothing: time clnet's Python alone")
    parser.add_argument("--profile", action="store_true", help="cProfile one run of adds with autograd")
    parser.add_argument("--torch", action="store_true", help="the same probes in PyTorch (CUDA where present)")
    parser.add_argument("--breakdown", action="store_true", help="time the pieces of an add (enqueue stubbed)")
    parser.add_argument("--breakdown-real", action="store_true",
                        help="time the pieces of an add with their real launches, in wall-clock time")
    parser.add_argument("--driver-groups", action="store_true",
                        help="leave every work-group to the driver, as on a GPU (a CPU's padded_group dropped): with "
                        "--stub, the Python a GPU's launch takes")
    parser.add_argument("--plain-queue", action="store_true",
                        help="a queue without profiling enabled (what a launch costs without timestamps)")
    args = parser.parse_args(argv)
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    if args.driver_groups:
        dev.padded_group = None
    if args.plain_queue:  # before any kernel is made: each keeps its queue's handle
        dev.queue = cl.CommandQueue(dev.context)
    if args.stub:
        global clock
        _stub_enqueue()
        clock = time.thread_time
    print(f"device: {dev.name} ({dev.cl_device.platform.name}, driver {dev.cl_device.driver_version})"
          f"{'; enqueue stubbed: Python only' if args.stub else ''}")
    results = measure(dev, args.adds, args.chains, repeats=args.repeats)
    for name, us in results.items():
        print(f"{us:8.2f} us  {name}")
    for name, n in python_calls(dev).items():
        print(f"{n:8.1f} Python function calls an op: {name}")
    if args.breakdown_real:
        for name, us in breakdown(dev, stub=False).items():
            print(f"{us:8.2f} us  piece, launched: {name}")
    if args.torch:
        where, theirs = measure_torch(args.adds, args.chains, repeats=args.repeats)
        for name, us in theirs.items():
            print(f"{us:8.2f} us  PyTorch ({where}): {name}")
    if args.profile:
        a = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
        b = clnet.tensor(np.ones(1024, np.float32), dev, requires_grad=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.adds):
            a + b
        prof.disable()
        dev.synchronize()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    if args.breakdown:  # after every real launch: it stubs the enqueue for the process
        for name, us in breakdown(dev).items():
            print(f"{us:8.2f} us  piece: {name}")
    return results


if __name__ == "__main__":
    main()
