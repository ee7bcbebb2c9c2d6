"""Out of device memory on a real GPU (issue 17): a training step at a batch that cannot fit raises clnet.OutOfMemory
with the layer, the shape, the device's memory and a batch that would fit, and the process, the device and the model
stay usable: a step at a batch that fits runs next, in the same process, with the same model.

    python3 bench/out_of_memory.py --device gpu --model resnet50 --batch 2048
"""
import time

import click
import numpy as np

import clnet
from clnet import models, nn, optim


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--model", "name", default="resnet50")
@click.option("--batch", type=int, default=2048, help="a batch too large for the device")
@click.option("--then", "then_batch", type=int, default=64, help="the batch that must still run afterwards")
def main(device_spec, name, batch, then_batch):
    dev = clnet.device(device_spec)
    spec = models.MODELS[name]
    clnet.manual_seed(0)
    model = models.build(name).to(dev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)

    def step(n):
        x = clnet.tensor(rng.standard_normal((n,) + spec["input_shape"]).astype(np.float32), dev)
        y = clnet.tensor(rng.integers(0, spec["classes"], n).astype(np.int32), dev)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

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
