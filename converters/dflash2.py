"""DFlash 2 checkpoints (`DFlash2DraftModel`, Inco / z-lab): the DFlash trunk plus a grouped
dynamic conv around each sublayer and a low-rank candidate selector (spec/drafters.md §2).

    layers.{i}.attention_conv.base_kernel [2, K, H]        -> blk.{i}.attn_conv.base [H, K, 2] F32
    layers.{i}.attention_conv.kernel_projection.weight [2*K*G, H] -> blk.{i}.attn_conv.proj.weight
    layers.{i}.mlp_conv.*                                    -> blk.{i}.ffn_conv.*
    candidate_selector.hidden_projection.weight [R, H]       -> dflash.selector.hproj.weight [H, R]
    candidate_selector.{predecessor,successor}_codebook [V, R] -> dflash.selector.{pred,succ}_cb [R, V]
The codebooks are plain parameters (no `.weight`), and so are their GGUF names.
"""
from __future__ import annotations

from luce.converters import dflash

LAYER = {
    **dflash.LAYER,
    "attention_conv.base_kernel": "attn_conv_base",
    "attention_conv.kernel_projection.weight": "attn_conv_proj",
    "mlp_conv.base_kernel": "ffn_conv_base",
    "mlp_conv.kernel_projection.weight": "ffn_conv_proj",
}
TOP = {
    **dflash.TOP,
    "candidate_selector.hidden_projection.weight": "selector_hproj",
    "candidate_selector.predecessor_codebook": "selector_pred_cb",
    "candidate_selector.successor_codebook": "selector_succ_cb",
}
MARKERS = ("attention_conv.", "mlp_conv.", "candidate_selector.")


def map_name(name: str):
    return dflash.map_name(name, LAYER, TOP)


def is_dflash2(names) -> bool:
    return any(m in n for n in names for m in MARKERS)
