"""`luce inspect` — validate a drafter (or target) GGUF and, with --target, the pair.

Exit codes: 0 valid (warnings allowed), 1 invalid, 2 unreadable (not a GGUF, truncated, I/O).
"""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from luce.converters.gguf_reader import GGUFFormatError
from luce.converters.validate import ERROR, Report, inspect_gguf

stdout = Console()

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}
HIDDEN = {"findings", "target"}


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(report: Report, console: Console, title: str = "") -> None:
    verdict = "[green]valid[/green]" if report.valid else "[bold red]invalid[/bold red]"
    table = Table(title=f"{title}{report.path}: {report.kind} ({report.arch}) — {verdict}",
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in report.summary.items():
        if key not in HIDDEN:
            table.add_row(key.replace("_", " "), _fmt(value))
    console.print(table)
    if report.findings:
        findings = Table("severity", "code", "message", title="findings", title_justify="left")
        for f in report.findings:
            findings.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", f.code, f.message)
        console.print(findings)
    else:
        console.print("no findings")
    if report.target is not None:
        render(report.target, console, title="target ")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--target", type=click.Path(dir_okay=False),
              help="qwen35 target GGUF: also check hidden size, vocab, mask token and target layers.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON only.")
def command(file, target, as_json):
    """Validate a drafter GGUF (qwen35-dflash-draft or upstream dflash) or a qwen35 target.

    Reports a summary and every finding with its severity. Exit code 0: valid (warnings
    allowed), 1: invalid, 2: unreadable (not a GGUF, truncated, crafted, I/O error).

    \b
    Examples:
      luce inspect drafter.gguf
      luce inspect drafter.gguf --target Qwen3.5-27B-Q4_K_M.gguf
      luce inspect drafter.gguf --json | jq .findings
    """
    try:
        report = inspect_gguf(file, target)
    except GGUFFormatError as e:
        if not as_json:
            raise
        click.echo(json.dumps({"valid": False, "kind": None, "arch": None, "path": file,
                               "findings": [{"severity": ERROR, "code": "unreadable", "message": str(e)}]},
                              indent=2))
        sys.exit(e.exit_code)
    if as_json:
        click.echo(report.to_json())
    else:
        render(report, stdout)
    sys.exit(report.exit_code)
