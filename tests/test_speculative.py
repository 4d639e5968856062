"""Speculative decoding on the CPU backend: the lossless invariant (greedy tokens with a drafter ==
greedy tokens without it) for every drafter kind, block sizes 2 .. 2x checkpoint, several prompt
lengths and a long generation; rejection sampling's output distribution (chi-square against the
target's own softmax); refusals before any compute.

Drafters with random weights rarely propose the target's token, so on their own they only test
rollback after 0 accepted. The `oracle_tokens` test hook (luce.h) replaces proposals with a
known continuation, corrupted at chosen places, while the drafter still runs: long accepted runs,
full-block accepts and rejections at every slot then all occur, and the tests assert from the
stats that they did.
"""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.rejection_check import chi_square_pvalue, draw_pairs, expected_pairs
from fixtures.spec_pair import build_pair, informed_dspark
from luce import Engine, LuceError

PROMPTS = {
    "one": [7],
    "short": [1, 2, 3, 4, 5, 6, 7],
    "long": [int(t) for t in np.random.default_rng(5).integers(0, 500, 600)],  # prefill chunks of 512 and 88
}
CKPT_BLOCK = {"dflash": 8, "dflash_swa": 8, "dflash2": 8, "dflash2_upstream": 8, "dflash2_logit_scalars": 8,
              "dspark": 7, "dspark_hidden_conf": 7}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="module")
def plain(pair):
    """Greedy references from the target alone: (prompt name, n) -> tokens."""
    with Engine(pair.target, threads=1) as eng:
        return {name: eng.generate(prompt_ids=ids, max_tokens=240, ignore_eos=True).tokens
                for name, ids in PROMPTS.items()}


def _spec(pair, name, prompt, n, **kw):
    with Engine(pair.target, threads=1, draft=pair.drafters[name]) as eng:
        return eng.generate(prompt_ids=PROMPTS[prompt], max_tokens=n, ignore_eos=True, **kw)


@pytest.mark.parametrize("name", list(CKPT_BLOCK))
def test_random_drafter_is_lossless_at_every_block_size(pair, plain, name):
    ckpt = CKPT_BLOCK[name]
    with Engine(pair.target, threads=1, draft=pair.drafters[name]) as eng:
        for block in (2, ckpt, 2 * ckpt):
            for prompt in PROMPTS:
                g = eng.generate(prompt_ids=PROMPTS[prompt], max_tokens=40, ignore_eos=True,
                                 draft_block_size=block, adaptive=False)
                assert g.tokens == plain[prompt][:40], (name, block, prompt)
                assert g.stats["spec_steps"] > 0 and g.stats["block_size"] == block
                # Each spec step commits its accepted drafts plus one bonus token.
                assert g.stats["n_accepted"] + g.stats["spec_steps"] + g.stats["plain_steps"] + 1 == 40


def _corrupt(tokens, every, offset):
    """The reference continuation with every `every`-th token (from `offset`) replaced."""
    out = list(tokens)
    for i in range(offset, len(out), every):
        out[i] = (out[i] + 1) % 500
    return out


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark", "dflash_swa"])
def test_oracle_proposals_long_runs_full_blocks_and_rollbacks(pair, plain, name):
    """240 tokens with proposals that are right except at a few places: accepted runs reach the
    whole block, some steps accept nothing (a wrong first proposal), others stop mid-block
    (DeltaNet rollback to a middle row) — and the output is still exactly the plain greedy one."""
    ref = plain["short"]
    rows = CKPT_BLOCK[name] if name.startswith("dspark") else CKPT_BLOCK[name] - 1
    for block, oracle in ((None, _corrupt(ref, 23, 9)), (2 * CKPT_BLOCK[name], _corrupt(ref, 11, 1))):
        g = _spec(pair, name, "short", 240, adaptive=False, oracle_tokens=oracle,
                  draft_block_size=block or 0)
        assert g.tokens == ref
        s = g.stats
        assert s["full_accept_steps"] > 0, s
        assert s["zero_accept_steps"] > 0, s
        partial = s["spec_steps"] - s["full_accept_steps"] - s["zero_accept_steps"]
        assert partial > 0, s
        if block is None:
            assert s["max_accepted"] == rows
            assert s["tau"] > 3
    assert s["max_accepted"] >= rows  # 2x the checkpoint: longer runs than the horizon


