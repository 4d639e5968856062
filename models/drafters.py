"""DFlash, DFlash 2 and DSpark drafters as plain PyTorch modules, and their release checkpoints.

One backbone for the three kinds (spec/drafters.md §1-§3):
  ctx   = hidden_norm(fc(concat_L h_L))            target taps h_L = HF hidden_states[L+1]
  block = [anchor, MASK x (B-1)] embedded by the TARGET's embed_tokens, at positions p..p+B-1
  every layer: queries from the block rows only; keys/values = [ctx rows ; block rows] through
  the layer's own k_proj/v_proj (k_norm on both, v not normed; the ctx rows skip the layer's
  input norm); plain Qwen3 RMSNorm (x * rsqrt(mean x^2 + eps) * w), SwiGLU MLP, NeoX RoPE over
  the full head_dim with fp32 inverse frequencies.
  out   = norm(h) -> the TARGET's lm_head.
DFlash / DFlash 2 slot j (j >= 1) predicts the token AT p+j (slot 0 dropped: B-1 drafts);
DSpark slot j predicts the token at p+j+1 (B drafts). DFlash 2 wraps attention and MLP in
grouped dynamic causal convs and walks a low-rank candidate selector; DSpark adds a Markov bigram
bias and a confidence head.

Packed layout used for training and for scoring many anchors at once (shapes):
  N sequences, S context rows each, A anchors per sequence, B block rows per anchor, Q = A*B.
  block rows (N, Q, H); ctx (N, S, H); q_pos (N, Q); k_pos (N, S+Q);
  visible (N, Q, S+Q) bool: ctx key i is visible to a block anchored at a iff i < a (the anchor's
  own features are not yet known at decode time); block keys only within the same block.
Decode with one anchor is the special case A = 1 with every ctx row visible.

Checkpoints use the key names and config fields of the public releases (z-lab DFlash, Inco
DFlash 2, RadixArk single-file DSpark): no embed_tokens, no lm_head, bf16 safetensors.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("dflash", "dflash2", "dspark")
ARCHITECTURE = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel",
                "dspark": "DSparkDraftModel"}


@dataclass(frozen=True)
class DrafterShape:
    kind: str
    hidden: int            # = target hidden: embeddings and LM head are borrowed
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    vocab: int
    mask_token_id: int
    rope_theta: float = 1e7
    eps: float = 1e-6
    max_positions: int = 4096
    conv_kernel_size: int = 2     # DFlash 2
    conv_group_size: int = 16
    selector_rank: int = 64
    selector_top_k: int = 16
    markov_rank: int = 64         # DSpark

    @property
    def first_slot(self) -> int:
        """First block row that yields a draft: 1 for same-position kinds, 0 for DSpark."""
        return 0 if self.kind == "dspark" else 1

    @property
    def label_shift(self) -> int:
        """Slot j of a block anchored at p predicts position p + j + label_shift."""
        return 1 if self.kind == "dspark" else 0


class RMSNorm(nn.Module):
    """Plain Qwen3 RMSNorm (NOT the target's zero-centred 1+w form): fp32 statistics."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope(x, pos, theta: float):
    """NeoX rotate-half RoPE over the full head dim. x (N, h, T, d), pos (N, T)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos[:, None, :, None].float() * inv_freq          # (N, 1, T, d/2), fp32
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return (x.float() * cos + half.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.eps)
        self.k_norm = RMSNorm(s.head_dim, s.eps)

    def forward(self, x, ctx, q_pos, k_pos, visible):
        s, (n, q_len, _), c_len = self.s, x.shape, ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(n, q_len, s.heads, s.head_dim)).transpose(1, 2)
        kv_in = torch.cat([ctx, x], 1)                                    # (N, S+Q, H)
        k = self.k_norm(self.k_proj(kv_in).view(n, c_len + q_len, s.kv_heads, s.head_dim))
        v = self.v_proj(kv_in).view(n, c_len + q_len, s.kv_heads, s.head_dim)
        q = rope(q, q_pos, s.rope_theta)
        k = rope(k.transpose(1, 2), k_pos, s.rope_theta)
        group = s.heads // s.kv_heads                                     # GQA: q head h -> kv h//group
        k = k.repeat_interleave(group, 1)
        v = v.transpose(1, 2).repeat_interleave(group, 1)
        mask = None if visible is None else visible[:, None]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s.head_dim ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(n, q_len, s.heads * s.head_dim))


class Mlp(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DynamicConv(nn.Module):
    """DFlash 2 grouped dynamic causal conv around one sublayer (spec §2.1):
    out[t,c] = sum_tau (base[side,tau,c] + dyn[t,side,tau,c//group]) * in[t-tau, c], taps never
    crossing a block (slot 0 reads zeros). dyn comes from kernel_projection of the sublayer's
    normed input, output index order (side, tap, group)."""

    def __init__(self, s: DrafterShape):
        super().__init__()
        self.taps, self.group = s.conv_kernel_size, s.conv_group_size
        groups = s.hidden // s.conv_group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, s.conv_kernel_size, s.hidden))
        self.kernel_projection = nn.Linear(s.hidden, 2 * s.conv_kernel_size * groups, bias=False)
        self.identity_()

    @torch.no_grad()
    def identity_(self):
        """Identity init: tap 0 = 1, other taps and the projection 0, so a fresh DFlash 2 layer
        computes exactly a DFlash layer."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def coefficients(self, u):
        """(N, Q, 2, T, G) dynamic taps from the normed sublayer input u (N, Q, H)."""
        n, q, _ = u.shape
        return self.kernel_projection(u).view(n, q, 2, self.taps, -1)

    def apply(self, x, dyn, side: int, block: int):
        n, q, h = x.shape
        rows = x.view(n, q // block, block, h)
        dyn = dyn[:, :, side].reshape(n, q // block, block, self.taps, -1)
        out = torch.zeros_like(rows)
        for tau in range(self.taps):
            shifted = F.pad(rows, (0, 0, tau, 0))[:, :, :block]          # in[t - tau], zero-padded
            coef = self.base_kernel[side, tau] + dyn[..., tau, :].repeat_interleave(self.group, -1)
            out = out + coef * shifted
        return out.view(n, q, h)


class Layer(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = Mlp(s)
        if s.kind == "dflash2":
            self.attention_conv = DynamicConv(s)
            self.mlp_conv = DynamicConv(s)

    def forward(self, x, ctx, q_pos, k_pos, visible, block: int):
        u = self.input_layernorm(x)
        if hasattr(self, "attention_conv"):
            dyn = self.attention_conv.coefficients(u)
            a = self.self_attn(self.attention_conv.apply(u, dyn, 0, block), ctx, q_pos, k_pos, visible)
            a = self.attention_conv.apply(a, dyn, 1, block)
        else:
            a = self.self_attn(u, ctx, q_pos, k_pos, visible)
        x = x + a
        u = self.post_attention_layernorm(x)
        if hasattr(self, "mlp_conv"):
            dyn = self.mlp_conv.coefficients(u)
            m = self.mlp_conv.apply(self.mlp(self.mlp_conv.apply(u, dyn, 0, block)), dyn, 1, block)
        else:
            m = self.mlp(u)
        return x + m


class CandidateSelector(nn.Module):
    """DFlash 2 low-rank pair scorer: S(a, b) = U(b) + <P[a] * W_h h, Q[b]> over the top-k of U."""

    def __init__(self, s: DrafterShape):
        super().__init__()
        # identity init (spec §2.2): Q = 0, so a fresh selector ranks by U alone.
        self.predecessor_codebook = nn.Parameter(torch.randn(s.vocab, s.selector_rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.zeros(s.vocab, s.selector_rank))
        self.hidden_projection = nn.Linear(s.hidden, s.selector_rank, bias=False)
        self.top_k = s.selector_top_k

    def scores(self, h, unary, cand, pred):
        """h (..., H), unary/cand (..., k) top-k logits and ids, pred (...) predecessor ids ->
        (..., k) pair scores."""
        gate = self.predecessor_codebook[pred] * self.hidden_projection(h)      # (..., r)
        return unary + torch.einsum("...r,...kr->...k", gate, self.successor_codebook[cand])


class MarkovHead(nn.Module):
    """DSpark vanilla Markov head: bias(prev) = W2 . W1[prev] over the vocabulary."""

    def __init__(self, s: DrafterShape):
        super().__init__()
        self.markov_w1 = nn.Embedding(s.vocab, s.markov_rank)
        self.markov_w2 = nn.Linear(s.markov_rank, s.vocab, bias=False)
        with torch.no_grad():  # bias 0 at init: a fresh head leaves the backbone's logits alone
            self.markov_w1.weight.normal_(0, 0.02)
            self.markov_w2.weight.zero_()


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(w . [h_k ; W1[prev_k]] + b): P(draft k survives | drafts < k survived)."""

    def __init__(self, s: DrafterShape):
        super().__init__()
        self.proj = nn.Linear(s.hidden + s.markov_rank, 1)
        with torch.no_grad():
            self.proj.weight.zero_()
            self.proj.bias.zero_()


class Drafter(nn.Module):
    def __init__(self, s: DrafterShape, target_hidden: int):
        super().__init__()
        if s.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {s.kind!r}")
        self.s = s
        self.fc = nn.Linear(len(s.target_layer_ids) * target_hidden, s.hidden, bias=False)
        self.hidden_norm = RMSNorm(s.hidden, s.eps)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.eps)
        for m in self.modules():  # HF initializer_range 0.02 for every projection ...
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.02)
        for m in self.modules():  # ... except the convs, which start as the identity
            if isinstance(m, DynamicConv):
                m.identity_()
        if s.kind == "dflash2":
            self.candidate_selector = CandidateSelector(s)
        if s.kind == "dspark":
            self.markov_head = MarkovHead(s)
            self.confidence_head = ConfidenceHead(s)

    def context(self, taps):
        """(N, S, n_taps*H_t) concatenated target taps -> (N, S, H) fused context rows."""
        return self.hidden_norm(self.fc(taps))

    def forward(self, block_emb, ctx, q_pos, k_pos, visible, block: int | None = None):
        """block_emb (N, Q, H), ctx (N, S, H) fused -> (N, Q, H) final-normed block hidden."""
        h = block_emb
        for layer in self.layers:
            h = layer(h, ctx, q_pos, k_pos, visible, block or self.s.block_size)
        return self.norm(h)


def packed_blocks(ids, anchors, block: int, mask_token_id: int):
    """Blocks for A anchors per sequence, all scored in one pass (module docstring layout).

    ids (N, L) token ids whose rows 0..L-1 are also the context rows; anchors (N, A) positions.
    Returns block_ids (N, Q), q_pos (N, Q), k_pos (N, L+Q), visible (N, Q, L+Q)."""
    n, length = ids.shape
    a = anchors.shape[1]
    slot = torch.arange(block, device=ids.device)
    q_pos = (anchors[:, :, None] + slot).reshape(n, a * block)
    block_ids = torch.full((n, a, block), mask_token_id, dtype=ids.dtype, device=ids.device)
    block_ids[:, :, 0] = ids.gather(1, anchors)
    k_pos = torch.cat([torch.arange(length, device=ids.device).expand(n, length), q_pos], 1)
    row_anchor = anchors.repeat_interleave(block, 1)                       # (N, Q)
    ctx_visible = torch.arange(length, device=ids.device)[None, None, :] < row_anchor[:, :, None]
    row_block = torch.arange(a, device=ids.device).repeat_interleave(block)
    blk_visible = (row_block[:, None] == row_block[None, :]).expand(n, -1, -1)
    return block_ids.reshape(n, a * block), q_pos, k_pos, torch.cat([ctx_visible, blk_visible], 2)


# ----------------------------------------------------------------------------- checkpoints

def config_dict(s: DrafterShape) -> dict:
    """config.json with the fields real releases carry (spec §1.8, §2.3, §3.4). The draft layers
    are full attention (like z-lab/Qwen3.5-27B-DFlash): our contexts never exceed a window."""
    cfg = {
        "architectures": [ARCHITECTURE[s.kind]],
        "model_type": "qwen3",
        "hidden_size": s.hidden, "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "hidden_act": "silu", "rms_norm_eps": s.eps, "vocab_size": s.vocab,
        "max_position_embeddings": s.max_positions,
        "rope_theta": s.rope_theta, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
        "layer_types": ["full_attention"] * s.layers,
        "num_target_layers": s.num_target_layers,
        "torch_dtype": "bfloat16",
    }
    dflash_config = {"mask_token_id": s.mask_token_id, "target_layer_ids": list(s.target_layer_ids)}
    if s.kind == "dflash":
        cfg["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
        cfg["block_size"] = s.block_size
    elif s.kind == "dflash2":
        cfg["is_causal"] = False
        dflash_config.update(block_size=s.block_size, conv_kernel_size=s.conv_kernel_size,
                             conv_group_size=s.conv_group_size, selector_rank=s.selector_rank,
                             selector_top_k=s.selector_top_k)
    else:  # RadixArk single-file DSpark: DSpark fields top level, backbone fields in dflash_config
        cfg.update(block_size=s.block_size, mask_token_id=s.mask_token_id,
                   target_layer_ids=list(s.target_layer_ids), markov_rank=s.markov_rank,
                   markov_head_type="vanilla", enable_confidence_head=True,
                   confidence_head_with_markov=True)
    cfg["dflash_config"] = dflash_config
    return cfg


def save(model: Drafter, out: Path) -> None:
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
               for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config_dict(model.s), indent=2) + "\n")


def shape_from_config(cfg: dict) -> DrafterShape:
    """Inverse of config_dict (reads dflash_config first, then top level, as loaders do)."""
    dc = cfg.get("dflash_config", {})
    get = lambda k, d=None: dc.get(k, cfg.get(k, d))
    kind = {v: k for k, v in ARCHITECTURE.items()}[cfg["architectures"][0]]
    return DrafterShape(
        kind=kind, hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"],
        layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        block_size=get("block_size"), target_layer_ids=tuple(get("target_layer_ids")),
        num_target_layers=cfg["num_target_layers"], vocab=cfg["vocab_size"],
        mask_token_id=get("mask_token_id"), rope_theta=cfg["rope_theta"], eps=cfg["rms_norm_eps"],
        max_positions=cfg["max_position_embeddings"],
        conv_kernel_size=get("conv_kernel_size", 2), conv_group_size=get("conv_group_size", 16),
        selector_rank=get("selector_rank", 64), selector_top_k=get("selector_top_k", 16),
        markov_rank=get("markov_rank", 64))


def load(folder: Path, target_hidden: int) -> Drafter:
    from safetensors.torch import load_file
    cfg = json.loads((folder / "config.json").read_text())
    model = Drafter(shape_from_config(cfg), target_hidden)
    model.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return model


def warm_start(child: Drafter, parent: Drafter) -> Drafter:
    """Copy the shared backbone (fc, hidden_norm, layers' attention/MLP/norms, norm) from a
    trained DFlash drafter; the added parts keep their identity inits (spec §2.1/§2.2), so a
    warm-started DFlash 2 starts out computing exactly its parent."""
    missing = child.load_state_dict(parent.state_dict(), strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"parent has keys the child lacks: {missing.unexpected_keys[:4]}")
    return child


def with_kind(s: DrafterShape, kind: str, block_size: int) -> DrafterShape:
    return replace(s, kind=kind, block_size=block_size)


def shape_dict(s: DrafterShape) -> dict:
    d = asdict(s)
    d["target_layer_ids"] = list(s.target_layer_ids)
    return d


def decay_weights(n_slots: int, gamma: float, device) -> torch.Tensor:
    """exp(-k/gamma), k = 0..n_slots-1, over the supervised slots (DFlash's exp(-(j-1)/gamma)
    for slots j >= 1 and DSpark's exp(-k/gamma) for slots k >= 0 are both this)."""
    return torch.exp(-torch.arange(n_slots, device=device, dtype=torch.float32) / gamma)

