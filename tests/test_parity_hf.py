"""Native logits vs the original Hugging Face model (`Qwen3_5ForCausalLM`, fp32) whose checkpoint
luce's converter turned into the GGUF the runtime loads (tests/fixtures/tiny_qwen35.py, spec
§2.2 shapes: both layer kinds, HK = 2 != HV = 6, tied and untied heads, an MTP block).

The bar (issue 3): max |diff| <= 1e-4 of the logit scale for the prefill (150 tokens = three
prefill chunks) and for every single-token decode step, and greedy generation of 64 tokens equal
to transformers' greedy generate().
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.native_eval import assert_logits_close, decode_step_logits
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine

REL_TOL = 1e-4
N_PROMPT = 150


@pytest.fixture(scope="module", params=["base", "tied", "mtp"])
def tiny(request, tmp_path_factory):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, request.param)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, model.config.vocab_size, N_PROMPT)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].double().numpy()
    return model, gguf_path, ids, ref


def test_prefill_matches_hf(tiny):
    _, path, ids, ref = tiny
    with Engine(path, threads=2, ctx_size=512) as eng:
        assert_logits_close(eng.logits(ids), ref, REL_TOL, "prefill")


def test_decode_steps_match_hf(tiny):
    _, path, ids, ref = tiny
    n_prefill, n_steps = 67, 16  # the decode steps cross the 2nd prefill-chunk boundary (64..)
    with Engine(path, threads=2, ctx_size=512) as eng:
        ours = decode_step_logits(eng, ids, n_prefill, n_steps)
    assert_logits_close(ours, ref[n_prefill - 1: n_prefill + n_steps], REL_TOL, "decode")


def test_f16_kv_cache_stays_close_to_hf(tiny):
    """The f16 KV cache rounds keys and values to IEEE half (relative error 2^-11): logits move,
    but by far less than a wrong cache layout would move them."""
    _, path, ids, ref = tiny
    with Engine(path, threads=2, ctx_size=512, kv_cache="f16") as eng:
        ours = eng.logits(ids)
    assert_logits_close(ours, ref, 5e-3, "prefill with f16 KV")
    assert np.abs(ours - ref).max() > 0  # the half-precision path really ran


def test_greedy_64_tokens_match_hf(tiny):
    model, path, ids, _ = tiny
    prompt = ids[:24]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64,
                             do_sample=False)[0, len(prompt):].tolist()
    with Engine(path, threads=2, ctx_size=512) as eng:
        gen = eng.generate(prompt_ids=prompt, max_tokens=64, ignore_eos=True)
    assert gen.tokens == ref