def test_dspark_confidence_gate_cuts_chains_and_stays_lossless(pair, plain):
    ref = plain["short"][:60]
    ungated = _spec(pair, "dspark", "short", 60, adaptive=False)
    gated = _spec(pair, "dspark", "short", 60, adaptive=False, dspark_confidence_threshold=0.99)
    oracle = _spec(pair, "dspark", "short", 60, adaptive=False, dspark_confidence_threshold=0.99,
                   oracle_tokens=ref)
    assert ungated.tokens == gated.tokens == oracle.tokens == ref
    # Random confidence heads sit near sigmoid(0) = 0.5: a 0.99 gate cuts every chain at slot 0.
    assert ungated.stats["n_drafted"] > 0
    assert gated.stats["n_drafted"] == 0 and oracle.stats["n_drafted"] == 0
    # A gate below every confidence changes nothing.
    loose = _spec(pair, "dspark", "short", 60, adaptive=False, dspark_confidence_threshold=1e-6)
    assert loose.stats["n_drafted"] == ungated.stats["n_drafted"]


def test_adaptive_policy_falls_back_to_plain_decoding_losslessly(pair, plain):
    g = _spec(pair, "dflash", "short", 120)
    assert g.tokens == plain["short"][:120]
    s = g.stats
    # A random drafter commits ~1 token per spec step, which never pays: after calibration (3 plain
    # steps, 1 spec step) decoding is plain, with rare probes (tests/test_spec_policy.py bounds them).
    assert s["plain_steps"] >= 60 and s["spec_steps"] >= 1, s
    assert s["step_cost_ratio"] > 0 and s["plain_step_seconds"] > 0 and s["spec_step_seconds"] > 0


def test_adaptive_policy_also_falls_back_in_sampled_runs(pair, plain):
    """Plain steps draw from p like everything else, so sampled runs fall back too. Top-k 1 makes
    the sampler greedy: the tokens must be the plain greedy ones, plain steps and probes included."""
    g = _spec(pair, "dflash", "short", 120, temperature=0.8, top_k=1, seed=4)
    assert g.tokens == plain["short"][:120]
    assert g.stats["plain_steps"] >= 60 and g.stats["spec_steps"] >= 1


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark"])
def test_adaptive_policy_is_lossless_whatever_it_chooses(pair, plain, name):
    """Oracle proposals (right except every 13th token) make speculation pay or not depending on
    this machine's step costs; either way the output is plain decoding's, and the policy measured
    both step kinds."""
    ref = plain["short"]
    for block in (0, 2 * CKPT_BLOCK[name]):
        g = _spec(pair, name, "short", 240, oracle_tokens=_corrupt(ref, 13, 5), draft_block_size=block)
        assert g.tokens == ref, (name, block)
        s = g.stats
        assert s["plain_steps"] >= 3 and s["spec_steps"] >= 1, s
        assert s["step_cost_ratio"] == pytest.approx(s["spec_step_seconds"] / s["plain_step_seconds"])
    no_adaptive = _spec(pair, name, "short", 240, oracle_tokens=_corrupt(ref, 13, 5), adaptive=False)
    assert no_adaptive.tokens == ref and no_adaptive.stats["plain_steps"] <= 1
    assert no_adaptive.stats["step_cost_ratio"] == 0


def test_long_context_cap_narrows_the_verify_width(pair, plain):
    ref = plain["short"][:80]
    g = _spec(pair, "dflash", "short", 80, adaptive=False, oracle_tokens=ref, draft_block_size=16,
              verify_cap_from=1)
    assert g.tokens == ref
    assert g.stats["max_accepted"] == 7  # width max(8, 16/2) = 8 rows: anchor + 7 proposals
    wide = _spec(pair, "dflash", "short", 80, adaptive=False, oracle_tokens=ref, draft_block_size=16,
                 verify_cap_from=-1)
    assert wide.tokens == ref and wide.stats["max_accepted"] == 15


def test_layouts_give_the_same_drafter(pair, plain):
    """The llama.cpp-layout file of the same DFlash 2 checkpoint drafts the same tokens."""
    a = _spec(pair, "dflash2", "long", 50, adaptive=False)
    b = _spec(pair, "dflash2_upstream", "long", 50, adaptive=False)
    assert a.tokens == b.tokens == plain["long"][:50]
    assert {k: a.stats[k] for k in ("n_drafted", "n_accepted")} == \
           {k: b.stats[k] for k in ("n_drafted", "n_accepted")}


