"""Where a torchvision network's training step spends device time, kernel by kernel, in clnet and in PyTorch (issue
26: squeezenet1_1 and densenet121 replay at 0.64x and 0.8x PyTorch's CUDA graph). The network is exported to ONNX in
training mode and imported (bench/depthwise.py's export); one eager step of each engine is profiled after warm-up:
clnet's kernels from profiling events (kernels.Profiler), PyTorch's from torch.profiler's CUDA activity. Each side
prints its kernel time summed (the device busy, no gaps), and the kernels grouped by name, largest first; clnet's
also by launch (name and global size) where one shape dominates.

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


def _tagging(prof, gemm):
    """gemm, its launches tagged with the product's sizes (M x N x K x batch) and its caller's `what`."""
    def tagged(M, N, K, *args, **kw):
        saved = prof.tag
        prof.tag = f"{M}x{N}x{K}x{kw.get('batch', 1)} {kw.get('what', '')}"
        try:
            return gemm(M, N, K, *args, **kw)
        finally:
            prof.tag = saved
    return tagged


def _tagging_bias(prof, bias_grad):
    """conv.bias_grad, its launches tagged with the gradient's N x C x P."""
    def tagged(dy, db, N, C, P, *args, **kw):
        saved = prof.tag
        prof.tag = f"{N}x{C}x{P}{' relu' if kw.get('relu_y') is not None else ''}"
        try:
            return bias_grad(dy, db, N, C, P, *args, **kw)
        finally:
            prof.tag = saved
    return tagged


def clnet_kernels(path, dev, x, labels, warmup):
    """(kernel name, ms) of each launch of one step, and (tag, kernel name, ms) of the products' launches (tagged by
    their sizes) and the bias gradients' (by N x C x P)."""
    runner = ClnetRunner(connx.load(path, device=dev).train(), dev, x, labels)
    for _ in range(warmup):
        runner.step()
    dev.synchronize()
    prof = kernels.Profiler()
    callers = [conv, products, winograd]
    saved = [m.gemm for m in callers]
    saved_bias = conv.bias_grad
    for m in callers:
        m.gemm = _tagging(prof, m.gemm)
    conv.bias_grad = _tagging_bias(prof, conv.bias_grad)
    kernels.context.profiler = prof
    try:
        runner.step()
        dev.synchronize()
    finally:
        kernels.context.profiler = None
        for m, g in zip(callers, saved):
            m.gemm = g
        conv.bias_grad = saved_bias
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
            launches, product_launches = clnet_kernels(path, dev, x, labels, args.warmup)
            report("clnet on " + dev.name, launches, args.top)
            report("clnet's products by size (M x N x K x batch) and caller",
                   [(f"{tag}: {name}", ms) for tag, name, ms in product_launches if "bias" not in name], args.top)
            report("clnet's bias gradients by N x C x P", [(f"{tag}: {name}", ms) for tag, name, ms in product_launches
                                                          if "bias" in name], args.top)
            if torch.cuda.is_available():
                report("PyTorch on " + torch.cuda.get_device_name(), torch_kernels(torch, tm, x, labels, args.warmup),
                       args.top)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
