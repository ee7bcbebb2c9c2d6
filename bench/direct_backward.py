"""A small layer's two gradients by im2col (im2col, two products, col2im: four launches) against the direct kernels
(direct.conv2d_backward_data and _weights: two), on the shapes of lenet's and lenet-wide's batch-1 backward (the
seed's workload) and one at batch 64: device time summed (profiling events) and wall time a backward in a loop of 20
(host and device: what a replay pays), medians.

    python3 bench/direct_backward.py --device gpu
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clnet  # noqa: E402
from clnet import conv, direct, kernels, nn  # noqa: E402

# (N, C, H, O, kernel): lenet-wide's conv2 and conv3, lenet's conv2, lenet's conv2 at batch 64
SHAPES = [(1, 120, 12, 120, 5), (1, 120, 4, 120, 3), (1, 20, 12, 50, 5), (64, 20, 12, 50, 5)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    dev = clnet.device(args.device)
    rng = np.random.default_rng(0)
    print(f"{dev.name}; device time summed and wall time a backward (median of {args.repeats} and of 5 loops of 20)")
    for N, C, H, O, k in SHAPES:
        layer = nn.Conv2d(C, O, k).to(dev)
        x = clnet.tensor(rng.standard_normal((N, C, H, H)).astype(np.float32), dev)
        s = layer.conv_shape(x.shape)
        dy = clnet.tensor(rng.standard_normal((N, O, s.OH, s.OW)).astype(np.float32), dev)
        dw = clnet.tensor(np.zeros(layer.weight.shape, np.float32), dev)

        def im2col():
            return conv._conv2d_backward_im2col(x, layer.weight.data, dy, s, dw, True, "im2col", 0.0)

        def by_direct():
            direct.conv2d_backward_weights(x, dy, s, dw, beta=0.0)
            return direct.conv2d_backward_data(layer.weight.data, dy, s)

        row, results = [], {}
        for name, f in (("im2col", im2col), ("direct", by_direct)):
            results[name] = (f().numpy(), dw.numpy())
            ms = kernels.device_ms(dev, f, args.repeats)
            walls = []
            for _ in range(5):
                dev.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    f()
                dev.synchronize()
                walls.append((time.perf_counter() - t0) / 20 * 1e6)
            row.append(f"{name} device {ms * 1e3:8.1f} us, wall {statistics.median(walls):8.1f} us")
        err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30))
                  for a, b in zip(results["im2col"], results["direct"]))
        print(f"  N={N} {C}->{O} {k}x{k} on {H}x{H} (largest difference {err:.1e}): " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
