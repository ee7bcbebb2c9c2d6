"""The `clnet bench` command: options, set-up (the device, the network, the batch), the runs in order (tuning,
clnet, the agreement check and PyTorch), the printed report, the JSON record and the exit status."""
import json
import sys
import time

import click
import numpy as np

from .. import kernels, models, onnx, rng, tuning
from ..devices import DeviceNotFound, device as get_device
from ..files import write_atomically
from ..train import WriteError, check_writable, mpi_world
from ..tune import tune_first
from . import report
from .runner import describe, run_clnet
from .twin import AGREEMENT_TOLERANCE, check_agreement, disagreements, run_torch, torch_twin


def _torch_device(compare):
    """The PyTorch device of --compare (strict float32: TF32 off, cudnn.benchmark on), or exit 2 saying why."""
    try:
        import torch
    except ImportError:
        click.echo(f"clnet bench: --compare {compare} needs PyTorch, which is not installed (pip install torch)",
                   err=True)
        sys.exit(2)
    if compare == "torch-cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        click.echo("clnet bench: --compare cuda needs a CUDA device, and PyTorch sees none", err=True)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda")


def _network(model, batch):
    """(network, input shape, zoo name PyTorch can rebuild or None, the onnx module or None) for MODEL."""
    if model.lower().endswith(".onnx"):  # the file's network and input shape; a zoo name where PyTorch rebuilds it
        try:  # clnet.onnx imports the onnx package only here, when a file is read
            net, in_shape, zoo_name = onnx.bench_setup(model, batch)
        except (onnx.OnnxImportError, ImportError, FileNotFoundError) as e:
            raise click.ClickException(str(e)) from None
        return net, in_shape, zoo_name, onnx
    entry = models.MODELS[model]
    return models.build(model), ((batch or entry["batch"]),) + tuple(entry["input_shape"]), model, None


def _data_parallel(net, in_shape, dev, x, labels, args):
    """Under mpiexec: the data-parallel step, tuned on rank 0, reported by rank 0."""
    from .. import distributed  # optional: needs mpi4py
    tuning.allow_less_accurate = args["less_accurate"]
    with distributed.stop_all_on_failure():
        distributed.tune_on_rank0(lambda: tune_first(net, in_shape, dev, args["tune"],
                                                     lambda line: click.echo(line, err=True)), dev)
        timing = distributed.time_data_parallel(net, dev, x, labels, args["iterations"], args["warmup"])
    if timing is None:  # not rank 0
        return
    click.echo(distributed.format_timing(timing))
    if args["json_path"]:
        record = dict(model=args["model"], batch_per_rank=in_shape[0], iterations=args["iterations"],
                      warmup=args["warmup"], timing=timing)
        _write_json(args["json_path"], record)


def _write_json(path, record):
    try:
        write_atomically(path, lambda f: json.dump(record, f, indent=1, default=str), text=True)
    except OSError as e:
        raise click.ClickException(f"cannot write --json {path} ({e.strerror or e}); the figures are printed above") \
            from e


