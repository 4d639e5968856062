"""`luce generate` — parse options, run luce.Engine, stream text to stdout, stats to stderr.

Prompt sources (exactly one): -p TEXT, -f FILE, --prompts FILE.jsonl (batch), --prompt-ids 1,2,3.
Every prompt input is read and checked before the model is loaded, so a typo fails fast.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from luce.batch import ResultLog, generate_record, generate_records, read_prompt_jobs, result_record
from luce.engine import DEFAULT_CTX_SIZE, DEFAULT_MAX_TOKENS, DEVICES, KV_CACHE_TYPES, MAX_PARALLEL
from luce.errors import LuceError

stderr = Console(stderr=True)


def open_engine(model, **engine_kwargs):
    """The Engine, with a progress bar on stderr while its weights upload to a GPU (when stderr is
    a terminal: a 15 GB upload takes seconds; the CPU maps the file and shows nothing)."""
    from luce.engine import Engine  # imported on use: `luce --help` stays fast

    if engine_kwargs["device"] == "cpu" or not stderr.is_terminal:
        return Engine(model, **engine_kwargs)
    with Progress(TextColumn("uploading weights"), BarColumn(), DownloadColumn(), console=stderr,
                  transient=True) as bar:
        task = bar.add_task("upload", total=None)
        return Engine(model, **engine_kwargs,
                      progress=lambda done, total: bar.update(task, completed=done, total=total))


def note_cpu_fallback(engine) -> None:
    """Under the stats block (so an error stays the only line): --device auto ran on the CPU
    because the GPU could not be used, and why; nothing when luce was built without a GPU
    backend (the CPU is all there is, and the note would be noise)."""
    if engine.gpu_unavailable:
        click.secho(f"running on the CPU: {engine.gpu_unavailable}", err=True, dim=True)


DEFAULT_TEMPERATURE = 0.0
DEFAULT_TOP_K = 0
DEFAULT_TOP_P = 1.0
DEFAULT_SEED = 0
DEFAULT_DEVICE = "auto"
DEFAULT_DRAFT_BLOCK_SIZE = "auto"     # the cost model chooses each step's width
DEFAULT_DDTREE_BUDGET = 22
DEFAULT_VERIFY_CAP = 8192             # committed tokens from which the verify width narrows
LOCAL_RAY = "local"                   # --ray without an ADDRESS: RAY_ADDRESS, else a local instance


class DraftSource(click.ParamType):
    """--draft: a drafter GGUF that exists, or `mtp` for the target's own MTP block."""
    name = "DRAFTER.gguf|mtp"
    _file = click.Path(exists=True, dir_okay=False)

    def convert(self, value, param, ctx):
        from luce.engine import MTP_DRAFT

        if str(value) == MTP_DRAFT:
            return MTP_DRAFT
        return self._file.convert(value, param, ctx)


class BlockSize(click.ParamType):
    """--draft-block-size: 'auto' or a whole number of rows (its range is the drafter's)."""
    name = "auto|N"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or str(value).strip().lower() == "auto":
            return value if isinstance(value, int) else "auto"
        try:
            number = int(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not 'auto' or a number of block rows", param, ctx)
        if number < 0:
            self.fail(f"{number} is not 'auto' or a number of block rows >= 0", param, ctx)
        return number


# ------------------------------------------------------------------------------------------
# prompt inputs


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 1,2,3, got {text!r}",
                                 param_hint="'--prompt-ids'") from None
    if not ids:
        raise click.BadParameter("no token ids given", param_hint="'--prompt-ids'")
    return ids


