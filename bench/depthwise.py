"""Depthwise convolutions: clnet's own kernels (clnet/depthwise.py) against im2col + GEMM (what ran them before) and
PyTorch, per pass, on mobilenet_v2's depthwise layers; optionally whole training steps of torchvision networks.

Layers: forward, data gradient and weight gradient of each distinct depthwise layer of torchvision's mobilenet_v2 at
224x224 (plus a few 5x5 and 7x7 shapes of mnasnet and convnext), timed alone: clnet's summed kernel time from
profiling events (median of --repeats), PyTorch's from CUDA events around --inner calls (median of --repeats), or
the wall clock with synchronisation on a CPU. Each line also gives the pass's fewest bytes (each input read once,
the output written once) over --bandwidth: the time a memory-bound pass cannot beat.

Networks (--networks): torchvision's model exported to ONNX in training mode, imported with clnet.onnx.load; one SGD
step with momentum timed eager (wall clock, the queue finished once at the step's end, on both sides) and replayed
as a clnet.Graph, against PyTorch eager and PyTorch's whole step as a CUDA graph, in the same process (with
--before also clnet with depthwise layers forced back to im2col; with --tune, clnet's kernels chosen by timing
first, as cudnn.benchmark chooses PyTorch's).

    python bench/depthwise.py --device gpu --torch cuda --batch 64 --networks mobilenet_v2 --json h200.json
    python bench/depthwise.py --device 1 --torch cpu --batch 16                   # PoCL against PyTorch CPU
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clnet  # noqa: E402
from clnet import conv, depthwise, kernels, tuning  # noqa: E402
from clnet.shapes import conv_shape  # noqa: E402
from clnet.tensor import empty  # noqa: E402

# (channels, input side, kernel, stride, how many such layers in the network); mobilenet_v2 first, in order
MOBILENET_V2 = [(32, 112, 3, 1, 1), (96, 112, 3, 2, 1), (144, 56, 3, 1, 1), (144, 56, 3, 2, 1), (192, 28, 3, 1, 2),
                (192, 28, 3, 2, 1), (384, 14, 3, 1, 4), (576, 14, 3, 1, 2), (576, 14, 3, 2, 1), (960, 7, 3, 1, 3)]
OTHERS = [(72, 56, 5, 2, 1), (120, 28, 5, 1, 1), (480, 14, 5, 1, 1), (96, 56, 7, 1, 1), (768, 7, 7, 1, 1)]
PASSES = ("forward", "data", "weights")


class forced:
    """Context: the passes of every depthwise layer run `algorithm` (None: the normal choice); other layers keep
    theirs."""

    def __init__(self, algorithm):
        self.other = algorithm == "depthwise-other"  # the depthwise kernels of the other device class's shape
        self.rows = algorithm == "depthwise-rows"  # the CPU's row kernels on every plane (no plane kernels)
        self.py = int(algorithm[len("depthwise-py"):]) if algorithm and algorithm.startswith("depthwise-py") else None
        self.algorithm = "depthwise" if self.other or self.py or self.rows else algorithm

    def __enter__(self):
        self.saved = saved = conv._conv_algorithm
        self.saved_shape = shaped = tuning.cpu_shaped
        if self.algorithm is not None:
            conv._conv_algorithm = lambda dev, kind, s, run: (self.algorithm if depthwise.supported(s)
                                                              else saved(dev, kind, s, run))
        if self.other:
            tuning.cpu_shaped = lambda dev: not shaped(dev)
        self.saved_py = depthwise.PY_GPU
        self.saved_tile = depthwise.planes_tile
        if self.rows:
            depthwise.planes_tile = lambda dev, s, which: None
        if self.py:  # outputs per work-item of the GPU forward and stride-1 data gradient
            depthwise.PY_GPU = self.py

    def __exit__(self, *exc):
        conv._conv_algorithm = self.saved
        tuning.cpu_shaped = self.saved_shape
        depthwise.PY_GPU = self.saved_py
        depthwise.planes_tile = self.saved_tile


def pass_bytes(s):
    """Fewest bytes a pass moves, the same for all three: forward reads x and writes y; data reads dy, writes dx;
    weights reads x and dy (the weights themselves are a few KB)."""
    x, y = s.N * s.C * s.H * s.W * 4, s.N * s.O * s.OH * s.OW * 4
    return x + y


def clnet_pass(dev, s, which, x, w, dy, dw):
    if which == "forward":
        return lambda: conv.conv2d_forward(x, w, None, s)
    if which == "data":
        return lambda: conv.conv2d_backward(x, w, dy, s, None, None, need_dx=True)
    return lambda: conv.conv2d_backward(x, w, dy, s, dw, None, need_dx=False, betas=(0.0, 1.0))


def torch_pass(torch, s, which, x, w, dy):
    F = torch.nn.functional
    args = ((s.SH, s.SW), (s.PH, s.PW), (s.DH, s.DW), s.G)
    if which == "forward":
        return lambda: F.conv2d(x, w, None, *args)
    if which == "data":
        return lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, *args)
    return lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, *args)


def torch_ms(torch, fn, inner, repeats):
    fn()
    cuda = bench_torch == "cuda"
    samples = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            torch.cuda.synchronize()
            samples.append(a.elapsed_time(b) / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(samples)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def layers(args, dev, torch, tdev):
    rng = np.random.default_rng(0)
    rows = []
    algorithms = ["depthwise"] + (["depthwise-other"] if args.other_shape else []) + \
        (["depthwise-rows"] if args.rows else []) + \
        [f"depthwise-py{p}" for p in args.py.split(",") if p] + (["im2col"] if args.before else [])
    print(f"| layer | count | pass | MB | floor us | " + " | ".join(f"clnet {a} us" for a in algorithms)
          + " | torch us | torch / clnet | clnet GB/s | rel. err vs torch |")
    print("|---|---|---|---|---|" + "---|" * len(algorithms) + "---|---|---|---|")
    shapes = [c for c in MOBILENET_V2 + ([] if args.mobilenet_only else OTHERS) if c[1] <= args.max_side]
    for C, side, k, stride, count in shapes:
        N = args.batch
        s = conv_shape("bench", (N, C, side, side), (C, 1, k, k), (stride, stride), (k // 2, k // 2),
                       (k // 2 * 2, k // 2 * 2), (1, 1), C)
        x = rng.standard_normal((N, C, side, side)).astype(np.float32)
        w = rng.standard_normal((C, 1, k, k)).astype(np.float32)
        dy = rng.standard_normal((N, C, s.OH, s.OW)).astype(np.float32)
        X, Wt, DY = clnet.tensor(x, dev), clnet.tensor(w, dev), clnet.tensor(dy, dev)
        DW = empty(w.shape, dev)
        tx, tw, tdy = (torch.from_numpy(a).to(tdev) for a in (x, w, dy)) if torch else (None, None, None)
        for which in PASSES:
            nbytes = pass_bytes(s)
            floor = nbytes / args.bandwidth * 1e6
            times = {}
            for a in algorithms:
                with forced(a):
                    fn = clnet_pass(dev, s, which, X, Wt, DY, DW)
                    out = fn()
                    dev.synchronize()
                    times[a] = kernels.device_ms(dev, fn, args.repeats if a != "im2col" else 3) * 1e3
                    if a == "depthwise":
                        ours = (out if which != "weights" else DW).numpy()
            t_us, err = None, None
            if torch:
                tfn = torch_pass(torch, s, which, tx, tw, tdy)
                t_us = torch_ms(torch, tfn, args.inner, args.repeats) * 1e3
                err = rel_err(ours, tfn().cpu().numpy())
            ratio = t_us / times["depthwise"] if t_us else None
            rows.append(dict(C=C, side=side, kernel=k, stride=stride, count=count, batch=N, which=which,
                             bytes=nbytes, floor_us=floor, clnet_us=times, torch_us=t_us, rel_err=err))
            print(f"| {C}x{side}x{side} k{k} s{stride} | {count} | {which} | {nbytes / 1e6:.1f} | {floor:.1f} | "
                  + " | ".join(f"{times[a]:.1f}" for a in algorithms)
                  + f" | {t_us or 0:.1f} | {ratio or 0:.2f} | {nbytes / times['depthwise'] / 1e3:.0f} | "
                  + (f"{err:.1e} |" if err is not None else "- |"), flush=True)
    mob = [r for r in rows if (r["C"], r["side"], r["kernel"], r["stride"], r["count"]) in MOBILENET_V2]
    for which in PASSES + ("all",):
        sel = [r for r in mob if which in ("all", r["which"])]
        total = {a: sum(r["clnet_us"][a] * r["count"] for r in sel) for a in algorithms}
        tt = sum((r["torch_us"] or 0) * r["count"] for r in sel)
        fl = sum(r["floor_us"] * r["count"] for r in sel)
        print(f"mobilenet_v2's 17 depthwise layers, {which}: floor {fl:.0f} us, "
              + ", ".join(f"clnet {a} {total[a]:.0f} us" for a in algorithms)
              + (f", torch {tt:.0f} us (torch / clnet {tt / total['depthwise']:.2f})" if torch else ""))
    return rows


def tiny(torch):
    """A small network of mobilenet_v2's block (expand, depthwise, project), for a quick check of --networks where
    torchvision is missing."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                         nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                         nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000))


