"""Continuous batching (native/src/batch.cpp, luce_batch_*): many sequences in one forward per
decode step. The oracle is the invariant the issue states: every prompt's greedy tokens from the
batch equal one-by-one Engine.generate of that prompt, token for token, whatever the number of
sequences in flight (1, 2, 3, with more prompts than slots, so finished slots take new prompts),
with per-prompt max_tokens and end-of-generation stops; the same on the emulated CUDA backend; and
the CLI's --parallel output equal to --parallel 1's. Speculative decoding in the batch:
test_batch_spec.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_luce
from fixtures.emulated_gpu import code_prompt_file, run_on_emulated_cuda
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine
from luce.binding import ffi, lib
from luce.errors import LuceError

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "models" / "reference" / "target-q8_0.gguf"
CODE_PROMPTS = REPO / "models" / "reference" / "prompts" / "code.jsonl"

# Prompts of different lengths (one longer than a 64-token step), each with its own budget, one 0.
PROMPTS = [[5, 17, 42, 99, 3, 250, 7], [11], [200, 3] * 40, [9, 8, 7, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
           [77, 78]]
BUDGETS = [9, 14, 5, 0, 11, 7]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_random_qwen35(tmp_path_factory.mktemp("batch") / "tiny.gguf", SPEC_TINY, seed=2)


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, threads=2, ctx_size=256) as eng:
        yield eng


def one_by_one(engine, prompts, budgets, **kw):
    return [engine.generate(prompt_ids=p, max_tokens=m, **kw).tokens for p, m in zip(prompts, budgets)]


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_batch_greedy_equals_one_by_one(engine, parallel):
    expected = one_by_one(engine, PROMPTS, BUDGETS, ignore_eos=True)
    finished = []
    results = engine.generate(prompt_ids=PROMPTS, max_tokens=BUDGETS, parallel=parallel, ignore_eos=True,
                              on_result=lambda i, gen: finished.append(i))
    assert [g.tokens for g in results] == expected
    assert [len(t) for t in expected] == BUDGETS
    assert sorted(finished) == list(range(len(PROMPTS)))  # each result reported once, as it finished
    assert all(g.stats["parallel"] == parallel and g.prompt_tokens == len(p) for g, p in zip(results, PROMPTS))
    single = engine.generate(prompt_ids=PROMPTS[0], max_tokens=2, ignore_eos=True)
    assert set(results[0].stats) == set(single.stats) | {"parallel"}  # the same result record, and its width


@pytest.mark.parametrize("kv, row_bytes", [("f16", lambda d: 2 * d), ("q8_0", lambda d: (d + 2 * d // 32 + 3) // 4 * 4),
                                           ("q4_0", lambda d: (d // 2 + 2 * d // 32 + 3) // 4 * 4)])
def test_batch_with_a_narrow_cache_equals_one_by_one_in_smaller_pages(tiny_path, kv, row_bytes):
    """With an f16, q8_0 or q4_0 cache the slots' KV pages hold rows of that type: the same tokens as
    one-by-one generation on that cache, and the peak memory of a batch of two slots is less than
    the f32 engine's by the row bytes saved over the cache of three sequences (the engine's session
    and both slots' pages)."""
    peak, info = {}, None
    for kind in ("f32", kv):
        with Engine(tiny_path, threads=2, ctx_size=256, kv_cache=kind) as eng:
            expected = one_by_one(eng, PROMPTS, BUDGETS, ignore_eos=True)
            got = eng.generate(prompt_ids=PROMPTS, max_tokens=BUDGETS, parallel=2, ignore_eos=True)
            assert [g.tokens for g in got] == expected
            peak[kind], info = eng.memory().peak_bytes, eng.info
    rows_per_sequence = 2 * info.n_full_attention * info.n_head_kv * 256
    assert peak["f32"] - peak[kv] == 3 * rows_per_sequence * (4 * info.head_dim - row_bytes(info.head_dim))


