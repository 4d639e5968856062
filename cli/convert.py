"""`luce convert` — parse options, run luce.converters.convert, render progress and a summary."""
from __future__ import annotations

import json

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from luce.converters import schema
from luce.converters import qwen35
from luce.converters.convert import ConvertOptions, convert_checkpoint

# Drafters take the drafter schema's types; the target converter also writes Q4_0 and Q4_1.
OUTTYPE_CHOICES = list(dict.fromkeys([*schema.OUTTYPES, *qwen35.OUTTYPES]))

stderr = Console(stderr=True)
stdout = Console()


class RichProgress:
    """Two bars on stderr: tensors and bytes."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def start(self, n_tensors: int, n_bytes: int) -> None:
        if not self.enabled:
            return
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            DownloadColumn(), console=stderr, transient=True)
        self.bar.start()
        self.tensors = self.bar.add_task("tensors", total=n_tensors)
        self.bytes = self.bar.add_task("bytes", total=n_bytes)

    def advance(self, name: str, n_bytes: int) -> None:
        if self.bar is not None:
            self.bar.update(self.tensors, advance=1, description=f"{name}")
            self.bar.update(self.bytes, advance=n_bytes)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


SUMMARY_ROWS = [("format", "Format"), ("layout", "Layout"), ("layers", "Layers"), ("hidden", "Hidden"),
                ("block_size", "Block size"), ("target_layer_ids", "Target layers"),
                ("mask_token_id", "Mask token"), ("heads", "Heads present"),
                ("sample_from_anchor", "Sample from anchor"), ("yarn", "YaRN"),
                ("sliding_window", "Sliding window"), ("tokenizer", "Tokenizer"), ("tensor_types", "Tensor types"),
                ("dropped", "Dropped tensors"), ("output_bytes", "Output size")]


def render_summary(result, console: Console) -> None:
    table = Table(title=str(result.path) if result.path else "dry run (nothing written)", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, label in SUMMARY_ROWS:
        if key in result.summary:
            value = result.summary[key]
            if key == "output_bytes" and value is not None:
                value = f"{value / 2**20:.2f} MiB ({value} bytes)"
            table.add_row(label, _fmt(value))
    console.print(table)
    if result.plan is not None and result.path is None:
        keys = Table("key", "type", "value", title="keys")
        for key, value in result.plan.keys:
            keys.add_row(key.at(result.plan.arch), key.vtype.name, _fmt(value))
        console.print(keys)
        plan = Table("tensor", "source", "shape (GGUF)", "type", "bytes", title="tensors")
        for t in result.plan.tensors:
            plan.add_row(t.gguf_name, t.source, str(list(t.gguf_shape)), t.stored.name, str(t.nbytes))
        console.print(plan)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src", type=click.Path(exists=True, dir_okay=True, file_okay=True))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Output GGUF path (written atomically; see --force).")
@click.option("--config", type=click.Path(exists=True, dir_okay=False),
              help="config.json to use (required when SRC is a single .safetensors file).")
@click.option("--outtype", type=click.Choice(OUTTYPE_CHOICES), default=schema.DEFAULT_OUTTYPE,
              show_default=True, help="Weight type for matrices; norms, conv bases and biases stay F32. "
                                      "q4_0 and q4_1 are for Qwen3.5 targets only.")
@click.option("--layout", type=click.Choice(list(schema.LAYOUTS)), default="lucebox", show_default=True,
              help="lucebox: arch qwen35-dflash-draft; llama.cpp: upstream arch dflash names.")
@click.option("--target-model", type=click.Path(exists=True, dir_okay=True, file_okay=True),
              help="Target GGUF or its Hugging Face folder; --layout llama.cpp copies its tokenizer "
                   "(required there, as llama.cpp's --target-model-dir).")
@click.option("--aux-heads", type=click.Path(exists=True, dir_okay=False),
              help="Sidecar head file (.safetensors); default: dflash_aux_heads.safetensors beside SRC.")
@click.option("--no-aux-heads", is_flag=True, help="Ignore any sidecar head file.")
@click.option("--no-yarn", is_flag=True, help="Write no rope.scaling.* keys (plain RoPE, keeps rope theta).")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--dry-run", is_flag=True, help="Print the plan (keys, tensors, types) and write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def command(src, out, config, outtype, layout, target_model, aux_heads, no_aux_heads, no_yarn, force, dry_run,
            as_json):
    """Convert a drafter checkpoint (DFlash, DFlash 2, DSpark) or a Qwen3.5 target to GGUF.

    SRC is a checkpoint folder (config.json + model.safetensors, or a sharded
    model.safetensors.index.json set, optionally dflash_aux_heads.safetensors) or a single
    .safetensors file with --config. The output is validated with the `luce inspect` rules
    before it replaces OUT; a failed or interrupted run leaves no file.

    \b
    Examples:
      luce convert z-lab-Qwen3.5-27B-DFlash/ -o dflash.gguf
      luce convert Qwen3.8-27B-DSpark/ -o dspark-q8.gguf --outtype q8_0 --no-yarn
      luce convert z-lab-Qwen3.5-27B-DFlash/ -o d.gguf --layout llama.cpp --target-model t.gguf
    """
    opts = ConvertOptions(config=config, outtype=outtype, layout=layout, aux_heads=aux_heads,
                          no_aux_heads=no_aux_heads, no_yarn=no_yarn, force=force, dry_run=dry_run,
                          target_model=target_model)
    progress = RichProgress(enabled=not as_json and stderr.is_terminal)
    try:
        result = convert_checkpoint(src, out, opts, progress)
    finally:
        progress.stop()
    for warning in result.warnings:
        stderr.print(f"[yellow]warning:[/yellow] {warning}")
    if as_json:
        click.echo(json.dumps({"path": str(result.path) if result.path else None, "kind": result.kind,
                               **result.summary, "warnings": result.warnings}, indent=2))
    else:
        render_summary(result, stdout)
