"""The `clnet` command: devices, bench, tune, train, eval. Commands check what the user typed, call the Python API
and print; they build no kernels themselves."""
import json
import math
import shlex
import signal
import sys

import click

from . import data as data_mod
from . import devices as device_mod
from . import lr_scheduler, models, optim, rng
from .bench import bench, out_of_memory_message
from .checkpoint import CheckpointError, check_checkpoint_fits, load_checkpoint
from .devices import DeviceNotFound
from .errors import Error
from .kernels import OutOfMemory
from .devices import device as _device
from .files import write_atomically
from .train import Diverged, FitError, WriteError, check_writable, evaluate, fit, mpi_world
from .tune import tune_first


@click.group()
@click.version_option(package_name="clnet")
@click.option("--verbose", is_flag=True, help="show the OpenCL compilers' own output (warnings, notes) as kernels build")
def main(verbose):
    """clnet: neural networks on any OpenCL device."""
    if verbose:
        from . import kernels
        kernels.verbose = True


@main.command()
def devices():
    """List every OpenCL platform and device."""
    try:
        rows = device_mod.list_devices()
    except DeviceNotFound as e:  # device_mod.UnsafeICDDirectory: a registration directory another user could write
        raise click.ClickException(str(e)) from e
    for path in device_mod.registered_libraries:
        click.echo(f"note: registered {path}: {device_mod.how_found.get(path, 'installed without an ICD file')}")
    if device_mod.icd_directory():
        click.echo(f"note: the registration lives in {device_mod.icd_directory()} (OCL_ICD_VENDORS for this process; "
                   "only you can write it)")
    if not rows:
        raise click.ClickException(device_mod.NO_PLATFORM_HELP)
    for r in rows:
        click.echo(f"[{r['index']}] {r['name']}  ({r['platform']})\n"
                   f"    type {r['type']}, {r['compute_units']} compute units, global memory "
                   f"{r['global_mem'] / 2**30:.1f} GiB, local memory {r['local_mem'] / 1024:.0f} KiB, "
                   f"{r['version']}, driver {r['driver']}")
        if not r["usable"]:
            click.echo(f"    unusable: its compiler cannot build a kernel here ({r['problem']}); clnet never picks "
                       "it (Debian's pocl-opencl-icd or Intel's CPU runtime runs on this CPU)")


@main.command()
@click.argument("model")
@click.option("--device", "device_spec", default="auto", show_default=True, help="gpu, cpu, an index, or a name")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="batch size [default: the model's paper batch]")
@click.option("--budget", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="seconds after which no new shape is started (the rest keep their defaults)")
@click.option("--retune", is_flag=True, help="time shapes again even if the cache has them")
@click.option("--less-accurate", is_flag=True,
              help="also try algorithms with a larger float32 error than the default's (Winograd F(4x4,3x3): 4-5x "
                   "per layer), as cudnn.benchmark does")
def tune(model, device_spec, batch, budget, retune, less_accurate):
    """Time every kernel choice of MODEL's training iteration on the device; store the fastest in the cache."""
    from . import models, tune as tune_mod, tuning
    from .devices import DeviceNotFound, device
    if model not in models.MODELS:
        raise click.BadParameter(f"unknown model {model!r}; known: {', '.join(models.MODELS)}", param_hint="MODEL")
    if batch is not None and batch < 1:
        raise click.BadParameter("--batch must be at least 1")
    try:
        dev = device(device_spec)
    except DeviceNotFound as e:
        raise click.ClickException(str(e))
    tuning.allow_less_accurate = less_accurate
    try:  # before the budget is spent: tuning that cannot be kept is refused at once
        check_writable(tuning.cache_path(), "tune: the tuning cache")
    except WriteError as e:
        raise click.ClickException(f"{e} (set CLNET_CACHE_DIR to a writable folder)") from e
    click.echo(f"tuning {model} on {dev.name}; cache {tuning.cache_path()}", err=True)
    report = tune_mod.tune_model(model, dev, batch, budget_s=budget, retune=retune,
                                 progress=lambda line: click.echo(line, err=True))
    gain = [r["default_ms"] / r["ms"] for r in report["tuned"].values() if r["ms"] > 0]
    click.echo(f"{len(report['tuned'])} shapes tuned, {report['cached']} already cached, {len(report['left'])} left "
               f"at their defaults (budget), in {report['seconds']:.1f} s"
               + (f"; median speed-up over the defaults {sorted(gain)[len(gain) // 2]:.2f}x" if gain else ""))
    lost = _unsaved(tuning.cache_path(), tuning.device_key(dev), report)
    if lost:
        raise click.ClickException(f"tune: {len(lost)} of the {len(report['tuned'])} tuned shapes could not be saved "
                                   f"to the cache {tuning.cache_path()}; free some space or set CLNET_CACHE_DIR to a "
                                   "writable folder, and tune again")


