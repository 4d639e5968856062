"""z-lab DFlash checkpoints (`DFlashDraftModel`): the trunk every drafter format shares.

HF names (spec/drafters.md §1.1; no `model.` prefix, no embed_tokens / lm_head):
    fc.weight [H, N*H]      hidden_norm.weight [H]      norm.weight [H]
    layers.{i}.input_layernorm / post_attention_layernorm .weight [H]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight, self_attn.{q,k}_norm.weight [d]
    layers.{i}.mlp.{gate,up,down}_proj.weight
Each maps to a schema role; the GGUF name comes from the schema.
"""
from __future__ import annotations

import re

TOP = {"fc.weight": "fc", "hidden_norm.weight": "hidden_norm", "norm.weight": "output_norm"}
LAYER = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}
# Frozen copies of the target's embedding and head that some producers ship (DeepSpec,
# speculators). The engine always uses the target's own, so they are dropped.
DROPPED = ("embed_tokens.weight", "lm_head.weight")
LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)$")
# Some exports nest the drafter under `model.`; names are compared without it.
PREFIX = "model."


def strip_prefix(name: str) -> str:
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def map_name(name: str, layer_table: dict = LAYER, top_table: dict = TOP):
    """(role, layer index or None) for a known HF name, else None."""
    name = strip_prefix(name)
    if name in top_table:
        return top_table[name], None
    m = LAYER_NAME.match(name)
    if m and m.group(2) in layer_table:
        return layer_table[m.group(2)], int(m.group(1))
    return None
