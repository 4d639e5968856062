"""The reference drafters' modules against z-lab's `dflash` package and against invariants.

Oracle: dflash 0.1.0 (z-lab; installed --no-deps by `make build`), whose DFlashDraftModel and
DFlash2DraftModel load OUR saved checkpoints and must compute the same hidden states and the
same greedy selector walk. Invariants: identity inits, packed training layout == decode."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # models/ is a repo folder, not part of the wheel

from models import drafters as dr  # noqa: E402
from models.train_drafters import acceptance, gold, losses, target_pass, walk  # noqa: E402

H, V = 64, 300


def shape(kind: str, block: int = 8) -> dr.DrafterShape:
    return dr.DrafterShape(kind=kind, hidden=H, intermediate=96, layers=2, heads=4, kv_heads=2,
                           head_dim=16, block_size=block, target_layer_ids=(1, 2),
                           num_target_layers=4, vocab=V, mask_token_id=V - 1,
                           selector_rank=8, selector_top_k=6, markov_rank=8)


def randomized(kind: str, seed: int = 0) -> dr.Drafter:
    """A drafter whose every parameter (identity-initialised convs and codebooks too) matters."""
    torch.manual_seed(seed)
    m = dr.Drafter(shape(kind), H)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_saved_checkpoint_matches_zlab_dflash_package(kind, tmp_path):
    dflash = pytest.importorskip("dflash")  # installed by make build; absent only by hand
    ours = randomized(kind)
    dr.save(ours, tmp_path)
    ours = dr.load(tmp_path, H).eval()   # bf16 round trip: compare the weights as stored
    cls = dflash.DFlash2DraftModel if kind == "dflash2" else dflash.DFlashDraftModel
    oracle = cls.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ctx_len, block = 11, 8
    taps = torch.randn(1, ctx_len, 2 * H)
    emb = torch.randn(1, block, H)
    pos = torch.arange(ctx_len + block)[None]
    with torch.no_grad():
        ref = oracle(position_ids=pos, noise_embedding=emb, target_hidden=taps)
        got = ours(emb, ours.context(taps), pos[:, ctx_len:], pos, None, block)
    diff = (ref - got).abs().max().item()
    assert diff < 1e-4, f"max |diff| {diff:.2e}; first values {ref[0, 0, :4]} vs {got[0, 0, :4]}"
    if kind == "dflash2":  # greedy selector walk, anchor = predecessor of slot 1
        lm_head = torch.nn.Linear(H, V, bias=False)
        anchor = torch.tensor([17])
        with torch.no_grad():
            h = got[:, 1:]
            want, _, _ = oracle.candidate_selector.select(h, lm_head(h), anchor, 0.0)
            sel, prev, mine = ours.candidate_selector, anchor, []
            for j in range(h.shape[1]):
                unary, cand = lm_head(h[:, j]).topk(sel.top_k, -1)
                prev = cand.gather(-1, sel.scores(h[:, j], unary, cand, prev).argmax(-1, keepdim=True))[:, 0]
                mine.append(prev)
        assert torch.stack(mine, 1).tolist() == want.tolist()


def test_checkpoint_layouts_are_the_release_layouts(tmp_path):
    from safetensors import safe_open
    layer = ["input_layernorm.weight", "post_attention_layernorm.weight",
             "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    conv = ["attention_conv.base_kernel", "attention_conv.kernel_projection.weight",
            "mlp_conv.base_kernel", "mlp_conv.kernel_projection.weight"]
    extra = {"dflash": [], "dflash2": ["candidate_selector.predecessor_codebook",
                                       "candidate_selector.successor_codebook",
                                       "candidate_selector.hidden_projection.weight"],
             "dspark": ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                        "confidence_head.proj.weight", "confidence_head.proj.bias"]}
    for kind in dr.KINDS:
        dr.save(randomized(kind), tmp_path / kind)
        with safe_open(str(tmp_path / kind / "model.safetensors"), "pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
        per_layer = layer + (conv if kind == "dflash2" else [])
        want = {"fc.weight", "hidden_norm.weight", "norm.weight", *extra[kind]}
        want |= {f"layers.{i}.{n}" for i in range(2) for n in per_layer}
        assert set(shapes) == want, kind
        assert dtypes == {"BF16"}
        assert shapes["fc.weight"] == (H, 2 * H)                # [H, n_taps * H_t]
        cfg = json.loads((tmp_path / kind / "config.json").read_text())
        assert cfg["architectures"] == [dr.ARCHITECTURE[kind]]
        assert cfg["dflash_config"]["mask_token_id"] == V - 1
        assert cfg["dflash_config"]["target_layer_ids"] == [1, 2]
        if kind == "dflash":
            assert cfg["block_size"] == 8 and cfg["num_target_layers"] == 4
        if kind == "dflash2":
            assert cfg["is_causal"] is False
            assert shapes["layers.0.attention_conv.base_kernel"] == (2, 2, H)
            assert shapes["layers.0.attention_conv.kernel_projection.weight"] == (2 * 2 * H // 16, H)
            assert shapes["candidate_selector.successor_codebook"] == (V, 8)
            assert shapes["candidate_selector.hidden_projection.weight"] == (8, H)
        if kind == "dspark":
            assert shapes["markov_head.markov_w1.weight"] == (V, 8)
            assert shapes["markov_head.markov_w2.weight"] == (V, 8)
            assert shapes["confidence_head.proj.weight"] == (1, H + 8)
            assert cfg["markov_rank"] == 8 and cfg["block_size"] == 8


def test_warm_started_dflash2_equals_its_dflash_parent():
    """Identity inits (spec §2.1/§2.2): conv taps (1, 0), projection 0, successor codebook 0."""
    parent = randomized("dflash")
    child = dr.warm_start(dr.Drafter(shape("dflash2"), H), parent).eval()
    taps, emb = torch.randn(2, 9, 2 * H), torch.randn(2, 8, H)
    pos = torch.arange(17).expand(2, -1)
    with torch.no_grad():
        a = parent(emb, parent.context(taps), pos[:, 9:], pos, None, 8)
        b = child(emb, child.context(taps), pos[:, 9:], pos, None, 8)
        unary, cand = torch.randn(2, 6), torch.randint(0, V, (2, 6))
        scores = child.candidate_selector.scores(b[:, 0], unary, cand, torch.tensor([3, 4]))
    assert torch.equal(a, b)
    assert torch.equal(scores, unary)


def test_packed_blocks_score_like_one_decode_call_per_anchor():
    """Training packs many anchors against the full sequence with a mask; each block must see
    exactly what decode gives it: context rows strictly before its anchor, its own rows."""
    m = randomized("dflash2")
    torch.manual_seed(1)
    n, length, block = 2, 30, 8
    ids = torch.randint(0, V - 1, (n, length))
    taps = torch.randn(n, length, 2 * H)
    emb_table = torch.randn(V, H)
    anchors = torch.tensor([[3, 12, 20], [1, 9, 21]])
    block_ids, q_pos, k_pos, visible = dr.packed_blocks(ids, anchors, block, V - 1)
    with torch.no_grad():
        packed = m(emb_table[block_ids], m.context(taps), q_pos, k_pos, visible, block)
        packed = packed.view(n, 3, block, H)
        for i in range(n):
            for j, a in enumerate(anchors[i].tolist()):
                blk = torch.full((1, block), V - 1)
                blk[0, 0] = ids[i, a]
                pos = torch.arange(a + block)[None]
                one = m(emb_table[blk], m.context(taps[i:i + 1, :a]), pos[:, a:], pos, None, block)
                diff = (one[0] - packed[i, j]).abs().max().item()
                assert diff < 1e-5, (i, a, diff)


def test_dspark_markov_bias_is_w2_of_w1_row():
    m = randomized("dspark")
    prev = torch.tensor([5, 7])
    mh = m.markov_head
    with torch.no_grad():
        got = mh.markov_w2(mh.markov_w1(prev))
    want = mh.markov_w1.weight[prev] @ mh.markov_w2.weight.T   # (2, r) @ (r, V)
    assert torch.allclose(got, want, atol=1e-6)


def test_walk_follows_the_greedy_speculative_loop():
    # anchor 0 accepts 2 drafts (commits 3: the anchor's block plus the bonus), so the next
    # anchor is offset 3; it accepts 0 -> offset 4; accepts 5 -> offset 10, past the end.
    assert walk([2, 9, 9, 0, 5, 9, 9, 9, 9, 9]) == [3, 1, 6]
    assert walk([0, 0, 0]) == [1, 1, 1]


def tiny_target(vocab: int):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 0], "mrope_interleaved": True})
    return Qwen3_5ForCausalLM(cfg).eval().requires_grad_(False)


def test_gold_labels_follow_each_kinds_slot_meaning():
    ids = torch.arange(100)[None] * 3
    anchors = torch.tensor([[10, 40]])
    assert gold(ids, anchors, 4, 0)[0, 0].tolist() == [30, 33, 36, 39]     # DFlash: slot j -> a+j
    assert gold(ids, anchors, 4, 1)[0, 1].tolist() == [123, 126, 129, 132]  # DSpark: slot j -> a+j+1
    assert (shape("dflash").first_slot, shape("dflash").label_shift) == (1, 0)
    assert (shape("dspark").first_slot, shape("dspark").label_shift) == (0, 1)


def test_dspark_next_token_slots_through_losses_and_acceptance():
    """A DSpark whose backbone output is zeroed and whose Markov head encodes "next = prev + 1"
    is a perfect drafter for a counting sequence IF slot j is scored against position p+j+1 and
    the chain starts at the anchor: CE ~ 0 and the greedy walk accepts every draft
    (tau = B + 1). A same-position misalignment would give CE ~ 100 and tau 1."""
    v, b = 40, 5
    target = tiny_target(v)
    s = dr.DrafterShape(kind="dspark", hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1,
                        head_dim=16, block_size=b, target_layer_ids=(1, 2), num_target_layers=4,
                        vocab=v, mask_token_id=v - 1, markov_rank=v)
    m = dr.Drafter(s, 32)
    with torch.no_grad():
        m.norm.weight.zero_()                                   # h = 0 -> lm_head(h) = 0
        m.markov_head.markov_w1.weight.copy_(torch.eye(v))
        nxt = (torch.arange(v) + 1) % (v - 1)                   # successor in the counting alphabet
        w2 = torch.zeros(v, v)
        w2[nxt, torch.arange(v)] = 100.0                        # bias(prev) = 100 * onehot(prev+1)
        m.markov_head.markov_w2.weight.copy_(w2)
    seqs = (torch.randint(0, v - 1, (3, 1)) + torch.arange(40)) % (v - 1)
    feats, tgt_logits = target_pass(target, seqs, s.target_layer_ids, True)
    anchors = torch.tensor([[3, 10, 20]] * 3)
    with torch.no_grad():
        parts = losses(m, target, seqs, feats, tgt_logits, anchors, 4.0)
    assert parts["ce"].item() < 1e-3
    acc = acceptance(m, target, seqs, 8, 16)
    assert acc["tau"] == b + 1 and acc["acceptance_rate"] == 1.0


def test_regenerated_data_is_the_targets_plain_greedy_decoding():
    """generate() with the hybrid cache (what the pipeline uses) and the cache-free fallback
    (full recomputation per token) produce the same tokens: the drafters train on exactly the
    target's greedy continuations."""
    from models.train_drafters import _greedy_no_cache, greedy_continue
    target = tiny_target(50)
    prompts = torch.randint(0, 49, (3, 7))
    assert torch.equal(greedy_continue(target, prompts, 10, 3), _greedy_no_cache(target, prompts, 10))