def export(name, shape, folder):
    import torch
    if name == "tiny":
        tm = tiny(torch).train()
    else:
        import torchvision
        # googlenet without its auxiliary heads: their 4x4 adaptive pooling of 14x14 planes has no ONNX export
        extra = dict(aux_logits=False, init_weights=True) if name in ("googlenet", "inception_v3") else {}
        tm = getattr(torchvision.models, name)(num_classes=1000, **extra).train()
    path = os.path.join(folder, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tm, (torch.zeros(shape),), path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=17)
    return tm, path


def networks(args, dev, torch, tdev):
    from clnet import bench as cb
    from clnet import onnx as connx
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in args.networks.split(","):
            try:
                out[name] = network(args, dev, torch, tdev, name, folder, cb, connx)
            except Exception as e:  # a network the importer cannot take yet: say so, time the others
                print(f"{name}: not measured: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
    return out


def network(args, dev, torch, tdev, name, folder, cb, connx):
    """One network's training step: clnet eager and replayed (and with --before, im2col for its depthwise layers),
    PyTorch eager and as a CUDA graph."""
    shape = (args.batch, 3, 224, 224) if name != "tiny" else (args.batch, 3, 32, 32)
    tm, path = export(name, shape, folder)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    labels = rng.integers(0, 1000, shape[0]).astype(np.int32)
    rec = dict(batch=args.batch)
    for tag, algorithm in [("clnet", None)] + ([("clnet_im2col", "im2col")] if args.before else []):
        model = connx.load(path, device=dev).train()
        if args.tune and algorithm is None:  # as PyTorch's cudnn.benchmark: the shapes' kernels chosen by timing
            report = clnet.autotune(model, shape, dev, budget_s=args.tune)
            print(f"{name} b{args.batch} clnet.autotune: {len(report['tuned'])} shapes tuned, {report['cached']} "
                  f"cached, {len(report['left'])} left at defaults, {report['seconds']:.1f} s", flush=True)
        runner = cb.ClnetRunner(model, dev, x, labels)
        with forced(algorithm):
            for _ in range(args.warmup):
                runner.iteration()
            # The eager step as a user's loop runs it (and as PyTorch's below is timed): the queue finished once,
            # at its end. `clnet bench`'s phases each finish the queue (its per-phase report), which keeps the
            # host from running ahead into the next phase: that sum is printed beside it.
            phases = [sum(v for k, v in runner.iteration().items() if k != "loss")
                      for _ in range(args.iterations)]
            eager, set0 = [], kernels.arguments_set
            for _ in range(args.iterations):
                t0 = time.perf_counter()
                runner.step()
                dev.synchronize()
                eager.append((time.perf_counter() - t0) * 1e3)
            replay, launches = cb.time_replays(runner, args.iterations, False)
            missed = (kernels.arguments_set - set0) / args.iterations
        rec[tag] = dict(eager_ms=statistics.median(eager), eager_phases_ms=statistics.median(phases),
                        eager_arguments_set=missed, replay_ms=replay, launches=launches)
        print(f"{name} b{args.batch} {tag}: eager {rec[tag]['eager_ms']:.2f} ms (phases finished apart "
              f"{rec[tag]['eager_phases_ms']:.2f}; {missed:.0f} launches a step set their arguments), replayed "
              f"{replay:.2f} ms ({launches} launches)", flush=True)
        del runner, model
    if torch is not None and tdev == "cpu":  # PyTorch CPU's eager step (no graphs there)
        xt, yt = torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))
        opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
        samples = []
        for i in range(args.warmup + args.iterations):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(tm(xt), yt).backward()
            opt.step()
            samples.append((time.perf_counter() - t0) * 1e3)
        rec["torch_eager_ms"] = statistics.median(samples[args.warmup:])
        c = rec["clnet"]
        print(f"{name} b{args.batch} torch CPU ({torch.get_num_threads()} threads): eager {rec['torch_eager_ms']:.1f} "
              f"ms; clnet replayed / torch {rec['torch_eager_ms'] / c['replay_ms']:.2f}x, eager / eager "
              f"{rec['torch_eager_ms'] / c['eager_ms']:.2f}x", flush=True)
    if torch is not None and tdev != "cpu":
        tm = tm.to(tdev)
        xt = torch.from_numpy(x).to(tdev)
        yt = torch.from_numpy(labels.astype(np.int64)).to(tdev)
        opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(tm(xt), yt).backward()
            opt.step()
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        samples = []
        for _ in range(args.iterations):  # wall clock, the queue finished at the end: as clnet's eager step
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3)
        rec["torch_eager_ms"] = statistics.median(samples)
        rec["torch_graph_ms"] = cb.torch_graph_ms(tm, opt, xt, yt, args.iterations, False)
        c = rec["clnet"]
        print(f"{name} b{args.batch} torch: eager {rec['torch_eager_ms']:.2f} ms, CUDA graph "
              f"{rec['torch_graph_ms']:.2f} ms; clnet replayed / CUDA graph "
              f"{rec['torch_graph_ms'] / c['replay_ms']:.2f}x, eager / eager "
              f"{rec['torch_eager_ms'] / c['eager_ms']:.2f}x", flush=True)
    return rec


