"""Training speed of networks imported from ONNX against the zoo's own clnet models (issue 13).

For each model: PyTorch's zoo twin is exported by PyTorch's TorchScript exporter in training mode (batch norm kept,
with batch statistics), `clnet.onnx.load` reads the file, and the zoo's clnet model gets the same weights. Both then
run the same training iteration (forward, cross-entropy, backward, SGD update) on the same batch: the sequence of
kernels each launches per step is compared (the import must add none), and each is timed, median of --iterations
after --warmup, the two interleaved so that a busy machine slows both alike.

    python bench/onnx_speed.py --device gpu --models resnet50,googlenet            # the H200 run of the issue
    python bench/onnx_speed.py --device 1 --models lenet,resnet18 --batch 8 --size 64   # a quick CPU check
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import clnet  # noqa: E402
import clnet.onnx as connx  # noqa: E402
from clnet import kernels, models, nn, optim  # noqa: E402


def export_twin(name, shape, folder):
    import torch
    twin = models.build(name, lib=torch).train()
    path = os.path.join(folder, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(twin, (torch.zeros(shape),), path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=17)
    return twin, path


class Step:
    def __init__(self, model, dev, x, labels):
        self.model, self.dev, self.x, self.labels = model, dev, x, labels
        self.opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        self.loss = nn.CrossEntropyLoss()

    def __call__(self):
        self.opt.zero_grad()
        self.loss(self.model(self.x), self.labels).backward()
        self.opt.step()
        self.dev.synchronize()


def launched(step):
    """The kernel names one step launches, in order."""
    names, saved = [], kernels.launch

    def record(dev, k, *args, **kw):
        names.append(getattr(k, "name", None) or getattr(k, "function_name", "?"))
        return saved(dev, k, *args, **kw)
    kernels.launch = record
    try:
        step()
    finally:
        kernels.launch = saved
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--models", default="resnet50,googlenet")
    ap.add_argument("--batch", type=int, default=None, help="default: the zoo's batch for each model")
    ap.add_argument("--size", type=int, default=None,
                    help="image side of the ResNets (they take any); default the zoo's")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dev = clnet.device(args.device)
    print(f"device: {dev.name} ({dev.platform_name}, driver {dev.driver_version})")
    print("| model | batch | input | zoo ms | imported ms | imported / zoo | kernels per step (zoo, imported) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            entry = models.MODELS[name]
            c, h, w = entry["input_shape"]
            if args.size and name.startswith("resnet"):  # global average pooling: any input size
                h = w = args.size
            shape = (args.batch or entry["batch"], c, h, w)
            twin, path = export_twin(name, shape, folder)
            imported = connx.load(path, device=dev).train()
            zoo = models.build(name).to(dev)
            zoo.load_state_dict(twin.state_dict())
            rng = np.random.default_rng(0)
            x = clnet.tensor(rng.standard_normal(shape).astype(np.float32), dev)
            labels = clnet.tensor(rng.integers(0, entry["classes"], shape[0]).astype(np.int32), dev)
            steps = dict(zoo=Step(zoo, dev, x, labels), imported=Step(imported, dev, x, labels))
            for _ in range(args.warmup):
                for s in steps.values():
                    s()
            kernels_run = {k: launched(s) for k, s in steps.items()}
            times = {k: [] for k in steps}
            for _ in range(args.iterations):
                for k, s in steps.items():
                    t0 = time.perf_counter()
                    s()
                    times[k].append((time.perf_counter() - t0) * 1e3)
            zms, ims = statistics.median(times["zoo"]), statistics.median(times["imported"])
            same = "same sequence" if kernels_run["zoo"] == kernels_run["imported"] else "DIFFERENT"
            print(f"| {name} | {shape[0]} | {h}x{w} | {zms:.2f} | {ims:.2f} | {ims / zms:.3f} | "
                  f"{len(kernels_run['zoo'])}, {len(kernels_run['imported'])} ({same}) |", flush=True)


if __name__ == "__main__":
    main()
