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


main.add_command(bench)
main.add_command(train_command, "train")
main.add_command(eval_command, "eval")

if __name__ == "__main__":
    sys.exit(main())
