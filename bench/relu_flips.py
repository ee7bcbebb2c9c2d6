"""Where clnet and PyTorch float64 disagree on a ReLU's on/off decision, layer by layer, and what that does to the
gradients: `python bench/relu_flips.py --model overfeat --batch 128 --conv3 winograd4 --device cpu`.

A ReLU whose input is within rounding of zero can go either way in float32; where one engine's float32 switches it
differently from float64, every gradient below it moves (one such flip after OverFeat's first fully connected layer
moved every lower gradient by about 5e-3, normwise). This counts the flips of clnet (with the 3x3 and 5x5 layers'
algorithms forced, for this batch, through the tuning cache) and of PyTorch float32, each against PyTorch float64 on
the same weights and batch, then prints the agreement figures `clnet bench --compare` checks. Any zoo model: the ReLU
inputs are taken by forward hooks on every ReLU module (one row per call) of clnet's model and of its PyTorch twin.
The reference runs on the CPU (float64 on the GPU would work as well; this keeps the script device-independent).
"""
import argparse
import copy
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="overfeat")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--conv3", default="winograd", help="algorithm for 3x3 layers: im2col, winograd, winograd4")
    ap.add_argument("--conv5", default="winograd", help="algorithm for 5x5 layers: im2col, winograd")
    args = ap.parse_args()
    # the forced choices go to a cache of their own, never the user's
    os.environ["CLNET_CACHE_DIR"] = tempfile.mkdtemp(prefix="clnet-flips-")
    import torch
    import clnet
    from clnet import bench, conv, models, nn, rng, tuning

    dev = clnet.device(args.device)
    rng.manual_seed(1)
    net = models.build(args.model).to(dev)
    shape = (args.batch,) + models.MODELS[args.model]["input_shape"]
    layers = dict(net.named_modules())
    forced = {}
    for m in bench.describe(net, shape, dev):
        layer = layers[m["path"]]
        if isinstance(layer, nn.Conv2d):
            s = layer.conv_shape(m["input"])
            alg = {3: args.conv3, 5: args.conv5}.get(s.KH) if (s.SH, s.SW) == (1, 1) else None
            if alg:
                forced.update({conv._conv_key(kind, s): alg
                               for kind in ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights")})
    tuning.allow_less_accurate = True
    tuning.store(dev, forced)
    data = np.random.default_rng(0)
    x = data.standard_normal(shape).astype(np.float32)
    labels = data.integers(0, models.MODELS[args.model]["classes"], args.batch).astype(np.int32)
    tm = bench.torch_twin(args.model, net)
    t64 = copy.deepcopy(tm).double()
    t0 = time.time()
    # Every ReLU module's input, per call (ResNet's blocks call theirs twice), in clnet, PyTorch float64 and float32:
    # each engine in training mode on the same batch, as the bench's agreement check runs them.
    pre = {}  # (path, call) -> [clnet, float64, float32]

    def capture(engine, model, as_numpy):
        calls = {}
        hooks = []
        for path, m in model.named_modules():
            if type(m).__name__ == "ReLU":
                def hook(module, inputs, path=path):
                    calls[path] = calls.get(path, 0) + 1
                    pre.setdefault((path, calls[path]), []).append(as_numpy(inputs[0]))
                hooks.append(m.register_forward_pre_hook(hook))
        try:
            engine()
        finally:
            for h in hooks:
                h.remove()

    with clnet.no_grad():
        capture(lambda: net(clnet.tensor(x, dev)), net, lambda t: t.numpy())
    for dtype, model in ((torch.float64, t64), (torch.float32, tm)):
        with torch.no_grad():
            capture(lambda: model(torch.tensor(x, dtype=dtype)), model, lambda t: t.numpy())
    print(f"{args.model} batch {args.batch} on {dev.name}: 3x3 layers by {args.conv3}, 5x5 by {args.conv5}")
    for (path, call), (c, r64, r32) in pre.items():
        err = lambda a: np.linalg.norm(a - r64) / np.linalg.norm(r64)
        name = path + (f" (call {call})" if call > 1 else "")
        print(f"  ReLU {name:24s} {c.size:9d} inputs: clnet error {err(c):.1e}, "
              f"{int(np.sum((c > 0) != (r64 > 0)))} flipped; PyTorch float32 error {err(r32):.1e}, "
              f"{int(np.sum((r32 > 0) != (r64 > 0)))} flipped")
    agreement = bench.check_agreement(net, dev, bench.torch_twin(args.model, net), torch.device("cpu"), x, labels)
    print("  relative error against float64 (clnet, PyTorch float32):")
    for k, v in agreement.items():
        print(f"    {k:34s} {v['clnet_vs_fp64']:.2e}  {v['torch_vs_fp64']:.2e}")
    print(f"  {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
