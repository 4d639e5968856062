"""The speculative benches: a whole DFlash 2 step on the synthetic 27B pair against a plain step
(zero and full acceptance, DDTree, verify steps inside the loop) with its per-op profile, and the
reference pair's speculative tok/s, device against the host's CPU."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .device import REPO, WORK, env, log, memory_mib


# Zero-acceptance run: one spec step per token; the last DRAFT_BENCH_BLOCK - 2 steps draft fewer
# rows (max_tokens caps them), so the run is long enough for those to weigh little (at 16 tokens
# they are 6 of 14 steps; the step's own cost is what the bar is about).
DRAFT_BENCH_TOKENS = 64
DRAFT_BENCH_BLOCK = 8
DRAFT_BENCH_ORACLE_STEPS = 16  # full-acceptance and DDTree runs: steps of a whole block each
DRAFT_BENCH_SETUP_S = 45  # generating the 2 GB drafter and loading the 27B pair, roughly
# Verify steps timed inside the speculative loop (loop_verify): widths 8 and 16, as issue 6's bar
# names width 16 and a DFlash 2 step verifies 8.
LOOP_VERIFY_WIDTHS = (8, 16)


# The reference pair's speculative decoding, GPU against CPU (issue 6's "spec decode on the
# reference models"): the committed Q8_0 drafters on held-out code, as the CPU table of
# docs/benchmarks.md measured them, at each checkpoint's block and at DFlash 2's block 8.
REF_SPEC_PROMPTS = 12  # first prompts of models/reference/prompts/code.jsonl
REF_SPEC_TOKENS = 64
REF_SPEC_BLOCKS = {"dflash": (0,), "dflash2": (0, 8), "dspark": (0,)}  # 0: the checkpoint's block


def bench_reference_spec(dut: str, threads: int, deadline: float) -> list[dict]:
    """tok/s of plain and speculative greedy decoding (chain and DDTree, adaptive off) with each
    reference drafter, on the device under test and on the CPU of the same host: one row per
    (device, drafter, block, verify) with its tau, acceptance and speedup over plain."""
    from luce import bench as luce_bench

    ref = REPO / "models" / "reference"
    prompts = [json.loads(line)["prompt"] for line in
               (ref / "prompts" / "code.jsonl").read_text().splitlines()[:REF_SPEC_PROMPTS]]
    tests = [luce_bench.Test("tg", REF_SPEC_TOKENS)]
    rows = []
    for kind, blocks in REF_SPEC_BLOCKS.items():  # a drafter's devices together: the budget cuts whole drafters
        for device in dict.fromkeys((dut, "cpu")):
            if time.perf_counter() > deadline:
                rows.append({"device": device, "draft": kind, "skipped": "time budget (--ref-spec-budget)"})
                continue
            log(f"reference speculative bench: {kind} on {device}")
            plain, *spec = luce_bench.bench_speculative(
                ref / "target-q8_0.gguf", ref / f"{kind}-q8_0.gguf", tests, 0, [threads], list(blocks),
                list(luce_bench.VERIFY_MODES), False, device, 1, True, prompt_set=prompts)
            rows += [{"device": device, "draft": kind, "block": r.block, "verify": r.verify, "tok_s": r.tok_s,
                      "plain_tok_s": plain.tok_s, "tau": r.tau, "acceptance": r.acceptance, "speedup": r.speedup}
                     for r in spec]
    return rows


def bench_drafter(shape: str, dut: str, threads: int, deadline: float, profile_path: Path | None = None) -> dict:
    """A whole DFlash 2 speculative step (draft, verify, rollback, bookkeeping) at block 8 on the
    synthetic pair (target from bench(), drafter from models/synthetic_drafter.py) against a plain
    step. The random drafter's proposals are all rejected (worst case: rollback every step); a
    second run forces full acceptance through the oracle hook (no rollback, 7 drafts kept); a
    third puts the oracle continuation on a DDTree tree's first-child chain (accepted as deep as
    that chain goes; the step verifies the whole tree)."""
    import numpy as np

    from luce import Engine

    sys.path.insert(0, str(REPO / "models"))
    import synthetic_drafter

    target = WORK / f"synthetic-{shape}-iq4_xs.gguf"
    if shape not in synthetic_drafter.SHAPES or not target.exists():
        return {"skipped": f"no synthetic {shape} target or drafter shape"}
    if time.perf_counter() > deadline - DRAFT_BENCH_SETUP_S:
        return {"skipped": "time budget (--drafter-budget): no room to generate and load the pair"}
    path = WORK / f"synthetic-dflash2-{shape}.gguf"
    res: dict = {"shape": shape, "block": DRAFT_BENCH_BLOCK, "drafter": str(path)}
    if not path.exists():
        log(f"generating {path.name}")
        t0 = time.perf_counter()
        synthetic_drafter.write(path.with_suffix(".tmp"), synthetic_drafter.SHAPES[shape])
        path.with_suffix(".tmp").rename(path)
        res["generate_seconds"] = round(time.perf_counter() - t0, 1)
    res["drafter_mib"] = round(path.stat().st_size / 2**20, 1)
    log("drafter bench: loading")
    with Engine(target, device=dut, threads=threads, ctx_size=1024, draft=path) as eng:
        ids = np.random.default_rng(4).integers(0, eng.info.n_vocab, 64).tolist()
        kw = dict(prompt_ids=ids, ignore_eos=True, draft_block_size=DRAFT_BENCH_BLOCK, adaptive=False)
        eng.generate(**kw, max_tokens=4)  # warm-up
        plain = eng.generate(**{**kw, "max_tokens": DRAFT_BENCH_TOKENS}, speculative=False)
        st = plain.stats
        res["plain_ms"] = 1e3 * st["decode_seconds"] / max(1, st["generated_tokens"] - 1)
        runs = {"zero_accept": dict(max_tokens=DRAFT_BENCH_TOKENS),
                "full_accept": dict(max_tokens=DRAFT_BENCH_ORACLE_STEPS * DRAFT_BENCH_BLOCK + 1, oracle_tokens=None),
                "ddtree_oracle": dict(max_tokens=DRAFT_BENCH_ORACLE_STEPS * DRAFT_BENCH_BLOCK + 1, oracle_tokens=None,
                                      ddtree=True)}
        for name, extra in runs.items():
            if time.perf_counter() > deadline:
                res[name] = "skipped: time budget"
                continue
            if "oracle_tokens" in extra:  # the plain continuation: every draft is accepted
                extra["oracle_tokens"] = eng.generate(**{**kw, "max_tokens": extra["max_tokens"]},
                                                      speculative=False).tokens
            log(f"drafter bench: {name}")
            st = eng.generate(**kw, **extra).stats
            n = max(1, st["spec_steps"])
            step = (st["decode_seconds"] - st["plain_steps"] * res["plain_ms"] / 1e3) / n
            res[name] = {"spec_steps": st["spec_steps"], "tau": st["tau"], "step_ms": 1e3 * step,
                         "draft_ms": 1e3 * st["draft_seconds"] / n, "verify_ms": 1e3 * st["verify_seconds"] / n,
                         "rollback_ms": 1e3 * st["rollback_seconds"] / n,
                         "x_plain": 1e3 * step / res["plain_ms"]}
        res["loop_verify"] = {}
        for width in LOOP_VERIFY_WIDTHS:
            if time.perf_counter() > deadline:
                res["loop_verify"][str(width)] = "skipped: time budget"
                continue
            log(f"drafter bench: verify steps of {width} rows")
            res["loop_verify"][str(width)] = _loop_verify(eng, kw, width, res["plain_ms"])
        res["memory"] = memory_mib(eng)
    if profile_path is not None and time.perf_counter() < deadline:  # on the CPU: the script's dry run
        res["profile"] = profile_drafter_steps(target, path, dut, threads, kw, profile_path)
    return res


def _loop_verify(eng, kw: dict, width: int, plain_ms: float) -> dict:
    """A verify step of `width` rows as the speculative loop runs it: the rollback history written,
    the argmax taken on the device, only the ids downloaded (bench()'s verify widths time
    session_eval, which writes no history and downloads every row's logits). Every draft is
    rejected, so each step verifies block = width rows and commits one token. Two runs, of
    DRAFT_BENCH_TOKENS and twice as many tokens, end alike (their last width - 2 steps verify
    fewer rows, max_tokens capping the drafts); their difference holds only full-width steps."""
    runs = [eng.generate(**{**kw, "draft_block_size": width, "max_tokens": n}).stats
            for n in (DRAFT_BENCH_TOKENS, 2 * DRAFT_BENCH_TOKENS)]
    steps = runs[1]["spec_steps"] - runs[0]["spec_steps"]
    verify_ms = 1e3 * (runs[1]["verify_seconds"] - runs[0]["verify_seconds"]) / max(1, steps)
    return {"steps": steps, "tau": runs[1]["tau"], "verify_ms": verify_ms, "x_plain": verify_ms / plain_ms}


def profile_drafter_steps(target: Path, drafter: Path, dut: str, threads: int, kw: dict, profile_path: Path) -> str:
    """Per-op device time (LUCE_GPU_PROFILE) of the zero-acceptance DFlash 2 run, in an engine of
    its own (the table is written when it closes): where a speculative step's time goes, by op."""
    from luce import Engine

    log("drafter bench: profile")
    with open(profile_path, "a") as f:
        f.write(f"\n## DFlash 2: {len(kw['prompt_ids'])}-token prompt, then {DRAFT_BENCH_TOKENS} tokens with every draft rejected (a "
                f"block-{DRAFT_BENCH_BLOCK} step per token, the last {DRAFT_BENCH_BLOCK - 2} with fewer drafts; "
                f"prefill included)\n")
    with env(LUCE_GPU_PROFILE=str(profile_path)), \
            Engine(target, device=dut, threads=threads, ctx_size=1024, draft=drafter) as eng:
        eng.generate(**kw, max_tokens=DRAFT_BENCH_TOKENS)
    return str(profile_path)