def test_batch_stops_each_sequence_at_its_end_of_generation_id(tmp_path, engine):
    """The same weights with an EOS id that one prompt's output reaches: that sequence stops
    before it (as one-by-one does) while the others run on."""
    free = engine.generate(prompt_ids=PROMPTS[0], max_tokens=12, ignore_eos=True).tokens
    path = write_random_qwen35(tmp_path / "eos.gguf", SPEC_TINY, seed=2, eos_token_id=free[4])
    with Engine(path, threads=2, ctx_size=256) as eng:
        budgets = [12] * len(PROMPTS)
        expected = [eng.generate(prompt_ids=p, max_tokens=12) for p in PROMPTS]
        got = eng.generate(prompt_ids=PROMPTS, max_tokens=budgets, parallel=3)
    assert [g.tokens for g in got] == [g.tokens for g in expected]
    assert [g.stats["stopped_by_eos"] for g in got] == [g.stats["stopped_by_eos"] for g in expected]
    assert got[0].stats["stopped_by_eos"] and len(got[0].tokens) <= 4


@pytest.mark.parametrize("top_k", [0, 20])
def test_batch_sampling_equals_one_by_one_with_the_same_seed(engine, top_k):
    """Each sequence draws from its own sampler seeded as one-by-one generation seeds it (with
    top_k one-by-one ranks on the backend and draws from the k best; the batch from the whole row:
    the same draws)."""
    kw = dict(temperature=0.9, top_k=top_k, top_p=0.95, seed=31, ignore_eos=True)
    expected = one_by_one(engine, PROMPTS, BUDGETS, **kw)
    assert [g.tokens for g in engine.generate(prompt_ids=PROMPTS, max_tokens=BUDGETS, parallel=3, **kw)] == expected


def test_batch_per_prompt_sampling_equals_one_by_one(engine):
    """temperature, top_k, top_p and seed given one per prompt (greedy and sampled prompts mixed in
    one batch): each sequence equals one-by-one generation with its own settings."""
    n = len(PROMPTS)
    per = dict(temperature=[0.0, 0.9, 1.3, 0.0, 0.7, 1.0], top_k=[0, 20, 0, 5, 0, 40],
               top_p=[1.0, 0.95, 0.8, 1.0, 1.0, 0.9], seed=[1, 2, 3, 4, 5, 2**63 + 7])
    expected = [engine.generate(prompt_ids=PROMPTS[i], max_tokens=BUDGETS[i], ignore_eos=True,
                                **{k: v[i] for k, v in per.items()}).tokens for i in range(n)]
    got = engine.generate(prompt_ids=PROMPTS, max_tokens=BUDGETS, parallel=3, ignore_eos=True, **per)
    assert [g.tokens for g in got] == expected
    # the settings did reach their sequences: a prompt sampled with another seed draws otherwise
    other = engine.generate(prompt_ids=PROMPTS, max_tokens=BUDGETS, parallel=3, ignore_eos=True,
                            **(per | {"seed": [s + 100 for s in per["seed"][:5]] + [per["seed"][5]]}))
    assert [g.tokens for g in other][1] != expected[1] and [g.tokens for g in other][0] == expected[0]


def test_reference_target_text_prompts(tmp_path):
    """The trained reference target on real code prompts, four in flight."""
    prompts = [json.loads(line)["prompt"] for line in CODE_PROMPTS.read_text().splitlines()[:6]]
    with Engine(TARGET, threads=2, ctx_size=1024) as eng:
        expected = [eng.generate(p, max_tokens=10 + 3 * i, ignore_eos=True) for i, p in enumerate(prompts)]
        got = eng.generate(prompts, max_tokens=[10 + 3 * i for i in range(6)], parallel=4, ignore_eos=True)
    assert [g.tokens for g in got] == [g.tokens for g in expected]
    assert [g.text for g in got] == [g.text for g in expected]


