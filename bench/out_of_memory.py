"""Out of device memory on a real GPU (issue 17): a training step at a batch that cannot fit raises clnet.OutOfMemory
with the layer, the shape, the device's memory and a batch that would fit, and the process, the device and the model
stay usable: a step at a batch that fits runs next, in the same process, with the same model.

    python3 bench/out_of_memory.py --device gpu --model resnet50 --batch 2048
"""
import time

import click
import numpy as np

import clnet
from graph_replay import zoo_training


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--model", "name", default="resnet50")
@click.option("--batch", type=int, default=2048, help="a batch too large for the device")
@click.option("--then", "then_batch", type=int, default=64, help="the batch that must still run afterwards")
def main(device_spec, name, batch, then_batch):
    dev = clnet.device(device_spec)
    train_step, batch_of = zoo_training(name, dev)

    def step(n):
        return float(train_step(*batch_of(n)))

    print(f"{name} on {dev.name}, {dev.global_mem_size / 2**30:.1f} GiB")
    t0 = time.perf_counter()
    try:
        step(batch)
        print(f"FAIL: batch {batch} fitted; choose a larger --batch")
        raise SystemExit(1)
    except clnet.OutOfMemory as e:
        print(f"PASS: batch {batch} raised clnet.OutOfMemory after {time.perf_counter() - t0:.1f} s: {e}")
        print(f"      fitting_batch({batch}) = {e.fitting_batch(batch)}")
    t0 = time.perf_counter()
    losses = [step(then_batch) for _ in range(3)]
    ok = all(np.isfinite(losses))
    print(f"{'PASS' if ok else 'FAIL'}: then 3 steps at batch {then_batch} in the same process: losses "
          f"{', '.join(f'{v:.4f}' for v in losses)} ({time.perf_counter() - t0:.1f} s)")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
