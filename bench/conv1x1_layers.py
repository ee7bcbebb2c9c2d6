"""mobilenet_v2's pointwise (1x1) layers at batch 16, each pass by every algorithm that runs it on one device, beside
PyTorch CPU's (issue 26's CPU target): im2col + GEMM (no column buffer for a 1x1 forward), the direct kernel
(forward), and conv1x1.py's kernels. Medians of wall-clock timings with the queue finished, in ms; each result is
first checked against float64.

    python3 bench/conv1x1_layers.py --device 0
"""
import argparse
import statistics
import time

import numpy as np

import clnet
from clnet import conv, conv1x1, direct
from clnet.shapes import ConvShape
from clnet.tensor import empty

# (C, H, O): the expansions, projections and the last 1x1 of mobilenet_v2 at 224x224, each shape once
SHAPES = [(32, 112, 16), (16, 112, 96), (96, 56, 24), (24, 56, 144), (144, 56, 24), (32, 28, 192), (192, 28, 32),
          (64, 14, 384), (384, 14, 64), (960, 7, 160), (160, 7, 960), (320, 7, 1280)]


def timed(fn, sync, repeats):
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def relative(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="0")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    dev = clnet.device(int(args.device) if args.device.isdigit() else args.device)
    torch = None
    if not args.no_torch:
        import torch
        torch.set_num_threads(dev.compute_units)
    print(f"device: {dev.name} ({dev.cl_device.platform.name}, driver {dev.cl_device.driver_version}); batch "
          f"{args.batch}; PyTorch {torch.__version__ + ' CPU, %d threads' % torch.get_num_threads() if torch else '-'}")
    print("layer              pass     im2col   direct    1x1  PyTorch   1x1 GFLOP/s  1x1 error")
    rng = np.random.default_rng(0)
    N = args.batch
    for C, H, O in SHAPES:
        s = ConvShape(N, C, H, H, O, 1, 1, 1, 1, 0, 0, 1, 1, 1, H, H)
        x_, w_, b_, dy_ = (rng.standard_normal(shape).astype(np.float32)
                           for shape in ((N, C, H, H), (O, C, 1, 1), (O,), (N, O, H, H)))
        x, w, b, dy = (clnet.tensor(a, dev) for a in (x_, w_, b_, dy_))
        W, X, DY = w_[:, :, 0, 0].astype(np.float64), x_.reshape(N, C, -1).astype(np.float64), \
            dy_.reshape(N, O, -1).astype(np.float64)
        want = dict(fwd=np.einsum("oc,ncp->nop", W, X) + b_[:, None], data=np.einsum("oc,nop->ncp", W, DY),
                    weights=np.einsum("nop,ncp->oc", DY, X))
        dw = empty((O, C, 1, 1), dev)
        ours = dict(fwd=lambda: conv1x1.conv2d_forward(x, w, b, s), data=lambda: conv1x1.conv2d_backward_data(w, dy, s),
                    weights=lambda: conv1x1.conv2d_backward_weights(x, dy, s, dw, 0.0))
        got = dict(fwd=ours["fwd"]().numpy().reshape(N, O, -1), data=ours["data"]().numpy().reshape(N, C, -1))
        ours["weights"]()
        got["weights"] = dw.numpy()[:, :, 0, 0]
        dw2 = empty((O, C, 1, 1), dev)
        others = dict(fwd=lambda: conv._conv2d_forward_im2col(x, w, b, s, False, "im2col"),
                      data=lambda: conv._conv2d_backward_im2col(x, w, dy, s, None, True, "im2col"),
                      weights=lambda: conv._conv2d_backward_im2col(x, w, dy, s, dw2, False, "im2col", 0.0))
        theirs = {}
        if torch:
            xt = torch.from_numpy(x_).requires_grad_()
            wt = torch.from_numpy(w_).requires_grad_()
            bt, dyt = torch.from_numpy(b_), torch.from_numpy(dy_)
            yt = torch.nn.functional.conv2d(xt, wt, bt)
            theirs = dict(fwd=lambda: torch.nn.functional.conv2d(xt, wt, bt),
                          data=lambda: torch.autograd.grad(yt, xt, dyt, retain_graph=True),
                          weights=lambda: torch.autograd.grad(yt, wt, dyt, retain_graph=True))
        flops = 2.0 * N * C * O * H * H
        for kind in ("fwd", "data", "weights"):
            t_gemm = timed(others[kind], dev.synchronize, args.repeats)
            t_direct = timed(lambda: direct.conv2d_forward(x, w, b, s), dev.synchronize, args.repeats) \
                if kind == "fwd" else float("nan")
            t_ours = timed(ours[kind], dev.synchronize, args.repeats)
            t_torch = timed(theirs[kind], lambda: None, args.repeats) if torch else float("nan")
            print(f"{N}x{C}x{H}x{H}->{O:<5d} {kind:8s} {t_gemm:7.2f} {t_direct:8.2f} {t_ours:6.2f} {t_torch:8.2f}  "
                  f"{flops / t_ours / 1e6:10.1f}  {relative(got[kind], want[kind]):9.1e}", flush=True)


if __name__ == "__main__":
    main()
