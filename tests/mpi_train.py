"""A few steps of data-parallel training, for tests/test_distributed.py to launch with `mpiexec -n 2` and to run in
its own process as the one-process reference (the same functions, with no world).

    mpiexec -n 2 python tests/mpi_train.py --device 1 --out DIR [--images N] [--no-loop] [--max-steps K]
        [--checkpoint CKPT] [--resume CKPT] [--fail-rank R --fail-step S] [--hang-rank R --hang-step S]

Rank 0 writes DIR/loop.json (the per-step global losses of a plain loss.backward(); opt.step() loop over
clnet.data.Loader's shards), DIR/fit.npz (the weights after clnet.fit) and DIR/fit.json (fit's per-epoch history).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import clnet
from clnet import data, models, nn, optim

# 37 images = 4 batches of 8 and a last one of 5, split 3 + 2 over two ranks (33: a last batch of 1, split 1 + 0)
IMAGES, BATCH, EPOCHS, LOOP_STEPS = 37, 8, 2, 3
BUCKET_MB = 0.05  # lenet's gradients in three buckets (the classifier, conv2, conv1)


def dataset(n=IMAGES, seed=3):
    """Images whose class is the row of a bright bar: learnable in a few steps."""
    r = np.random.default_rng(seed)
    labels = r.integers(0, 10, n)
    images = r.integers(0, 50, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c + 3:2 * c + 6, 4:24] = 240
    return data.Dataset(images, labels.astype(np.uint8), "bars", 0.2, 0.3)


def model(dev, world):
    clnet.manual_seed(0)
    net = models.build("lenet").to(dev)
    if world is not None:
        import clnet.distributed as dist
        net = dist.DataParallel(net, bucket_mb=BUCKET_MB, world=world)
    return net


def run_loop(dev, world, steps=LOOP_STEPS):
    """The Python API: each step's global mean loss, from the ranks' shares (equal shares: no share() needed)."""
    net = model(dev, world)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    shard = (world.rank, world.size) if world is not None else None
    loader = data.Loader(dataset(), BATCH, dev, data.epoch_order(IMAGES, 0, 0), shard=shard)
    losses = []
    for _, (x, y, y_host) in zip(range(steps), loader):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()  # the last bucket's hook waits for the all-reduces: .grad is the global mean's
        opt.step()
        total = np.array([float(loss) * len(y_host)])
        if world is not None:
            world.allreduce(total)
        losses.append(float(total[0]) / BATCH)
    return losses


def run_fit(dev, world, max_steps=None, checkpoint=None, resume=None, fail=None, hang=None, images=IMAGES):
    net = model(dev, world)
    rank = world.rank if world is not None else 0
    for what, spec in (("fail", fail), ("hang", hang)):
        if spec is not None and spec[0] == rank:
            calls = [0]

            def trip(module, args, what=what, at=spec[1]):
                calls[0] += 1
                if calls[0] == at:
                    if what == "fail":
                        raise RuntimeError(f"injected failure at step {at}")
                    time.sleep(3600)
            net.register_forward_pre_hook(trip)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    test = dataset(10, seed=4)
    result = clnet.fit(net, dataset(images), test, epochs=EPOCHS, batch=BATCH, optimizer=opt, device=dev, seed=0,
                       checkpoint=checkpoint, resume=resume, max_steps=max_steps, model_name="lenet",
                       interrupt_checkpoint=checkpoint)
    inner = net.module if world is not None else net
    return inner.state_dict(), result


def tune_and_time(dev, world, dist):
    """Rank 0 'tunes' (stores one made-up entry) while the others wait and take its table; then a two-step timing
    of the data-parallel step. Rank 0 gets what every rank saw, and the timing."""
    from clnet import tuning
    returned = dist.tune_on_rank0(lambda: tuning.store(dev, {"mpi-test-key": dict(kernel="none")}) or "tuned", dev)
    seen = dist.gather_json(dict(rank=world.rank, returned=returned, entry=tuning.entries(dev).get("mpi-test-key")))
    x = np.random.default_rng(world.rank).standard_normal((4, 1, 28, 28)).astype(np.float32)
    timing = dist.time_data_parallel(model(dev, None), dev, x, np.arange(4, dtype=np.int32), iterations=2, warmup=1)
    net = model(dev, world)  # weights that drift apart on one rank are caught and replaced by rank 0's
    checks = [net.check_in_sync()]
    if world.rank == 1:
        w = net.module.parameters()[0]
        w.write(w.numpy() * np.float32(1.001))
    checks.append(net.check_in_sync())
    net.end_epoch()
    checks.append(net.check_in_sync())
    return dict(tuning=seen, timing=timing, in_sync=checks)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--images", type=int, default=IMAGES)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--checkpoint")
    p.add_argument("--resume")
    p.add_argument("--no-loop", action="store_true")
    p.add_argument("--fail-rank", type=int)
    p.add_argument("--fail-step", type=int, default=2)
    p.add_argument("--hang-rank", type=int)
    p.add_argument("--hang-step", type=int, default=2)
    a = p.parse_args()
    import clnet.distributed as dist
    world = dist.init()
    dev = dist.device(a.device)
    losses = extras = None
    if not a.no_loop:
        losses = run_loop(dev, world)
        extras = tune_and_time(dev, world, dist)
    weights, result = run_fit(dev, world, a.max_steps, a.checkpoint, a.resume,
                              None if a.fail_rank is None else (a.fail_rank, a.fail_step),
                              None if a.hang_rank is None else (a.hang_rank, a.hang_step), a.images)
    if world.rank == 0:
        os.makedirs(a.out, exist_ok=True)
        np.savez(os.path.join(a.out, "fit.npz"), **weights)
        with open(os.path.join(a.out, "fit.json"), "w") as f:
            json.dump(dict(loop=losses, history=result["epochs"], global_step=result["global_step"],
                           world=world.size, device=dev.name, extras=extras), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
