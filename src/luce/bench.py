"""Benchmarks in llama-bench's manner: every list-valued parameter is swept, tests are named
`pp512` (prefill of 512 prompt tokens) and `tg128` (128 decoded tokens), tok/s is the mean ±
stddev over repetitions after one unmeasured warm-up, and one row schema feeds every printer.

Prompts are random token ids (seeded), so timings exclude tokenization. The optional peer is
llama.cpp through the `llama-cpp-python` package (the `bench` extra), run on the same GGUF with
the same thread count in the same process, so each luce row can carry a ratio to it.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from luce.binding import lib
from luce.errors import LuceError

DEFAULT_PROMPT_TOKENS = (512,)
DEFAULT_GEN_TOKENS = (128,)
DEFAULT_REPETITIONS = 5


@dataclasses.dataclass
class Test:
    """One measured workload: `pp` prefills n_prompt tokens, `tg` decodes n_gen tokens."""
    kind: str  # "pp" | "tg"
    n: int

    @property
    def name(self) -> str:
        return f"{self.kind}{self.n}"


@dataclasses.dataclass
class Row:
    """The one row schema behind every output format."""
    model: str
    size_gib: float
    backend: str
    threads: int
    test: str
    tok_s: float
    tok_s_std: float
    gb_s: float | None  # weight bytes streamed per second (decode rows only)
    reps: int
    vs_peer: float | None = None  # this row's tok/s divided by the peer's, same test and threads
    sampling: str | None = None  # tg rows decoded with a sampler (luce bench --temp): its settings
    # Speculative rows (luce bench --draft): drafter, block rows, chain|tree, mean tokens per
    # draft step (bonus included), accepted / drafted, tok/s over the plain row of the same test.
    draft: str | None = None
    block: int | str | None = None  # "auto (w)": the cost model chose, w where it ended
    verify: str | None = None
    tau: float | None = None
    acceptance: float | None = None
    speedup: float | None = None
    # The engine's peak backend memory by the end of this row's runs (Engine.memory: on a GPU
    # weights, caches, state and scratch; on the CPU all but the mapped weights).
    peak_mib: float | None = None
    # Batched rows (luce bench --parallel): sequences decoding at once; tok/s is their aggregate.
    parallel: int | None = None


def tests_from(prompt_tokens: Iterable[int], gen_tokens: Iterable[int]) -> list[Test]:
    return [Test("pp", n) for n in prompt_tokens if n > 0] + [Test("tg", n) for n in gen_tokens if n > 0]


def resolve_threads(n: int) -> int:
    """0 means one thread per core; rows always show the number actually used."""
    return n or os.cpu_count() or 1


def random_prompt(n: int, n_vocab: int, seed: int) -> list[int]:
    # Ids from the lower part of the vocabulary: real text never uses the filler/special tail.
    rng = np.random.default_rng(seed)
    return rng.integers(0, max(2, min(n_vocab, 32000)), size=n).tolist()


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The sampler settings tg rows decode with (luce bench --temp/--top-k/--top-p); the default
    is greedy. The seed makes every measured run draw the same tokens."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def label(self) -> str | None:
        if self.temperature <= 0.0:
            return None
        parts = [f"temp {self.temperature:g}"] + ([f"top-k {self.top_k}"] if self.top_k else []) \
            + ([f"top-p {self.top_p:g}"] if self.top_p < 1.0 else [])
        return ", ".join(parts)

    def generate_kwargs(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)


GREEDY = Sampling()


def measure(run_once: Callable[[], float], n_tokens: int, reps: int, warmup: bool) -> tuple[float, float]:
    """(mean, std) tok/s of run_once, which returns the seconds spent on n_tokens tokens."""
    if warmup:
        run_once()
    rates = [n_tokens / max(run_once(), 1e-9) for _ in range(reps)]
    return statistics.fmean(rates), (statistics.stdev(rates) if len(rates) > 1 else 0.0)


# ---- luce ------------------------------------------------------------------------------------

def luce_timer(engine, test: Test, seed: int, sampling: Sampling = GREEDY) -> Callable[[], float]:
    n_vocab = engine.info.n_vocab
    if test.kind == "pp":
        prompt = random_prompt(test.n, n_vocab, seed)
        return lambda: engine.generate(prompt_ids=prompt, max_tokens=1, ignore_eos=True).stats["prefill_seconds"]
    prompt = random_prompt(1, n_vocab, seed)

    def decode_seconds() -> float:
        # tg counts decoded tokens only: the first token comes from the prefill logits.
        stats = engine.generate(prompt_ids=prompt, max_tokens=test.n + 1, ignore_eos=True,
                                **sampling.generate_kwargs()).stats
        return stats["decode_seconds"] * test.n / max(1, stats["generated_tokens"] - 1)

    return decode_seconds


def decode_weight_bytes(model: Path, info) -> int:
    """Weight bytes one decode step reads: what the backend keeps, less the token embedding when
    the head is untied (a step gathers one row of it). The GB/s column is tok/s times this, so it
    compares with the memory bandwidth the way llama-bench's does not (it counts the whole file)."""
    if info.tied_head:
        return info.weight_bytes
    from luce.converters.gguf_reader import GGUFFile

    with GGUFFile.open(model) as f:
        embd = f.tensors.get("token_embd.weight")
        return info.weight_bytes - (embd.nbytes if embd else 0)


