"""Where a replayed step's time goes on the host. Times a captured training step (forward, cross-entropy, backward,
SGD with momentum) enqueued through pyopencl (an Event object per launch), without events through ctypes (what
clnet.Graph does where it finds the OpenCL loader; ctypes releases the GIL around each call), and the same holding
the GIL (ctypes.PyDLL), each three ways:

- enqueue: the host's time in `replay()` alone (the queue finished before and after, outside the timing);
- step: `replay()` then `finish()`, per step, as `clnet bench` times it;
- loop: 50 replays back to back, finished once at the end, per step (a training loop's steady rate);
- long: --long-loop replays back to back (fit_cost.py's replay row runs 3000), per step, pyopencl's enqueue and
  event-free only: on the H200 (h200-v17) lenet b64 ran 0.26 ms a step in 50-step loops but 0.43 in fit_cost's.

On the H200 (h200-v14b) enqueue, step and loop were equal with pyopencl's enqueue, and clFlush every K launches
changed nothing: the step is the host's enqueue time, about 14 us a launch, with the device idle between kernels.
Holding the GIL was tried in clnet itself after v15 and its replays were slower in that run (h200-v15b): this
measures the two side by side.

    python3 bench/replay_cost.py --device gpu --model lenet:64 --model lenet-wide:1 --json out.json
"""
import json
import statistics
import time

import click

import clnet
from clnet import graph
from graph_replay import zoo_training


def captured_step(name, batch, dev):
    train_step, batch_of = zoo_training(name, dev)
    x, y = batch_of(batch)
    for _ in range(3):
        train_step(x, y)
    g = clnet.Graph()
    with g.capture():
        train_step(x, y)
    dev.synchronize()
    return g


def timings(g, dev, repeats=50, loop=50, long_loop=0):
    enq, step, per_loop = [], [], []
    for _ in range(repeats):
        dev.synchronize()
        t0 = time.perf_counter()
        g.replay()
        enq.append(time.perf_counter() - t0)
        dev.synchronize()
        t0 = time.perf_counter()
        g.replay()
        dev.synchronize()
        step.append(time.perf_counter() - t0)
    for _ in range(5):
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(loop):
            g.replay()
        dev.synchronize()
        per_loop.append((time.perf_counter() - t0) / loop)
    ms = lambda v: statistics.median(v) * 1e3  # noqa: E731
    out = dict(enqueue_ms=ms(enq), step_ms=ms(step), loop_ms=ms(per_loop))
    if long_loop:
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(long_loop):
            g.replay()
        dev.synchronize()
        out["long_ms"] = (time.perf_counter() - t0) / long_loop * 1e3
    return out


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--model", "specs", multiple=True, default=["lenet:64", "lenet-wide:1"], help="NAME:BATCH")
@click.option("--long-loop", type=int, default=0, help="also time this many replays back to back")
@click.option("--json", "json_path", default=None)
def main(device_spec, specs, long_loop, json_path):
    dev = clnet.device(device_spec)
    print(f"{dev.name} ({dev.platform_name}, driver {dev.driver_version})")
    out = {}
    for spec in specs:
        name, batch = spec.split(":")
        g = captured_step(name, int(batch), dev)
        released = graph._enqueue_raw
        held = graph.event_free("clEnqueueNDRangeKernel", graph.ENQUEUE_ARGS, hold_gil=True)
        for how in ("pyopencl", "event-free", "GIL held", "pyopencl", "event-free", "GIL held"):
            g.event_free = how != "pyopencl"
            graph._enqueue_raw = held if how == "GIL held" else released
            timings(g, dev, repeats=5, loop=5)  # warm
            r = out.setdefault(f"{spec} {how}", [])
            r.append(dict(timings(g, dev, long_loop=0 if how == "GIL held" else long_loop), launches=g.launches))
            r = r[-1]
            long = f", long {r['long_ms']:.3f}" if "long_ms" in r else ""
            print(f"{spec:14s} {how:10s}: enqueue {r['enqueue_ms']:.3f} ms, step {r['step_ms']:.3f} ms, "
                  f"loop {r['loop_ms']:.3f}{long} ms per step ({g.launches} launches, "
                  f"{r['enqueue_ms'] / g.launches * 1e3:.1f} us each)", flush=True)
        graph._enqueue_raw = released
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
