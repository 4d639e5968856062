"""`luce bench` — prefill and decode throughput, swept over lists like llama-bench."""
from __future__ import annotations

from pathlib import Path

import click

from luce.cli.generate import DraftSource
from luce.errors import LuceError

DEFAULT_THREADS = "0"


class IntList(click.ParamType):
    """`512`, `128,256,512` or llama-bench's `first-last+step` (e.g. `1-8+1`)."""
    name = "LIST"

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        out = []
        try:
            for part in str(value).split(","):
                part = part.strip()
                if "-" in part[1:]:
                    span, _, step = part.partition("+")
                    first, last = (int(x) for x in span.split("-", 1))
                    out += list(range(first, last + 1, int(step or 1)))
                elif part:
                    out.append(int(part))
        except ValueError:
            self.fail(f"{value!r} is not a list of integers (e.g. 128,512 or 1-8+1)", param, ctx)
        if not out or any(x < 0 for x in out):
            self.fail(f"{value!r} must name one or more non-negative integers", param, ctx)
        return out


class BlockList(IntList):
    """--draft-block-size: a list of block rows and/or `auto`, e.g. `4,8,16,auto`."""
    name = "LIST"

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        numbers = ",".join(p for p in parts if p.lower() != "auto")
        out = super().convert(numbers, param, ctx) if numbers else []
        return out + ["auto"] * any(p.lower() == "auto" for p in parts)