bench_torch = None


def main():
    global bench_torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--torch", choices=["cuda", "cpu", "none"], default="none", help="PyTorch beside clnet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=10, help="PyTorch calls per timed sample")
    ap.add_argument("--bandwidth", type=float, default=4.2e12, help="bytes/s for the floor (H200 device copy)")
    ap.add_argument("--before", action="store_true", help="also time im2col, what ran depthwise layers before")
    ap.add_argument("--other-shape", action="store_true", help="also time the other device class's kernel shape")
    ap.add_argument("--rows", action="store_true", help="also time the CPU's row kernels where the plane kernels "
                    "run (depthwise.planes_tile)")
    ap.add_argument("--py", default="", help="also time these outputs per work-item of the GPU forward and stride-1 "
                    "data gradient (comma-separated, depthwise.PY_GPU's candidates)")
    ap.add_argument("--max-side", type=int, default=1 << 30, help="only the layers whose input planes are at most "
                    "this wide (the 17-layer totals then cover those)")
    ap.add_argument("--mobilenet-only", action="store_true", help="skip the 5x5 and 7x7 shapes")
    ap.add_argument("--no-layers", action="store_true")
    ap.add_argument("--networks", default="", help="comma-separated torchvision models for whole training steps")
    ap.add_argument("--tune", type=float, default=0, help="seconds of clnet.autotune for each network before its "
                    "steps are timed (PyTorch runs with cudnn.benchmark); 0: clnet's default kernel choices")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = clnet.device(args.device)
    torch, tdev = None, None
    if args.torch != "none":
        import torch
        bench_torch = args.torch
        tdev = args.torch
        if args.torch == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cudnn.benchmark = True
        print(f"PyTorch {torch.__version__}" + (f", cuDNN {torch.backends.cudnn.version()}, "
                                                 f"{torch.cuda.get_device_name()}" if args.torch == "cuda" else
                                                 f", {torch.get_num_threads()} threads"))
    print(f"clnet device: {dev.name} ({dev.platform_name}, driver {dev.driver_version}); batch {args.batch}")
    result = dict(device=dev.name, platform=dev.platform_name, driver=dev.driver_version, batch=args.batch,
                  command=" ".join(sys.argv))
    if not args.no_layers:
        result["layers"] = layers(args, dev, torch, tdev)
    if args.networks:
        result["networks"] = networks(args, dev, torch, tdev)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