def read_prompt_file(path: str) -> str:
    """The file's text; one trailing newline is dropped (as llama.cpp's -f does). '-' is stdin."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as e:
        raise LuceError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise LuceError(f"prompt file {path} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


# ------------------------------------------------------------------------------------------
# rendering


def print_stats(stats: dict) -> None:
    """gpt-fast style block on stderr: counts and speeds of the two phases."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(justify="right")
    table.add_row("prompt tokens", str(stats["prompt_tokens"]), f"prefill {stats['prefill_tok_s']:9.1f} tok/s")
    table.add_row("generated tokens", str(stats["generated_tokens"]), f"decode  {stats['decode_tok_s']:9.1f} tok/s")
    if "prompt_cached_tokens" in stats:  # prompt tokens above: those prefilled after the cache's part
        table.add_row("prompt cache", f"{stats['prompt_cached_tokens']} loaded",
                      f"load + head + state copy {stats['prompt_cache_seconds']:.3f}s")
    if "tau" in stats:  # speculative run
        table.add_row("draft steps", f"{stats['spec_steps']} (+{stats['plain_steps']} plain)",
                      f"tau {stats['tau']:.2f}, block {stats['block_size']}"
                      + (" (auto)" if stats.get("block_auto") else ""))
        table.add_row("accepted", f"{stats['n_accepted']} / {stats['n_drafted']}",
                      f"acceptance {100 * stats['acceptance']:5.1f} %")
        table.add_row("time split", "", f"draft {stats['draft_seconds']:.3f}s verify {stats['verify_seconds']:.3f}s "
                                        f"rollback {stats['rollback_seconds']:.3f}s")
        table.add_row("policy", policy_choice(stats), policy_ratio(stats))
        if stats["step_cost_ratio"] and stats["adaptive"]:
            table.add_row("speedup", "", f"expected {stats['expected_speedup']:.2f}x, "
                                         f"achieved {stats['achieved_speedup']:.2f}x")
    if "peak_memory_bytes" in stats:
        where = "on the GPU" if stats["memory_on"] == "device" else "host, weights mapped"
        table.add_row("peak memory", f"{stats['peak_memory_bytes'] / 2**20:.1f} MiB", where)
    stderr.print(table)


def policy_choice(stats: dict) -> str:
    """What the adaptive policy ended up doing, in words."""
    if not stats["adaptive"]:
        return "speculate always"
    if not stats["step_cost_ratio"]:
        return "calibrating"
    return "speculate" if stats["expected_speedup"] >= 1 else "plain, probing"


def policy_ratio(stats: dict) -> str:
    """The measured cost of a spec step in plain steps (the expected speedup of speculating is
    tokens per spec step over it; the achieved one is against the same measured plain step)."""
    if not stats["step_cost_ratio"]:
        return "step costs not measured" if stats["spec_steps"] else "run too short to draft"
    if not stats["adaptive"]:
        return f"spec step {stats['step_cost_ratio']:.2f}x plain (one plain step measured)"
    cached = " (costs from the cache)" if stats.get("costs_from_cache") else ""
    return f"spec step {stats['step_cost_ratio']:.2f}x plain{cached}"


class Stream:
    """Writes text to stdout as it arrives, flushing so a pipe sees it at once."""

    def __init__(self):
        self.written = []

    def __call__(self, text: str) -> None:
        self.written.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()

    def finish(self, full_text: str) -> None:
        # text the incremental decoder still held (a cut UTF-8 sequence at the end), then a newline
        streamed = "".join(self.written)
        tail = full_text[len(streamed):] if full_text.startswith(streamed) else ""
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()


# ------------------------------------------------------------------------------------------
# command


@click.command()
@click.option("-m", "--model", type=click.Path(exists=True, dir_okay=False), metavar="TARGET.gguf",
              help="Target model: a qwen35 GGUF (default: the bundled reference target).")
@click.option("-p", "--prompt", metavar="TEXT", help="Prompt text.")
@click.option("-f", "--prompt-file", metavar="FILE", help="Read the prompt from FILE ('-' for stdin).")
@click.option("--prompts", "prompts_file", metavar="FILE.jsonl",
              help='Batch: one prompt per line (a JSON string or {"prompt": ...}).')
@click.option("--output", "output_file", metavar="FILE.jsonl", type=click.Path(dir_okay=False, writable=True),
              help="With --prompts: append one JSON result per line here as each finishes (never overwritten).")
@click.option("--resume", is_flag=True,
              help="With --output: continue an interrupted batch, skipping the prompts whose ids it holds.")
@click.option("--ray", "ray_address", metavar="[ADDRESS]", is_flag=False, flag_value=LOCAL_RAY, default=None,
              help="With --prompts: spread the batch over a Ray cluster (ADDRESS, else RAY_ADDRESS or a local "
                   "instance); one engine per GPU, else per CPU worker.")