def test_bad_batch_requests_are_refused(engine):
    with pytest.raises(LuceError, match="parallel must be an integer in 1..64"):
        engine.generate(prompt_ids=PROMPTS, parallel=0)
    with pytest.raises(LuceError, match="request 2: prompt .* exceed the context size 256"):
        engine.generate(prompt_ids=[[1], [2], [3] * 250], max_tokens=10)
    with pytest.raises(LuceError, match="a list of 2 numbers"):
        engine.generate(prompt_ids=[[1], [2]], max_tokens=[1, 2, 3])
    with pytest.raises(LuceError, match="temperature must be a number or a list of 2 numbers"):
        engine.generate(prompt_ids=[[1], [2]], temperature=[0.5, "hot"])
    with pytest.raises(LuceError, match="seed must be a number or a list of 2 numbers"):
        engine.generate(prompt_ids=[[1], [2]], seed=[True, 3])
    with pytest.raises(LuceError, match="top_p must be a number \\(a list of them goes with a list of prompts\\)"):
        engine.generate(prompt_ids=[1, 2], top_p=[0.5])
    out = ffi.new("luce_batch **")
    for bad in (0, -3, 65):  # the runtime's own bound, below the Python check
        assert lib().luce_batch_create(engine._model, bad, 64, 0, out) == lib().LUCE_ERR_INVALID_ARGUMENT
        assert "n_parallel" in ffi.string(lib().luce_last_error()).decode()
    assert engine.generate(prompt_ids=[[1, 2]], max_tokens=3, ignore_eos=True)[0].tokens == \
        engine.generate(prompt_ids=[1, 2], max_tokens=3, ignore_eos=True).tokens  # the session still works


_EMU_PROBE = r"""
import json, sys
from luce import Engine
from luce.binding import ffi, lib
prompts, budgets = json.loads(sys.argv[2]), json.loads(sys.argv[3])
with Engine(sys.argv[1], device="gpu", ctx_size=256) as eng:
    single = [eng.generate(prompt_ids=p, max_tokens=m, ignore_eos=True).tokens for p, m in zip(prompts, budgets)]
    batch = [g.tokens for g in eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=3, ignore_eos=True)]
    kw = dict(temperature=0.9, top_k=20, seed=5, ignore_eos=True)
    sampled = [eng.generate(prompt_ids=p, max_tokens=m, **kw).tokens for p, m in zip(prompts, budgets)]
    sampled_batch = [g.tokens for g in eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=3, **kw)]
# Quantized, rotated caches with no split-KV pass (128 positions: one split).
with Engine(sys.argv[1], device="gpu", ctx_size=128, cache_type_k="q8_0", cache_type_v="q4_0", kv_rotate=True) as eng:
    quant_single = [eng.generate(prompt_ids=p, max_tokens=m, ignore_eos=True).tokens for p, m in zip(prompts, budgets)]
    quant_batch = [g.tokens for g in eng.generate(prompt_ids=prompts, max_tokens=budgets, parallel=3, ignore_eos=True)]
print(json.dumps({"device": eng.device, "single": single, "batch": batch, "sampled": sampled,
                  "sampled_batch": sampled_batch, "quant_single": quant_single, "quant_batch": quant_batch}))
"""


def test_batch_on_the_emulated_cuda_backend(tiny_path):
    """The batched step only calls Backend ops, so the GPU backend runs it as it is: on the emulated
    CUDA path (a child process: the GPU library stays loaded once loaded) the batch equals the GPU's
    own one-by-one decoding, graph-replayed steps included, greedy and seeded top-k sampling; and
    with quantized, rotated caches read without the split-KV pass. (The GPU runs a batch's
    recurrent layers and attention for all sequences in one launch per op: these equalities are
    what holds those launches to the per-sequence ones, bit for bit.)"""
    prompts, budgets = PROMPTS[:5], [6, 9, 3, 0, 5]
    out = run_on_emulated_cuda(_EMU_PROBE, tiny_path, json.dumps(prompts), json.dumps(budgets))
    assert out["device"] == "gpu"
    assert out["batch"] == out["single"] and [len(t) for t in out["single"]] == budgets
    assert out["sampled_batch"] == out["sampled"] and out["sampled"] != out["single"]
    assert out["quant_batch"] == out["quant_single"] and [len(t) for t in out["quant_single"]] == budgets


