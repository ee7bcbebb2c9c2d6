"""Tensors past 2**31 elements on a real device: `python3 bench/large_tensors.py --device gpu` (an H200: about 45 GB
of device memory, under a minute).

With the real index limit (clnet.kernels.INDEX_LIMIT, just under 2**31) it runs
  - ReLU forward and backward over a tensor of 2**31 + 2**25 + 4099 elements (8.7 GB), and its sum;
  - Conv2d(3, 16, 3, padding=1) forward and backward on (2675, 3, 224, 224), whose output has 2,147,532,800
    elements (8.6 GB), with the output itself as the upstream gradient;
and checks each against the same op run on slices small enough for one launch (every element compared on the
device, normwise per slice; the weight and bias gradients against the slices' sums), plus the elements either side of
element 2**31 against NumPy on the host. It prints each big op's time and one PASS/FAIL line per check, and exits 1
on a failure.

`--index-limit 100000 --device cpu` runs the same checks with a fake limit and sizes scaled to it (20x20 images),
to exercise the script end to end without a GPU.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clnet  # noqa: E402
from clnet import kernels, ops  # noqa: E402
from clnet.nn import functional as F  # noqa: E402
from clnet.tensor import empty, pool, region_alignment  # noqa: E402

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def timed(dev, name, fn):
    dev.synchronize()
    t0 = time.perf_counter()
    out = fn()
    dev.synchronize()
    print(f"      {name}: {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    return out


def sq_norm(t):
    """sum of t**2, as a float (computed on the device)."""
    return float(ops.mul(t, t).sum().item())


def slice_error(big, n0, small):
    """Normwise difference between elements [n0, n0 + small.size) of big and small, on the device."""
    part = big.region(n0, small.shape)
    return np.sqrt(sq_norm(part - small)) / max(np.sqrt(sq_norm(small)), 1e-30)


def relu_check(dev, n, block, rng):
    """ReLU and its gradient over n elements, against slices of at most `block` elements."""
    print(f"ReLU over {n} elements ({n * 4 / 2**30:.1f} GiB)", flush=True)
    base = rng.standard_normal(block).astype(np.float32)

    def host_block(i, count):  # block i of the input: the random block shifted, so that no two blocks agree
        return base[:count] + np.float32((i % 89) * 0.01 - 0.4)

    x = empty((n,), dev)
    starts = range(0, n, block)

    def upload():
        for i, s in enumerate(starts):
            c = min(block, n - s)
            x.region(s, (c,)).write(host_block(i, c))
    timed(dev, "upload", upload)
    x.requires_grad_(True)
    y = timed(dev, "relu forward", lambda: F.relu(x))
    g = ops.full((n,), dev, 1.0)
    timed(dev, "relu backward", lambda: y.backward(g))

    worst_y = worst_dx = 0.0
    for s in starts:
        c = min(block, n - s)
        leaf = x.detach().region(s, (c,)).requires_grad_(True)
        ys = F.relu(leaf)
        ys.backward(ops.full((c,), dev, 1.0))
        worst_y = max(worst_y, slice_error(y.detach(), s, ys.detach()))
        worst_dx = max(worst_dx, slice_error(x.grad, s, leaf.grad))
    check("relu forward, every slice", worst_y == 0.0, f"largest normwise difference {worst_y:.1e}")
    check("relu backward, every slice", worst_dx == 0.0, f"largest normwise difference {worst_dx:.1e}")

    # a block either side of element 2**31 (of the limit, with a fake one), on the host
    i = min(max(kernels.INDEX_LIMIT, 2**31 if n > 2**31 else 0), n - 1) // block
    i = max(1, min(i, len(starts) - 1))
    lo, hi = (i - 1) * block, min(n, (i + 1) * block)
    expect = np.maximum(np.concatenate([host_block(i - 1, block), host_block(i, hi - i * block)]), 0)
    got = y.detach().region(lo, expect.shape).numpy()
    check(f"relu elements {lo}..{hi} on the host", np.array_equal(got, expect), f"{int(np.sum(got != expect))} differ")
    got = x.grad.region(lo, expect.shape).numpy()
    check(f"relu gradient elements {lo}..{hi} on the host", np.array_equal(got, (expect > 0).astype(np.float32)),
          f"{int(np.sum(got != (expect > 0)))} differ")

    total = timed(dev, "sum", lambda: float(y.sum().item()))
    parts = sum(float(F.relu(x.detach().region(s, (min(block, n - s),))).sum().item()) for s in starts)
    check("relu sum", abs(total - parts) <= 1e-5 * abs(parts), f"{total:.6e} against the slices' {parts:.6e}")


def conv_check(dev, N, H, per_slice, rng):
    """Conv2d(3, 16, 3, padding=1) forward and backward on (N, 3, H, H), against slices of per_slice images."""
    C, O = 3, 16
    print(f"Conv2d({C}, {O}, 3, padding=1) on ({N}, {C}, {H}, {H}): output {N * O * H * H} elements "
          f"({N * O * H * H * 4 / 2**30:.1f} GiB)", flush=True)
    x_host = rng.standard_normal((N, C, H, H), dtype=np.float32)
    w_host = (rng.standard_normal((O, C, 3, 3)) / np.sqrt(C * 9)).astype(np.float32)
    b_host = rng.standard_normal(O).astype(np.float32)
    x = timed(dev, "upload", lambda: clnet.tensor(x_host, dev, requires_grad=True))
    w, b = clnet.tensor(w_host, dev, requires_grad=True), clnet.tensor(b_host, dev, requires_grad=True)
    y = timed(dev, "conv2d forward", lambda: F.conv2d(x, w, b, padding=1))
    timed(dev, "conv2d backward", lambda: y.backward(y.detach()))  # the loss sum(y**2) / 2

    ws, bs = clnet.tensor(w_host, dev, requires_grad=True), clnet.tensor(b_host, dev, requires_grad=True)
    x_image, y_image = C * H * H, O * H * H
    worst_y = worst_dx = 0.0
    for n0 in range(0, N, per_slice):
        n = min(per_slice, N - n0)
        xs = clnet.tensor(x_host[n0:n0 + n], dev, requires_grad=True)
        ys = F.conv2d(xs, ws, bs, padding=1)
        ys.backward(ys.detach())  # ws.grad and bs.grad gather every slice's share
        worst_y = max(worst_y, slice_error(y.detach().reshape(-1), n0 * y_image, ys.detach().reshape(-1)))
        worst_dx = max(worst_dx, slice_error(x.grad.reshape(-1), n0 * x_image, xs.grad.reshape(-1)))
    check("conv2d forward, every image", worst_y < 1e-5, f"largest normwise difference of a slice {worst_y:.1e}")
    check("conv2d input gradient, every image", worst_dx < 1e-5,
          f"largest normwise difference of a slice {worst_dx:.1e}")
    for name, big, small in (("weight", w, ws), ("bias", b, bs)):
        got, ref = big.grad.numpy().astype(np.float64), small.grad.numpy().astype(np.float64)
        err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        check(f"conv2d {name} gradient", err < 1e-4, f"normwise difference from the slices' sum {err:.1e}")

    # the image holding element 2**31 of the output (or the last), against float64 NumPy on the host
    i = min(N - 1, 2**31 // y_image)
    xp = np.pad(x_host[i].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    ref = np.full((O, H, H), 0.0) + b_host.astype(np.float64)[:, None, None]
    for kh in range(3):
        for kw in range(3):
            ref += np.einsum("oc,chw->ohw", w_host[:, :, kh, kw].astype(np.float64), xp[:, kh:kh + H, kw:kw + H])
    got = y.detach().reshape(-1).region(i * y_image, (O, H, H)).numpy()
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    check(f"conv2d image {i} against NumPy float64", err < 1e-5, f"normwise error {err:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--index-limit", type=int, default=None,
                    help="a fake kernels.INDEX_LIMIT (sizes scale to it); default: the real one")
    ap.add_argument("--image", type=int, default=None, help="image side of the convolution (default 224, or 20 with "
                                                            "--index-limit)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.index_limit is not None:
        kernels.INDEX_LIMIT = args.index_limit
    target = 2**31 if args.index_limit is None else args.index_limit  # the size to pass
    H = args.image or (224 if args.index_limit is None else 20)
    dev = clnet.device(args.device)
    rng = np.random.default_rng(args.seed)
    print(f"{dev.name}: index limit {kernels.INDEX_LIMIT}, largest buffer "
          f"{dev.cl_device.max_mem_alloc_size / 2**30:.1f} GiB", flush=True)
    t0 = time.perf_counter()
    block = max(1024, min(2**26, target // 8)) // 1024 * 1024  # slices well within the limit, aligned
    relu_check(dev, target + target // 64 + 4099, block, rng)
    pool(dev).release_cached()  # the ReLU tensors are gone: give their memory back to the driver
    N = target // (16 * H * H) + 1
    align = region_alignment(dev) // 4
    step = align // math.gcd(3 * H * H, align)  # slices start where a sub-buffer of the input may
    conv_check(dev, N, H, max(step, target // 4 // (16 * H * H) // step * step), rng)
    print(f"{len(failures)} of the checks failed; {time.perf_counter() - t0:.1f} s in all", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
