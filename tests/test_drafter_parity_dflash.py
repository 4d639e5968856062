"""DFlash backbone parity: luce_drafter_forward vs z-lab's own DFlashDraftModel (`dflash` 0.1.0) on the
same fp32 weights, same raw target features, same block, same positions (docs/oracles.md).

Tolerance: 1e-4 x max(1, rms) of the reference hidden. Both sides are fp32; they differ only in
summation order (matmul blocking, softmax), worth ~1e-6 here, so 1e-4 keeps 100x headroom while
every plausible formula error (a wrong position, the YaRN attention factor, a missing norm, the
block not seeing itself) moves the output by 1e-2 or more — checked where the variant is subtle.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.drafter_parity import (BLOCK, TAPS, assert_close, assert_tokens_equal, convert_drafter, dflash_config,
                                     features, mask_block, target)
from fixtures.native_drafter import NativeDrafter
from oracles import zlab

REL = 1e-4
ANCHOR = 17

# name -> config overrides. YaRN configs keep max_position = factor x original, and pick a theta /
# original context whose correction range falls inside head_dim/2 = 8 (so the ramp mixes both ends).
VARIANTS = {
    "plain": {},
    "yarn_rope_scaling": {"rope_theta": 1e4, "max_position_embeddings": 8192,
                          "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 2048}},
    "yarn_rope_parameters": {"max_position_embeddings": 8192,
                             "rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0,
                                                 "original_max_position_embeddings": 1024,
                                                 "beta_fast": 16.0, "beta_slow": 2.0}},
    # Legacy spelling: `type` instead of `rope_type`, original context at the top level.
    "yarn_legacy_type": {"rope_theta": 2e4, "max_position_embeddings": 12288, "original_max_position_embeddings": 2048,
                         "rope_scaling": {"type": "yarn", "factor": 6.0}},
    # The 27B drafters' shape in miniature: n_head * head_dim (6 x 16 = 96) != hidden (64), and a
    # 6:1 GQA ratio; 3 layers.
    "heads_wider_than_hidden": {"num_attention_heads": 6, "num_key_value_heads": 1, "num_hidden_layers": 3},
    # Qwen3.6 style: first layer sliding (in-block causal by default), last layer full; window
    # 12 >= any block here, so it binds on context keys only (the case the spec pins down).
    "swa_causal": {"use_sliding_window": True, "sliding_window": 12,
                   "layer_types": ["sliding_attention", "full_attention"]},
}
VARIANTS["swa_causal_llama_cpp"] = VARIANTS["swa_causal"]   # upstream keys: attention.causal + pattern
LAYOUTS = {"swa_causal_llama_cpp": "llama.cpp"}
SEEDS = {name: 100 + i for i, name in enumerate(VARIANTS)}


def _config(name):
    cfg = dflash_config(**VARIANTS[name])
    if "rope_parameters" in cfg:
        del cfg["rope_theta"]
    return cfg


@pytest.fixture(scope="module")
def tgt(tmp_path_factory):
    return target(tmp_path_factory)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tgt):
    """name -> (native drafter, z-lab oracle, converted drafter), built lazily, freed at module end."""
    built = {}

    def get(name):
        if name not in built:
            drafter = convert_drafter(tmp_path_factory.mktemp(f"dflash_{name}"), _config(name), "dflash", SEEDS[name],
                                      layout=LAYOUTS.get(name, "lucebox"), target_model=tgt.gguf)
            built[name] = (NativeDrafter(tgt.gguf, drafter.gguf), zlab.build(drafter.cfg, drafter.tensors), drafter)
        return built[name]

    yield get
    for native, _, _ in built.values():
        native.close()


def test_info_describes_the_checkpoint(pairs):
    native, _, _ = pairs("plain")
    info = native.info
    assert (info["kind"], info["n_layer"], info["n_embd"], info["n_head"], info["n_head_kv"], info["head_dim"],
            info["n_ff"]) == (0, 2, 64, 4, 2, 16, 128)
    assert (info["block_size"], info["mask_token_id"], info["target_layer_ids"]) == (BLOCK, 500, TAPS)
    assert (info["has_conv"], info["has_selector"], info["has_markov"], info["sample_from_anchor"]) == (0, 0, 0, 0)


@pytest.mark.parametrize("n_ctx", [1, 9, 64])
def test_forward_matches_zlab(pairs, tgt, n_ctx):
    native, oracle, _ = pairs("plain")
    feats, block = features(n_ctx, seed=n_ctx), mask_block(ANCHOR, BLOCK)
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 f"DFlash hidden, n_ctx={n_ctx}")


def test_forward_heads_wider_than_hidden(pairs, tgt):
    native, oracle, _ = pairs("heads_wider_than_hidden")
    assert (native.info["n_head"], native.info["n_head_kv"], native.info["n_layer"]) == (6, 1, 3)
    feats, block = features(21, seed=21), mask_block(ANCHOR, BLOCK)
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 "DFlash hidden, 6 x 16 query width over hidden 64, GQA 6:1")


@pytest.mark.parametrize("n_block", [2, 2 * BLOCK])
def test_forward_other_block_sizes(pairs, tgt, n_block):
    native, oracle, _ = pairs("plain")
    feats, block = features(13, seed=5), mask_block(ANCHOR, n_block)
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 f"DFlash hidden, block {n_block}")


def test_forward_any_block_tokens(pairs, tgt):
    """Rows are embedded from the block ids themselves (not assumed to be masks)."""
    native, oracle, _ = pairs("plain")
    feats, block = features(6, seed=6), [3, 250, 500, 7, 499, 0, 500, 42]
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 "DFlash hidden, arbitrary block ids")


def test_forward_on_real_target_features(pairs, tgt):
    """Features as a decode loop has them: the tiny target's own layer outputs for a 24-token prompt,
    selected by z-lab's extract_context_feature (so the tap indexing is theirs too); the anchor is
    the target's greedy next token."""
    native, oracle, _ = pairs("plain")
    prompt = [5, 99, 230, 17, 48, 301, 2, 77] * 3
    states = tgt.hidden_states(prompt)
    feats = zlab.context_features(states, oracle.target_layer_ids)
    with torch.no_grad():
        anchor = int(tgt.model(torch.tensor([prompt])).logits[0, -1].argmax())
    block = mask_block(anchor, BLOCK)
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 "DFlash hidden on the target's own features")


