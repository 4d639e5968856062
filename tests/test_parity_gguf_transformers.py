"""Native logits vs transformers reading the SAME GGUF (`from_pretrained(dir, gguf_file=...)`).

transformers' qwen35 GGUF loader is an implementation nobody here wrote: it maps the GGUF back
to Qwen3_5ForCausalLM (undoing the +1 norms, ssm_a, the tiled v-head order) and dequantizes
every weight type with its own code. Models are tiny random qwen35 GGUFs
(fixtures/random_qwen35_gguf.py): both layer kinds, HK = 2 != HV = 6, tied and untied heads, an
MTP block that must be skipped, per-layer head-count arrays, and every supported weight type.

Tolerances, relative to the logit scale max|ref|:
  float weights (F32/F16/BF16): 1e-4 (fp32 accumulation in a different order).
  Q5_0/Q5_1, which transformers cannot read, are compared with an F32 copy of the same file,
  each tensor dequantized by gguf.quants (another oracle nobody here wrote).
  8-bit-activation types (every quantized one: Q8_0, Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL, K, IQ4_XS, the
  1-3-bit Q2_K/Q3_K/IQ1-IQ3, and "mixed", which holds many in one file): the quant kernels
  multiply int8-quantized activations
  (d = max|x|/127 per block, as llama.cpp does), ~0.4% relative error per matmul; through this
  contractive tiny network that is ~1.5% of the logit scale, so 4e-2 holds with margin while a
  layout or mapping bug (O(1) of the scale, see spec pitfall 2) cannot pass.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q

from fixtures.native_eval import assert_logits_close, decode_step_logits
from fixtures.random_qwen35_gguf import K_QUANT_TINY, write_random_qwen35
from luce import Engine

# Tiny models: torch's intra-op threads only add contention under pytest-xdist (a 64-token
# generate() took 15 s with them on a busy 2-core machine, 0.4 s without).
torch.set_num_threads(1)

FLOAT_TOL = 1e-4
QUANT_TOL = 4e-2
N_PROMPT = 150  # > 2 prefill chunks of 64

# transformers reads a copy whose Q5_0/Q5_1 tensors (types it cannot read) are F32, dequantized
# by gguf.quants.
DEQUANTIZED = "dequantized"
UNREADABLE_BY_TRANSFORMERS = (Q.Q5_0, Q.Q5_1)

# Every type luce reads beyond F32/F16/BF16/Q8_0/K/IQ4_XS, one per 2-D tensor in turn (the token
# embedding and the output head included), on the 256-column shapes the 256-element blocks need.
MIXED_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K, Q.IQ2_XXS, Q.IQ2_XS,
               Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M]


def mixed_type(name: str) -> Q:
    """A type per tensor, spread over MIXED_TYPES by a stable hash of the name."""
    return MIXED_TYPES[sum(name.encode()) % len(MIXED_TYPES)]


# name -> (writer kwargs for the native file, kwargs for the file transformers reads, tolerance)
VARIANTS = {
    "f32": (dict(), None, FLOAT_TOL),
    "f32_tied": (dict(tied=True), None, FLOAT_TOL),
    # transformers cannot read per-layer head arrays; it reads the same weights with scalars.
    "f32_mtp_per_layer_heads": (dict(mtp=True, per_layer_heads=True), dict(), FLOAT_TOL),
    "f16": (dict(weight_type=Q.F16), None, FLOAT_TOL),
    "bf16": (dict(weight_type=Q.BF16), None, FLOAT_TOL),
    "q8_0": (dict(weight_type=Q.Q8_0), None, QUANT_TOL),
    "q8_0_tied": (dict(weight_type=Q.Q8_0, tied=True), None, QUANT_TOL),
    "q4_K": (dict(config=K_QUANT_TINY, weight_type=Q.Q4_K), None, QUANT_TOL),
    "q5_K": (dict(config=K_QUANT_TINY, weight_type=Q.Q5_K), None, QUANT_TOL),
    "q6_K": (dict(config=K_QUANT_TINY, weight_type=Q.Q6_K), None, QUANT_TOL),
    "iq4_xs": (dict(config=K_QUANT_TINY, weight_type=Q.IQ4_XS), None, QUANT_TOL),
    "q4_0": (dict(weight_type=Q.Q4_0), None, QUANT_TOL),
    "q4_1": (dict(weight_type=Q.Q4_1), None, QUANT_TOL),
    "iq4_nl": (dict(weight_type=Q.IQ4_NL), None, QUANT_TOL),
    "q5_0": (dict(weight_type=Q.Q5_0), DEQUANTIZED, QUANT_TOL),
    "q5_1": (dict(weight_type=Q.Q5_1), DEQUANTIZED, QUANT_TOL),
    "q2_K": (dict(config=K_QUANT_TINY, weight_type=Q.Q2_K), None, QUANT_TOL),
    "q3_K": (dict(config=K_QUANT_TINY, weight_type=Q.Q3_K), None, QUANT_TOL),
    "iq2_xxs": (dict(config=K_QUANT_TINY, weight_type=Q.IQ2_XXS), None, QUANT_TOL),
    "iq2_xs": (dict(config=K_QUANT_TINY, weight_type=Q.IQ2_XS), None, QUANT_TOL),
    "iq2_s": (dict(config=K_QUANT_TINY, weight_type=Q.IQ2_S), None, QUANT_TOL),
    "iq3_xxs": (dict(config=K_QUANT_TINY, weight_type=Q.IQ3_XXS), None, QUANT_TOL),
    "iq3_s": (dict(config=K_QUANT_TINY, weight_type=Q.IQ3_S), None, QUANT_TOL),
    "iq1_s": (dict(config=K_QUANT_TINY, weight_type=Q.IQ1_S), None, QUANT_TOL),
    "iq1_m": (dict(config=K_QUANT_TINY, weight_type=Q.IQ1_M), None, QUANT_TOL),
    "mixed": (dict(config=K_QUANT_TINY, weight_type=mixed_type), DEQUANTIZED, QUANT_TOL),
}


def _hf_from_gguf(path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    return model.eval()


def _dequantized_copy(src, dst):
    """src with its tensors of UNREADABLE_BY_TRANSFORMERS types replaced by gguf.quants' F32
    dequantization of them."""
    from gguf.quants import dequantize

    from fixtures.gguf_edit import rewrite
    from luce.converters.gguf_reader import GGUFFile

    arrays = {}
    with GGUFFile.open(src) as gf:
        for name, t in gf.tensors.items():
            if t.ggml_type not in UNREADABLE_BY_TRANSFORMERS:
                continue
            rows = np.array(gf.tensor_bytes(name)).reshape(int(np.prod(t.shape[1:])), -1)
            arrays[name] = dequantize(rows, t.ggml_type).astype(np.float32).reshape(tuple(reversed(t.shape)))
    return rewrite(src, dst, tensors=arrays)


class Case:
    def __init__(self, root, name):
        native_kw, ref_kw, self.tol = VARIANTS[name]
        self.path = write_random_qwen35(root / f"{name}.gguf", seed=3, **native_kw)
        ref_path = self.path
        if ref_kw == DEQUANTIZED:
            ref_path = _dequantized_copy(self.path, root / f"{name}_ref.gguf")
        elif ref_kw is not None:
            kw = {k: v for k, v in native_kw.items() if k in ("config", "weight_type", "tied")}
            ref_path = write_random_qwen35(root / f"{name}_ref.gguf", seed=3, **kw, **ref_kw)
        self.hf = _hf_from_gguf(ref_path)
        self.n_vocab = self.hf.config.vocab_size
        self.ids = [int(i) for i in np.random.default_rng(7).integers(0, self.n_vocab, N_PROMPT)]
        with torch.no_grad():
            self.ref = self.hf(torch.tensor([self.ids])).logits[0].double().numpy()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_prefill_and_decode_logits(tmp_path, name):
    """One test per variant (the oracle's setup dominates the cost): the prefill of 150 tokens
    (three chunks of 64), then a second pass that prefills 70 tokens and feeds 12 one at a time;
    each step's logits must equal the full-sequence reference at that position."""
    case = Case(tmp_path, name)
    n_prefill, n_steps = 70, 12
    with Engine(case.path, threads=2, ctx_size=256) as eng:
        assert_logits_close(eng.logits(case.ids), case.ref, case.tol, "prefill")
        steps = decode_step_logits(eng, case.ids, n_prefill, n_steps)
    assert_logits_close(steps, case.ref[n_prefill - 1: n_prefill + n_steps], case.tol, "decode")


@pytest.mark.parametrize("name", ["f32", "mixed"])
def test_greedy_generation_matches_transformers(tmp_path, name, monkeypatch):
    """64 greedy tokens equal transformers' generate() on the same GGUF, on the mixed file also
    with a drafter. EOS is an ordinary token
    on both sides (luce: ignore_eos; transformers: no eos_token_id; its min_new_tokens would
    instead mask EOS out of the argmax). The mixed file runs luce's exact kernels (fp32
    activations, LUCE_CPU_KERNELS=exact), as transformers computes: the int8-activation path
    is held to the logits tolerance above, not to bit-equal argmaxes."""
    if name == "mixed":
        monkeypatch.setenv("LUCE_CPU_KERNELS", "exact")
    native_kw, ref_kw, _ = VARIANTS[name]
    path = write_random_qwen35(tmp_path / "g.gguf", seed=5, **native_kw)
    hf = _hf_from_gguf(_dequantized_copy(path, tmp_path / "g_ref.gguf") if ref_kw == DEQUANTIZED else path)
    prompt = [int(i) for i in np.random.default_rng(11).integers(0, hf.config.vocab_size, 20)]
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, len(prompt):].tolist()
    assert len(ref) == 64
    with Engine(path, threads=2, ctx_size=256) as eng:
        gen = eng.generate(prompt_ids=prompt, max_tokens=64, ignore_eos=True)
    assert gen.tokens == ref
    assert gen.prompt_tokens == len(prompt) and gen.stats["generated_tokens"] == 64
    if name == "mixed":
        _assert_speculative_equals(path, prompt, ref, tmp_path)


def _assert_speculative_equals(path, prompt, ref, tmp_path):
    """With a DFlash drafter of the target's width, speculative steps at two block sizes (forced:
    no adaptive fallback to plain steps) give the same 64 tokens: every weight type is also read
    by the verify pass, which runs the target on a block of tokens at once."""
    from fixtures import drafter_checkpoints as ck
    from luce.converters.convert import ConvertOptions, convert_checkpoint

    drafter = tmp_path / "drafter.gguf"
    convert_checkpoint(ck.zlab_dflash(tmp_path / "ckpt", hidden=K_QUANT_TINY.hidden), drafter, ConvertOptions())
    with Engine(path, threads=2, ctx_size=256, draft=drafter) as eng:
        for block in (4, ck.BLOCK):
            gen = eng.generate(prompt_ids=prompt, max_tokens=64, ignore_eos=True, draft_block_size=block,
                               adaptive=False)
            assert gen.tokens == ref, block
            assert gen.stats["spec_steps"] > 0 and gen.stats["block_size"] == block