def _bench_engine(model: Path, tests: list[Test], ctx: int, **kw):
    """An engine sized for the tests; when the model refuses the context, the error says which
    tests asked for it (the user gave -p/-n, not a context size)."""
    from luce.engine import Engine

    try:
        return Engine(model, ctx_size=ctx, **kw)
    except LuceError as e:
        if e.status != lib().LUCE_ERR_CONTEXT_FULL:  # not a drafter's or any other refusal
            raise
        names = ", ".join(t.name for t in tests)
        raise LuceError(f"{names} need a {ctx}-position context: {e}", status=e.status) from None


def peak_mib(engine) -> float:
    return engine.memory().peak_bytes / 2**20


def bench_luce(model: Path, tests: list[Test], threads: list[int], device: str, reps: int,
               warmup: bool, seed: int = 0, sampling: Sampling = GREEDY) -> list[Row]:
    rows = []
    size_gib = model.stat().st_size / 2**30
    for t in map(resolve_threads, threads):
        # tgN decodes n + 1 tokens after a 1-token prompt (luce_timer); ppN needs n + 1.
        ctx = max([x.n + 2 for x in tests] + [16])
        with _bench_engine(model, tests, ctx, device=device, threads=t) as engine:
            weight_gb = decode_weight_bytes(model, engine.info) / 1e9
            for test in tests:
                mean, std = measure(luce_timer(engine, test, seed, sampling), test.n, reps, warmup)
                rows.append(Row(model.name, size_gib, f"luce {device}", t, test.name, mean, std,
                                weight_gb * mean if test.kind == "tg" else None, reps,
                                sampling=sampling.label if test.kind == "tg" else None,
                                peak_mib=peak_mib(engine)))
    return rows


# ---- many sequences at once ------------------------------------------------------------------

def parallel_test_name(n_gen: int, depth: int) -> str:
    """llama-bench's name for decoding after a `depth`-token prompt: tg128 @ d512."""
    return f"tg{n_gen} @ d{depth}"


def parallel_timer(engine, n_gen: int, depth: int, n_parallel: int, seed: int,
                   taus: list | None = None) -> Callable[[], float]:
    """Seconds for n_parallel * n_gen decoded tokens, n_parallel sequences at once after their
    own `depth`-token prompts (the batch runtime, Engine.generate of a list; with the engine's
    drafter, if it has one, each sequence drafting its own blocks): the aggregate decode rate
    that llama-batched-bench calls S_TG. Every prompt is prefilled as its sequence is admitted,
    before the first shared decode step, so the decode time is the wall time less the prefills.
    taus, if given, receives each run's mean tau over its sequences."""
    prompts = [random_prompt(depth, engine.info.n_vocab, seed + i) for i in range(n_parallel)]

    def decode_seconds() -> float:
        t0 = time.perf_counter()
        results = engine.generate(prompt_ids=prompts, max_tokens=n_gen + 1, ignore_eos=True, parallel=n_parallel)
        wall = time.perf_counter() - t0
        prefill = sum(r.stats["prefill_seconds"] for r in results)
        decoded = sum(len(r.tokens) - 1 for r in results)  # each first token comes from its prefill
        if taus is not None and "tau" in results[0].stats:
            taus.append(statistics.fmean(r.stats["tau"] for r in results))
        return (wall - prefill) * n_parallel * n_gen / max(1, decoded)

    return decode_seconds