def _unsaved(path, device_key, report):
    """The keys of report["tuned"] that the cache file on disk does not hold for the device: what a failed write (a
    full disk; tuning.store only warns) left out."""
    try:
        with open(path) as f:
            on_disk = json.load(f).get(device_key, {})
    except (OSError, ValueError, AttributeError):
        on_disk = {}
    return [k for k in report["tuned"] if k not in on_disk]


# -- plotting --------------------------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise click.ClickException("--plot needs matplotlib, which is not installed: pip install 'clnet[plot]' "
                                   "(or pip install matplotlib)") from e
    return plt


def plot_history(path, history, title=""):
    """Write a PNG of the loss and accuracy curves per epoch (train, and test where measured)."""
    plt = _pyplot()
    ep = [r["epoch"] for r in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((a, "loss", "loss"), (b, "accuracy", "accuracy")):
        ax.plot(ep, [r["train_" + key] for r in history], "o-", label="train")
        if all("test_" + key in r for r in history):
            ax.plot(ep, [r["test_" + key] for r in history], "s-", label="test")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


# -- commands --------------------------------------------------------------------------------------------------------
def _load_data(dataset, data_dir, split, subset=None, model=None):
    """The split as a Dataset, or a one-line error: files missing or damaged, no images, or images of another shape
    than MODEL takes."""
    try:
        found = data_mod.load(dataset, split, data_dir)
    except (data_mod.DataNotFound, ValueError) as e:  # IDXError, or a data set name clnet does not know
        raise click.ClickException(str(e)) from e
    images = data_mod.find_files(dataset, split, data_dir)[0]
    if len(found) == 0:
        raise click.ClickException(f"{images} holds no images: the {dataset} {split} set needs at least one; pass "
                                   "--data-dir with the complete files")
    if model is not None and tuple(found.images.shape[1:]) != tuple(models.MODELS[model]["input_shape"]):
        raise click.ClickException(f"{images} holds images of shape {tuple(found.images.shape[1:])}; {model} takes "
                                   f"{tuple(models.MODELS[model]['input_shape'])}: pass the {dataset} files of that "
                                   "size")
    return found.subset(subset)


def _finite(ctx, param, value):
    """click callback: a NaN passes every range test (nan > 0 and nan < 0 are both false), inf passes a minimum."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", ctx=ctx, param=param)
    return value


def _device_or_fail(spec):
    try:
        return _device(spec)
    except DeviceNotFound as e:
        raise click.ClickException(str(e)) from e


def _check_model(name):
    if name not in models.MODELS:
        raise click.BadParameter(f"unknown model {name!r}; known models: {', '.join(models.MODELS)}",
                                 param_hint="MODEL")
    shape = models.MODELS[name]["input_shape"]
    if shape != (1, 28, 28):
        fits = [m for m, e in models.MODELS.items() if e["input_shape"] == (1, 28, 28)]
        raise click.BadParameter(f"{name} expects input {shape}; mnist and fashion-mnist are (1, 28, 28) images; "
                                 f"use {', '.join(fits)}", param_hint="MODEL")


OPTIMIZERS = dict(sgd=optim.SGD, adam=optim.Adam, adamw=optim.AdamW)


def _optimizer(name, params, cfg):
    if name == "sgd":
        return optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"])
    return OPTIMIZERS[name](params, lr=cfg["lr"], weight_decay=cfg["weight_decay"])


def _scheduler(name, opt, cfg):
    """The --schedule's lr scheduler, stepped by fit after each epoch: cosine falls from --lr towards 0 over the
    epochs of the run that started it (a resumed run keeps that span: its checkpoint holds the schedule)."""
    return lr_scheduler.CosineAnnealingLR(opt, T_max=cfg["epochs"]) if name == "cosine" else None


SCHEDULES = ("constant", "cosine")
DEFAULTS = dict(epochs=10, batch=64, lr=0.01, momentum=0.9, weight_decay=0.0, seed=0, subset=None, optimizer="sgd",
                test_subset=None, schedule="constant")


@click.command("train")
@click.argument("model")
@click.option("--dataset", type=click.Choice(data_mod.DATASETS), default=None,
              help="Data set (default fashion-mnist, or the resumed checkpoint's).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the IDX files (default $CLNET_DATA, else /usr/share/datasets/fashion-mnist).")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Epochs in all (default 10).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size (default 64).")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, callback=_finite,
              help="Learning rate (default 0.01).")
@click.option("--momentum", type=click.FloatRange(min=0), default=None, callback=_finite,
              help="SGD momentum (default 0.9).")
@click.option("--optimizer", "optimizer_name", type=click.Choice(sorted(OPTIMIZERS)), default=None,
              help="sgd (default), adam or adamw (these take --lr and --weight-decay; try --lr 0.001).")
@click.option("--weight-decay", type=click.FloatRange(min=0), default=None, callback=_finite,
              help="L2 weight decay (default 0).")
@click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
              help="Learning rate over the epochs: constant (default) or cosine (from --lr towards 0 over --epochs: "
                   "PyTorch's CosineAnnealingLR(T_max=epochs), stepped after each epoch).")
@click.option("--device", "device_spec", default="auto", show_default=True,
              help="auto, gpu, cpu, an index from `clnet devices`, or a name substring.")
@click.option("--seed", type=int, default=None, help="Seed of initialisation and shuffling (default 0).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint written after each epoch, on Ctrl-C and at the end (default: the --resume file).")
@click.option("--resume", type=click.Path(dir_okay=False), default=None, help="Continue the run of this checkpoint.")
@click.option("--subset", type=click.IntRange(min=1), default=None, help="Train on the first N training images.")
@click.option("--test-subset", type=click.IntRange(min=1), default=None, help="Test on the first N test images.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None, help="JSON log of per-epoch figures.")
@click.option("--tune/--no-tune", default=None,
              help="autotune the model's shapes missing from the cache first [default: on GPUs]")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of the loss and accuracy curves (needs matplotlib: pip install 'clnet[plot]').")
def train_command(model, dataset, data_dir, epochs, batch, lr, momentum, optimizer_name, weight_decay, schedule,
                  device_spec, seed, checkpoint, resume, subset, test_subset, log_path, tune, plot_path):
    """Train MODEL (lenet, lenet-wide, resnet8) on MNIST or Fashion-MNIST, reporting test accuracy after each epoch.

    Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint, prints the command that continues the run
    and exits with 130 (143 for SIGTERM); --resume continues it exactly.

    Under `mpiexec -n N` it trains data-parallel, one rank per device: --batch is the global batch (a multiple of N),
    rank 0 tunes, prints and writes; a failing rank stops them all.
    """
    try:
        world = mpi_world()
    except Error as e:  # an mpiexec from another MPI than mpi4py's (distributed.MPIMismatch): one line
        raise click.ClickException(str(e)) from e
    if world is None:
        status = _train(None, model, dataset, data_dir, epochs, batch, lr, momentum, optimizer_name, weight_decay,
                        schedule, device_spec, seed, checkpoint, resume, subset, test_subset, log_path, tune,
                        plot_path)
    else:
        from . import distributed
        with distributed.stop_all_on_failure():  # an interrupted run left it cleanly on every rank: no abort
            status = _train(world, model, dataset, data_dir, epochs, batch, lr, momentum, optimizer_name,
                            weight_decay, schedule, device_spec, seed, checkpoint, resume, subset, test_subset,
                            log_path, tune, plot_path)
    if status:
        click.get_current_context().exit(status)


def _train(world, model, dataset, data_dir, epochs, batch, lr, momentum, optimizer_name, weight_decay, schedule,
           device_spec, seed, checkpoint, resume, subset, test_subset, log_path, tune, plot_path):
    """The train command's work; returns the exit status of an interrupted run (128 + the signal), else None."""
    echo = click.echo if world is None or world.rank == 0 else (lambda *a, **k: None)
    _check_model(model)
    if plot_path:
        _pyplot()
    for path, what in ((log_path, "--log"), (plot_path, "--plot")):
        if path:
            try:
                check_writable(path, what)
            except WriteError as e:
                raise click.ClickException(str(e)) from e
    given = dict(epochs=epochs, batch=batch, lr=lr, momentum=momentum, weight_decay=weight_decay, seed=seed,
                 subset=subset, optimizer=optimizer_name, test_subset=test_subset, schedule=schedule)
    ckpt = None
    if resume:
        try:
            ckpt = load_checkpoint(resume)
        except CheckpointError as e:
            raise click.ClickException(str(e)) from e
        if ckpt["model"] != model:
            raise click.ClickException(f"checkpoint {resume} holds a {ckpt['model']!r} model, not {model!r}")
        stored = ckpt["config"]
        conflicts = [f"--{k.replace('_', '-')} {given[k]} (checkpoint: {stored.get(k, DEFAULTS[k])})" for k in
                     ("batch", "lr", "momentum", "weight_decay", "seed", "subset", "test_subset", "optimizer",
                      "schedule") if given[k] is not None and given[k] != stored.get(k, DEFAULTS[k])]
        if dataset is not None and dataset != stored.get("dataset"):
            conflicts.append(f"--dataset {dataset} (checkpoint: {stored.get('dataset')})")
        if conflicts:
            raise click.ClickException(f"--resume continues the run of {resume} unchanged; these options differ "
                                       f"from it: {', '.join(conflicts)}. Leave them out.")
        dataset = stored.get("dataset")
        for what, value, known in (("data set", dataset, (None,) + data_mod.DATASETS),
                                   ("optimizer", stored.get("optimizer", "sgd"), tuple(OPTIMIZERS)),
                                   ("schedule", stored.get("schedule", "constant"), SCHEDULES)):
            if value not in known:
                raise click.ClickException(f"checkpoint {resume} is damaged: its record's {what} {value!r} is not "
                                           "one clnet knows; use an earlier checkpoint")
        given = {k: stored.get(k, DEFAULTS[k]) if k != "epochs" or v is None else v for k, v in given.items()}
        checkpoint = checkpoint or resume
    dataset = dataset or "fashion-mnist"
    cfg = {k: (DEFAULTS[k] if v is None and k not in ("subset", "test_subset") else v) for k, v in given.items()}
    test_subset = cfg["test_subset"]
    train_data = _load_data(dataset, data_dir, "train", cfg["subset"], model)
    test_data = _load_data(dataset, data_dir, "test", test_subset, model)
    if world is not None:
        try:
            data_mod.check_global_batch(cfg["batch"], world.size)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--batch") from None
        from . import distributed
        dev = distributed.device(device_spec)
    else:
        dev = _device_or_fail(device_spec)
    rng.manual_seed(cfg["seed"])
    net = models.build(model).to(dev)
    shape = (cfg["batch"] // (world.size if world else 1),) + tuple(models.MODELS[model]["input_shape"])
    if world is None:
        tune_first(net, shape, dev, tune, click.echo)
    else:  # rank 0 tunes a rank's share, the others wait for its table; then the model is wrapped
        distributed.tune_on_rank0(lambda: tune_first(net, shape, dev, tune, click.echo), dev)
        net = distributed.DataParallel(net)
    opt = _optimizer(cfg["optimizer"], net.parameters(), cfg)
    sched = _scheduler(cfg["schedule"], opt, cfg)
    echo(f"training {model} on {dataset} ({len(train_data)} training, {len(test_data)} test images) on "
         f"{dev.name} ({dev.platform_name}): batch {cfg['batch']}, {cfg['optimizer']} lr {cfg['lr']}, "
         + (f"momentum {cfg['momentum']}, " if cfg["optimizer"] == "sgd" else "")
         + f"weight decay {cfg['weight_decay']}, seed {cfg['seed']}"
         + (f", {cfg['schedule']} schedule" if sched is not None else "")
         + (f"; data-parallel over {world.size} ranks, {cfg['batch'] // world.size} images each" if world else ""))
    try:
        result = fit(net, train_data, test_data, epochs=cfg["epochs"], batch=cfg["batch"], optimizer=opt,
                     scheduler=sched, device=dev, seed=cfg["seed"], checkpoint=checkpoint, resume=ckpt, log=log_path,
                     progress=True, model_name=model, interrupt_checkpoint=f"{model}-{dataset}-interrupted.ckpt",
                     config=dict(dataset=dataset, lr=cfg["lr"], momentum=cfg["momentum"],
                                 weight_decay=cfg["weight_decay"], subset=cfg["subset"], optimizer=cfg["optimizer"],
                                 test_subset=test_subset, schedule=cfg["schedule"]))
    except (CheckpointError, Diverged, FitError, WriteError) as e:
        raise click.ClickException(str(e)) from e
    except OutOfMemory as e:
        raise click.ClickException(out_of_memory_message(model, cfg["batch"], e)) from None
    if result["interrupted"]:
        # what the checkpoint does not hold travels on the command line, so the command continues this very run
        again = [("--epochs", cfg["epochs"]), ("--test-subset", test_subset), ("--data-dir", data_dir),
                 ("--device", device_spec if device_spec != "auto" else None), ("--log", log_path),
                 ("--plot", plot_path), ("--tune" if tune else "--no-tune", "") if tune is not None else (None, None)]
        extra = "".join(f" {flag}" + (f" {shlex.quote(str(v))}" if v != "" else "") for flag, v in again
                        if flag is not None and v is not None)
        echo(f"stopped at epoch {result['epoch'] + 1}, step {result['step']}; checkpoint written to "
             f"{result['checkpoint']}. Continue with: {f'mpiexec -n {world.size} ' if world else ''}"
             f"clnet train {model} --resume {shlex.quote(result['checkpoint'])}{extra}")
        # the shell's convention, 128 + the signal: a scheduler or script sees that the run did not finish
        return 128 + (result["signal"] or signal.SIGINT)
    hist = result["epochs"]
    if world is not None and world.rank != 0:
        return
    if plot_path and hist:
        try:
            plot_history(plot_path, hist, f"{model} on {dataset}")
        except OSError as e:
            raise click.ClickException(f"cannot write the plot {plot_path} ({e.strerror or e}); the training is "
                                       "done" + (f" and kept in {result['checkpoint']}" if result["checkpoint"] else "")
                                       + (f", the figures in {log_path}" if log_path else "")) from e
    if hist:
        last = hist[-1]
        best = max(hist, key=lambda r: r.get("test_accuracy", 0.0))
        total = sum(r["seconds"] + r.get("eval_seconds", 0.0) for r in hist)
        click.echo(f"done: {model} on {dataset}, {len(hist)} epochs, test accuracy {last.get('test_accuracy', 0):.4f} "
                   f"(best {best.get('test_accuracy', 0):.4f} at epoch {best['epoch']}), test loss "
                   f"{last.get('test_loss', float('nan')):.4f}, {total:.1f} s of training and testing"
                   + (f"; checkpoint {result['checkpoint']}" if result["checkpoint"] else "")
                   + (f"; log {log_path}" if log_path else "") + (f"; plot {plot_path}" if plot_path else ""))


@click.command("eval")
@click.argument("model")
@click.option("--checkpoint", type=click.Path(dir_okay=False), required=True, help="Checkpoint to evaluate.")
@click.option("--dataset", type=click.Choice(data_mod.DATASETS), default=None,
              help="Data set (default: the checkpoint's).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the IDX files (default $CLNET_DATA, else /usr/share/datasets/fashion-mnist).")
@click.option("--batch", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--device", "device_spec", default="auto", show_default=True)
@click.option("--test-subset", type=click.IntRange(min=1), default=None, help="Test on the first N test images.")
def eval_command(model, checkpoint, dataset, data_dir, batch, device_spec, test_subset):
    """Test-set loss, accuracy and confusion counts per class of MODEL with the weights of a checkpoint."""
    _check_model(model)
    try:
        ckpt = load_checkpoint(checkpoint)
        net = models.build(model)
        check_checkpoint_fits(ckpt, net, model)
        net.load_state_dict(ckpt["state_dict"])
    except (CheckpointError, KeyError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    dataset = dataset or ckpt["config"].get("dataset") or "fashion-mnist"
    test_data = _load_data(dataset, data_dir, "test", test_subset, model)
    dev = _device_or_fail(device_spec)
    ev = evaluate(net.to(dev), test_data, batch=batch, device=dev)
    click.echo(f"{model} ({checkpoint}, epoch {ckpt['epoch']}) on the {dataset} test set, {ev['images']} images, "
               f"{dev.name}: accuracy {ev['accuracy']:.4f}, loss {ev['loss']:.4f}")
    conf = ev["confusion"]
    names = list(test_data.classes) + [str(i) for i in range(len(test_data.classes), len(conf))]
    width = max(6, max(len(str(v)) for v in conf.flat) + 1)
    click.echo("confusion counts (rows: true class, columns: predicted class)")
    click.echo(f"{'':>14}" + "".join(f"{i:>{width}}" for i in range(len(conf))) + "  accuracy")
    for i, row in enumerate(conf):
        total = row.sum()
        acc = f"{row[i] / total:.3f}" if total else "-"
        click.echo(f"{i:>2} {names[i][:11]:<11}" + "".join(f"{v:>{width}}" for v in row) + f"  {acc:>8}")


@main.command("run")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False), required=True,
              help=".npy for a one-input graph, or .npz with the inputs by graph-input name (or in order)")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), required=True,
              help=".npy for a one-output graph, else .npz (the outputs by name)")
@click.option("--device", "device_spec", default="auto", show_default=True)
def run_command(model, input_path, output_path, device_spec):
    """Run the ONNX network MODEL (eval mode) on the arrays of --input; write its outputs to --output."""
    from . import onnx as onnx_mod
    dev = _device_or_fail(device_spec)
    try:
        outs = onnx_mod.run_file(model, input_path, output_path, dev)
    except (onnx_mod.OnnxImportError, ImportError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{model} on {dev.name}: wrote {output_path} "
               f"({', '.join('x'.join(map(str, o.shape)) for o in outs)})", err=True)


main.add_command(bench)
main.add_command(train_command, "train")
main.add_command(eval_command, "eval")

if __name__ == "__main__":
    sys.exit(main())
