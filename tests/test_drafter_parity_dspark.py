"""DSpark parity against NeMo Automodel 0.7.0's Qwen3DSparkModel on the same fp32 weights
(docs/oracles.md): the backbone (luce_drafter_forward vs _forward_backbone, RadixArk-style YaRN
factor 32) and the heads (luce_drafter_chain vs the vanilla Markov chain
markov_head.sample_block_tokens and sigmoid(predict_confidence_step)), with the confidence head
conditioned on the Markov embedding (C = H + R) and on the hidden state only (C = H).

Tolerances: hidden 1e-4 x max(1, rms) (fp32 both sides, see test_drafter_parity_dflash.py);
confidence 1e-5 absolute (one fp32 dot product of C <= 80 terms through a sigmoid, slope <= 1/4;
the errors are ~1e-7). Chain tokens must be equal.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.drafter_parity import (TAPS, assert_close, assert_tokens_equal, convert_drafter, dspark_config,
                                     features, mask_block, stored_types, target)
from fixtures.native_drafter import NativeDrafter
from oracles import nemo

REL = 1e-4
CONFIDENCE_ATOL = 1e-5
BLOCK = 7
ANCHOR = 17


@pytest.fixture(scope="module")
def tgt(tmp_path_factory):
    return target(tmp_path_factory)


@pytest.fixture(scope="module", params=[True, False], ids=["confidence_h_plus_r", "confidence_h"])
def ref(request, tmp_path_factory, tgt):
    """(converted drafter, NeMo Qwen3DSparkModel, confidence conditioned on the Markov embedding?)."""
    with_markov = request.param
    drafter = convert_drafter(tmp_path_factory.mktemp("dspark"), dspark_config(with_markov), "dspark",
                              seed=20 + with_markov)
    return drafter, nemo.build_dspark(drafter.cfg, drafter.tensors, tgt.embed, tgt.lm_head), with_markov


@pytest.fixture(scope="module")
def pair(ref, tgt):
    drafter, model, with_markov = ref
    native = NativeDrafter(tgt.gguf, drafter.gguf)
    yield native, model, with_markov
    native.close()


def test_info_describes_the_checkpoint(pair):
    native, _, with_markov = pair
    info = native.info
    assert (info["kind"], info["block_size"], info["sample_from_anchor"], info["target_layer_ids"]) == (2, BLOCK, 1, TAPS)
    assert (info["has_markov"], info["markov_rank"], info["has_confidence"]) == (1, 16, 1)
    assert info["confidence_dim"] == (64 + 16 if with_markov else 64)
    assert (info["has_conv"], info["has_selector"]) == (0, 0)


@pytest.mark.parametrize("n_ctx, n_block", [(3, BLOCK), (40, BLOCK), (9, 2), (9, 2 * BLOCK)])
def test_backbone_matches_nemo(pair, n_ctx, n_block):
    native, model, _ = pair
    feats, block = features(n_ctx, seed=n_ctx), mask_block(ANCHOR, n_block)
    assert_close(native.forward(feats, block), nemo.dspark_forward(model, feats, block), REL,
                 f"DSpark hidden (YaRN factor 32), n_ctx={n_ctx}, block {n_block}")


@pytest.mark.parametrize("anchor, seed", [(ANCHOR, 1), (450, 2)])
def test_markov_chain_and_confidence_match_nemo(pair, anchor, seed):
    """All B rows propose (sample_from_anchor): slot k predicts position p+k+1, prev_0 = anchor."""
    native, model, _ = pair
    hidden = nemo.dspark_forward(model, features(12, seed=seed), mask_block(anchor, BLOCK))
    want_tokens, want_confidence = nemo.markov_chain(model, hidden, anchor)
    tokens, confidence = native.chain(hidden, anchor)
    assert_tokens_equal(tokens, want_tokens, f"DSpark Markov chain from anchor {anchor}")
    np.testing.assert_allclose(confidence, want_confidence, rtol=0, atol=CONFIDENCE_ATOL,
                               err_msg="DSpark confidence sigmoid(w.[h_k; W1[prev_k]] + b)")


def test_markov_bias_changes_the_chain(ref):
    """Fixture strength: W2 W1[prev] moves at least one argmax, and the confidence is not flat."""
    _, model, _ = ref
    hidden = nemo.dspark_forward(model, features(12, seed=1), mask_block(ANCHOR, BLOCK))
    tokens, confidence = nemo.markov_chain(model, hidden, ANCHOR)
    plain = (hidden @ model.lm_head.weight.detach().numpy().T).argmax(-1)
    assert (tokens != plain).any()
    assert np.ptp(confidence) > 0.05


def test_chain_without_confidence_output(pair):
    """confidence_out may be NULL; the tokens do not depend on it."""
    native, model, _ = pair
    hidden = np.random.default_rng(5).standard_normal((BLOCK, 64)).astype(np.float32)
    assert_tokens_equal(native.chain(hidden, 99, confidence=False)[0], nemo.markov_chain(model, hidden, 99)[0],
                        "DSpark Markov chain on random rows")


def test_upstream_layout_matches_nemo(tmp_path_factory, tgt):
    """The same weights in the llama.cpp `dflash` layout (markov_w1 / markov_w2 / conf_proj names)."""
    drafter = convert_drafter(tmp_path_factory.mktemp("dspark_upstream"), dspark_config(True), "dspark", seed=23,
                              layout="llama.cpp", target_model=tgt.gguf)
    model = nemo.build_dspark(drafter.cfg, drafter.tensors, tgt.embed, tgt.lm_head)
    feats, block = features(10, seed=10), mask_block(ANCHOR, BLOCK)
    hidden = nemo.dspark_forward(model, feats, block)
    want_tokens, want_confidence = nemo.markov_chain(model, hidden, ANCHOR)
    with NativeDrafter(tgt.gguf, drafter.gguf) as native:
        assert (native.info["kind"], native.info["sample_from_anchor"]) == (2, 1)
        assert_close(native.forward(feats, block), hidden, REL, "DSpark hidden, llama.cpp layout")
        tokens, confidence = native.chain(hidden, ANCHOR)
    assert_tokens_equal(tokens, want_tokens, "DSpark Markov chain, llama.cpp layout")
    np.testing.assert_allclose(confidence, want_confidence, rtol=0, atol=CONFIDENCE_ATOL)


def test_f16_file_matches_nemo(tmp_path_factory, tgt):
    """The default file type: Markov tables and confidence weight stored as F16 (weights drawn
    f16-exact); lookups of W1[prev] and the W2 product must keep fp32 accuracy."""
    drafter = convert_drafter(tmp_path_factory.mktemp("dspark_f16"), dspark_config(True), "dspark", seed=24,
                              outtype="f16")
    assert list(stored_types(drafter.gguf).values()).count("F16") >= 10
    model = nemo.build_dspark(drafter.cfg, drafter.tensors, tgt.embed, tgt.lm_head)
    feats, block = features(10, seed=11), mask_block(ANCHOR, BLOCK)
    hidden = nemo.dspark_forward(model, feats, block)
    want_tokens, want_confidence = nemo.markov_chain(model, hidden, ANCHOR)
    with NativeDrafter(tgt.gguf, drafter.gguf) as native:
        assert_close(native.forward(feats, block), hidden, REL, "DSpark hidden, f16 file")
        tokens, confidence = native.chain(hidden, ANCHOR)
    assert_tokens_equal(tokens, want_tokens, "DSpark Markov chain, f16 file")
    np.testing.assert_allclose(confidence, want_confidence, rtol=0, atol=CONFIDENCE_ATOL)