def bench_parallel(model: Path, n_gen: list[int], depth: int, parallel: list[int], threads: list[int], device: str,
                   reps: int, warmup: bool, seed: int = 0, draft: Path | str | None = None) -> list[Row]:
    """Aggregate decode tok/s of each number of sequences in `parallel`, each decoding tgN after
    its own random prompt of `depth` tokens (at least 1); with `draft`, each sequence drafting with
    it (the adaptive policy on, the width auto) and the rows carrying the mean tau."""
    depth = max(1, depth)
    tests = [Test("tg", n) for n in n_gen if n > 0]
    rows = []
    size_gib = model.stat().st_size / 2**30
    for t in map(resolve_threads, threads):
        ctx = depth + max([x.n for x in tests] + [16]) + 2
        with _bench_engine(model, tests, ctx, device=device, threads=t, draft=draft) as engine:
            for test in tests:
                for n_par in parallel:
                    taus: list = []
                    timer = parallel_timer(engine, test.n, depth, n_par, seed, taus)
                    mean, std = measure(timer, test.n * n_par, reps, warmup)
                    rows.append(Row(model.name, size_gib, f"luce {device}", t, parallel_test_name(test.n, depth),
                                    mean, std, None, reps, parallel=n_par, peak_mib=peak_mib(engine),
                                    draft=Path(draft).name if draft is not None else None,
                                    tau=statistics.fmean(taus) if taus else None))
    return rows


# ---- speculative decoding ---------------------------------------------------------------------

VERIFY_MODES = ("chain", "tree")


def bench_speculative(model: Path, draft: Path | str, tests: list[Test], prompt_tokens: int, threads: list[int],
                      block_sizes: list[int | str], verify_modes: list[str], adaptive: bool, device: str,
                      reps: int, warmup: bool, seed: int = 0, prompt_set: list[str] | None = None,
                      sampling: Sampling = GREEDY, last_stats: list | None = None) -> list[Row]:
    """tgN of decoding without the drafter (the baseline row), then with it for every block size
    and verify mode, all with the same sampler (greedy by default); each speculative row carries
    tau, acceptance and its speedup.

    Acceptance depends on the text, so with `prompt_set` (real prompts, e.g. the held-out sets of
    models/reference/prompts) every measured run decodes tgN after each prompt of the set and the
    row reports the set's totals; without it, one random prompt of `prompt_tokens` ids is used.
    A block size is a number of rows or "auto"; last_stats, if given, receives the stats of the
    last speculative run (its cost model: cost_curve)."""
    from luce.engine import Engine

    rows = []
    size_gib = model.stat().st_size / 2**30
    for t in map(resolve_threads, threads):
        with Engine(model, device=device, threads=t, ctx_size=16, draft=draft) as probe:
            prompts = ([probe.tokenizer.encode(text) for text in prompt_set] if prompt_set
                       else [random_prompt(prompt_tokens, probe.info.n_vocab, seed)])
        ctx = max(len(p) for p in prompts) + 1 + max([x.n for x in tests] + [16])
        with _bench_engine(model, tests, ctx, device=device, threads=t, draft=draft) as engine:
            prompt = prompts
            for test in (x for x in tests if x.kind == "tg"):
                base = _spec_measure(engine, prompt, test, reps, warmup, speculative=False,
                                     **sampling.generate_kwargs())
                rows.append(Row(model.name, size_gib, f"luce {device}", t, test.name, base[0], base[1], None,
                                reps, draft="none", sampling=sampling.label, peak_mib=peak_mib(engine)))
                for block in block_sizes:
                    for mode in verify_modes:
                        stats = []
                        mean, std, tau, acc = _spec_measure(engine, prompt, test, reps, warmup, speculative=True,
                                                            draft_block_size=block, ddtree=mode == "tree",
                                                            adaptive=adaptive, last_stats=stats,
                                                            **sampling.generate_kwargs())
                        if last_stats is not None:
                            last_stats[:] = stats
                        label = (f"auto ({stats[0]['block_size']})" if stats[0]["block_auto"] else
                                 stats[0]["block_size"]) if block == "auto" else block or engine.draft_info.block_size
                        rows.append(Row(model.name, size_gib, f"luce {device}", t, test.name, mean, std, None,
                                        reps, sampling=sampling.label, draft=Path(draft).name,
                                        block=label, verify=mode, tau=tau,
                                        acceptance=acc, speedup=mean / base[0], peak_mib=peak_mib(engine)))
    return rows