@click.command()
@click.option("-m", "--model", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Target qwen35 GGUF.")
@click.option("-p", "--n-prompt", type=IntList(), default="512", show_default=True,
              help="Prompt lengths for pp tests (list; 0 skips pp).")
@click.option("-n", "--n-gen", type=IntList(), default="128", show_default=True,
              help="Generated lengths for tg tests (list; 0 skips tg).")
@click.option("-t", "--threads", type=IntList(), default=DEFAULT_THREADS, show_default=True,
              help="CPU threads (list; 0 = one per core).")
@click.option("-r", "--repetitions", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Measured runs per test; tok/s is mean ± stddev.")
@click.option("--device", type=click.Choice(["cpu", "gpu", "auto"]), default="cpu", show_default=True,
              help="Backend to measure.")
@click.option("--peer", type=click.Choice(["none", "llama.cpp"]), default="none", show_default=True,
              help="Also run llama.cpp (llama-cpp-python) on the same file and report the ratio.")
@click.option("-o", "--output", "fmt", type=click.Choice(["md", "json", "jsonl", "csv"]), default="md",
              show_default=True, help="Output format (stdout).")
@click.option("--no-warmup", is_flag=True, help="Skip the unmeasured warm-up run of each test.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random prompt ids, and of the sampler under --temp.")
@click.option("--temp", "--temperature", "temperature", type=click.FloatRange(min=0.0), default=0.0,
              show_default=True, help="tg tests sample at this temperature (0: greedy), as luce generate does.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --temp: sample from the k most likely tokens (0: all).")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True,
              help="With --temp: nucleus sampling.")
@click.option("--draft", type=DraftSource(), metavar="DRAFTER.gguf|mtp",
              help="Speculative decoding: tgN with and without this drafter, or mtp (the target's own MTP "
                   "block) (tau, acceptance, speedup).")
@click.option("--draft-block-size", "block_sizes", type=BlockList(), default="auto", show_default=True,
              help="With --draft: block rows to sweep (list of numbers and/or auto; 0 = the checkpoint "
                   "value). The cost curve behind auto follows the table.")
@click.option("--verify", "verify_modes", default="chain", show_default=True, metavar="chain,tree",
              help="With --draft: verification modes to sweep (chain, tree).")
@click.option("--no-adaptive", is_flag=True, help="With --draft: always draft (no measured fallback to plain decoding).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help="With --draft: decode after every prompt of this set (one JSON string or "
                   "{\"prompt\": ...} per line) instead of one random prompt; e.g. "
                   "models/reference/prompts/code.jsonl.")
@click.option("-np", "--parallel", type=IntList(), default=None, metavar="LIST",
              help="Decode this many sequences at once (list, 1..64; continuous batching): tgN after a prompt "
                   "of the first -p length per sequence, aggregate tok/s as llama-batched-bench's S_TG.")
def command(model, n_prompt, n_gen, threads, repetitions, device, peer, fmt, no_warmup, seed, temperature, top_k,
            top_p, draft, block_sizes, verify_modes, no_adaptive, prompts_file, parallel):
    """Measure prefill (ppN) and decode (tgN) tok/s of a qwen35 GGUF, or with --draft the
    speculative decode speed per block size and verify mode against plain decoding.

    \b
    Examples:
      luce bench -m model.gguf -p 512 -n 128 -t 2 --peer llama.cpp
      luce bench -m model.gguf --draft drafter.gguf -p 64 -n 128 --draft-block-size 8,16 --verify chain,tree
      luce bench -m model.gguf --draft drafter.gguf --draft-block-size 4,8,16,auto
      luce bench -m model.gguf --draft drafter.gguf --temp 0.7 --top-k 20 --top-p 0.95
      luce bench -m model.gguf --device gpu -p 512 -n 128 --parallel 1,8,32,64
    """
    from luce import bench
    from luce.batch import read_prompt_jobs

    sampling = bench.Sampling(temperature, top_k, top_p, seed)
    if sampling.label and peer != "none":
        raise click.BadParameter("the llama.cpp peer decodes without a sampler; compare greedy runs",
                                 param_hint="--peer")

    if parallel is not None:
        _bench_parallel(model, n_prompt, n_gen, threads, repetitions, device, peer, fmt, no_warmup, seed,
                        sampling, draft, parallel)
        return
    if prompts_file and draft is None:
        raise click.BadParameter("a prompt set only applies to speculative runs (--draft)",
                                 param_hint="--prompts")
    if draft is not None:
        modes = [m.strip() for m in verify_modes.split(",") if m.strip()]
        bad = [m for m in modes if m not in bench.VERIFY_MODES]
        if bad or not modes:
            raise click.BadParameter(f"{verify_modes!r}: choose from {', '.join(bench.VERIFY_MODES)}",
                                     param_hint="--verify")
        if not model.is_file():
            raise LuceError(f"model not found: {model}")
        tests = bench.tests_from([], n_gen)
        if not tests:
            raise click.BadParameter("nothing to measure: -n is 0", param_hint="-n")
        prompt_set = [job.prompt for job in read_prompt_jobs(prompts_file)] if prompts_file else None
        last = []
        rows = bench.bench_speculative(model, draft, tests, n_prompt[0], threads, block_sizes, modes,
                                       not no_adaptive, device, repetitions, not no_warmup, seed, prompt_set,
                                       sampling, last_stats=last)
        click.echo(bench.PRINTERS[fmt](rows))
        if fmt == "md":
            if last:
                click.echo("\ncost model after the last run (per block width):\n" + bench.format_cost_curve(last[0]))
            click.echo("\n" + bench.footer())
        return

    if not model.is_file():
        raise LuceError(f"model not found: {model}")
    tests = bench.tests_from(n_prompt, n_gen)
    if not tests:
        raise click.BadParameter("nothing to measure: both -p and -n are 0", param_hint="-p/-n")
    rows = bench.bench_luce(model, tests, threads, device, repetitions, not no_warmup, seed, sampling)
    if peer == "llama.cpp":
        peer_rows = bench.bench_llama_cpp(model, tests, threads, repetitions, not no_warmup, seed)
        bench.attach_peer_ratios(rows, peer_rows)
        rows += peer_rows
    click.echo(bench.PRINTERS[fmt](rows))
    if fmt == "md":
        click.echo("\n" + bench.footer())


def _bench_parallel(model, n_prompt, n_gen, threads, repetitions, device, peer, fmt, no_warmup, seed, sampling,
                    draft, parallel):
    """luce bench --parallel: aggregate decode rows, one per number of sequences."""
    from luce import bench
    from luce.engine import MAX_PARALLEL

    bad = [n for n in parallel if not 1 <= n <= MAX_PARALLEL]
    if bad:
        raise click.BadParameter(f"{bad[0]} sequences: choose 1..{MAX_PARALLEL}", param_hint="--parallel")
    for given, hint in ((peer != "none", "--peer"), (sampling.label, "--temp")):
        if given:
            raise click.BadParameter("not measured with --parallel (greedy decoding, luce alone; "
                                     "tools/bench_matrix.py runs llama-batched-bench beside it)", param_hint=hint)
    if not model.is_file():
        raise LuceError(f"model not found: {model}")
    if not any(n > 0 for n in n_gen):
        raise click.BadParameter("nothing to measure: -n is 0", param_hint="-n")
    rows = bench.bench_parallel(model, n_gen, n_prompt[0], parallel, threads, device, repetitions, not no_warmup,
                                seed, draft)
    click.echo(bench.PRINTERS[fmt](rows))
    if fmt == "md":
        click.echo("\n" + bench.footer())
