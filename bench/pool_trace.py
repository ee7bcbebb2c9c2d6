"""Where a training step's device memory goes: every buffer the pool hands out, tagged by the clnet function that
asked for it, over a few eager steps of a zoo network.

Prints the pool's bytes (buffers in use and cached: what `clnet bench` reports as peak memory), the peak of the
bytes the traced steps had in use at once, and per calling site the most bytes it held at once and its distinct
sizes; the sites' peaks summed, set against the in-use peak, say how far apart in time they fall. The step is
`clnet bench`'s (bench.runner.ClnetRunner: SGD with momentum, cross-entropy).

    python3 bench/pool_trace.py --model resnet50 --batch 128 --device gpu [--json out.json]
"""
import collections
import json
import sys

import click
import numpy as np

import clnet
from clnet import models
from clnet.bench.runner import ClnetRunner
from clnet.tensor import _Storage, pool as device_pool


def _site():
    """module.function of the innermost clnet frame that asked for the buffer, past tensor.py, creation.py and the
    generic makers (empty, zeros, _make)."""
    f = sys._getframe(2)
    skip = {"tensor.py", "creation.py", "pool_trace.py"}
    while f is not None:
        name = f.f_code.co_filename.rsplit("/", 1)[-1]
        if "clnet" in f.f_code.co_filename and name not in skip and f.f_code.co_name not in ("empty", "zeros", "_make"):
            return f"{name[:-3]}.{f.f_code.co_name}"
        f = f.f_back
    return "(user)"


@click.command()
@click.option("--model", default="resnet50")
@click.option("--batch", default=16)
@click.option("--device", "device_spec", default="auto")
@click.option("--steps", default=3)
@click.option("--json", "json_path", default=None)
def main(model, batch, device_spec, steps, json_path):
    dev = clnet.device(device_spec)
    pool = device_pool(dev)
    live = {}  # id(buffer) -> (size, site)
    state = dict(live_bytes=0, peak_live=0)
    site_now = collections.Counter()
    site_peak = collections.Counter()
    site_sizes = collections.defaultdict(set)
    take, give = pool.take, pool.give

    def traced_take(nbytes):
        buf, number, size, block = take(nbytes)
        site = _site()
        live[id(buf)] = (size, site)
        state["live_bytes"] += size
        state["peak_live"] = max(state["peak_live"], state["live_bytes"])
        site_now[site] += size
        site_peak[site] = max(site_peak[site], site_now[site])
        site_sizes[site].add(size)
        return buf, number, size, block

    def returned(buf):
        entry = live.pop(id(buf), None)
        if entry is not None:
            state["live_bytes"] -= entry[0]
            site_now[entry[1]] -= entry[0]

    def traced_give(buf, number, size):
        returned(buf)
        return give(buf, number, size)

    storage_del = _Storage.__del__

    def traced_del(storage):  # a tensor's storage gives its buffer back inline (BufferPool.give's body)
        returned(storage.buffer)
        storage_del(storage)

    rng = np.random.default_rng(0)
    spec = models.MODELS[model]
    runner = ClnetRunner(models.build(model), dev,
                         rng.standard_normal((batch,) + tuple(spec["input_shape"])).astype(np.float32),
                         rng.integers(0, spec["classes"], batch).astype(np.int32))
    pool.release_cached()
    state["pool_at_start"] = pool.allocated_bytes
    pool.take, pool.give = traced_take, traced_give
    _Storage.__del__ = traced_del
    per_step = []
    for i in range(steps):
        runner.step()
        dev.synchronize()
        per_step.append(pool.allocated_bytes)
        click.echo(f"step {i}: pool {pool.allocated_bytes / 2**20:.1f} MiB, in-use peak "
                   f"{state['peak_live'] / 2**20:.1f} MiB", err=True)
    pool.take, pool.give = take, give
    _Storage.__del__ = storage_del
    cached = collections.Counter()
    for size, bucket in pool.free.items():
        cached[size] += len(bucket)
    rows = sorted(site_peak.items(), key=lambda kv: -kv[1])
    click.echo(f"{model} batch {batch} on {dev.name}: pool {pool.allocated_bytes / 2**20:.1f} MiB "
               f"(at start {state['pool_at_start'] / 2**20:.1f}), peak in use {state['peak_live'] / 2**20:.1f} MiB, "
               f"cached now {sum(s * n for s, n in cached.items()) / 2**20:.1f} MiB in {len(cached)} sizes")
    click.echo(f"the sites' peaks summed: {sum(site_peak.values()) / 2**20:.1f} MiB")
    click.echo(f"{'site':48s} {'peak MiB':>10s} {'sizes':>6s}")
    for site, peak in rows[:30]:
        click.echo(f"{site:48s} {peak / 2**20:10.1f} {len(site_sizes[site]):6d}")
    click.echo("largest cached sizes (MiB x count): " + ", ".join(
        f"{s / 2**20:.1f}x{n}" for s, n in sorted(cached.items(), key=lambda kv: -kv[0] * kv[1])[:15]))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(model=model, batch=batch, device=dev.name, pool_bytes=pool.allocated_bytes,
                           pool_at_start=state["pool_at_start"], peak_live_bytes=state["peak_live"],
                           per_step_pool=per_step, sites={s: p for s, p in rows},
                           cached={str(s): n for s, n in cached.items()}), f, indent=1)


if __name__ == "__main__":
    main()