def _spec_measure(engine, prompts: list[list[int]], test: Test, reps: int, warmup: bool,
                  last_stats: list | None = None, **kw):
    """(mean tok/s, std, mean tau, mean acceptance) of decoding test.n tokens after each prompt;
    one measured run covers the whole prompt list, tau/acceptance average over its prompts.
    last_stats receives the last run's stats."""
    taus, accs = [], []

    def decode_seconds() -> float:
        seconds = 0.0
        for prompt in prompts:
            stats = engine.generate(prompt_ids=prompt, max_tokens=test.n + 1, ignore_eos=True, **kw).stats
            taus.append(stats.get("tau"))
            if last_stats is not None:
                last_stats[:] = [stats]
            accs.append(stats.get("acceptance"))
            seconds += stats["decode_seconds"] * test.n / max(1, stats["generated_tokens"] - 1)
        return seconds

    mean, std = measure(decode_seconds, test.n * len(prompts), reps, warmup)
    taus, accs = taus[-reps * len(prompts):], accs[-reps * len(prompts):]
    if taus[0] is None:
        return mean, std
    return mean, std, statistics.fmean(taus), statistics.fmean(accs)


def cost_curve(stats: dict) -> list[dict]:
    """The policy's cost model at the end of a speculative run, per block width it could choose:
    the step cost (measured in this run or an earlier one on this device, else interpolated),
    the tokens a step is expected to commit, and the tok/s that makes."""
    curve = []
    for w, seconds in enumerate(stats["width_model_seconds"]):
        if w >= 2 and seconds > 0:
            tokens = stats["width_tokens"][w]
            curve.append({"width": w, "step_ms": 1e3 * seconds, "measured": stats["width_seconds"][w] > 0,
                          "tokens_per_step": tokens, "tok_s": tokens / seconds})
    return curve


def format_cost_curve(stats: dict) -> str:
    """cost_curve as a markdown table, with the plain step beside it and the width chosen."""
    curve = cost_curve(stats)
    if not curve or not stats["plain_step_seconds"]:
        return "cost curve: not measured (the run was too short to calibrate)"
    plain = 1 / stats["plain_step_seconds"]
    lines = ["| block | step ms | tokens/step | expected tok/s | vs plain |", "| ---: | ---: | ---: | ---: | ---: |"]
    for c in curve:
        mark = "" if c["measured"] else " ~"
        lines.append(f"| {c['width']} | {c['step_ms']:.2f}{mark} | {c['tokens_per_step']:.2f} | {c['tok_s']:.0f} | "
                     f"{c['tok_s'] / plain:.2f}x |")
    best = max(curve, key=lambda c: c["tok_s"])
    choice = (f"speculate with block {best['width']}" if best["tok_s"] > plain else
              f"plain decoding (no width pays; probes at block {best['width']})")
    return ("\n".join(lines) + f"\n\nplain step {1e3 * stats['plain_step_seconds']:.2f} ms ({plain:.0f} tok/s); "
            f"~ = interpolated between measured widths; chosen: {choice}")


# ---- llama.cpp peer ----------------------------------------------------------------------------

def llama_cpp_timer(llm, test: Test, n_vocab: int, seed: int) -> Callable[[], float]:
    if test.kind == "pp":
        prompt = random_prompt(test.n, n_vocab, seed)

        def prefill_seconds() -> float:
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt)
            return time.perf_counter() - t0

        return prefill_seconds
    token = random_prompt(1, n_vocab, seed)

    def decode_seconds() -> float:
        llm.reset()
        llm.eval(token)
        t0 = time.perf_counter()
        for _ in range(test.n):
            llm.eval(token)
        return time.perf_counter() - t0

    return decode_seconds


