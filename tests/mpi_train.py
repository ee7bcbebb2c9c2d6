"""A few steps of data-parallel training, for tests/test_distributed.py to launch with `mpiexec -n 2` and to run in
its own process as the one-process reference (the same functions, with no world).

    mpiexec -n 2 python tests/mpi_train.py --device 1 --out DIR [--images N] [--no-loop] [--max-steps K]
        [--checkpoint CKPT] [--resume CKPT] [--fail-rank R --fail-step S]
        [--hang-rank R --hang-step S --hang-timeout T]

Rank 0 writes DIR/fit.npz (the weights after clnet.fit, with a StepLR schedule) and DIR/fit.json: fit's per-epoch
history, and without
--no-loop the per-step global losses of a plain loss.backward(); opt.step() loop over clnet.data.Loader's shards,
the tuning and timing checks, and the run of a network with batch norm, dropout and a residual connection
(DIR/bn.npz: its weights and buffers), whose one-process reference is `run_shares`.
"""
import argparse
import json
import os
import sys
import threading
import time
import zlib

import numpy as np

import clnet
from clnet import data, models, nn, optim, rng

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


def run_fit(dev, world, max_steps=None, checkpoint=None, resume=None, fail=None, hang=None, images=IMAGES,
            hang_timeout=None):
    net = model(dev, world)
    rank = world.rank if world is not None else 0
    for what, spec in (("fail", fail), ("hang", hang)):
        if spec is not None:
            calls = [0]

            def trip(module, args, what=what, at=spec[1], here=spec[0] == rank):
                calls[0] += 1
                if calls[0] == at:
                    if hang_timeout is not None:  # every rank: the first step's kernel builds had the default
                        world.timeout = hang_timeout
                    if not here:
                        return
                    if what == "fail":
                        raise RuntimeError(f"injected failure at step {at}")
                    time.sleep(3600)
            net.register_forward_pre_hook(trip)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    sched = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # the second epoch at half the lr, on every rank
    test = dataset(10, seed=4)
    result = clnet.fit(net, dataset(images), test, epochs=EPOCHS, batch=BATCH, optimizer=opt, device=dev, seed=0,
                       checkpoint=checkpoint, resume=resume, max_steps=max_steps, model_name="lenet",
                       interrupt_checkpoint=checkpoint, scheduler=sched)
    inner = net.module if world is not None else net
    return inner.state_dict(), result


def bn_model(dev, world):
    """Batch norm, dropout and a residual block (the zoo's BasicBlock), small: 28 -> 14 -> 7 pixels, 8 channels."""
    clnet.manual_seed(1)
    block = models.blocks(clnet)["BasicBlock"](8, 8)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        block, nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.25), nn.Linear(8 * 7 * 7, 10)).to(dev)
    if world is not None:
        import clnet.distributed as dist
        net = dist.DataParallel(net, bucket_mb=0.01, world=world)  # three buckets
    return net


def bn_optimizer(net):
    return optim.SGD(net.parameters(), lr=0.02, momentum=0.9)


def run_fit_bn(dev, world, dist):
    """clnet.fit of bn_model over the ranks (each epoch's end broadcasts rank 0's buffers), then close(). Rank 0 gets
    the weights and buffers, fit's history, every rank's checksums of them, and whether close() ended the
    communication thread."""
    net = bn_model(dev, world)
    result = clnet.fit(net, dataset(), dataset(10, seed=4), epochs=EPOCHS, batch=BATCH, optimizer=bn_optimizer(net),
                       device=dev, seed=0, model_name="bn")
    state = net.module.state_dict()
    sums = dist.gather_json({k: zlib.crc32(np.ascontiguousarray(v).tobytes()) for k, v in state.items()})
    thread = net._thread
    net.close()
    net.close()
    closed = dict(started=thread is not None, ended=thread is not None and not thread.is_alive(),
                  left=[t.name for t in threading.enumerate() if t is thread])
    return state, dict(history=result["epochs"], global_step=result["global_step"], sums=sums, closed=closed)


def run_shares(dev, ranks=2, epochs=EPOCHS, images=IMAGES):
    """One process doing what `ranks` ranks do in run_fit_bn: each global batch's shares run forward and backward
    one after another, each from its rank's own random stream (dropout's seeds) and with its loss weighted by its
    share, their gradients summed before the step; batch norm keeps rank 0's running statistics (a share of another
    rank runs on a copy, as its rank's statistics are replaced by rank 0's at every epoch's end). Returns the weights
    and buffers and fit's figures: the training loss and the test loss and accuracy of each epoch."""
    net = bn_model(dev, None)
    opt = bn_optimizer(net)
    loss_fn = nn.CrossEntropyLoss()
    train, test = dataset(images), dataset(10, seed=4)
    streams = [rng.get_state()] * ranks
    buffers = net.buffers()
    history = []
    for epoch in range(epochs):
        order = data.epoch_order(images, 0, epoch)
        loaders = [data.Loader(train, BATCH, dev, order, shard=(r, ranks)) for r in range(ranks)]
        total = 0.0
        for shares in zip(*loaders):
            n = sum(len(y_host) for _, _, y_host in shares)
            opt.zero_grad()
            for r, (x, y, y_host) in enumerate(shares):
                if not len(y_host):
                    continue
                kept = [b.numpy() for b in buffers] if r else None
                rng.set_state(streams[r])
                loss = loss_fn(net(x), y)
                streams[r] = rng.get_state()
                (loss * (len(y_host) / n)).backward()
                total += float(loss) * len(y_host)
                if kept is not None:
                    for b, k in zip(buffers, kept):
                        b.write(k)
            opt.step()
        ev = clnet.evaluate(net, test, batch=256, device=dev)
        history.append(dict(train_loss=total / images, test_loss=ev["loss"], test_accuracy=ev["accuracy"]))
    net.train()
    return net.state_dict(), history


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
    p.add_argument("--hang-timeout", type=float, help="every rank's collective deadline from the hang step on")
    a = p.parse_args()
    import clnet.distributed as dist
    world = dist.init()
    dev = dist.device(a.device)
    losses = extras = bn = None
    if not a.no_loop:
        losses = run_loop(dev, world)
        extras = tune_and_time(dev, world, dist)
    weights, result = run_fit(dev, world, a.max_steps, a.checkpoint, a.resume,
                              None if a.fail_rank is None else (a.fail_rank, a.fail_step),
                              None if a.hang_rank is None else (a.hang_rank, a.hang_step), a.images, a.hang_timeout)
    if not a.no_loop:
        bn_state, bn = run_fit_bn(dev, world, dist)
    if world.rank == 0:
        os.makedirs(a.out, exist_ok=True)
        np.savez(os.path.join(a.out, "fit.npz"), **weights)
        if bn is not None:
            np.savez(os.path.join(a.out, "bn.npz"), **bn_state)
        with open(os.path.join(a.out, "fit.json"), "w") as f:
            json.dump(dict(loop=losses, history=result["epochs"], global_step=result["global_step"],
                           world=world.size, device=dev.name, extras=extras, bn=bn), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
