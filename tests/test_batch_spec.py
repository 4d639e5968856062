"""Speculative decoding inside the batch (native/src/batch.cpp with a drafter; SpecSequence in
speculative.cpp). The oracle is the invariant that makes speculative decoding lossless: every
prompt's greedy tokens from a speculative batch equal one-by-one plain greedy generation's, token
for token, whatever the number of sequences in flight (1, 8, 32: at 32 the blocks need several
forwards of 64 rows each step, and finished slots take new prompts), the drafter (DFlash 2, DFlash,
DSpark, the target's MTP block), fixed or adaptive block widths, per-prompt budgets and
end-of-generation stops; the same on the emulated CUDA backend; and the CLI's `--parallel N
--draft` output equal to plain `--parallel 1`'s. Each result carries its own tau and acceptance."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_luce
from fixtures.emulated_gpu import code_prompt_file, run_on_emulated_cuda
from fixtures.random_qwen35_gguf import write_random_qwen35
from luce import Engine
from luce.errors import LuceError

REPO = Path(__file__).resolve().parents[1]
REF = REPO / "models" / "reference"
TARGET = REF / "target-q8_0.gguf"
DRAFTERS = {kind: REF / f"{kind}-q8_0.gguf" for kind in ("dflash2", "dflash", "dspark")}
CODE_PROMPTS = REF / "prompts" / "code.jsonl"

# Prompt lengths from 1 token to past a 64-row step; budgets from 0 (prefill only) and 1-2 (no
# room to draft) up to a few blocks. 34 prompts: more than 32 slots, so slots are reused.
LENGTHS = [1, 2, 5, 9, 17, 30, 70, 120]
N_PROMPTS = 34


def budget(i: int) -> int:
    return [0, 1, 2][i] if i < 3 else 6 + (i * 7) % 23


@pytest.fixture(scope="module")
def prompts():
    """Mixed-length id lists: the reference code prompts, cut to LENGTHS in turn."""
    texts = [json.loads(line)["prompt"] for line in CODE_PROMPTS.read_text().splitlines()]
    with Engine(TARGET, threads=2, ctx_size=512) as eng:
        ids = [eng.encode_prompt(t) for t in texts]
    out = []
    for i in range(N_PROMPTS):
        src = ids[i % len(ids)]
        while len(src) < LENGTHS[i % len(LENGTHS)]:  # a long cut needs a long prompt: join two
            src = src + ids[(i + len(out)) % len(ids)]
        out.append([int(t) for t in src[:LENGTHS[i % len(LENGTHS)]]])
    return out


@pytest.fixture(scope="module")
def budgets():
    return [budget(i) for i in range(N_PROMPTS)]


@pytest.fixture(scope="module")
def plain(prompts, budgets):
    """One-by-one plain greedy generation: the oracle, with and without end-of-generation stops."""
    with Engine(TARGET, threads=2, ctx_size=512) as eng:
        return {eos: [eng.generate(prompt_ids=p, max_tokens=m, ignore_eos=not eos).tokens
                      for p, m in zip(prompts, budgets)] for eos in (False, True)}


FIXED = dict(ignore_eos=True, adaptive=False, draft_block_size=8)  # every step drafts a block of 8 rows


def counts(gen) -> tuple:
    return tuple(gen.stats[k] for k in ("spec_steps", "plain_steps", "n_drafted", "n_accepted"))


@pytest.fixture(scope="module")
def spec_single(prompts, budgets):
    """One-by-one speculative generation at a fixed width: each prompt's draft and accept counts."""
    with Engine(TARGET, threads=2, ctx_size=512, draft=DRAFTERS["dflash2"]) as eng:
        return [counts(eng.generate(prompt_ids=p, max_tokens=m, **FIXED)) for p, m in zip(prompts, budgets)]


def spec_batch(drafter, prompts, budgets, parallel, **kw):
    with Engine(TARGET, threads=2, ctx_size=512, draft=drafter) as eng:
        return eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=parallel, **kw)


def assert_drafted(results):
    """The batch really speculated: blocks were drafted and some proposals accepted, and each
    result's tau and acceptance are its own counts'."""
    assert sum(g.stats["spec_steps"] for g in results) > len(results)
    assert sum(g.stats["n_accepted"] for g in results) > 0
    for g in results:
        st = g.stats
        if st["spec_steps"]:
            assert st["tau"] == pytest.approx((st["n_accepted"] + st["spec_steps"]) / st["spec_steps"])
            assert st["acceptance"] == pytest.approx(st["n_accepted"] / st["n_drafted"])


@pytest.mark.parametrize("parallel", [1, 8, 32])
def test_spec_batch_equals_plain_one_by_one(prompts, budgets, plain, spec_single, parallel):
    """Every step drafts (fixed width, no adaptive fallback to plain steps, which this CPU's costs
    would otherwise choose for most steps of the small reference pair). At a fixed width a
    sequence's drafts depend only on its committed tokens and their target features, so each
    sequence also drafts and accepts exactly what it does alone: the batch hands every sequence
    its own verify rows and taps."""
    got = spec_batch(DRAFTERS["dflash2"], prompts, budgets, parallel, **FIXED)
    assert [g.tokens for g in got] == plain[False]
    assert [counts(g) for g in got] == spec_single
    assert [len(g.tokens) for g in got] == budgets
    assert all(g.stats["parallel"] == parallel for g in got)
    assert_drafted(got)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_spec_batch_with_other_drafters(prompts, budgets, plain, kind):
    got = spec_batch(DRAFTERS[kind], prompts, budgets, 8, ignore_eos=True, adaptive=False)
    assert [g.tokens for g in got] == plain[False]
    assert_drafted(got)


