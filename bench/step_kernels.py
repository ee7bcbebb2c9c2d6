"""Each kernel of one eager training step of a zoo network, in launch order, with its device time from profiling
events (kernels.Profiler.launches_ms) and what launched it: where a small step's device time goes, launch by launch.

    python3 bench/step_kernels.py --device gpu --model lenet --batch 1
"""
import argparse

import clnet
from clnet import kernels
from graph_replay import zoo_training


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="lenet")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="profiled steps after three warm-up steps; the least of each")
    args = p.parse_args()
    dev = clnet.device(args.device)
    train_step, batch_of = zoo_training(args.model, dev)
    x, y = batch_of(args.batch)
    for _ in range(3):
        train_step(x, y)
    dev.synchronize()
    runs = []
    for _ in range(args.steps):
        prof = kernels.Profiler()
        kernels.context.profiler = prof
        try:
            train_step(x, y)
            dev.synchronize()
        finally:
            kernels.context.profiler = None
        runs.append(prof.launches_ms())
    names = [(name, what) for name, what, _ in runs[0]]
    if len({len(r) for r in runs}) > 1:
        raise SystemExit(f"the steps launched different kernels ({sorted({len(r) for r in runs})} launches): "
                         "no kernel-by-kernel least")
    least = [min(r[i][2] for r in runs) for i in range(len(names))]
    print(f"{args.model} b{args.batch} on {dev.name}: {len(names)} kernels, {sum(least) * 1e3:.1f} us of kernel time "
          f"(the least of {args.steps} steps, kernel by kernel)")
    for (name, w), ms in zip(names, least):
        print(f"  {ms * 1e3:8.1f} us  {name:28s} {w}")


if __name__ == "__main__":
    main()
