"""Where clnet and PyTorch float64 disagree on a ReLU's on/off decision, layer by layer, and what that does to the
gradients: `python bench/relu_flips.py --model overfeat --batch 128 --conv3 winograd4 --device cpu`.

A ReLU whose input is within rounding of zero can go either way in float32; where one engine's float32 switches it
differently from float64, every gradient below it moves (one such flip after OverFeat's first fully connected layer
moved every lower gradient by about 5e-3, normwise). This counts the flips of clnet (with the 3x3 and 5x5 layers'
algorithms forced, for this batch, through the tuning cache) and of PyTorch float32, each against PyTorch float64 on
the same weights and batch, then prints the agreement figures `clnet bench --compare` checks. The reference runs on
the CPU (float64 on the GPU would work as well; this keeps the script device-independent).
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
    from clnet import bench, models, nn, ops, rng, tuning

    dev = clnet.device(args.device)
    rng.manual_seed(1)
    net = models.build(args.model).to(dev)
    shape = (args.batch,) + models.MODELS[args.model]["input_shape"]
    forced, cur = {}, shape
    for layer in net:
        if isinstance(layer, nn.Conv2d):
            s = layer.conv_shape(cur)
            alg = {3: args.conv3, 5: args.conv5}.get(s.KH) if (s.SH, s.SW) == (1, 1) else None
            if alg:
                forced.update({ops._conv_key(kind, s): alg
                               for kind in ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights")})
        cur = layer.output_shape(cur)
    tuning.allow_less_accurate = True
    tuning.store(dev, forced)
    data = np.random.default_rng(0)
    x = data.standard_normal(shape).astype(np.float32)
    labels = data.integers(0, net[-1].out_features, args.batch).astype(np.int32)
    tm = bench.to_torch(net)
    t0 = time.time()
    pre = {}  # layer index -> [clnet, float64, float32] inputs of the ReLU that follows it
    h = clnet.tensor(x, dev)
    for i, layer in enumerate(net):
        h = layer(h)  # layer by layer: nothing folded, so the ReLU's input is visible
        if i + 1 < len(net) and isinstance(net[i + 1], nn.ReLU):
            pre[i] = [h.numpy()]
    for dtype, model in ((torch.float64, copy.deepcopy(tm).double()), (torch.float32, tm)):
        t = torch.tensor(x, dtype=dtype)
        with torch.no_grad():
            for i, layer in enumerate(model):
                t = layer(t)
                if i in pre:
                    pre[i].append(t.numpy())
    print(f"{args.model} batch {args.batch} on {dev.name}: 3x3 layers by {args.conv3}, 5x5 by {args.conv5}")
    for i, (c, r64, r32) in pre.items():
        err = lambda a: np.linalg.norm(a - r64) / np.linalg.norm(r64)
        print(f"  layer {i:2d} {type(net[i]).__name__:7s} {c.size:9d} ReLU inputs: clnet error {err(c):.1e}, "
              f"{int(np.sum((c > 0) != (r64 > 0)))} flipped; PyTorch float32 error {err(r32):.1e}, "
              f"{int(np.sum((r32 > 0) != (r64 > 0)))} flipped")
    agreement = bench.check_agreement(net, dev, tm, torch.device("cpu"), x, labels)
    print("  relative error against float64 (clnet, PyTorch float32):")
    for k, v in agreement.items():
        print(f"    {k:16s} {v['clnet_vs_fp64']:.2e}  {v['torch_vs_fp64']:.2e}")
    print(f"  {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
