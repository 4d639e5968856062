"""`luce bench` — placeholder until the runtime lands (issue 3)."""
import click

from luce.errors import LuceError


@click.command()
def command():
    """Measure prefill/decode tok/s (available once the native runtime lands)."""
    raise LuceError("luce bench is not available yet: the native runtime lands with issue 3")
