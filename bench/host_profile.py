"""Where a small network's iteration spends host time: enqueue time per step (host side only, the device finishing
later) against the whole step, and the Python functions that cost most (cProfile).

    python bench/host_profile.py --device gpu --model lenet --batch 64
    python bench/host_profile.py --device gpu --model resnet50 --batch 1 --forward-only  # eager inference
"""
import argparse
import cProfile
import pstats
import time

import numpy as np

import clnet
from clnet import kernels, models, nn, optim


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="lenet")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--forward-only", action="store_true", help="an eval-mode forward under no_grad, not a step")
    p.add_argument("--top", type=int, default=18, help="cProfile's rows")
    args = p.parse_args()
    dev = clnet.device(args.device)
    clnet.manual_seed(0)
    model = models.build(args.model).to(dev)
    shape = (args.batch,) + tuple(models.MODELS[args.model]["input_shape"])
    gen = np.random.default_rng(0)
    x = clnet.tensor(gen.standard_normal(shape).astype(np.float32), dev)
    classes = models.MODELS[args.model]["classes"]
    labels = clnet.tensor(gen.integers(0, classes, args.batch).astype(np.int32), dev)
    loss_fn, opt = nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():  # as `clnet bench` times it: x wants no gradient, so none is computed for it
        loss = loss_fn(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if args.forward_only:
        model.eval()

        def step():  # noqa: F811 -- the inference pass instead
            with clnet.no_grad():
                model(x)

    for _ in range(5):
        step()
    dev.synchronize()
    launches = kernels.launch_count
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    t1 = time.perf_counter()
    dev.synchronize()
    t2 = time.perf_counter()
    n = (kernels.launch_count - launches) / args.steps
    print(f"{args.model} b{args.batch} on {dev.name}: host enqueue {(t1 - t0) / args.steps * 1e3:.3f} ms per step, "
          f"whole step {(t2 - t0) / args.steps * 1e3:.3f} ms, {n:.0f} launches "
          f"({(t1 - t0) / args.steps / n * 1e6:.1f} us of host time per launch)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    dev.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
