"""What a concatenation costs (issue 26): device time (the sum of its kernels' profiled times) and host time of
clnet.cat forward and of its backward, for the joins of squeezenet1_1, googlenet and densenet121 at batch 64.

    python3 bench/cat_cost.py --device gpu [--batch 64]

Each figure: the median of --repeats calls, in microseconds; bytes moved and the bandwidth they imply.
"""
import argparse

import numpy as np

import clnet
from clnet import kernels, ops
from copy_cost import timed  # bench/, where this runs from


def cases(n):
    return {
        "squeezenet fire2 (2 inputs)": [(n, 64, 55, 55)] * 2,
        "googlenet 3a (4 inputs)": [(n, 64, 28, 28), (n, 128, 28, 28), (n, 32, 28, 28), (n, 32, 28, 28)],
        "densenet block1 last (7)": [(n, 64, 56, 56)] + [(n, 32, 56, 56)] * 6,
        "densenet block3 last (25)": [(n, 256, 14, 14)] + [(n, 32, 14, 14)] * 24,
        "densenet block4 last (17)": [(n, 512, 7, 7)] + [(n, 32, 7, 7)] * 16,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    print(f"{dev.name} ({dev.platform_name}, driver {dev.driver_version}), batch {args.batch}, medians of "
          f"{args.repeats}")
    rng = np.random.default_rng(0)
    for name, shapes in cases(args.batch).items():
        xs = [clnet.tensor(rng.standard_normal(s).astype(np.float32), dev) for s in shapes]
        total = sum(int(np.prod(s)) for s in shapes)
        dy = clnet.tensor(rng.standard_normal((args.batch, sum(s[1] for s in shapes)) + shapes[0][2:])
                          .astype(np.float32), dev)

        def forward():
            with clnet.no_grad():
                return clnet.cat(xs, 1)

        def backward():
            fn = ops.Cat()
            fn.needs, fn.saved = (True,) * len(xs), None
            fn.dim, fn.sizes = 1, [s[1] for s in shapes]
            return fn.backward(dy)

        for what, fn in (("forward", forward), ("backward", backward)):
            dms = kernels.device_ms(dev, fn, repeats=args.repeats)
            hus = timed(fn, dev, 1, args.repeats, host_only=True)
            print(f"{name:28s} {what:8s} device {dms * 1e3:8.1f} us ({2 * 4 * total / dms / 1e6:6.0f} GB/s), "
                  f"host {hus:7.1f} us")


if __name__ == "__main__":
    main()
