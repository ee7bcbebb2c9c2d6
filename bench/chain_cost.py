"""What a fused chain costs against the launches it replaces, by size (tuning.FUSE_CHAINS decides per device class
from this): the 5-step element-wise chain relu(a * b + a) * 0.5 - b, captured twice (Graph(fuse=False) and
Graph(fuse=True)), replayed --repeats times each with the queue finished after every replay; median and least ms.

    python3 bench/chain_cost.py --device 0
"""
import statistics
import time

import click
import numpy as np

import clnet
import clnet.nn.functional as F


@click.command()
@click.option("--device", default="auto")
@click.option("--repeats", default=30)
@click.option("--sizes", default="1024,16384,262144,1048576,16777216")
def main(device, repeats, sizes):
    dev = clnet.device(device)
    print(f"{dev.name} ({dev.platform_name}), {repeats} replays each, queue finished after each")
    rng = np.random.default_rng(0)
    for n in (int(s) for s in sizes.split(",")):
        a = clnet.tensor(rng.standard_normal(n).astype(np.float32), dev)
        b = clnet.tensor(rng.standard_normal(n).astype(np.float32), dev)
        row = []
        for fuse in (False, True):
            g = clnet.Graph(fuse=fuse)
            with clnet.no_grad(), g.capture():
                F.relu(a * b + a) * 0.5 - b
            for _ in range(3):
                g.replay()
            dev.synchronize()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                g.replay()
                dev.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            row.append((g.launches, statistics.median(times), min(times)))
        (lu, mu, su), (lf, mf, sf) = row
        print(f"n={n:>9}  unfused {lu} launches {mu:8.3f} ms (least {su:.3f}) | fused {lf} launch {mf:8.3f} ms "
              f"(least {sf:.3f}) | fused/unfused {mf / mu:.2f}")


if __name__ == "__main__":
    main()