def test_spec_batch_adaptive_with_stops(prompts, budgets, plain):
    """The default adaptive policy, per sequence, and each sequence stopping at its own
    end-of-generation id as one-by-one generation does."""
    got = spec_batch(DRAFTERS["dflash2"], prompts, budgets, 8)
    assert [g.tokens for g in got] == plain[True]
    assert all(g.stats["spec_steps"] + g.stats["plain_steps"] > 0 for g in got if len(g.tokens) > 1)


def test_one_token_truncation_makes_the_sampled_spec_batch_greedy(prompts, budgets, plain):
    """Sampled acceptance in the batch reads each sequence's own verify rows (backend top-k at its
    row offset): with top_k=1 every distribution is the argmax, so the tokens are greedy ones."""
    got = spec_batch(DRAFTERS["dflash2"], prompts[:12], budgets[:12], 5, ignore_eos=True, adaptive=False,
                     temperature=0.8, top_k=1, seed=3)
    assert [g.tokens for g in got] == plain[False][:12]
    assert_drafted(got)


def test_mtp_drafting_in_the_batch(tmp_path):
    """The target's own MTP block drafts each sequence's chain (a nearly-bigram target whose MTP
    block copies it, so proposals are often accepted)."""
    path = write_random_qwen35(tmp_path / "copy.gguf", seed=12, mtp=True, mtp_values="copy")
    prompts = [[5, 17, 42, 99, 3], [11], [200, 3] * 40, [9, 8, 7, 6], [1, 2, 3], [77, 78]]
    budgets = [12, 9, 5, 0, 14, 2]
    with Engine(path, threads=2, ctx_size=256) as eng:
        expected = [eng.generate(prompt_ids=p, max_tokens=m, ignore_eos=True, speculative=False).tokens
                    for p, m in zip(prompts, budgets)]
    with Engine(path, threads=2, ctx_size=256, draft="mtp") as eng:
        got = eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=4, ignore_eos=True, adaptive=False)
    assert [g.tokens for g in got] == expected
    assert_drafted(got)


def test_ddtree_in_the_batch_is_refused(prompts):
    with Engine(TARGET, threads=2, ctx_size=512, draft=DRAFTERS["dflash2"]) as eng:
        with pytest.raises(LuceError, match="request 0: DDTree inside a batch is not implemented"):
            eng.generate(prompt_ids=prompts[:3], max_tokens=4, parallel=2, ddtree=True)
        with pytest.raises(LuceError, match="request 0: --draft-block-size must be in"):
            eng.generate(prompt_ids=prompts[:3], max_tokens=4, parallel=2, draft_block_size=99)
        # the engine still works after a refused batch
        assert eng.generate(prompt_ids=prompts[:2], max_tokens=3, parallel=2)[1].tokens == \
            eng.generate(prompt_ids=prompts[1], max_tokens=3, speculative=False).tokens


_EMU_PROBE = r"""
import json, sys
from luce import Engine
target, drafter, prompts, budgets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
with Engine(target, device="gpu", ctx_size=256) as eng:
    plain = [eng.generate(prompt_ids=p, max_tokens=m, ignore_eos=True).tokens for p, m in zip(prompts, budgets)]
with Engine(target, device="gpu", ctx_size=256, draft=drafter) as eng:
    got = eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=3, ignore_eos=True, adaptive=False,
                       draft_block_size=6)
print(json.dumps({"device": eng.device, "plain": plain, "spec": [g.tokens for g in got],
                  "accepted": sum(g.stats["n_accepted"] for g in got)}))
"""


def test_spec_batch_on_the_emulated_cuda_backend(prompts):
    """The batched verify only calls Backend ops: on the emulated CUDA path (a child process: the
    GPU library stays loaded once loaded) the speculative batch equals the GPU's one-by-one plain
    decoding."""
    few, budgets = prompts[3:8], [7, 9, 4, 8, 6]
    out = run_on_emulated_cuda(_EMU_PROBE, TARGET, DRAFTERS["dflash2"], json.dumps(few), json.dumps(budgets))
    assert out["device"] == "gpu"
    assert out["spec"] == out["plain"] and [len(t) for t in out["plain"]] == budgets
    assert out["accepted"] > 0


def test_cli_parallel_with_a_drafter_equals_plain_parallel_1(tmp_path):
    src = code_prompt_file(tmp_path, 6)
    runs = {}
    for name, extra in (("plain", ["--parallel", 1]),
                        ("spec", ["--parallel", 4, "--draft", DRAFTERS["dflash2"], "--no-adaptive"])):
        out = tmp_path / f"{name}.jsonl"
        proc = run_luce("generate", "-m", TARGET, "--prompts", src, "--output", out, "-n", 20, "-t", 2,
                        "--device", "cpu", "--ignore-eos", *extra)
        assert proc.returncode == 0, proc.stderr
        runs[name] = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(runs["spec"]) == [f"p{i}" for i in range(6)]  # every id exactly once
    assert {i: r["tokens"] for i, r in runs["spec"].items()} == {i: r["tokens"] for i, r in runs["plain"].items()}
    assert all("tau" in r["stats"] and "acceptance" in r["stats"] for r in runs["spec"].values())


def test_cli_parallel_with_ddtree_is_one_error_line(tmp_path):
    proc = run_luce("generate", "-m", TARGET, "--prompts", code_prompt_file(tmp_path, 6), "--parallel", 2,
                    "--draft", DRAFTERS["dflash2"], "--ddtree")
    assert proc.returncode == 2 and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "--ddtree does not combine with --parallel" in errors[0]
    assert "Traceback" not in proc.stderr
