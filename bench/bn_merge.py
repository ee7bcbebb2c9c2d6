"""A training batch norm's finishing launches merged into the passes that use them (bench/NOTES.md v44): device time
and launches of the forward (statistics, finish, apply -> statistics, apply_runs) and of the backward (gradient
sums, finish, dx -> gradient sums, dx_runs), the paths side by side on the networks' shapes (the merged passes at
each of --runs: normalization.MERGED_RUN), and the host's view: --loops forward-and-backward pairs enqueued back to
back, the queue finished once, in wall-clock time a pair.

    python3 bench/bn_merge.py --device gpu
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clnet  # noqa: E402
from clnet import kernels, normalization  # noqa: E402
from clnet.tensor import empty  # noqa: E402

# (N, C, H, W): googlenet's first and last, resnet50's 56x56 and 7x7, densenet's 28x28 and 14x14 blocks, at b64
SHAPES = [(64, 64, 112, 112), (64, 64, 56, 56), (64, 256, 56, 56), (64, 192, 28, 28), (64, 128, 28, 28),
          (64, 512, 14, 14), (64, 832, 7, 7), (64, 2048, 7, 7)]


def merged_forward(x, w, b, rm, rv):
    return normalization.batch_norm_train_forward(x, w, b, rm, rv, 0.1, 1e-5)


def merged_backward(dy, x, w, mean, invstd, dw, db):
    return normalization.batch_norm_backward(dy, x, w, mean, invstd, True, dw, db)


def apart_forward(x, w, b, rm, rv):
    """The three-pass forward the merged one replaced: statistics, their finish, the normalising pass."""
    mean, invstd = normalization.batch_norm_stats(x, 1e-5, rm, rv, 0.1)
    y = empty(x.shape, x.device)
    normalization._elementwise(x.device, "batchnorm_apply", *x.shape[:2], x.size // x.shape[0] // x.shape[1], x, mean,
                               invstd, w, b, y, -1.0, what="batch norm", images=(x, y))
    return y, mean, invstd


def apart_backward(dy, x, w, mean, invstd, dw, db):
    """The three-pass backward: gradient sums, their finish, the dx pass."""
    N, C = x.shape[:2]
    gmean, dx = empty((2, C), x.device), empty(x.shape, x.device)
    normalization._grad_sums(dy, x, mean, invstd, dw, db, gmean, "batch norm backward", 1.0)
    normalization._elementwise(x.device, "batchnorm_dx", N, C, x.size // N // C, dy, x, mean, invstd, w, gmean, dx,
                               None, what="batch norm backward", images=(dy, x, dx))
    return dx


def pair(forward, backward, x, w, b, rm, rv, dy, dw, db):
    y, mean, invstd = forward(x, w, b, rm, rv)
    return y, backward(dy, x, w, mean, invstd, dw, db)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--loops", type=int, default=200)
    ap.add_argument("--runs", type=lambda v: [int(r) for r in v.split(",")], default=[2048, 4096, 8192, 0],
                    help="MERGED_RUN values to time (0: runs as long as the statistics')")
    args = ap.parse_args()
    dev = clnet.device(args.device)
    print(f"{dev.name}; median of {args.repeats} (device time: profiling events, summed)")
    default_run = normalization.MERGED_RUN
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        C = shape[1]
        t = lambda *s: clnet.tensor(rng.standard_normal(s).astype(np.float32), dev)  # noqa: E731
        x, dy = t(*shape), t(*shape)
        w, b, rm, rv, dw, db = (t(C) for _ in range(6))
        row, outs = [], {}
        variants = [("apart", apart_forward, apart_backward, default_run)] + [
            (f"merged {run or 'stats runs'}", merged_forward, merged_backward, run or 1 << 40) for run in args.runs]
        for name, forward, backward, run in variants:
            normalization.MERGED_RUN = run
            try:
                pair(forward, backward, x, w, b, rm, rv, dy, dw, db)
                n0 = kernels.launch_count
                outs[name] = [o.numpy() for o in pair(forward, backward, x, w, b, rm, rv, dy, dw, db)]
                launches = kernels.launch_count - n0
                fwd = kernels.device_ms(dev, lambda: forward(x, w, b, rm, rv), args.repeats)
                y, mean, invstd = forward(x, w, b, rm, rv)
                bwd = kernels.device_ms(dev, lambda: backward(dy, x, w, mean, invstd, dw, db), args.repeats)
                walls = []
                for _ in range(5):
                    dev.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(args.loops):
                        pair(forward, backward, x, w, b, rm, rv, dy, dw, db)
                    dev.synchronize()
                    walls.append((time.perf_counter() - t0) / args.loops * 1e6)
            finally:
                normalization.MERGED_RUN = default_run
            row.append(f"{name}: {launches} launches, fwd {fwd * 1e3:7.1f} us, bwd {bwd * 1e3:7.1f} us, "
                       f"pair wall {statistics.median(walls):7.1f} us")
        same = all(np.array_equal(a, c) for out in outs.values() for a, c in zip(outs["apart"], out))
        print(f"{shape} (the same bits each way: {same})\n    " + "\n    ".join(row), flush=True)


if __name__ == "__main__":
    main()
