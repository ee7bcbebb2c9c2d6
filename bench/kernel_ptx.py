"""One kernel family's device time and its compiled code, for comparing two checkouts (bench/NOTES.md v48: the batch
norm's gradient sums 22% slower in googlenet's step once kernels took (buffer, offset) pairs). Times the training
batch norm's backward (normalization.batch_norm_backward: gradient sums, then dx_runs) on bench/bn_merge.py's
shapes, median device time of --repeats, then writes the binaries of every program built so far whose kernels
include --name (PTX on NVIDIA) to --dump.

    python3 bench/kernel_ptx.py --device gpu --dump $OUT/ptx-tree
"""
import argparse
import os
import sys

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clnet  # noqa: E402
from clnet import kernels, normalization  # noqa: E402
from bn_merge import SHAPES  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--name", default="batchnorm_grad_sums")
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()
    dev = clnet.device(args.device)
    rng = np.random.default_rng(0)
    print(f"{dev.name}; batch norm backward, median device time of {args.repeats}")
    for shape in SHAPES:
        C = shape[1]
        t = lambda *s: clnet.tensor(rng.standard_normal(s).astype(np.float32), dev)  # noqa: E731
        x, dy = t(*shape), t(*shape)
        w, b, rm, rv, dw, db = (t(C) for _ in range(6))
        _, mean, invstd = normalization.batch_norm_train_forward(x, w, b, rm, rv, 0.1, 1e-5)
        run = lambda: normalization.batch_norm_backward(dy, x, w, mean, invstd, True, dw, db)  # noqa: E731
        run()
        ms = kernels.device_ms(dev, run, args.repeats)
        at = [getattr(t.storage, "at", 0) for t in (x, dy)]  # (a checkout before offsets has none)
        print(f"  {shape}: {ms * 1e3:7.1f} us (x at byte {at[0]}, dy at {at[1]})", flush=True)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for i, prog in enumerate(kernels._programs.values()):
            names = prog.get_info(cl.program_info.KERNEL_NAMES)
            if args.name in names.split(";"):
                for j, binary in enumerate(prog.get_info(cl.program_info.BINARIES)):
                    with open(os.path.join(args.dump, f"{args.name}-{i}-{j}.bin"), "wb") as f:
                        f.write(binary)
        print(f"wrote {args.dump}")


if __name__ == "__main__":
    main()