def test_dflash_tau_walk_with_a_drafter_handed_the_answer(monkeypatch):
    """A DFlash whose drafts are the true tokens p+1..p+B-1 must reach tau = B with every draft
    accurate; one that gets only its first k drafts right, tau = k + 1; one that drafts the
    token AT p+d instead of p+1+d (a same-position slip) on a sequence without repeats, tau = 1.
    Checks acceptance()'s gold alignment and walk for the DFlash kinds (the DSpark walk is
    checked above through a real Markov head)."""
    import models.train_drafters as td
    b, k = 8, 3
    m = dr.Drafter(shape("dflash", b), H)
    seqs = torch.stack([torch.randperm(V - 1)[:60] for _ in range(2)])     # no repeated token
    monkeypatch.setattr(td, "target_pass", lambda *a, **kw: (None, None))

    def drafter_from(shift, right):
        def drafts(drafter, target, ids, feats, anchors):
            d = gold(ids, anchors, b - 1, shift).clone()
            d[..., right:] = V - 1                                         # never a gold token
            return d
        return drafts

    monkeypatch.setattr(td, "greedy_drafts", drafter_from(1, b - 1))
    acc = acceptance(m, None, seqs, 8, 32)
    assert acc["tau"] == b and acc["draft_accuracy"] == [1.0] * (b - 1)
    monkeypatch.setattr(td, "greedy_drafts", drafter_from(1, k))
    acc = acceptance(m, None, seqs, 8, 32)
    assert acc["tau"] == k + 1 and acc["draft_accuracy"] == [1.0] * k + [0.0] * (b - 1 - k)
    monkeypatch.setattr(td, "greedy_drafts", drafter_from(0, b - 1))
    assert acceptance(m, None, seqs, 8, 32)["tau"] == 1.0
