"""Where a torchvision network's training step spends device time, kernel by kernel, in clnet and in PyTorch (issue
26: squeezenet1_1 and densenet121 replay at 0.64x and 0.8x PyTorch's CUDA graph). The network is exported to ONNX in
training mode and imported (bench/depthwise.py's export); one eager step of each engine is profiled after warm-up:
clnet's kernels from profiling events (kernels.Profiler), PyTorch's from torch.profiler's CUDA activity. Each side
prints its kernel time summed (the device busy, no gaps), and the kernels grouped by name, largest first; clnet's
products, bias gradients, im2col and Winograd passes also by their sizes (TAGS).

    python3 bench/net_kernels.py --device gpu --networks squeezenet1_1,densenet121 --batch 64
"""
import argparse
import collections
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clnet  # noqa: E402
from clnet import conv, kernels, products, winograd  # noqa: E402
from clnet import onnx as connx  # noqa: E402
from clnet.bench.runner import ClnetRunner  # noqa: E402
from depthwise import export  # noqa: E402


def _tagged(prof, fn, label):
    """fn, its launches tagged with label(*its arguments) (a call inside it tags its own, then restores this one's)."""
    def run(*args, **kw):
        saved = prof.tag
        prof.tag = label(*args, **kw)
        try:
            return fn(*args, **kw)
        finally:
            prof.tag = saved
    return run


def _conv_label(kind):
    return lambda *args, **kw: (lambda s: f"{kind} {s.N}x{s.C}x{s.H}x{s.W}->{s.O} k{s.KH}x{s.KW} s{s.SH}")(
        next(a for a in args if hasattr(a, "KH")))


# (module, function, label of a call): products by M x N x K x batch and their caller's `what`, bias gradients by
# N x C x P, im2col and the Winograd passes by layer shape
TAGS = [(m, "gemm", lambda M, N, K, *a, **kw: f"{M}x{N}x{K}x{kw.get('batch', 1)} {kw.get('what', '')}")
        for m in (conv, products, winograd)] + [
    (conv, "bias_grad", lambda dy, db, N, C, P, *a, **kw:
     f"{N}x{C}x{P}{' relu' if kw.get('relu_y') is not None else ''}"),
    (conv, "_im2col", lambda x, s, n0, nimg, col: f"C{s.C} {s.H}x{s.W} k{s.KH}x{s.KW} s{s.SH}, {nimg} images"),
    (winograd, "conv2d_forward", _conv_label("forward")),
    (winograd, "conv2d_backward_data", _conv_label("data")),
    (winograd, "conv2d_backward_weights", _conv_label("weights"))]
# the launches reported by tag: kernels whose names start so
TAGGED = [("products", "gemm"), ("bias gradients", "bias_grad"), ("im2col", "im2col"), ("Winograd", "winograd")]


def clnet_kernels(path, dev, x, labels, warmup):
    """(kernel name, ms) of each launch of one step, and (tag, kernel name, ms) of the tagged launches (TAGS)."""
    runner = ClnetRunner(connx.load(path, device=dev).train(), dev, x, labels)
    for _ in range(warmup):
        runner.step()
    dev.synchronize()
    prof = kernels.Profiler()
    saved = [(module, name, getattr(module, name)) for module, name, _ in TAGS]
    for module, name, label in TAGS:
        setattr(module, name, _tagged(prof, getattr(module, name), label))
    kernels.context.profiler = prof
    try:
        runner.step()
        dev.synchronize()
    finally:
        kernels.context.profiler = None
        for module, name, fn in saved:
            setattr(module, name, fn)
    times = prof.times_ms()
    return [(name, ms) for _, name, ms in times], [(tag, name, ms) for tag, name, ms in times if isinstance(tag, str)]


def torch_kernels(torch, tm, x, labels, warmup):
    xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(labels.astype(np.int64)).cuda()
    tm = tm.cuda()
    opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(tm(xt), yt).backward()
        opt.step()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    out = [(e.name, e.device_time / 1e3) for e in p.events() if e.device_type.name == "CUDA"]
    if not out:  # a profiler that lists kernels only under their ops: the kernels' own rows of the averages
        out = [(e.key, e.self_device_time_total / 1e3) for e in p.key_averages()
               if e.self_device_time_total > 0 and "::" not in e.key]
    return out


def report(side, records, top):
    total = sum(ms for _, ms in records)
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for name, ms in records:
        by_name[name][0] += ms
        by_name[name][1] += 1
    print(f"  {side}: {len(records)} kernels, {total:.3f} ms of kernel time")
    for name, (ms, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {ms:8.3f} ms {100 * ms / total:5.1f}%  x{n:<4d} {name[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--networks", default="squeezenet1_1")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = clnet.device(args.device)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.networks.split(","):
            shape = (args.batch, 3, 224, 224) if name != "tiny" else (args.batch, 3, 32, 32)
            tm, path = export(name, shape, folder)
            rng = np.random.default_rng(0)
            x = rng.standard_normal(shape).astype(np.float32)
            labels = rng.integers(0, 1000, shape[0]).astype(np.int32)
            print(f"{name} batch {args.batch}, one eager training step after {args.warmup} (SGD with momentum)")
            launches, tagged = clnet_kernels(path, dev, x, labels, args.warmup)
            report("clnet on " + dev.name, launches, args.top)
            for what, prefix in TAGGED:
                report(f"clnet's {what} by size", [(f"{tag}: {name}", ms) for tag, name, ms in tagged
                                                   if name.startswith(prefix)], args.top)
            if torch.cuda.is_available():
                report("PyTorch on " + torch.cuda.get_device_name(), torch_kernels(torch, tm, x, labels, args.warmup),
                       args.top)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
