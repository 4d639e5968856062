"""`luce convert` as a library call: detect the checkpoint, plan, write atomically, validate.

The CLI renders; this module decides. A drafter is written to a temp file beside OUT, checked
with the same rules as `luce inspect`, and only then renamed to OUT; any error or Ctrl-C
leaves no file. A Qwen3.5 target dispatches to `luce.converters.qwen35.convert_qwen35`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from luce.converters import schema
from luce.converters.detect import TARGET_KIND, detect_checkpoint, is_target_config
from luce.converters.drafter_gguf import DraftPlan, plan_drafter, write_drafter
from luce.converters.output import atomic_output, check_destination
from luce.converters.safetensors_source import CONFIG_FILE, load_json, open_checkpoint
from luce.converters.target_vocab import open_target_vocab
from luce.converters.validate import inspect_gguf
from luce.errors import LuceError


class Progress(Protocol):
    """What the CLI's progress bar implements (a no-op by default)."""

    def start(self, n_tensors: int, n_bytes: int) -> None: ...

    def advance(self, name: str, n_bytes: int) -> None: ...


class NoProgress:
    def start(self, n_tensors: int, n_bytes: int) -> None:
        pass

    def advance(self, name: str, n_bytes: int) -> None:
        pass


@dataclass
class ConvertResult:
    path: Path | None              # None on --dry-run
    kind: str
    format: str
    summary: dict
    warnings: list[str] = field(default_factory=list)
    plan: DraftPlan | None = None


@dataclass
class ConvertOptions:
    config: Path | None = None
    outtype: str = schema.DEFAULT_OUTTYPE
    layout: str = "lucebox"
    aux_heads: Path | None = None
    no_aux_heads: bool = False
    no_yarn: bool = False
    force: bool = False
    dry_run: bool = False
    target_model: Path | None = None   # target GGUF or HF folder: the tokenizer for --layout llama.cpp


def _target_config(src: Path, config: Path | None) -> dict | None:
    path = Path(config) if config else (src / CONFIG_FILE if src.is_dir() else src.parent / CONFIG_FILE)
    return load_json(path, "config") if path.exists() else None


def convert_checkpoint(src, out, opts: ConvertOptions | None = None,
                       progress: Progress | None = None) -> ConvertResult:
    src, out = Path(src), Path(out)
    opts, progress = opts or ConvertOptions(), progress or NoProgress()
    if not src.exists():
        raise LuceError(f"{src}: no such file or directory")
    if not opts.dry_run:
        check_destination(out, opts.force)       # fail before any work
    config = _target_config(src, opts.config)
    if config is not None and is_target_config(config):
        return _convert_target(src, out, opts, progress)
    if opts.outtype not in schema.OUTTYPES:
        raise LuceError(f"--outtype {opts.outtype} is for Qwen3.5 targets; drafters take "
                        f"{', '.join(schema.OUTTYPES)}")
    target_vocab = None
    if opts.layout == "llama.cpp" and opts.target_model is not None:
        target_vocab = open_target_vocab(opts.target_model)
    ckpt = open_checkpoint(src, opts.config, opts.aux_heads, use_sidecar=not opts.no_aux_heads)
    try:
        kind = detect_checkpoint(ckpt.config, ckpt.tensors, ckpt.sidecar)
        plan = plan_drafter(ckpt, kind, opts.layout, opts.outtype, opts.no_yarn, target_vocab)
        result = ConvertResult(None, kind, plan.variant, {}, list(plan.warnings), plan)
        if opts.target_model is not None and target_vocab is None:
            result.warnings.append("--target-model is used only by --layout llama.cpp (the lucebox layout "
                                   "carries no tokenizer); ignored")
        if opts.dry_run:
            result.summary = plan_summary(plan, None)
            return result
        progress.start(len(plan.tensors), sum(t.nbytes for t in plan.tensors))
        with atomic_output(out, opts.force) as tmp:
            write_drafter(plan, tmp, lambda t: progress.advance(t.gguf_name, t.nbytes))
            report = inspect_gguf(tmp)
            errors = [f for f in report.findings if f.severity == "error"]
            if errors:
                raise LuceError(f"converted file failed validation: {errors[0].code}: {errors[0].message}")
            result.warnings += [f.message for f in report.findings if f.severity == "warning"]
        result.path = out
        result.summary = plan_summary(plan, out.stat().st_size)
        return result
    finally:
        ckpt.close()


def plan_summary(plan: DraftPlan, out_size: int | None) -> dict:
    c = plan.config
    return {
        "format": plan.variant, "layout": plan.layout, "arch": plan.arch, "layers": c.n_layer,
        "hidden": c.hidden, "block_size": c.block_size, "target_layer_ids": c.target_layer_ids,
        "n_target_layers": plan.n_target_layers, "mask_token_id": c.mask_token_id,
        "heads": plan.heads, "sample_from_anchor": c.sample_from_anchor,
        "yarn": (f"factor {c.yarn.factor:g}, original {c.yarn.original_context}" if c.yarn else None),
        "sliding_window": c.sliding_window, "tensor_types": plan.type_counts(),
        "n_tensors": len(plan.tensors), "dropped": plan.dropped, "output_bytes": out_size,
        "tokenizer": (f"{plan.target_vocab.n_vocab} tokens from {plan.target_vocab.path}"
                      if plan.target_vocab is not None else None),
    }


def _convert_target(src: Path, out: Path, opts: ConvertOptions, progress) -> ConvertResult:
    try:
        qwen35 = importlib.import_module("luce.converters.qwen35")
    except ModuleNotFoundError:
        raise LuceError(f"{src} is a Qwen3.5 target checkpoint; the target converter is not available "
                        f"in this build yet") from None
    result = qwen35.convert_qwen35(src, out, opts.outtype, progress, force=opts.force)
    if isinstance(result, ConvertResult):
        return result
    return ConvertResult(out, TARGET_KIND, "Qwen3.5 target", result if isinstance(result, dict) else {})
