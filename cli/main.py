"""`luce` entry point: a click group whose subcommands are imported lazily.

`luce --help` therefore never imports numpy, the converters or the native library. Every
command module exposes a click command named `command`. LuceError raised anywhere below is
shown as one line on stderr with the exit code it carries; no traceback unless LUCE_DEBUG=1.
"""
from __future__ import annotations

import importlib
import os
import sys

import click

from luce import __version__
from luce.errors import LuceError

# command name -> (module, one-line help shown by `luce --help`)
COMMANDS = {
    "convert": ("luce.cli.convert", "Convert a drafter or Qwen3.5 checkpoint to GGUF."),
    "inspect": ("luce.cli.inspect", "Validate a drafter GGUF and its fit with a target."),
    "generate": ("luce.cli.generate", "Generate text with a qwen35 target (and a drafter)."),
    "bench": ("luce.cli.bench", "Measure prefill/decode tok/s and speculative speedups."),
}


class UserFacingError(click.ClickException):
    """A LuceError on its way out: click prints `Error: <message>` and exits with its code."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def invoke(self, ctx):
        # LuceError is the library's user-facing failure: one red line, its exit code.
        try:
            return super().invoke(ctx)
        except LuceError as e:
            if os.environ.get("LUCE_DEBUG"):
                raise
            raise UserFacingError(str(e), e.exit_code) from None

    def format_commands(self, ctx, formatter):
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="luce")
def cli():
    """luce: fast, lossless local inference for Qwen3.5-family hybrid models with
    block-diffusion speculative decoding (DFlash, DFlash 2, DSpark).

    Exit codes: 0 success, 1 error (one line on stderr), 2 usage error or, for
    `luce inspect`, an unreadable file.
    """


def main(argv=None):
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="luce")
    except KeyboardInterrupt:  # pragma: no cover - click normally turns this into Abort
        click.echo("Interrupted.", err=True)
        sys.exit(130)