def test_forward_matches_zlab_incremental_decode(pairs, tgt):
    """What z-lab's decode loop computes after committing the context in steps of 5, 3, 1 and 7 rows
    (cached context K/V, block K/V cropped away each step) equals luce's forward over all 16 rows."""
    native, oracle, _ = pairs("plain")
    feats, block = features(16, seed=16), mask_block(ANCHOR, BLOCK)
    want = zlab.forward_incremental(oracle, tgt.embed, feats, [5, 3, 1, 7], block)
    np.testing.assert_allclose(want, zlab.forward(oracle, tgt.embed, feats, block), atol=1e-5)  # oracle self-check
    assert_close(native.forward(feats, block), want, REL, "DFlash hidden after incremental context")


@pytest.mark.parametrize("name", ["yarn_rope_scaling", "yarn_rope_parameters", "yarn_legacy_type"])
def test_yarn_rope_matches_hf(pairs, tgt, name):
    native, oracle, drafter = pairs(name)
    feats, block = features(200, seed=2), mask_block(ANCHOR, BLOCK)
    want = zlab.forward(oracle, tgt.embed, feats, block)
    # The same weights with plain RoPE at the same theta must land far outside the tolerance,
    # or this test could not tell YaRN from no YaRN.
    plain_cfg = {k: v for k, v in drafter.cfg.items() if k not in ("rope_scaling", "rope_parameters")}
    plain_cfg["rope_theta"] = oracle.config.rope_parameters["rope_theta"]
    plain = zlab.build(plain_cfg, drafter.tensors)
    assert np.abs(zlab.forward(plain, tgt.embed, feats, block) - want).max() > 100 * REL
    assert_close(native.forward(feats, block), want, REL, f"DFlash hidden with {name}")


@pytest.mark.parametrize("name, n_ctx", [("swa_causal", 5), ("swa_causal", 30),
                                         ("swa_causal_llama_cpp", 30)])
def test_swa_causal_layer_matches_zlab(pairs, tgt, name, n_ctx):
    """dflash 0.1.0 builds the in-block causal + window mask for sliding layers itself (is_causal
    defaults to 'layer is sliding'); n_ctx 30 > window 12 makes the window cut context keys."""
    native, oracle, _ = pairs(name)
    assert [layer.self_attn.is_causal for layer in oracle.layers] == [True, False]
    feats, block = features(n_ctx, seed=n_ctx), mask_block(ANCHOR, BLOCK)
    assert_close(native.forward(feats, block), zlab.forward(oracle, tgt.embed, feats, block), REL,
                 f"DFlash hidden, causal SWA layer ({name}), n_ctx={n_ctx}")


def test_swa_variant_is_distinguishable(pairs, tgt):
    """Fixture strength: on the same weights, dropping the in-block causal mask or the window each
    moves the reference far beyond the tolerance, so the SWA test pins both."""
    _, oracle, drafter = pairs("swa_causal")
    tensors = drafter.tensors
    feats, block = features(30, seed=30), mask_block(ANCHOR, BLOCK)
    want = zlab.forward(oracle, tgt.embed, feats, block)
    not_causal = zlab.build(_config("swa_causal") | {"is_causal": False}, tensors)
    no_window = zlab.build(_config("plain"), tensors)
    for other in (not_causal, no_window):
        assert np.abs(zlab.forward(other, tgt.embed, feats, block) - want).max() > 100 * REL


def test_argmax_chain_matches_zlab(pairs, tgt):
    native, oracle, _ = pairs("plain")
    hidden = zlab.forward(oracle, tgt.embed, features(9, seed=9), mask_block(ANCHOR, BLOCK))[1:]
    tokens, _ = native.chain(hidden, ANCHOR)
    assert_tokens_equal(tokens, zlab.argmax_chain(oracle, hidden, tgt.lm_head), "DFlash proposals")
