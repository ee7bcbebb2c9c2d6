"""The `clnet` command: devices, bench, train, eval."""
import sys

import click

from . import devices as device_mod
from .bench import bench
from .train import eval_command, train_command


@click.group()
@click.version_option(package_name="clnet")
def main():
    """clnet: neural networks on any OpenCL device."""


@main.command()
def devices():
    """List every OpenCL platform and device."""
    rows = device_mod.list_devices()
    for path in device_mod.registered_libraries:
        click.echo(f"note: registered {path}, which is installed without an ICD file")
    if not rows:
        raise click.ClickException(device_mod.NO_PLATFORM_HELP)
    for r in rows:
        click.echo(f"[{r['index']}] {r['name']}  ({r['platform']})\n"
                   f"    type {r['type']}, {r['compute_units']} compute units, global memory "
                   f"{r['global_mem'] / 2**30:.1f} GiB, local memory {r['local_mem'] / 1024:.0f} KiB, "
                   f"{r['version']}, driver {r['driver']}")


@main.command()
@click.argument("model")
@click.option("--device", "device_spec", default="auto", show_default=True, help="gpu, cpu, an index, or a name")
@click.option("--batch", type=int, default=None, help="batch size [default: the model's paper batch]")
@click.option("--budget", type=float, default=600.0, show_default=True,
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
    click.echo(f"tuning {model} on {dev.name}; cache {tuning.cache_path()}", err=True)
    report = tune_mod.tune_model(model, dev, batch, budget_s=budget, retune=retune,
                                 progress=lambda line: click.echo(line, err=True))
    gain = [r["default_ms"] / r["ms"] for r in report["tuned"].values() if r["ms"] > 0]
    click.echo(f"{len(report['tuned'])} shapes tuned, {report['cached']} already cached, {len(report['left'])} left "
               f"at their defaults (budget), in {report['seconds']:.1f} s"
               + (f"; median speed-up over the defaults {sorted(gain)[len(gain) // 2]:.2f}x" if gain else ""))


main.add_command(bench)
main.add_command(train_command, "train")
main.add_command(eval_command, "eval")

if __name__ == "__main__":
    sys.exit(main())
