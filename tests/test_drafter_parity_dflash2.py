"""DFlash 2 parity: the trunk with grouped dynamic causal convs (luce_drafter_forward) and the greedy
candidate-selector walk (luce_drafter_chain) against two implementations we did not write, on the
same fp32 weights: z-lab's `dflash` 0.1.0 DFlash2DraftModel and NeMo Automodel 0.7.0's
Qwen3DFlash2DraftModel / CandidateSelector.walk (docs/oracles.md).

Tolerance: as for DFlash, 1e-4 x max(1, rms) of the reference hidden (fp32 both sides, summation
order only; the convs alone move the output by O(1), asserted below). Walk tokens must be equal.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.drafter_parity import (BLOCK, TAPS, assert_close, assert_tokens_equal, convert_drafter, dflash_config,
                                     dflash2_config, features, mask_block, stored_types, target)
from fixtures.gguf_edit import F32, rewrite
from fixtures.native_drafter import NativeDrafter
from luce.converters.schema import ARCH
from luce.converters.validate import inspect_gguf
from luce.errors import LuceError
from oracles import nemo, zlab

REL = 1e-4
ANCHOR = 17


@pytest.fixture(scope="module")
def tgt(tmp_path_factory):
    return target(tmp_path_factory)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """(converted drafter, z-lab DFlash2DraftModel, NeMo Qwen3DFlash2DraftModel) on the same weights."""
    drafter = convert_drafter(tmp_path_factory.mktemp("dflash2"), dflash2_config(), "dflash2", seed=7)
    return drafter, zlab.build(drafter.cfg, drafter.tensors, dflash2=True), nemo.build_dflash2(drafter.cfg, drafter.tensors)


@pytest.fixture(scope="module")
def pair(ref, tgt):
    drafter, z, nm = ref
    native = NativeDrafter(tgt.gguf, drafter.gguf)
    yield native, z, nm, drafter
    native.close()


def test_info_describes_the_checkpoint(pair):
    info = pair[0].info
    assert (info["kind"], info["block_size"], info["sample_from_anchor"]) == (1, BLOCK, 0)
    assert (info["has_conv"], info["conv_kernel_size"], info["conv_group_size"]) == (1, 2, 16)
    assert (info["has_selector"], info["selector_rank"], info["selector_top_k"]) == (1, 32, 8)
    assert (info["has_markov"], info["has_confidence"]) == (0, 0)


@pytest.mark.parametrize("n_ctx, n_block", [(1, BLOCK), (20, BLOCK), (11, 2), (11, 2 * BLOCK)])
def test_forward_matches_zlab_and_nemo(pair, tgt, n_ctx, n_block):
    native, z, nm, _ = pair
    feats, block = features(n_ctx, seed=n_ctx), mask_block(ANCHOR, n_block)
    want = zlab.forward(z, tgt.embed, feats, block)
    assert_close(nemo.dflash2_forward(nm, tgt.embed, feats, block), want, REL, "NeMo vs z-lab (oracles disagree)")
    assert_close(native.forward(feats, block), want, REL, f"DFlash 2 hidden, n_ctx={n_ctx}, block {n_block}")


def test_convs_are_exercised(ref, tgt):
    """The same trunk without the convs is far from the reference: a luce forward that skipped or
    mis-ordered them could not pass the test above."""
    drafter, z, _ = ref
    trunk_only = zlab.build(dflash_config(), {k: v for k, v in drafter.tensors.items()
                                              if "conv" not in k and "selector" not in k})
    feats, block = features(20, seed=20), mask_block(ANCHOR, BLOCK)
    assert np.abs(zlab.forward(trunk_only, tgt.embed, feats, block) - zlab.forward(z, tgt.embed, feats, block)).max() > 0.1


@pytest.mark.parametrize("anchor, seed", [(ANCHOR, 1), (300, 2), (0, 3)])
def test_selector_walk_matches_zlab_and_nemo(pair, tgt, anchor, seed):
    native, z, nm, _ = pair
    hidden = zlab.forward(z, tgt.embed, features(9, seed=seed), mask_block(anchor, BLOCK))[1:]
    want = zlab.selector_walk(z, hidden, tgt.lm_head, anchor)
    assert_tokens_equal(nemo.selector_walk(nm, hidden, tgt.lm_head, anchor), want, "NeMo vs z-lab walk")
    tokens, _ = native.chain(hidden, anchor)
    assert_tokens_equal(tokens, want, f"DFlash 2 selector walk from anchor {anchor}")


def test_selector_walk_departs_from_argmax(ref, tgt):
    """Fixture strength: the pairwise term changes the path, so equality above means the selector ran."""
    _, z, _ = ref
    hidden = zlab.forward(z, tgt.embed, features(9, seed=1), mask_block(ANCHOR, BLOCK))[1:]
    assert (zlab.selector_walk(z, hidden, tgt.lm_head, ANCHOR) != zlab.argmax_chain(z, hidden, tgt.lm_head)).any()


def test_random_rows_walk(pair, tgt):
    """Rows need not come from a forward: the walk is a function of (rows, anchor) only."""
    native, z, _, _ = pair
    hidden = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    tokens, _ = native.chain(hidden, 123)
    assert_tokens_equal(tokens, zlab.selector_walk(z, hidden, tgt.lm_head, 123), "DFlash 2 walk on random rows")


@pytest.fixture(scope="module", params=["lucebox", "llama.cpp"])
def windowed(request, tmp_path_factory, tgt):
    """Qwen3.8-DFlash2 style: every layer sliding_attention, is_causal false (bidirectional), with a
    window (12) shorter than the context so that it cuts context keys; in both layouts."""
    cfg = dflash2_config(use_sliding_window=True, sliding_window=12, layer_types=["sliding_attention"] * 2)
    drafter = convert_drafter(tmp_path_factory.mktemp("dflash2_swa"), cfg, "dflash2", seed=8,
                              layout=request.param, target_model=tgt.gguf if request.param == "llama.cpp" else None)
    native = NativeDrafter(tgt.gguf, drafter.gguf)
    yield native, zlab.build(drafter.cfg, drafter.tensors, dflash2=True), nemo.build_dflash2(drafter.cfg, drafter.tensors), drafter
    native.close()


def test_upstream_layout_matches_zlab(tmp_path_factory, tgt):
    """The same weights converted to the llama.cpp `dflash` layout (flat keys, 1-based target_layers,
    attn_conv_base / selector_* names) load to the same drafter."""
    drafter = convert_drafter(tmp_path_factory.mktemp("dflash2_upstream"), dflash2_config(), "dflash2", seed=9,
                              layout="llama.cpp", target_model=tgt.gguf)
    z = zlab.build(drafter.cfg, drafter.tensors, dflash2=True)
    feats, block = features(10, seed=10), mask_block(ANCHOR, BLOCK)
    hidden = zlab.forward(z, tgt.embed, feats, block)
    with NativeDrafter(tgt.gguf, drafter.gguf) as native:
        assert (native.info["kind"], native.info["target_layer_ids"]) == (1, TAPS)
        assert_close(native.forward(feats, block), hidden, REL, "DFlash 2 hidden, llama.cpp layout")
        assert_tokens_equal(native.chain(hidden[1:], ANCHOR)[0], zlab.selector_walk(z, hidden[1:], tgt.lm_head, ANCHOR),
                            "DFlash 2 selector walk, llama.cpp layout")


def test_f16_file_matches_zlab(tmp_path_factory, tgt):
    """The default file type: matrices, conv projections and selector codebooks stored as F16
    (weights drawn f16-exact, so the oracle runs on the same values); the runtime's f16 matmul and
    codebook-row lookups must keep fp32 accuracy (f16 weights multiply fp32 activations as they are)."""
    drafter = convert_drafter(tmp_path_factory.mktemp("dflash2_f16"), dflash2_config(), "dflash2", seed=11,
                              outtype="f16")
    assert list(stored_types(drafter.gguf).values()).count("F16") >= 10
    z = zlab.build(drafter.cfg, drafter.tensors, dflash2=True)
    feats, block = features(10, seed=12), mask_block(ANCHOR, BLOCK)
    hidden = zlab.forward(z, tgt.embed, feats, block)
    with NativeDrafter(tgt.gguf, drafter.gguf) as native:
        assert_close(native.forward(feats, block), hidden, REL, "DFlash 2 hidden, f16 file")
        assert_tokens_equal(native.chain(hidden[1:], ANCHOR)[0], zlab.selector_walk(z, hidden[1:], tgt.lm_head, ANCHOR),
                            "DFlash 2 selector walk, f16 file")


# spec/drafters.md §1.5: a sliding layer keeps context keys with position > (a+j) - W whatever its
# in-block direction; the file records the window (pattern + sliding_window) and the direction
# (attention.causal = false) separately, so the bidirectional layers keep their window.
@pytest.mark.parametrize("n_ctx", [5, 30])
def test_bidirectional_sliding_window_matches_zlab_and_nemo(windowed, tgt, n_ctx):
    native, z, nm, _ = windowed
    assert native.info["kind"] == 1
    feats, block = features(n_ctx, seed=n_ctx), mask_block(ANCHOR, BLOCK)
    want = zlab.forward(z, tgt.embed, feats, block)
    assert_close(nemo.dflash2_forward(nm, tgt.embed, feats, block), want, REL, "NeMo vs z-lab (oracles disagree)")
    assert_close(native.forward(feats, block), want, REL, f"DFlash 2 hidden, bidirectional SWA, n_ctx {n_ctx}, window 12")


def test_bidirectional_window_is_described(windowed):
    """inspect reads the two facts the loader reads: window 12 on both layers, neither causal."""
    report = inspect_gguf(windowed[3].gguf)
    assert report.valid, [f.message for f in report.findings]
    assert (report.summary["sliding_window"], report.summary["in_block_causal"]) == (12, [False, False])


def test_old_bidirectional_file_loads_as_before(tmp_path, tgt):
    """A lucebox file written before attention.causal existed (no window keys for bidirectional
    layers) still loads, and runs as it always did: bidirectional without a window."""
    cfg = dflash2_config(use_sliding_window=True, sliding_window=12, layer_types=["sliding_attention"] * 2)
    drafter = convert_drafter(tmp_path, cfg, "dflash2", seed=8)
    old = rewrite(drafter.gguf, tmp_path / "old.gguf",
                  drop_kv={f"{ARCH}.attention.{k}" for k in ("causal", "sliding_window", "sliding_window_pattern")})
    unwindowed = zlab.build(cfg | {"use_sliding_window": False}, drafter.tensors, dflash2=True)
    feats, block = features(30, seed=30), mask_block(ANCHOR, BLOCK)
    with NativeDrafter(tgt.gguf, old) as native:
        assert_close(native.forward(feats, block), zlab.forward(unwindowed, tgt.embed, feats, block), REL,
                     "DFlash 2 hidden, earlier file without a window")


def test_bidirectional_window_is_distinguishable(windowed, tgt):
    """Fixture strength: past the window, dropping it (the old file's reading) or running the
    sliding layers causal (Lucebox's reading of a bare pattern) each moves the reference far
    beyond the tolerance, so the test above pins both the window and the direction."""
    _, z, _, drafter = windowed
    feats, block = features(30, seed=30), mask_block(ANCHOR, BLOCK)
    want = zlab.forward(z, tgt.embed, feats, block)
    for name, change in [("no window", {"layer_types": ["full_attention"] * 2, "use_sliding_window": False}),
                         ("causal", {"is_causal": True})]:
        other = zlab.build(drafter.cfg | change, drafter.tensors, dflash2=True)
        assert np.abs(zlab.forward(other, tgt.embed, feats, block) - want).max() > 100 * REL, name


# spec/drafters.md §2.2: the unary logits are scaled by `output_multiplier`, then soft-capped
# (tanh(x / cap) * cap), before the top-k and the walk (Muse-Glimmer sets 0.196 / 20); z-lab's
# compute_logits applies both. The test first checks, on the oracle alone, that the two knobs
# change the walk for these weights (so equality means the runtime applied them).
def test_logit_multiplier_and_softcap_match_zlab(tmp_path_factory, tgt):
    cfg = dflash2_config()
    cfg["dflash_config"] |= {"output_multiplier": 8.0, "final_logit_softcapping": 5.0}
    drafter = convert_drafter(tmp_path_factory.mktemp("dflash2_softcap"), cfg, "dflash2", seed=7)
    z = zlab.build(drafter.cfg, drafter.tensors, dflash2=True)
    hidden = zlab.forward(z, tgt.embed, features(9, seed=1), mask_block(ANCHOR, BLOCK))[1:]
    want = zlab.selector_walk(z, hidden, tgt.lm_head, ANCHOR)
    untransformed = zlab.build(dflash2_config(), drafter.tensors, dflash2=True)
    assert (zlab.selector_walk(untransformed, hidden, tgt.lm_head, ANCHOR) != want).any()  # the knobs matter here
    with NativeDrafter(tgt.gguf, drafter.gguf) as native:
        assert_tokens_equal(native.chain(hidden, ANCHOR)[0], want, "DFlash 2 walk with multiplier 8, softcap 5")


@pytest.mark.parametrize("key, value", [("output_multiplier", 0.0), ("output_multiplier", float("inf")),
                                        ("final_logit_softcapping", -1.0), ("final_logit_softcapping", float("nan"))])
def test_loader_refuses_bad_logit_scalars(tmp_path, ref, tgt, key, value):
    """The runtime applies the same rule as inspect (finite, > 0): a cap of 0 would divide by zero."""
    name = f"qwen35-dflash-draft.dflash.dflash2.{key}"
    path = rewrite(ref[0].gguf, tmp_path / "bad.gguf", set_kv={name: (value, F32)})
    with pytest.raises(LuceError, match=f"{name}=.* must be finite and > 0"):
        NativeDrafter(tgt.gguf, path)