@click.option("--ray-workers", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --ray: engine actors (0: one per GPU of the cluster, else CPUs / --threads).")
@click.option("--parallel", type=click.IntRange(1, MAX_PARALLEL), default=1, show_default=True, metavar="N",
              help=f"With --prompts: N sequences in flight (1..{MAX_PARALLEL}), one forward per decode step over all "
                   "of them (continuous batching); 1 runs the prompts one after another. With --draft each "
                   "sequence drafts its own block and one forward verifies them all (chain drafting: not "
                   "with --ddtree). With --ray: N in flight on each worker.")
@click.option("--prompt-ids", metavar="1,2,3", help="Raw prompt token ids (debugging, parity checks).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=0), default=DEFAULT_MAX_TOKENS, show_default=True,
              help="Most tokens to generate.")
@click.option("--temp", "--temperature", "temperature", type=click.FloatRange(min=0.0), default=DEFAULT_TEMPERATURE,
              show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=DEFAULT_TOP_K, show_default=True,
              help="Sample from the k most likely tokens (0: all).")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=DEFAULT_TOP_P,
              show_default=True, help="Nucleus sampling: smallest set with this total probability.")
@click.option("-s", "--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True,
              help="Random seed for sampling.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user turn with the GGUF's chat template.")
@click.option("--device", type=click.Choice(DEVICES), default=DEFAULT_DEVICE, show_default=True,
              help="Backend to run on (auto: GPU when available, else CPU).")