def bench_llama_cpp(model: Path, tests: list[Test], threads: list[int], reps: int, warmup: bool,
                    seed: int = 0) -> list[Row]:
    try:
        from llama_cpp import Llama
    except ImportError as e:
        raise LuceError("the llama.cpp peer needs llama-cpp-python (pip install 'luce[bench]'; "
                        "see docs/benchmarks.md for the build flags)") from e
    rows = []
    size_gib = model.stat().st_size / 2**30
    for t in map(resolve_threads, threads):
        ctx = max([1 + x.n for x in tests] + [16])
        llm = Llama(str(model), n_ctx=ctx, n_batch=512, n_ubatch=512, n_threads=t, n_threads_batch=t,
                    verbose=False)
        for test in tests:
            mean, std = measure(llama_cpp_timer(llm, test, llm.n_vocab(), seed), test.n, reps, warmup)
            rows.append(Row(model.name, size_gib, "llama.cpp cpu", t, test.name, mean, std, None, reps))
        del llm
    return rows


def attach_peer_ratios(rows: list[Row], peer_rows: list[Row]) -> None:
    peer = {(r.test, r.threads): r.tok_s for r in peer_rows}
    for r in rows:
        if (r.test, r.threads) in peer:
            r.vs_peer = r.tok_s / peer[(r.test, r.threads)]


# ---- printers ----------------------------------------------------------------------------------

COLUMNS = [  # (field, header, format)
    ("model", "model", "{}"),
    ("size_gib", "size", "{:.2f} GiB"),
    ("backend", "backend", "{}"),
    ("threads", "threads", "{}"),
    ("test", "test", "{}"),
    ("sampling", "sampling", "{}"),
    ("parallel", "np", "{}"),
    ("tok_s", "t/s", None),
    ("gb_s", "GB/s", "{:.1f}"),
    ("vs_peer", "vs llama.cpp", "{:.2f}x"),
    ("draft", "draft", "{}"),
    ("block", "block", "{}"),
    ("verify", "verify", "{}"),
    ("tau", "tau", "{:.2f}"),
    ("acceptance", "accept", "{:.1%}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("peak_mib", "peak MiB", "{:.1f}"),
]


def _cell(row: Row, field: str, fmt: str | None) -> str:
    if field == "tok_s":
        return f"{row.tok_s:.2f} ± {row.tok_s_std:.2f}"
    value = getattr(row, field)
    return "" if value is None else fmt.format(value)


def to_markdown(rows: list[Row]) -> str:
    """llama-bench style: a column only if it carries information (varies, or is always shown)."""
    always = {"model", "backend", "test", "tok_s"}
    cols = [c for c in COLUMNS
            if c[0] in always or len({getattr(r, c[0]) for r in rows}) > 1
            or (c[0] in ("size_gib", "threads") and rows)
            or (c[0] in ("sampling", "parallel", "gb_s", "vs_peer", "draft", "tau", "acceptance", "speedup", "peak_mib")
                and any(getattr(r, c[0]) is not None for r in rows))]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |",
             "| " + " | ".join("---:" if f in ("tok_s", "parallel", "gb_s", "vs_peer", "threads", "size_gib", "block", "tau", "acceptance",
                                              "speedup", "peak_mib") else "---"
                               for f, _, _ in cols) + " |"]
    lines += ["| " + " | ".join(_cell(r, f, fmt) for f, _, fmt in cols) + " |" for r in rows]
    return "\n".join(lines)


def to_json(rows: list[Row]) -> str:
    return json.dumps([dataclasses.asdict(r) for r in rows], indent=2)


def to_jsonl(rows: list[Row]) -> str:
    return "\n".join(json.dumps(dataclasses.asdict(r)) for r in rows)


def to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in dataclasses.fields(Row)])
    w.writeheader()
    for r in rows:
        w.writerow(dataclasses.asdict(r))
    return buf.getvalue().rstrip("\n")


PRINTERS = {"md": to_markdown, "json": to_json, "jsonl": to_jsonl, "csv": to_csv}


def footer() -> str:
    """What llama-bench prints under a table: the build and the machine."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    date = time.strftime("%Y-%m-%d")
    return f"build: luce {commit or 'unknown commit'} · {cpu}, {os.cpu_count()} cores · {date}"
