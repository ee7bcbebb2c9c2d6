"""CPU max pooling's forward with the window's size fixed at build (WIN_KH, WIN_KW: no padding, every window inside
the input) against the run-time bounds, alternating, on lenet b64's first pooling (64, 20, 24, 24) -> 12x12:

    python3 bench/pool_window_ab.py --device 1

Prints each round's median of 30 launches per variant and whether their outputs (maximum and argmax) agree.
"""
import statistics
import sys
import time

import numpy as np

import clnet
from clnet import kernels


def main():
    dev = clnet.device(sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu")
    x = clnet.tensor(np.random.default_rng(0).standard_normal((64, 20, 24, 24)).astype(np.float32), dev)
    y = clnet.tensor(np.zeros((64, 20, 12, 12), np.float32), dev)
    idx = clnet.tensor(np.zeros((64, 20, 12, 12), np.int32), dev)
    geometry = (64 * 20, 24, 24, 2, 2, 2, 2, 0, 0, 12, 12)
    variants = {"run-time bounds": None, "fixed 2x2 window": dict(WIN_KH=2, WIN_KW=2)}
    times, outputs = {name: [] for name in variants}, {}
    for _ in range(8):
        for name, defines in variants.items():
            k = kernels.kernel(dev, "pool.cl", "maxpool2d_fwd_grid", defines)
            for _ in range(3):
                kernels.launch(dev, k, (12, 12, 64 * 20), None, x, *geometry, y, idx)
            dev.synchronize()
            runs = []
            for _ in range(30):
                t0 = time.perf_counter()
                kernels.launch(dev, k, (12, 12, 64 * 20), None, x, *geometry, y, idx)
                dev.synchronize()
                runs.append(time.perf_counter() - t0)
            times[name].append(statistics.median(runs) * 1e3)
            outputs[name] = (y.numpy(), idx.numpy())
    print(f"{dev.name}: medians of 30 launches, 8 alternating rounds")
    for name, t in times.items():
        print(f"{name:18s} " + " ".join(f"{v:.2f}" for v in t) + f"  (median {statistics.median(t):.2f} ms)")
    same = all(np.array_equal(a, b) for a, b in zip(*outputs.values()))
    print("outputs identical:", same)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