@click.option("-t", "--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="CPU threads (0: one per core).")
@click.option("-c", "--ctx-size", type=click.IntRange(min=1), default=DEFAULT_CTX_SIZE, show_default=True,
              help="Context length in tokens (prompt + generated).")
@click.option("-ctk", "--cache-type-k", type=click.Choice(list(KV_CACHE_TYPES)), default="f32", show_default=True,
              help="Attention K cache type (llama.cpp's -ctk): f16 halves it, q8_0 / q4_0 store llama.cpp's blocks "
              "(CPU and GPU).")
@click.option("-ctv", "--cache-type-v", type=click.Choice(list(KV_CACHE_TYPES)), default="f32", show_default=True,
              help="Attention V cache type (llama.cpp's -ctv).")
@click.option("--kv-rotate", is_flag=True,
              help="Store K rotated by a Walsh-Hadamard matrix (queries read alike; exact in math): spreads "
              "outliers before a q8_0 / q4_0 cache rounds them.")
@click.option("--fa-window", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Full-attention layers see only the last N positions (0: all; at least 64). "
              "The first prompt longer than N is named in one warning on stderr.")
@click.option("--prompt-cache", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Keep each prompt's head (its last whole 256-token block) on disk in DIR; a later prompt "
              "that starts with a kept head loads it and prefills only the rest. Plain decoding, one sequence "
              "at a time (not with --draft or --parallel > 1).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt and nothing else.")
@click.option("--draft", type=DraftSource(), metavar="DRAFTER.gguf|mtp",
              help="Speculative decoding with this DFlash / DFlash 2 / DSpark drafter (checked like luce inspect), "
              "or mtp: the target's own MTP block drafts (no drafter file).")
@click.option("--draft-block-size", type=BlockSize(), default=DEFAULT_DRAFT_BLOCK_SIZE, show_default=True,
              metavar="auto|N", help="Draft block rows: auto (the width the measured costs and acceptance say "
              "is fastest, chosen each step; cached per model, drafter and device, see docs/cli.md), or "
              "exactly N (0: the drafter's checkpoint value; else 2..2x it, at most 32; with --draft mtp N is the "
              "drafts per step, 1..8, auto up to 4).")
@click.option("--ddtree", is_flag=True, help="Tree verification (DDTree) instead of a single chain.")
@click.option("--ddtree-budget", type=click.IntRange(1, 63), default=DEFAULT_DDTREE_BUDGET, show_default=True,
              help="DDTree nodes per verify step.")
@click.option("--no-adaptive", is_flag=True,
              help="Always draft (never fall back to plain decoding when drafting does not pay on this device).")
@click.option("--dspark-confidence-threshold", type=click.FloatRange(min=0.0, max=1.0, max_open=True), default=0.0,
              show_default=True, help="DSpark: cut the chain at the first confidence below this (0: off).")
@click.option("--verify-cap", type=click.IntRange(min=0), default=DEFAULT_VERIFY_CAP, show_default=True,
              help="From this many committed tokens, verify at most max(8, block/2) rows (0: never cap).")
def command(model, prompt, prompt_file, prompts_file, output_file, resume, ray_address, ray_workers, parallel, prompt_ids, max_tokens, temperature, top_k,
            top_p, seed, ignore_eos, chat, device, threads, ctx_size, cache_type_k, cache_type_v, kv_rotate, fa_window,
            prompt_cache, as_json,
            draft, draft_block_size, ddtree, ddtree_budget, no_adaptive, dspark_confidence_threshold, verify_cap):
    """Generate text with a qwen35 target model, plain or speculative (--draft).

    Text streams to stdout as it is produced; a stats block (prompt tokens, prefill tok/s,
    generated tokens, decode tok/s; with --draft also steps, tau, acceptance and the
    draft/verify/rollback time split) follows on stderr. Greedy output with a drafter is
    identical to greedy output without it. Exit codes: 0 success, 1 error, 2 usage error.
    """
    spec_options = [name for name, given in (("--draft-block-size", draft_block_size != DEFAULT_DRAFT_BLOCK_SIZE),
                                             ("--ddtree", ddtree), ("--no-adaptive", no_adaptive),
                                             ("--dspark-confidence-threshold", dspark_confidence_threshold > 0))
                    if given]
    if spec_options and draft is None:
        raise click.UsageError(f"{', '.join(spec_options)} needs a drafter: --draft DRAFTER.gguf (or --draft mtp)")
    sources = [name for name, value in (("-p", prompt), ("-f", prompt_file), ("--prompts", prompts_file),
                                        ("--prompt-ids", prompt_ids)) if value is not None]
    if len(sources) != 1:
        raise click.UsageError("give exactly one prompt source: -p, -f, --prompts or --prompt-ids"
                               + (f" (got {', '.join(sources)})" if sources else ""))
    if output_file is not None and prompts_file is None:
        raise click.UsageError("--output goes with --prompts")
    if (ray_address is not None or ray_workers) and prompts_file is None:
        raise click.UsageError("--ray and --ray-workers spread a --prompts batch; give --prompts FILE.jsonl")
    if parallel > 1 and prompts_file is None:
        raise click.UsageError("--parallel runs a --prompts batch; give --prompts FILE.jsonl")
    if parallel > 1 and ddtree:
        raise click.UsageError("--ddtree does not combine with --parallel > 1 (a batch verifies chains only): "
                               "drop one of them")
    if prompt_cache is not None and (draft is not None or parallel > 1):
        raise click.UsageError("--prompt-cache goes with plain decoding one sequence at a time: "
                               "drop --draft / --parallel, or the cache")
    if ray_workers and ray_address is None:
        raise click.UsageError("--ray-workers goes with --ray")
    if resume and output_file is None:
        raise click.UsageError("--resume continues an --output file; give --prompts FILE --output FILE")
    if chat and prompt_ids is not None:
        raise click.UsageError("--chat renders text prompts; it cannot apply to --prompt-ids")
    if model is None:
        from luce import reference_target

        model = reference_target()
        if not model.is_file():
            raise click.UsageError("a model is required: -m TARGET.gguf (a qwen35 GGUF); "
                                   "this install has no bundled reference target")
        click.secho(f"no -m given: using the bundled reference target ({model.name}, 12.6 M "
                    "parameters trained on Python source and essays; see docs/models.md)", err=True, dim=True)
    if output_file is not None and not Path(output_file).resolve().parent.is_dir():
        raise LuceError(f"output folder {Path(output_file).resolve().parent} does not exist")

    # every prompt input is checked before the (slow) model load
    if prompt_ids is not None:
        jobs = [{"prompt_ids": parse_prompt_ids(prompt_ids)}]
    elif prompts_file is not None:
        jobs = read_prompt_jobs(prompts_file)
    else:
        text = prompt if prompt is not None else read_prompt_file(prompt_file)
        if not text:
            raise LuceError("the prompt is empty")
        jobs = [{"prompt": text}]

    settings = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                    ignore_eos=ignore_eos, chat=chat)
    if draft is not None:
        settings.update(draft_block_size=draft_block_size, ddtree=ddtree, ddtree_budget=ddtree_budget,
                        adaptive=not no_adaptive, dspark_confidence_threshold=dspark_confidence_threshold,
                        verify_cap_from=verify_cap if verify_cap > 0 else -1)
    engine_kwargs = dict(device=device, threads=threads, ctx_size=ctx_size, draft=draft, cache_type_k=cache_type_k,
                         cache_type_v=cache_type_v, kv_rotate=kv_rotate, fa_window=fa_window,
                         prompt_cache=prompt_cache)
    warnings.showwarning = lambda message, *_: click.secho(f"warning: {message}", err=True, fg="yellow")
    # an --output that would lose results is refused before the model load, too
    log = ResultLog(output_file, resume=resume) if output_file is not None else None
    try:
        if ray_address is not None:
            from luce.ray_batch import RayBatch

            with RayBatch(model, None if ray_address == LOCAL_RAY else ray_address, ray_workers,
                          engine_kwargs, parallel=parallel) as batch:
                run_batch(batch.run, jobs, settings, log, as_json)
            return
        with open_engine(model, **engine_kwargs) as engine:
            if prompts_file is not None:
                if parallel > 1:
                    run_batch(lambda todo, *args: run_parallel(engine, parallel, todo, *args), jobs, settings, log,
                              as_json)
                else:
                    run_batch(lambda todo, *args: run_in_order(engine, todo, *args), jobs, settings, log, as_json)
                if not as_json:
                    note_cpu_fallback(engine)
            elif as_json:
                click.echo(json.dumps(result_record(engine.generate(**jobs[0], **settings)), ensure_ascii=False))
            else:
                stream = Stream()
                gen = engine.generate(**jobs[0], **settings, on_text=stream)
                stream.finish(gen.text)
                print_stats(gen.stats)
                note_cpu_fallback(engine)
    except BrokenPipeError:
        # the reader went away (`luce generate ... | head`): stop quietly, as Unix tools do;
        # stdout is pointed at /dev/null so Python's exit-time flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a tool killed by the pipe
    finally:
        if log is not None:
            log.close()


