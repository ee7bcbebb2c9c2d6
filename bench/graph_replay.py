"""Host cost of a training step, eager against a replayed clnet.Graph, beside PyTorch eager (and its CUDA graph on a
GPU), on one device. Each step is forward, cross-entropy, backward and SGD with momentum, on a fixed batch.

    python3 bench/graph_replay.py --device 1 --model lenet --batch 64 --model lenet-wide --batch 1
    python3 bench/graph_replay.py --device 0 --model lenet-wide --batch 1 --in-backward  # optimizer in backward
    python3 bench/graph_replay.py --device 0 --model lenet --batch 1 --gpu-shaped --no-torch  # a GPU's launches

Prints and writes JSON (--json) of medians over --repeats timed blocks of --steps steps each, the queue finished at
the end of each block (so the figure is the steady rate of a training loop, host and device overlapping).
"""
import json
import statistics
import time

import click
import numpy as np

import clnet
from clnet import kernels, models, nn, optim, tuning
from clnet.bench import torch_graph_ms


def in_backward(params, make):
    """PyTorch's optimizer-in-backward pattern: an optimizer per parameter (make([p])), stepped and zeroed in the
    parameter's post-accumulate-grad hook as soon as its gradient is complete (on a CPU a large dense weight's batch-1
    gradient is then taken by its step in one pass and never written, conv.DeferredWeightGrad). Returns the
    optimizers, whose zero_grad the step also calls first: inside a captured step, so that the capture's backward
    overwrites the gradients rather than adding to gradients a step before the capture zeroed."""
    opts = {id(p): make([p]) for p in params}

    def hook(p):
        opts[id(p)].step()
        opts[id(p)].zero_grad()
    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    return list(opts.values())


def zoo_training(name, dev, hooked=False):
    """(train_step, batch_of) for a zoo model on dev with SGD (momentum 0.9) and cross-entropy: train_step(x, y) runs
    one step and returns its loss tensor; batch_of(n) draws n random images and labels on dev. The other bench
    scripts that time or stress a training step use it too. hooked: the optimizer-in-backward pattern (in_backward)
    instead of one optimizer stepped after backward."""
    spec = models.MODELS[name]
    clnet.manual_seed(0)
    model = models.build(name).to(dev)
    loss_fn = nn.CrossEntropyLoss()
    if hooked:
        opts = in_backward(list(model.parameters()), lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9))
    rng = np.random.default_rng(0)

    def batch_of(n):
        return (clnet.tensor(rng.standard_normal((n,) + spec["input_shape"]).astype(np.float32), dev),
                clnet.tensor(rng.integers(0, spec["classes"], n).astype(np.int32), dev))

    if hooked:
        def train_step(x, y):
            for o in opts:
                o.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            return loss
        return train_step, batch_of
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return train_step, batch_of


def clnet_rates(name, batch, dev, steps, repeats, hooked=False):
    train_step, batch_of = zoo_training(name, dev, hooked)
    x, y = batch_of(batch)

    def step():
        train_step(x, y)

    def timed(fn):
        out = []
        for _ in range(repeats):
            dev.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            dev.synchronize()
            out.append((time.perf_counter() - t0) / steps * 1e3)
        return statistics.median(out)

    for _ in range(3):
        step()
    before = kernels.launch_count
    step()
    launches = kernels.launch_count - before
    eager = timed(step)
    g = clnet.Graph()
    with g.capture():
        step()
    replay = timed(g.replay)
    return dict(eager_ms=eager, replay_ms=replay, launches=launches, recorded=g.launches, kernels=replayed_kernels(g))


def replayed_kernels(g):
    """The replay's launches in order, by kernel name (fused chains included), and its host actions as "host"."""
    return [(getattr(item[0], "function_name", None) or "host") if isinstance(item, tuple) else "host"
            for item in g._items]


def torch_rates(name, batch, steps, repeats, cuda, hooked=False):
    import torch
    spec = models.MODELS[name]
    tdev = torch.device("cuda" if cuda else "cpu")
    model = models.build(name, lib=torch).to(tdev)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn((batch,) + spec["input_shape"], device=tdev)
    y = torch.randint(0, spec["classes"], (batch,), device=tdev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if hooked:
        opts = in_backward(list(model.parameters()), lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9))

        def step():
            for o in opts:
                o.zero_grad(set_to_none=False)
            loss_fn(model(x), y).backward()
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad(set_to_none=False)
            loss_fn(model(x), y).backward()
            opt.step()

    def timed(fn):
        out = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            sync()
            out.append((time.perf_counter() - t0) / steps * 1e3)
        return statistics.median(out)

    for _ in range(3):
        step()
    result = dict(eager_ms=timed(step))
    if cuda and not hooked:  # the CUDA-graph step a PyTorch user who cares about small batches runs (per replay)
        result["graph_ms"] = torch_graph_ms(model, opt, x, y, steps * repeats, forward_only=False)
    return result


@click.command()
@click.option("--device", "device_spec", default="auto")
@click.option("--model", "names", multiple=True, default=["lenet"])
@click.option("--batch", "batches", multiple=True, type=click.IntRange(1), default=[64])
@click.option("--steps", type=click.IntRange(1), default=50)
@click.option("--repeats", type=click.IntRange(1), default=5)
@click.option("--torch/--no-torch", "with_torch", default=True)
@click.option("--json", "json_path", default=None)
@click.option("--in-backward", "hooked", is_flag=True,
              help="both engines in PyTorch's optimizer-in-backward pattern (an optimizer per parameter, stepped in "
                   "its post-accumulate-grad hook) instead of one optimizer stepped after backward")
@click.option("--gpu-shaped", is_flag=True,
              help="a CPU device runs a GPU's kernels and default choices (as the tests' other-shape runs do): the "
                   "launches and kernels of a GPU's untuned step, counted here; its times mean nothing")
def main(device_spec, names, batches, steps, repeats, with_torch, json_path, hooked, gpu_shaped):
    dev = clnet.device(device_spec)
    cuda = dev.is_gpu
    if gpu_shaped:
        dev.is_gpu, dev.padded_group = True, None
        tuning.cpu_shaped = lambda d: False
    rows = []
    for name, batch in zip(names, batches):
        row = dict(model=name, batch=batch, device=dev.name, in_backward=hooked,
                   **clnet_rates(name, batch, dev, steps, repeats, hooked))
        if with_torch:
            row["torch"] = torch_rates(name, batch, steps, repeats, cuda=cuda, hooked=hooked)
        rows.append(row)
        click.echo(json.dumps(row))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