# ---- DDTree ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dflash", "dflash2", "dflash2_logit_scalars", "dspark", "dflash_swa"])
def test_ddtree_is_lossless(pair, plain, name):
    """Tree verification: every node sees only its ancestors, DeltaNet runs each node from its
    parent's state, the accepted path's K/V move to consecutive slots. Random drafters (wide
    trees, K = 8 when the budget exceeds the depth, short paths) and the oracle continuation on
    the tree's first-child chain (deep paths) must all give the plain greedy tokens."""
    ref = plain["short"][:150]
    wide = 2 * CKPT_BLOCK[name]
    with Engine(pair.target, threads=1, draft=pair.drafters[name]) as eng:
        for budget, block, oracle in ((22, 0, None), (40, wide, None), (4, 0, _corrupt(ref, 13, 5)),
                                      (22, 0, _corrupt(ref, 13, 5)), (9, wide, _corrupt(ref, 17, 3))):
            g = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=150, ignore_eos=True, ddtree=True,
                             ddtree_budget=budget, draft_block_size=block, adaptive=False, oracle_tokens=oracle)
            assert g.tokens == ref, (budget, block, oracle is not None)
            s = g.stats
            if budget > 2 * CKPT_BLOCK[name]:  # wide tree: more nodes verified than a chain holds
                assert s["n_drafted"] > s["spec_steps"] * (CKPT_BLOCK[name] - 1)
            if oracle is not None:  # accepted paths of several nodes; chain-shaped trees to the bottom
                assert s["max_accepted"] >= (budget if budget <= CKPT_BLOCK[name] - 1 else 2), s
    long = _spec(pair, name, "long", 60, ddtree=True, adaptive=False)
    assert long.tokens == plain["long"][:60]


# ---- sampling ----------------------------------------------------------------------------------

# "informed": a DSpark drafter built from the target's own next-token distributions (q close to p,
# not equal), so proposals are accepted often AND rejected often: a wrong residual would show.
# The random DSpark / DFlash drafters' q barely overlaps the target's top-3; the random DFlash 2
# selector's 8 candidates miss it entirely (the residual branch alone runs). Top-k 3 puts p and q
# on the backend's candidates; a nucleus without top-k keeps them whole rows (DFlash 2's q is its
# selector's candidates either way).
TOP_K3 = (1.0, 3, 1.0)   # temperature, top-k, top-p
NUCLEUS = (0.35, 0, 0.5)


@pytest.mark.parametrize("ddtree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("name,setting", [(n, TOP_K3) for n in ("informed", "dspark", "dflash2",
                                                                 "dflash2_logit_scalars", "dflash")]
                         + [(n, NUCLEUS) for n in ("informed", "dspark", "dflash2", "dflash")],
                         ids=lambda v: v if isinstance(v, str) else "top_k=3" if v == TOP_K3 else "top_p=0.5")
def test_sampled_tokens_follow_the_target_distribution(pair, name, setting, ddtree, tmp_path):
    """(t0, t1) drawn with the drafter must be distributed as the target's own p(t0) p(t1|t0) at
    the run's sampler setting (fixtures/rejection_check.py): chain rejection sampling, or a tree
    walked by the target's own draws."""
    prompt, draws = PROMPTS["short"], 2000
    temperature, top_k, top_p = setting
    draft = (informed_dspark(tmp_path, pair.target, prompt, top_k, temperature, top_p) if name == "informed"
             else pair.drafters[name])
    with Engine(pair.target, threads=1, draft=draft) as eng:
        counts, accepted, rejected = draw_pairs(eng, prompt, setting, draws, ddtree=ddtree)
        expected = expected_pairs(eng, prompt, setting, draws)
    assert set(counts) <= set(expected), set(counts) - set(expected)
    pvalue, cells = chi_square_pvalue(counts, expected)
    assert pvalue > 1e-3, (pvalue, cells)
    if name == "informed":  # both branches of the rejection sampler ran many times
        assert accepted > draws // 5 and rejected > draws // 20, (accepted, rejected)
    else:  # random drafters: the residual branch runs (their top-3 proposals rarely meet p's)
        assert rejected > 0