def run_batch(run, jobs, settings: dict, log: ResultLog | None, as_json: bool) -> None:
    """Generates the prompts the log does not hold yet with run(todo, settings, write, progress)
    (one engine in order, or a RayBatch). With --output (log) every result is appended to the log
    as it finishes (an interrupted run keeps every finished result; --resume skips them), with
    progress on stderr; without it the lines stream to stdout. A prompt the engine refuses (e.g.
    longer than the context) gets an {"error": ...} line; the run goes on and exits 1 at the end."""
    todo = [job for job in jobs if log is None or job.id not in log.done]
    if len(todo) < len(jobs) and not as_json:
        click.echo(f"resuming {log.path}: {len(jobs) - len(todo)} of {len(jobs)} prompts already answered", err=True)
    failed = []

    def write(record: dict) -> None:
        if "error" in record:
            failed.append(record["id"])
        if log is not None:
            log.write(record)
        else:
            sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
            sys.stdout.flush()

    with BatchProgress(len(todo), enabled=log is not None and not as_json) as progress:
        run(todo, settings, write, progress.advance)
    if failed:
        raise LuceError(f"{len(failed)} of {len(todo)} prompts failed (see their error lines)")


def run_in_order(engine, todo, settings: dict, write, progress) -> None:
    for job in todo:
        record = generate_record(engine, job, settings)
        write(record)
        progress(record)


def run_parallel(engine, parallel: int, todo, settings: dict, write, progress) -> None:
    """--parallel N: the prompts through the engine's continuous batching, N sequences in flight;
    each result is written as its sequence finishes (luce.batch.generate_records)."""
    def emit(record: dict) -> None:
        write(record)
        progress(record)

    generate_records(engine, todo, settings, parallel, emit)


class BatchProgress:
    """Prompts done, generated tok/s and ETA on stderr: a live bar on a terminal, one plain line
    per prompt otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done, self.tokens = total, enabled, 0, 0
        self.bar = None
        if enabled and stderr.is_terminal:
            self.bar = Progress(TextColumn("{task.completed}/{task.total} prompts"), BarColumn(),
                                TextColumn("{task.fields[tok_s]:.1f} tok/s"), TimeRemainingColumn(),
                                console=stderr)
            self.task = self.bar.add_task("batch", total=total, tok_s=0.0)
        self.start = time.perf_counter()

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def advance(self, record: dict) -> None:
        self.done += 1
        self.tokens += record.get("stats", {}).get("generated_tokens", 0)
        tok_s = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update(self.task, advance=1, tok_s=tok_s)
        elif self.enabled:
            what = (f"error: {record['error']}" if "error" in record else
                    f"{record['stats']['generated_tokens']} tokens, {record['stats']['decode_tok_s']:.1f} tok/s")
            click.echo(f"[{self.done}/{self.total}] id {record['id']}: {what} ({tok_s:.1f} tok/s overall)", err=True)
