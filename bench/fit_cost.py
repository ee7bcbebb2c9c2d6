"""Where `clnet.fit`'s step goes at a small batch: the whole fit loop per step against its parts, on random images.

    python3 bench/fit_cost.py --device gpu --model lenet-wide --batch 1 --steps 3000

Rows (ms per step, each the median of --repeats runs over --steps steps):
  fit      clnet.fit for one epoch of --steps batches (graphs on), its own `seconds` per step;
  loader   data.Loader alone: the batches gathered and uploaded, no step;
  replay   the captured step replayed back to back (no loader, no metrics), finished once at the end.
fit - replay is the host work fit adds per step. --profile: cProfile's top functions (internal time) of one more
fit epoch, where that host work goes.
"""
import cProfile
import json
import pstats
import statistics
import time

import click
import numpy as np

import clnet
from clnet import data, models
from replay_cost import captured_step


def dataset(name, steps, batch):
    spec = models.MODELS[name]
    rng = np.random.default_rng(0)
    n = steps * batch
    images = rng.integers(0, 256, (n,) + spec["input_shape"], dtype=np.uint8)
    return data.Dataset(images, rng.integers(0, spec["classes"], n), mean=0.3, std=0.3)


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--model", "name", default="lenet-wide")
@click.option("--batch", type=int, default=1)
@click.option("--steps", type=int, default=3000)
@click.option("--repeats", type=int, default=3)
@click.option("--json", "json_path", default=None)
@click.option("--profile", is_flag=True, help="cProfile one more fit epoch")
def main(device_spec, name, batch, steps, repeats, json_path, profile):
    dev = clnet.device(device_spec)
    print(f"{dev.name} ({dev.platform_name}, driver {dev.driver_version}): {name} batch {batch}, {steps} steps")
    ds = dataset(name, steps, batch)
    rows = {}

    def fit_ms():
        clnet.manual_seed(0)
        model = models.build(name)
        r = clnet.fit(model, ds, epochs=1, batch=batch, lr=0.001, device=dev)
        return r["epochs"][0]["seconds"] / steps * 1e3

    def loader_ms():
        t0 = time.perf_counter()
        for _ in data.Loader(ds, batch, dev, data.epoch_order(len(ds), 0, 0)):
            pass
        dev.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    g = captured_step(name, batch, dev)

    def replay_ms():
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            g.replay()
        dev.synchronize()
        return (time.perf_counter() - t0) / steps * 1e3

    for row, fn in (("fit", fit_ms), ("loader", loader_ms), ("replay", replay_ms)):
        fn()  # warm: builds, tuning, first allocations
        rows[row] = statistics.median(fn() for _ in range(repeats))
        print(f"{row:8s} {rows[row]:.3f} ms per step", flush=True)
    print(f"fit adds {rows['fit'] - rows['replay']:.3f} ms per step to the replayed step ({g.launches} launches)")
    if profile:
        prof = cProfile.Profile()
        prof.runcall(fit_ms)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(device=dev.name, driver=dev.driver_version, model=name, batch=batch, steps=steps,
                           launches=g.launches, ms_per_step=rows), f, indent=1)


if __name__ == "__main__":
    main()
