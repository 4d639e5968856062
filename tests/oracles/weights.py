"""One seeded set of fp32 drafter weights in the published checkpoint naming, shared by every oracle
and by `luce convert`, so both sides of a parity test run the very same numbers.

Scales are chosen so that every part visibly moves the output (drafter_checkpoints.py's generic fixtures use 0.05,
which leaves attention almost uniform and the heads nearly inert):
  matrices ~ N(0, 1/fan_in)     keeps activations O(1) through the stack
  norm weights ~ 1 + N(0, 0.2)  plain RMSNorm multipliers (not zero-centred)
  conv base ~ N(0, 0.5), conv projection ~ N(0, 0.5/sqrt(H))
  selector codebooks ~ N(0, 0.5), hidden projection ~ N(0, 1/sqrt(H)): the pairwise term is
      ~ sqrt(R) * 0.25 ~ 1.4 for R = 32, comparable to the logit gaps, so the walk departs
      from plain argmax
  Markov w1, w2 ~ N(0, 0.5): bias W2 W1[prev] ~ sqrt(R) * 0.25 ~ 1 for R = 16
  confidence weight ~ N(0, 1/sqrt(C)), bias ~ N(0, 0.5)

Shapes are HF (torch) order. `cfg` is the checkpoint's config.json dict.
"""
from __future__ import annotations

import math

import torch


def _dims(cfg: dict) -> dict:
    dflash = cfg.get("dflash_config", {})
    taps = dflash.get("target_layer_ids", cfg.get("target_layer_ids"))
    return dict(H=cfg["hidden_size"], L=cfg["num_hidden_layers"], NH=cfg["num_attention_heads"],
                NKV=cfg["num_key_value_heads"], D=cfg["head_dim"], FF=cfg["intermediate_size"],
                V=cfg["vocab_size"], N=len(taps))


class _Draw:
    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *shape, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std + mean

    def matrix(self, rows: int, cols: int) -> torch.Tensor:
        return self.normal(rows, cols, std=1.0 / math.sqrt(cols))

    def norm(self, n: int) -> torch.Tensor:
        return self.normal(n, std=0.2, mean=1.0)


def trunk(cfg: dict, draw: _Draw) -> dict[str, torch.Tensor]:
    """fc + hidden_norm + norm + L Qwen3 layers (z-lab DFlash names, no `model.` prefix)."""
    d = _dims(cfg)
    H, D = d["H"], d["D"]
    t = {"fc.weight": draw.matrix(H, d["N"] * H), "hidden_norm.weight": draw.norm(H), "norm.weight": draw.norm(H)}
    for i in range(d["L"]):
        p = f"layers.{i}."
        t |= {
            p + "input_layernorm.weight": draw.norm(H),
            p + "post_attention_layernorm.weight": draw.norm(H),
            p + "self_attn.q_proj.weight": draw.matrix(d["NH"] * D, H),
            p + "self_attn.k_proj.weight": draw.matrix(d["NKV"] * D, H),
            p + "self_attn.v_proj.weight": draw.matrix(d["NKV"] * D, H),
            p + "self_attn.o_proj.weight": draw.matrix(H, d["NH"] * D),
            p + "self_attn.q_norm.weight": draw.norm(D),
            p + "self_attn.k_norm.weight": draw.norm(D),
            p + "mlp.gate_proj.weight": draw.matrix(d["FF"], H),
            p + "mlp.up_proj.weight": draw.matrix(d["FF"], H),
            p + "mlp.down_proj.weight": draw.matrix(H, d["FF"]),
        }
    return t


def dflash2_extras(cfg: dict, draw: _Draw) -> dict[str, torch.Tensor]:
    """Per-layer attention_conv / mlp_conv and the candidate selector (Inco / NeMo names)."""
    d, dc = _dims(cfg), cfg["dflash_config"]
    H, K, groups, R = d["H"], dc["conv_kernel_size"], d["H"] // dc["conv_group_size"], dc["selector_rank"]
    t = {}
    for i in range(d["L"]):
        for conv in ("attention_conv", "mlp_conv"):
            t[f"layers.{i}.{conv}.base_kernel"] = draw.normal(2, K, H, std=0.5)
            t[f"layers.{i}.{conv}.kernel_projection.weight"] = draw.normal(2 * K * groups, H, std=0.5 / math.sqrt(H))
    t["candidate_selector.hidden_projection.weight"] = draw.matrix(R, H)
    t["candidate_selector.predecessor_codebook"] = draw.normal(d["V"], R, std=0.5)
    t["candidate_selector.successor_codebook"] = draw.normal(d["V"], R, std=0.5)
    return t


def dspark_extras(cfg: dict, draw: _Draw) -> dict[str, torch.Tensor]:
    """Vanilla Markov head + confidence head (RadixArk / DeepSpec names)."""
    d = _dims(cfg)
    R = cfg["markov_rank"]
    C = d["H"] + (R if cfg.get("confidence_head_with_markov", True) else 0)
    return {"markov_head.markov_w1.weight": draw.normal(d["V"], R, std=0.5),
            "markov_head.markov_w2.weight": draw.normal(d["V"], R, std=0.5),
            "confidence_head.proj.weight": draw.normal(1, C, std=1.0 / math.sqrt(C)),
            "confidence_head.proj.bias": draw.normal(1, std=0.5)}


def drafter_tensors(cfg: dict, seed: int, kind: str, f16_exact: bool = False) -> dict[str, torch.Tensor]:
    """kind: "dflash" | "dflash2" | "dspark". f16_exact rounds every value to the nearest float16
    (still returned as fp32), so that `--outtype f16` stores the weights losslessly and the oracle
    can run on exactly what the f16 GGUF holds."""
    draw = _Draw(seed)
    t = trunk(cfg, draw)
    if kind == "dflash2":
        t |= dflash2_extras(cfg, draw)
    elif kind == "dspark":
        t |= dspark_extras(cfg, draw)
    if f16_exact:
        t = {k: v.half().float() for k, v in t.items()}
    return t