# Proposals are drawn from the target sampler's own distribution over the drafter's scores: with a
# top-k of 1 (or a nucleus too small to hold two tokens) q is one-hot on the drafter's best token
# and p on the target's, so a sampled run must be the greedy run: the same tokens AND the same
# accepted drafts, step for step. Had q ignored the truncation, drafts would be random draws, and
# the informed drafter (whose first proposal is the target's argmax with q ~ 0.9) would lose some.
@pytest.mark.parametrize("ddtree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}], ids=["top_k=1", "top_p=1e-6"])
def test_one_token_truncation_makes_sampled_drafting_greedy(pair, tmp_path, truncation, ddtree):
    prompt = PROMPTS["short"]
    drafters = dict(pair.drafters, informed=informed_dspark(tmp_path, pair.target, prompt, 1, 1.0))
    for name in ("informed", "dflash", "dflash2", "dspark"):
        with Engine(pair.target, threads=1, draft=drafters[name]) as eng:
            greedy = eng.generate(prompt_ids=prompt, max_tokens=12, ignore_eos=True, adaptive=False, ddtree=ddtree)
            for seed in range(40 if name == "informed" else 3):
                g = eng.generate(prompt_ids=prompt, max_tokens=12, ignore_eos=True, adaptive=False, ddtree=ddtree,
                                 temperature=1.0, seed=seed, **truncation)
                assert g.tokens == greedy.tokens, (name, seed)
                assert (g.stats["n_drafted"], g.stats["n_accepted"]) == \
                    (greedy.stats["n_drafted"], greedy.stats["n_accepted"]), (name, seed)
        if name == "informed":
            assert greedy.stats["n_accepted"] > 0  # the first proposal is taken


# ---- refusals ----------------------------------------------------------------------------------

def test_bad_block_size_is_refused_with_the_rule(pair):
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        for bad in (1, 17, -3):
            with pytest.raises(LuceError, match=r"--draft-block-size must be in \[2, 16\].*got"):
                eng.generate(prompt_ids=[1, 2], max_tokens=4, draft_block_size=bad)


def test_ddtree_budget_is_checked(pair):
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        with pytest.raises(LuceError, match="--ddtree-budget must be in 1..63"):
            eng.generate(prompt_ids=[1, 2], max_tokens=4, ddtree=True, ddtree_budget=64)


def test_mismatched_pair_is_refused_before_compute(pair, tmp_path):
    from fixtures.random_qwen35_gguf import K_QUANT_TINY, write_random_qwen35

    other = write_random_qwen35(tmp_path / "hidden256.gguf", K_QUANT_TINY)
    with pytest.raises(LuceError, match="drafter hidden 64 != target hidden 256"):
        Engine(other, threads=1, draft=pair.drafters["dflash"])


def test_native_loader_refuses_a_mismatched_pair_on_its_own(pair, tmp_path):
    """Without the Python inspect pass the native loader still refuses, before any compute."""
    from fixtures.random_qwen35_gguf import K_QUANT_TINY, write_random_qwen35
    from luce.binding import ffi, lib

    other = write_random_qwen35(tmp_path / "hidden256.gguf", K_QUANT_TINY)
    with Engine(other, threads=1) as eng:
        out = ffi.new("luce_drafter **")
        status = lib().luce_drafter_load(str(pair.drafters["dspark"]).encode(), eng._model, out)
        assert status == 1 and out[0] == ffi.NULL
        assert "hidden 64 != target hidden 256" in ffi.string(lib().luce_last_error()).decode()


def test_not_a_drafter_is_refused(pair):
    with pytest.raises(LuceError, match="not a drafter"):
        Engine(pair.target, threads=1, draft=pair.target)


# ---- stop ids and streaming ----------------------------------------------------------------------

def _native_generate(eng, prompt, n, stop_ids, oracle, on_tokens=None):
    """luce_generate with an explicit stop list (Engine uses the tokenizer's end-of-generation ids)."""
    from luce.binding import check, ffi, lib

    stop = ffi.new("int32_t[]", stop_ids)
    orc = ffi.new("int32_t[]", oracle)
    params = ffi.new("luce_generate_params *", {"max_tokens": n, "top_p": 1.0, "stop_ids": stop,
                                                "n_stop_ids": len(stop_ids), "no_adaptive": 1,
                                                "oracle_tokens": orc, "n_oracle_tokens": len(oracle)})
    out, stats = ffi.new("int32_t[]", n), ffi.new("luce_generate_stats *")
    cb = ffi.NULL
    if on_tokens is not None:
        cb = ffi.callback("int32_t(void *, const int32_t *, int32_t)",
                          lambda _u, toks, k: on_tokens([toks[i] for i in range(k)]) or 0)
    ids = ffi.new("int32_t[]", prompt)
    check(lib().luce_session_reset(eng._session))
    check(lib().luce_generate(eng._session, eng._drafter, ids, len(prompt), params, cb, ffi.NULL, out, n, stats))
    return [out[i] for i in range(stats.n_generated)], stats


def test_stop_id_inside_an_accepted_run_ends_generation_there(pair, plain):
    """The stop token is committed in the middle of a fully accepted block: output ends right
    before it, as in plain decoding, and the streamed batches add up to the output."""
    ref = plain["short"]
    i = next(k for k in range(12, len(ref)) if ref[k] not in ref[:k])  # first occurrence of its token
    streamed = []
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        tokens, st = _native_generate(eng, PROMPTS["short"], 60, [ref[i]], ref, streamed.extend)
    assert tokens == ref[:i] == streamed
    assert st.stopped_by_eos == 1 and st.max_accepted == 7


def test_speculative_generation_needs_an_empty_session(pair):
    """The drafter context must hold every committed position's features: a session that already
    holds a prefix is refused (the plain loop accepts it)."""
    from luce.binding import ffi, lib

    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"]) as eng:
        eng.logits([1, 2, 3])  # leaves 3 positions in the session
        params = ffi.new("luce_generate_params *", {"max_tokens": 4, "top_p": 1.0})
        out, ids = ffi.new("int32_t[]", 4), ffi.new("int32_t[]", [4, 5])
        status = lib().luce_generate(eng._session, eng._drafter, ids, 2, params, ffi.NULL, ffi.NULL, out, 4,
                                     ffi.NULL)
        assert status == 1 and "empty session" in ffi.string(lib().luce_last_error()).decode()


@pytest.mark.parametrize("cache", [dict(kv_cache="f16"), dict(kv_cache="q8_0", kv_rotate=True),
                                   dict(cache_type_k="q4_0", cache_type_v="q8_0")])
def test_narrow_kv_cache_chain_and_tree(pair, cache):
    """With an f16, q8_0 (K rotated) or q4_0/q8_0 attention cache, speculative output equals plain
    output on the same cache (tree commits move rows of each type's size)."""
    prompt = PROMPTS["short"]
    with Engine(pair.target, threads=1, **cache) as eng:
        ref = eng.generate(prompt_ids=prompt, max_tokens=80, ignore_eos=True).tokens
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash2"], **cache) as eng:
        oracle = _corrupt(ref, 11, 4)
        chain = eng.generate(prompt_ids=prompt, max_tokens=80, ignore_eos=True, adaptive=False, oracle_tokens=oracle)
        tree = eng.generate(prompt_ids=prompt, max_tokens=80, ignore_eos=True, adaptive=False, oracle_tokens=oracle,
                            ddtree=True, ddtree_budget=30)
    assert chain.tokens == tree.tokens == ref
    assert tree.stats["max_accepted"] >= 2


@pytest.mark.parametrize("config", [dict(kv_cache="q8_0", kv_rotate=True), dict(fa_window=64),
                                    dict(cache_type_k="q4_0", cache_type_v="q8_0", kv_rotate=True, fa_window=96)],
                         ids=["q8_0-rotated", "fa-window", "q4_0-q8_0-rotated-fa-window"])
@pytest.mark.filterwarnings("ignore:the prompt .* outgrows fa_window")  # its own test: test_fa_window.py
def test_long_context_verify_cap_with_cache_types_and_window(pair, config):
    """The long-context verify cap (here from the first step) under a quantized, rotated cache
    and a window narrower than the 600-token prompt: speculative output equals plain output of
    the same engine settings, and the cap held each verify to 8 rows (anchor + 7) while the
    drafter drafted its block of 16."""
    prompt = PROMPTS["long"]
    with Engine(pair.target, threads=1, **config) as eng:
        ref = eng.generate(prompt_ids=prompt, max_tokens=60, ignore_eos=True).tokens
    with Engine(pair.target, threads=1, draft=pair.drafters["dflash"], **config) as eng:
        g = eng.generate(prompt_ids=prompt, max_tokens=60, ignore_eos=True, adaptive=False, draft_block_size=16,
                         verify_cap_from=1, oracle_tokens=ref)
    assert g.tokens == ref
    assert g.stats["max_accepted"] == 7 and g.stats["block_size"] == 16


def test_tree_fits_a_tight_context(pair, plain):
    """The context holds exactly prompt + max_tokens: the tree shrinks near the end instead of
    writing cache slots past it."""
    prompt = PROMPTS["short"]
    with Engine(pair.target, threads=1, ctx_size=len(prompt) + 30, draft=pair.drafters["dflash2"]) as eng:
        g = eng.generate(prompt_ids=prompt, max_tokens=30, ignore_eos=True, ddtree=True, ddtree_budget=40,
                         adaptive=False, oracle_tokens=plain["short"])
    assert g.tokens == plain["short"][:30]