def _compare(result, zoo_name, onnx_mod, fresh, dev, tdev, x, labels, args):
    """PyTorch beside clnet: the agreement check on fresh weights, then the timed runs; fills result["compare"] and
    the rows' PyTorch columns. Returns whether clnet disagrees with the float64 reference."""
    import torch
    compare = args["compare"]
    # Agreement on fresh weights: both engines start from one new state, untouched by the timed steps above.
    rng.manual_seed(args["seed"] + 1)
    if onnx_mod is not None:  # the zoo twin with the file's weights (ONNX carries no num_batches_tracked)
        tm = models.build(zoo_name, lib=torch)
        tm.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in fresh.state_dict().items()},
                           strict=False)
        tm = tm.to(tdev)
    else:
        fresh = models.build(zoo_name).to(dev)
        tm = torch_twin(zoo_name, fresh).to(tdev)
    agreement = check_agreement(fresh, dev, tm, tdev, x, labels)
    t_res = run_torch(tm, tdev, x, labels, args["iterations"], args["warmup"], args["forward_only"])
    cuda = compare == "cuda"
    info = dict(torch=torch.__version__, cudnn=torch.backends.cudnn.version() if cuda else None,
                torch_device=torch.cuda.get_device_name() if cuda else "cpu")
    if not cuda:
        info["threads"] = torch.get_num_threads()
    result["compare"] = report.compare_record("cuDNN" if cuda else "torch-cpu", info, t_res, agreement,
                                              AGREEMENT_TOLERANCE, result["clnet"]["total_ms"])
    report.add_torch_rows(result["layers"], t_res)
    if args["tf32"] and cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        t32 = run_torch(tm, tdev, x, labels, args["iterations"], args["warmup"], args["forward_only"],
                        progress=False)
        result["compare"]["tf32_phases"] = t32["phases"]
        result["compare"]["tf32_total_ms"] = sum(t32["phases"].values())
    return bool(disagreements(agreement, AGREEMENT_TOLERANCE))


def _list_models():
    for name, entry in models.MODELS.items():
        shape, doc = "x".join(map(str, entry["input_shape"])), " ".join((entry["doc"] or "").split())
        click.echo(f"{name:12s} batch {entry['batch']:4d}  input {shape:9s}  {doc}")


@click.command()
@click.argument("model", required=False)
@click.option("--device", "device_spec", default="auto", show_default=True, help="auto, gpu, cpu, an index or a name")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="batch size [default: the model's, as convnet-benchmarks]")
@click.option("--iterations", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="untimed iterations first (kernel builds; the buffer pool settles in 3-5)")
@click.option("--forward-only", is_flag=True, help="time the forward pass (and the loss) only")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every figure to this file")
@click.option("--markdown", is_flag=True, help="print the table as Markdown")
@click.option("--compare", type=click.Choice(["cuda", "torch-cpu"]), help="run PyTorch beside clnet")
@click.option("--tf32", is_flag=True, help="with --compare cuda: also time PyTorch with its TF32 defaults")
@click.option("--list", "list_models", is_flag=True, help="list the models and their default batch sizes")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tune/--no-tune", default=None,
              help="autotune shapes missing from the cache first [default: on GPUs, where it takes seconds]")
@click.option("--less-accurate", is_flag=True,
              help="let the tuner pick algorithms with a larger float32 error than the default's (Winograd "
                   "F(4x4,3x3): 4-5x per layer), as cudnn.benchmark does")
