"""Graph fusion A/B: a replayed training step with runs of pointwise launches fused into one launch each
(clnet.Graph(fuse=True), the default) against the same step replayed launch by launch (Graph(fuse=False)), on one
device. Steps: LeNet from the zoo at --batch, and a ConvNeXt-style block (layer norm, linear, GELU, linear, layer
scale, residual) over channels-last input (--batch, --hw, --hw, --channels); forward, loss, backward and SGD with
momentum each.

    python3 bench/fusion.py --device 0 --batch 1 --repeats 15 --steps 50 --json out.json

Prints, per step and variant, the launches a replay enqueues, the launches fused away, the chains' lengths, and the
median over --repeats timed blocks of --steps replays (the queue finished at the end of each block) in ms per step.
Both variants are captured from the same model state and replayed in alternating blocks, so drift hits both alike.
"""
import json
import statistics
import sys
import time

import click
import numpy as np

import clnet
from clnet import models, nn, optim


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(clnet.tensor(np.full(c, 1e-1, np.float32)))

    def forward(self, x):
        return x + self.gamma * self.fc2(self.act(self.fc1(self.norm(x))))


def lenet_step(dev, batch, _hw, _channels):
    clnet.manual_seed(0)
    model = models.build("lenet").to(dev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = clnet.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), dev)
    y = clnet.tensor(rng.integers(0, 10, batch).astype(np.int32), dev)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return step


def block_step(dev, batch, hw, channels):
    clnet.manual_seed(0)
    model = Block(channels).to(dev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = clnet.tensor(rng.standard_normal((batch, hw, hw, channels)).astype(np.float32), dev)
    t = clnet.tensor(rng.standard_normal((batch, hw, hw, channels)).astype(np.float32), dev)

    def step():
        opt.zero_grad()
        d = model(x) - t
        loss = (d * d).mean()
        loss.backward()
        opt.step()
    return step


STEPS = {"lenet": lenet_step, "convnext-block": block_step}


def measure(dev, name, batch, hw, channels, steps, repeats):
    step = STEPS[name](dev, batch, hw, channels)
    step()
    step()  # builds, tuning and the optimizer's flat buffers before the captures
    graphs = {}
    for fuse in (False, True):
        g = clnet.Graph(fuse=fuse)
        with g.capture():
            step()
        graphs[fuse] = g
    times = {False: [], True: []}
    for g in graphs.values():
        for _ in range(steps):  # warm: the fused launch's first enqueues
            g.replay()
    dev.synchronize()
    for _ in range(repeats):
        for fuse, g in graphs.items():
            dev.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                g.replay()
            dev.synchronize()
            times[fuse].append((time.perf_counter() - t0) / steps * 1e3)
    out = {}
    for fuse, g in graphs.items():
        out["fused" if fuse else "unfused"] = dict(launches=g.launches, fused_away=g.fused, chains=list(g.chains),
                                                   ms=statistics.median(times[fuse]), samples=times[fuse])
    return out


@click.command()
@click.option("--device", "device_spec", default="auto", help="clnet.device() spec: an index, a name word, auto")
@click.option("--model", "names", multiple=True, type=click.Choice(sorted(STEPS)), help="default: both")
@click.option("--batch", default=1, show_default=True)
@click.option("--hw", default=7, show_default=True, help="the block's input height and width")
@click.option("--channels", default=96, show_default=True, help="the block's channels (ConvNeXt-T's first stage)")
@click.option("--steps", default=50, show_default=True, help="replays per timed block")
@click.option("--repeats", default=15, show_default=True, help="timed blocks per variant (the median is reported)")
@click.option("--json", "json_path", default=None, help="write the figures here too")
def main(device_spec, names, batch, hw, channels, steps, repeats, json_path):
    dev = clnet.device(device_spec)
    report = dict(device=dev.name, platform=dev.platform_name, batch=batch, hw=hw, channels=channels, steps=steps,
                  repeats=repeats, argv=sys.argv[1:], results={})
    print(f"{dev.name} ({dev.platform_name}), batch {batch}, {repeats} blocks of {steps} replays")
    for name in names or sorted(STEPS):
        r = measure(dev, name, batch, hw, channels, steps, repeats)
        report["results"][name] = r
        u, f = r["unfused"], r["fused"]
        print(f"{name:15s} unfused {u['launches']:3d} launches {u['ms']:8.3f} ms | fused {f['launches']:3d} launches "
              f"({f['fused_away']} merged, chains {f['chains']}) {f['ms']:8.3f} ms | fused/unfused "
              f"{f['ms'] / u['ms']:.3f}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
