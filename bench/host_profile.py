"""Where a small network's iteration spends host time: enqueue time per step (host side only, the device finishing
later) against the whole step, and the Python functions that cost most (cProfile).

    python bench/host_profile.py --device gpu --model lenet --batch 64
    python bench/host_profile.py --device gpu --model resnet50 --batch 1 --forward-only  # eager inference
    python bench/host_profile.py --device gpu --onnx densenet121 --batch 64      # torchvision's, through ONNX
    python bench/host_profile.py --device 0 --onnx densenet121.onnx --batch 1 --stub   # clnet's Python alone

--onnx takes a torchvision model's name (exported in training mode where torchvision is installed, as
bench/depthwise.py does) or an .onnx file. --stub makes every enqueue a no-op (results meaningless): what is left is
clnet's own Python per step and per launch, on any machine, also timed in this thread's CPU time (the least of
--rounds); --driver-groups launches as on a GPU (the driver picks every work-group: no padded_group), the Python a
GPU's launches take. Every run counts the Python function calls of one step (a figure no other load changes).
"""
import argparse
import cProfile
import pstats
import statistics
import sys
import time

import numpy as np
import pyopencl as cl

import clnet
from clnet import kernels, models, nn, optim


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="lenet")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--forward-only", action="store_true", help="an eval-mode forward under no_grad, not a step")
    p.add_argument("--top", type=int, default=18, help="cProfile's rows")
    p.add_argument("--onnx", default=None, help="a torchvision model's name or an .onnx file instead of --model")
    p.add_argument("--stub", action="store_true", help="enqueue nothing: clnet's Python alone")
    p.add_argument("--sort", default="tottime", help="cProfile's order (tottime, cumulative)")
    p.add_argument("--dump", default=None, help="also write cProfile's statistics to this file")
    p.add_argument("--rounds", type=int, default=5, help="--stub: rounds of --steps steps timed in thread CPU time")
    p.add_argument("--driver-groups", action="store_true",
                   help="leave every work-group to the driver, as on a GPU (a CPU's padded_group dropped)")
    args = p.parse_args()
    dev = clnet.device(args.device)
    if args.driver_groups:
        dev.padded_group = None
    clnet.manual_seed(0)
    if args.onnx:
        model, shape, classes = onnx_model(args.onnx, args.batch, dev)
    else:
        model = models.build(args.model).to(dev)
        shape = (args.batch,) + tuple(models.MODELS[args.model]["input_shape"])
        classes = models.MODELS[args.model]["classes"]
    if args.stub:
        kernels.event_free_launches = False  # through pyopencl's enqueue, itself made a no-op
        cl.enqueue_nd_range_kernel = lambda *a, **k: None
    gen = np.random.default_rng(0)
    x = clnet.tensor(gen.standard_normal(shape).astype(np.float32), dev)
    labels = clnet.tensor(gen.integers(0, classes, shape[0]).astype(np.int32), dev)
    loss_fn, opt = nn.CrossEntropyLoss(), optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():  # as `clnet bench` times it: x wants no gradient, so none is computed for it
        loss = loss_fn(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    if args.forward_only:
        model.eval()

        def step():  # noqa: F811 -- the inference pass instead
            with clnet.no_grad():
                model(x)

    for _ in range(5):
        step()
    dev.synchronize()
    launches = kernels.launch_count
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    t1 = time.perf_counter()
    dev.synchronize()
    t2 = time.perf_counter()
    n = (kernels.launch_count - launches) / args.steps
    print(f"{args.onnx or args.model} b{shape[0]} on {dev.name}: host enqueue {(t1 - t0) / args.steps * 1e3:.3f} ms per step, "
          f"whole step {(t2 - t0) / args.steps * 1e3:.3f} ms, {n:.0f} launches "
          f"({(t1 - t0) / args.steps / n * 1e6:.1f} us of host time per launch)")
    if args.stub:  # what a shared machine's other work moves least: this thread's CPU time, the least of the rounds
        rounds = []
        for _ in range(args.rounds):
            c0 = time.thread_time()
            for _ in range(args.steps):
                step()
            rounds.append((time.thread_time() - c0) / args.steps)
        print(f"  thread CPU time a step, least of {args.rounds} rounds of {args.steps}: {min(rounds) * 1e3:.3f} ms "
              f"({min(rounds) / n * 1e6:.1f} us a launch; median {statistics.median(rounds) / n * 1e6:.1f})")
    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
    sys.setprofile(count)  # Python and C function calls of one step: a figure no other load changes
    step()
    sys.setprofile(None)
    print(f"  {calls[0] - 1} Python function calls a step, {(calls[0] - 1) / n:.1f} a launch")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    dev.synchronize()
    stats = pstats.Stats(prof)
    if args.dump:
        stats.dump_stats(args.dump)
    stats.sort_stats(args.sort).print_stats(args.top)


def onnx_model(name, batch, dev):
    """(clnet model in training mode, input shape, classes) of an .onnx file (its batch its own), or of torchvision's
    model `name` exported to one at `batch` (224x224 images)."""
    from clnet import onnx as connx
    path = name
    if not name.endswith(".onnx"):
        import tempfile
        from depthwise import export  # bench/depthwise.py: torchvision's model in training mode
        path = export(name, (batch, 3, 224, 224), tempfile.mkdtemp())[1]
    import onnx
    graph = onnx.load(path).graph
    in_dims, out_dims = ([d.dim_value for d in v.type.tensor_type.shape.dim] for v in (graph.input[0], graph.output[0]))
    return connx.load(path, device=dev).train(), tuple(in_dims), out_dims[1]


if __name__ == "__main__":
    main()