def bench(**args):
    """Time training iterations of MODEL (forward, backward, update), module by module, with the peak device memory
    of the step; with --compare, beside PyTorch (its eager step, its CUDA graph, its allocator's peak).

    Under `mpiexec -n N`: the data-parallel step instead, each rank on its own batch of --batch images (weak
    scaling): per-rank and aggregate images/s, the scaling efficiency and where the all-reduce's time goes.
    """
    started = time.perf_counter()
    model, compare = args["model"], args["compare"]
    world = mpi_world()
    if args["list_models"] or model is None:
        _list_models()
        if model is None and not args["list_models"]:
            raise click.UsageError("name a MODEL (see --list)")
        return
    onnx_file = model.lower().endswith(".onnx")
    if not onnx_file and model not in models.MODELS:
        raise click.BadParameter(f"unknown model {model!r}; known: {', '.join(models.MODELS)} or a file.onnx",
                                 param_hint="MODEL")
    if args["json_path"]:  # before the run, not after it
        try:
            check_writable(args["json_path"], "--json")
        except WriteError as e:
            raise click.ClickException(str(e)) from e
    tdev = _torch_device(compare) if compare else None
    try:
        if world is not None:
            from .. import distributed  # optional: needs mpi4py
            dev = distributed.device(args["device_spec"])
        else:
            dev = get_device(args["device_spec"])
    except DeviceNotFound as e:
        raise click.ClickException(str(e))
    rng.manual_seed(args["seed"])
    net, in_shape, zoo_name, onnx_mod = _network(model, args["batch"])
    batch = in_shape[0]
    try:
        modules = describe(net, in_shape, dev)
    except kernels.OutOfMemory as e:
        raise click.ClickException(report.out_of_memory_message(model, batch, e)) from None
    except ValueError as e:  # a batch too large for 32-bit indexing
        raise click.ClickException(f"{model} at --batch {batch}: {e}") from None
    data_rng = np.random.default_rng(args["seed"])
    x = data_rng.standard_normal(in_shape).astype(np.float32)
    classes = modules[0]["output"][1]  # the model's own output (the root is called first)
    labels = data_rng.integers(0, classes, batch).astype(np.int32)
    if world is not None:
        _data_parallel(net, in_shape, dev, x, labels, args)
        return
    click.echo(f"clnet bench {model}: batch {batch}, {args['iterations']} iterations after {args['warmup']} warm-up, "
               f"on {dev.name} ({dev.platform_name}, driver {dev.driver_version})", err=True)
    tuning.allow_less_accurate = args["less_accurate"]
    tune_report = tune_first(net, in_shape, dev, args["tune"], lambda line: click.echo(line, err=True),
                             progress=lambda line: click.echo("tune " + line, err=True))
    builds = kernels.build_count
    try:
        cl_res = run_clnet(net, dev, x, labels, args["iterations"], args["warmup"], args["forward_only"],
                           progress=True, started=started)
    except kernels.OutOfMemory as e:
        raise click.ClickException(report.out_of_memory_message(model, batch, e)) from None
    result = dict(model=model, batch=batch, iterations=args["iterations"], warmup=args["warmup"],
                  forward_only=args["forward_only"], less_accurate=args["less_accurate"],
                  env=report.environment(dev),
                  clnet=report.clnet_record(cl_res, modules, tune_report, kernels.build_count - builds),
                  expected_transfer_bytes=dict(input=0, labels=0, loss=4),
                  layers=report.profile_rows(modules, cl_res))
    status = 0
    fresh = None
    if compare and onnx_file:
        fresh = onnx_mod.load(model, device=dev)
        result["onnxruntime_error"] = err = onnx_mod.onnxruntime_agreement(model, fresh, x)
        click.echo(f"agreement with ONNX Runtime (CPU) on the output: largest relative error {err:.2e}, tolerance "
                   f"{AGREEMENT_TOLERANCE:.0e}", err=True)
        status = int(err > AGREEMENT_TOLERANCE)
        if zoo_name is None:
            click.echo(f"{model}: PyTorch cannot rebuild this network (its weights match no zoo model): clnet "
                       "alone is timed", err=True)
            compare = None
    if compare and _compare(result, zoo_name, onnx_mod, fresh, dev, tdev, x, labels, args):
        status = 1
    click.echo(report.render_table(result, args["markdown"]))
    if compare and "tf32_total_ms" in result["compare"]:
        click.echo(f"PyTorch with TF32 allowed: total {result['compare']['tf32_total_ms']:.3f} ms")
    if args["json_path"]:
        _write_json(args["json_path"], result)
        click.echo(f"wrote {args['json_path']}", err=True)
    if result.get("onnxruntime_error", 0) > AGREEMENT_TOLERANCE:
        click.echo(f"ERROR: clnet disagrees with ONNX Runtime on the output: relative error "
                   f"{result['onnxruntime_error']:.2e}, tolerance {AGREEMENT_TOLERANCE:.0e}", err=True)
    if status and "compare" not in result:
        sys.exit(1)
    if status:
        for k, v in disagreements(result["compare"]["agreement"], AGREEMENT_TOLERANCE).items():
            click.echo(f"ERROR: clnet disagrees with the float64 reference on {k}: relative error "
                       f"{v['clnet_vs_fp64']:.2e} (PyTorch float32: {v['torch_vs_fp64']:.2e}), tolerance "
                       f"{AGREEMENT_TOLERANCE:.0e}", err=True)
        sys.exit(1)
