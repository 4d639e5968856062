"""Native logits vs the original Hugging Face model (`Qwen3_5ForCausalLM`, fp32) whose checkpoint
luce's converter turned into the GGUF the runtime loads (tests/fixtures/tiny_qwen35.py, spec
§2.2 shapes: both layer kinds, HK = 2 != HV = 6, tied and untied heads, an MTP block).

The bar: max |diff| <= 1e-4 of the logit scale for the prefill (600 tokens: one chunk
of 512 and a short one, or 64-token chunks when every row's logits are wanted) and for every
single-token decode step, and greedy generation of 64 tokens equal to transformers' greedy
generate().
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.native_eval import assert_logits_close, decode_step_logits, last_rows_logits
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine, LuceError

# Tiny models: torch's intra-op threads only add contention under pytest-xdist (a 64-token
# generate() took 15 s with them on a busy 2-core machine, 0.4 s without).
torch.set_num_threads(1)

REL_TOL = 1e-4
N_PROMPT = 600  # > PREFILL_STEP (session.h): a full prefill chunk and a short one
CTX = 1024


@pytest.fixture(scope="module", params=["base", "tied", "mtp"])
def tiny(request, tmp_path_factory):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, request.param)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, model.config.vocab_size, N_PROMPT)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].double().numpy()
    return model, gguf_path, ids, ref


def test_prefill_matches_hf(tiny):
    _, path, ids, ref = tiny
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        assert_logits_close(eng.logits(ids), ref, REL_TOL, "prefill")


@pytest.mark.parametrize("n_rows", [1, 44, 100, 250, 550])
def test_prefill_last_rows_match_hf(tiny, n_rows):
    """The logits of the last n_rows positions only: prefill chunks are cut so that none returns
    more than 64 rows (generate.cpp prefill_chunk), wherever the wanted rows begin."""
    _, path, ids, ref = tiny
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        out = last_rows_logits(eng, ids, n_rows)
    assert_logits_close(out, ref[-n_rows:], REL_TOL, f"last {n_rows} rows")


def test_decode_steps_match_hf(tiny):
    _, path, ids, ref = tiny
    n_prefill, n_steps = 515, 16  # a 512-token prefill chunk, then 3; the steps cross position 512
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        ours = decode_step_logits(eng, ids, n_prefill, n_steps)
    assert_logits_close(ours, ref[n_prefill - 1: n_prefill + n_steps], REL_TOL, "decode")


def test_hidden_state_capture_matches_hf(tiny):
    """Captured layer outputs (for drafters) equal HF's hidden_states[i + 1] (the output of
    decoder layer i) at every position, over several prefill chunks."""
    model, path, ids, _ = tiny
    layers = [0, 3, 5, 6]  # both kinds; not the last layer (HF normalises its final entry)
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    ref = np.stack([hs[i + 1][0].double().numpy() for i in layers], axis=1)  # [n, layers, E]
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        ours = eng.hidden_states(ids, layers)
        with pytest.raises(LuceError):
            eng.hidden_states(ids[:3], [3, 1])
    assert_logits_close(ours, ref, REL_TOL, "hidden states")


def test_f16_kv_cache_stays_close_to_hf(tiny):
    """The f16 KV cache rounds keys and values to IEEE half (relative error 2^-11): logits move,
    but by far less than a wrong cache layout would move them."""
    _, path, ids, ref = tiny
    with Engine(path, threads=2, ctx_size=CTX, kv_cache="f16") as eng:
        ours = eng.logits(ids)
    assert_logits_close(ours, ref, 5e-3, "prefill with f16 KV")
    assert np.abs(ours - ref).max() > 0  # the half-precision path really ran


def test_greedy_64_tokens_match_hf(tiny):
    model, path, ids, _ = tiny
    prompt = ids[:24]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64,
                             do_sample=False)[0, len(prompt):].tolist()
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        gen = eng.generate(prompt_ids=prompt, max_tokens=64, ignore_eos=True)
    assert gen.tokens == ref


def test_prefill_step_setting(tiny, monkeypatch):
    """LUCE_PREFILL_STEP sets a session's prompt chunk: on the CPU a prefill row is its decode row
    bit for bit, so chunks of 64 and the default give the same logits; a bad value is one error."""
    _, path, ids, _ = tiny
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        default = eng.logits(ids)
    monkeypatch.setenv("LUCE_PREFILL_STEP", "64")
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        assert np.array_equal(eng.logits(ids), default)
    for bad in ("63", "1025", "512x"):
        monkeypatch.setenv("LUCE_PREFILL_STEP", bad)
        with pytest.raises(LuceError, match=f"LUCE_PREFILL_STEP={bad}: not an integer in 64..1024"):
            Engine(path, threads=2, ctx_size=CTX)
