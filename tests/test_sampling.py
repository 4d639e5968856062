"""The host sampler (native/src/sampling.h) against a numpy implementation of its documented rules
(tests/fixtures/sampler_oracle.py, written from sampling.h's text, not from the C++):

- RNG: xoshiro256** seeded through splitmix64(seed), uniform = (next >> 11) * 2^-53.
- Candidates: the top_k largest logits (0 = all), ties to the lower id; then the smallest prefix
  whose softmax mass (at the temperature) reaches top_p; one draw in proportion to the kept
  weights, walking the candidates best first (in id order when nothing is truncated).
- The explicit distribution (luce_sample_probs, what speculative decoding's rejection sampling
  compares the drafter's q with): the same candidates, renormalised, zero elsewhere.
- A whole seeded generation (one RNG over the run; with top-k the backend ranks each decode
  step's row and only the k candidates reach the sampler) replays step by step.

The rows are crafted to reach every branch the fast ranking has: ties (a whole row of equal
logits, where the tie rule alone decides the candidates), signed zeros, peaked and flat rows, and
a 248k-token vocabulary (Qwen3.5's) whose nucleus needs more than one round of selection.
Equality is on the drawn token ids; the weights are fp32 exps on both sides (numpy's and libm's
may differ in the last bit, which could move a draw only when u falls within ~1e-7 of a boundary).
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.native_eval import decode_step_logits
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from fixtures.sampler_oracle import Xoshiro256, oracle_draw, oracle_probs, oracle_sample
from luce import Engine
from luce.binding import check, ffi, lib
from luce.errors import LuceError

def luce_sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, seed: int) -> int:
    out = ffi.new("int32_t *")
    check(lib().luce_sample(ffi.from_buffer("float[]", logits), len(logits), temperature, top_k, top_p, seed, out))
    return int(out[0])


def luce_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    probs = np.empty(len(logits), np.float32)
    check(lib().luce_sample_probs(ffi.from_buffer("float[]", logits), len(logits), temperature, top_k, top_p,
                                  ffi.from_buffer("float[]", probs)))
    return probs


def _rows() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    normal = rng.normal(0, 2, 1000).astype(np.float32)
    tied = normal.copy()
    tied[rng.choice(1000, 200, replace=False)] = normal[:200]  # many exact ties with other ids
    tied[[3, 500, 999]] = np.float32(0.0)
    tied[[10, 600]] = np.float32(-0.0)
    tied[np.argmax(tied)] = tied.max()
    # Qwen3.5's vocabulary: a peaked head (a trained model's) over a long flat tail, and a row
    # whose 0.9 nucleus takes a few thousand ids (several rounds of selection).
    big_peaked = rng.normal(0, 1, 248320).astype(np.float32)
    big_peaked[rng.choice(248320, 30, replace=False)] += np.float32(12.0)
    big_broad = (rng.normal(0, 1, 248320) * 2.5).astype(np.float32)
    # Every exponent the weights take, down to the -87 floor and past it (the sampler's own exp).
    ramp = np.linspace(-95, 0, 50_000, dtype=np.float32)
    return {"normal": normal, "tied": tied, "flat": np.zeros(256, np.float32), "peaked": normal * 8,
            "big_peaked": big_peaked, "big_broad": big_broad, "ramp": ramp}


ROWS = _rows()
SETTINGS = [(0.7, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.9), (1.2, 50, 0.5), (1.0, 0, 0.999), (1.0, 5, 1.0),
            (0.9, 0, 0.3)]


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_sampled_ids_follow_the_documented_rules(row, temperature, top_k, top_p):
    logits = ROWS[row]
    seeds = range(4) if logits.size > 10_000 else range(40)
    got = [luce_sample(logits, temperature, top_k, top_p, seed) for seed in seeds]
    assert got == [oracle_sample(logits, temperature, top_k, top_p, seed) for seed in seeds]


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_explicit_distribution_is_the_renormalised_candidate_set(row, temperature, top_k, top_p):
    logits = ROWS[row]
    want = oracle_probs(logits, temperature, top_k, top_p)
    got = luce_probs(logits, temperature, top_k, top_p)
    assert np.array_equal(got > 0, want > 0)  # the same candidates, ties included
    # atol: a few units of the float32 subnormal spacing (1.4e-45), where no relative error holds.
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=1e-44)


@pytest.mark.parametrize("top_k", [3000, 4000, 10000])
def test_large_top_k_ranks_exactly_when_a_sample_misleads_the_estimate(top_k):
    """Past a few hundred candidates the ranking keeps the ids scoring at or above an estimate of
    the k-th best score, taken from a strided sample of the row (every 60th id of 248320), and
    falls back to every id when fewer than k qualify. Here the sample holds exactly the high ids
    (with many equal scores), so the estimate lands among the very best and too few qualify; the
    candidates must still be the numpy oracle's. (The broad rows above take the estimate's own
    path.)"""
    rng = np.random.default_rng(9)
    logits = rng.normal(0, 1, 248320).astype(np.float32)
    logits[::60] = np.float32(6.0) + rng.integers(0, 4, logits[::60].size).astype(np.float32)
    got, want = luce_probs(logits, 1.0, top_k, 1.0), oracle_probs(logits, 1.0, top_k, 1.0)
    assert np.array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=1e-44)
    assert [luce_sample(logits, 1.0, top_k, 1.0, s) for s in range(3)] == \
        [oracle_sample(logits, 1.0, top_k, 1.0, s) for s in range(3)]


def test_a_flat_row_keeps_the_lowest_ids():
    """Every logit equal: the tie rule alone picks the candidates (top-k 5: ids 0-4; top-p 0.25 of
    256 equal weights, each 1/256 exactly: the first 64 ids), so a draw never leaves them."""
    flat = ROWS["flat"]
    assert {luce_sample(flat, 1.0, 5, 1.0, s) for s in range(200)} == set(range(5))
    assert max(luce_sample(flat, 1.0, 0, 0.25, s) for s in range(200)) < 64
    assert np.flatnonzero(luce_probs(flat, 1.0, 0, 0.25)).tolist() == list(range(64))


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(n=0), "n must be positive"),
])
def test_bad_arguments_are_one_error_line(kwargs, message):
    args = dict(n=4, temperature=1.0, top_k=0, top_p=1.0)
    args.update(kwargs)
    row = np.zeros(4, np.float32)
    out = ffi.new("int32_t *")
    with pytest.raises(LuceError, match=message):
        check(lib().luce_sample(ffi.from_buffer("float[]", row), args["n"], args["temperature"], args["top_k"],
                                args["top_p"], 1, out))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_random_qwen35(tmp_path_factory.mktemp("sampling") / "tiny.gguf", SPEC_TINY, seed=2)
    with Engine(path, threads=2, ctx_size=256) as eng:
        yield eng


@pytest.mark.parametrize("top_k,top_p", [(20, 0.8), (40, 1.0), (0, 0.9), (0, 1.0)])
def test_seeded_generation_replays_with_the_numpy_sampler(engine, top_k, top_p):
    """generate(seed): the first token from the prompt's last row on the host, each later one from
    its decode step (top-k runs: the k candidates Backend::topk_rows ranked where the logits are;
    otherwise the whole row), one RNG throughout. The numpy sampler, replayed with one RNG over
    the logits of the same sequences, draws the same ids."""
    prompt, temperature, seed, n = [5, 17, 42, 99, 3, 250, 7], 0.8, 11, 12
    got = engine.generate(prompt_ids=prompt, max_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p,
                          seed=seed, ignore_eos=True).tokens
    rows = decode_step_logits(engine, prompt + got, len(prompt), n - 1)  # the rows generate drew from
    rng = Xoshiro256(seed)
    assert got == [oracle_draw(row, temperature, top_k, top_p, rng) for row in rows]
