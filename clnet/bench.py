"""`clnet bench`: time training iterations of a zoo model."""
import click


@click.command()
@click.argument("model", required=False)
def bench(model):
    """Time training iterations of MODEL."""
    raise click.ClickException("not built yet")