def test_cli_parallel_writes_every_id_once_as_parallel_1(tmp_path):
    src = code_prompt_file(tmp_path, 5)
    results = {}
    for parallel in (1, 2):
        out = tmp_path / f"out{parallel}.jsonl"
        proc = run_luce("generate", "-m", TARGET, "--prompts", src, "--output", out, "-n", 12, "-t", 2,
                        "--device", "cpu", "--parallel", parallel)
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(r["id"] for r in records) == [f"p{i}" for i in range(5)]  # every id exactly once
        results[parallel] = {r["id"]: (r["text"], r["tokens"]) for r in records}
    assert results[2] == results[1]


@pytest.mark.parametrize("value", ["0", "-1", "65"])
def test_cli_bad_parallel_is_one_error_line(tmp_path, value):
    proc = run_luce("generate", "-m", TARGET, "--prompts", code_prompt_file(tmp_path, 5), "--parallel", value)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert proc.stdout == "" and len(errors) == 1 and "--parallel" in errors[0]
    assert "Traceback" not in proc.stderr


def test_cli_prompt_lines_carry_their_own_settings(tmp_path):
    """A prompt line's max_tokens / temperature / seed override the run's for that prompt, the
    same with --parallel 1 and 2, and equal to a run that gives that prompt those options."""
    lines = [{"id": "a", "prompt": "def add(a, b):"},
             {"id": "b", "prompt": "def sub(a, b):", "max_tokens": 3},
             {"id": "c", "prompt": "import os", "temperature": 1.1, "seed": 9, "max_tokens": 7}]
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    results = {}
    for parallel in (1, 2):
        out = tmp_path / f"out{parallel}.jsonl"
        proc = run_luce("generate", "-m", TARGET, "--prompts", src, "--output", out, "-n", 5, "-t", 2,
                        "--ignore-eos", "--device", "cpu", "--parallel", parallel)
        assert proc.returncode == 0, proc.stderr
        results[parallel] = {r["id"]: r["tokens"] for r in map(json.loads, out.read_text().splitlines())}
    assert results[2] == results[1]
    assert [len(results[1][k]) for k in "abc"] == [5, 3, 7]
    with Engine(TARGET, threads=2) as eng:
        alone = eng.generate("import os", max_tokens=7, temperature=1.1, seed=9, ignore_eos=True).tokens
    assert results[1]["c"] == alone


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a", "temperature": -1}', '"temperature" must be a number >= 0'),
    ('{"prompt": "a", "top_p": 0}', '"top_p" must be a number in (0, 1]'),
    ('{"prompt": "a", "max_tokens": 2.5}', '"max_tokens" must be an integer >= 0'),
    ('{"prompt": "a", "seed": "x"}', '"seed" must be an integer in 0..2^64-1'),
    ('{"prompt": "a", "top_k": true}', '"top_k" must be an integer >= 0'),
])
def test_cli_bad_prompt_line_settings_are_one_error_line(tmp_path, line, message):
    src = tmp_path / "prompts.jsonl"
    src.write_text('"fine"\n' + line + "\n")
    proc = run_luce("generate", "-m", TARGET, "--prompts", src, "--output", tmp_path / "out.jsonl")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and f"prompts.jsonl:2: {message}" in errors[0], proc.stderr
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").stat().st_size == 0


def test_cli_parallel_keeps_going_past_a_refused_prompt(tmp_path):
    """A prompt that does not fit the context gets the same error line as with --parallel 1, the
    others their results; the run exits 1."""
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join(json.dumps(p) for p in ["short", "word " * 40, "also short", "x"]) + "\n")
    lines = {}
    for parallel in (1, 2):
        out = tmp_path / f"out{parallel}.jsonl"
        proc = run_luce("generate", "-m", TARGET, "--prompts", src, "--output", out, "-n", 2, "-c", 16, "-t", 2,
                        "--device", "cpu", "--parallel", parallel)
        assert proc.returncode == 1 and "1 of 4 prompts failed" in proc.stderr
        lines[parallel] = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    assert [("error" in r) for r in lines[2]] == [False, True, False, False]
    assert [r.get("error", r.get("tokens")) for r in lines[2]] == [r.get("error", r.get("tokens")) for r in lines[1]]
