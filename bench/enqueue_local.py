"""What the driver's enqueue of one tiny kernel costs the host with the work-group left to the driver (clnet's launch
on GPUs: kernels.launch passes no local size) against a work-group given, and through ctypes' CDLL (the GIL
released, clnet's) against PyDLL (the GIL held). Issue 26's eager add spends about 5.5 us of its 13 in this call on
the H100 (v59); a cheaper form would lower every eager launch and every replayed one.

Each figure: bench/subbuffer_launch.py's launch_times over --launches enqueues of `axpby` over 1024 elements (256
work-items of 4): medians of 5 runs after one, the queue finished before and after each, wall-clock microseconds an
enqueue.

    python3 bench/enqueue_local.py --device gpu
"""
import argparse

import numpy as np

import clnet
from clnet import elementwise, kernels
from subbuffer_launch import launch_times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--launches", type=int, default=5000)
    args = parser.parse_args(argv)
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    a = clnet.tensor(np.ones(1024, np.float32), dev)
    b = clnet.tensor(np.ones(1024, np.float32), dev)
    out = clnet.tensor(np.zeros(1024, np.float32), dev)
    k = elementwise._elementwise(dev, "axpby")
    with kernels._launch_lock:
        clone, _, handle = kernels._with_args(k, (a, b, out, 1.0, 1.0, 1024))
    print(f"device: {dev.name} ({dev.cl_device.platform.name}, driver {dev.cl_device.driver_version})")
    enqueues = {"CDLL (GIL released)": kernels._enqueue_raw,
                "PyDLL (GIL held)": kernels.event_free("clEnqueueNDRangeKernel", None, hold_gil=True)}
    glob = kernels._grid((256,))
    for how, fn in enqueues.items():
        for local in (None, (32,), (64,), (128,), (256,)):
            loc = None if local is None else kernels._grid(local)

            def enqueue(j, fn=fn, loc=loc):
                if fn(k.queue, handle, kernels._DIMS[1], None, glob, loc, kernels._NO_EVENTS, None, None):
                    raise RuntimeError("enqueue refused")
            host, whole = launch_times(dev.queue, None, None, args.launches, enqueue)
            print(f"{how}, work-group {'the driver' if local is None else local[0]:>10}: "
                  f"{host:6.2f} us an enqueue, {whole:6.2f} us with the queue finished")
    expect = np.full(1024, 2.0, np.float32)
    if not np.array_equal(out.numpy(), expect):
        raise SystemExit("the probe's adds gave a wrong result")


if __name__ == "__main__":
    main()
