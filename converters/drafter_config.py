"""config.json of a DFlash / DFlash 2 / DSpark checkpoint -> one normalised DraftConfig.

Where published configs disagree (spec/engine.md §2.2, §9; spec/drafters.md §1.5, §1.8, §3.4):
  - `dflash_config` (and DSpark's `dspark_config`) win over top-level fields for block_size,
    mask_token_id, target_layer_ids and the DFlash 2 conv / selector fields and logit scalars
    (`output_multiplier`, `final_logit_softcapping`: finite and > 0; a null cap means off);
  - rope: transformers>=5 `rope_parameters`, else legacy `rope_scaling`; YaRN is recognised by
    `rope_type` or the legacy `type` spelling; `original_max_position_embeddings` comes from the
    rope dict, else the top level; a YaRN factor > 1 without an original context is refused
    (the engine would silently fall back to plain RoPE);
  - a sliding layer's window and its in-block direction are recorded separately: the window
    comes from `layer_types` + `sliding_window` whatever the direction (the references cut context
    keys outside it either way, spec/drafters.md §1.5), for bidirectional layers only when
    `use_sliding_window` is true (as transformers and llama.cpp's converter read it); the direction is the first of top-level
    `is_causal`, `dflash_config.is_causal`, `dflash_config.causal`, and by default a sliding layer
    is causal;
  - `aux_hidden_state_layer_ids` (speculators/vLLM) are layer *inputs*, i.e. id + 1.
Tensor-derived values are cross-checked in `check_against_shapes` (the weights are the truth,
but a disagreement means the config describes another model, so it is an error naming both).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from luce.converters import schema
from luce.errors import LuceError

SLIDING = "sliding_attention"


@dataclass
class Yarn:
    factor: float
    original_context: int
    beta_fast: float = schema.DEFAULT_BETA_FAST
    beta_slow: float = schema.DEFAULT_BETA_SLOW


@dataclass
class DraftConfig:
    kind: str                       # dflash | dflash2 | dspark
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int | None            # None: derive from k_proj rows / n_head_kv
    ff: int | None
    vocab: int
    eps: float
    rope_theta: float
    context_length: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int] | None
    yarn: Yarn | None = None
    sliding_window: int | None = None
    swa_pattern: list[bool] | None = None
    conv_kernel: int = 0
    conv_group: int = schema.DEFAULT_CONV_GROUP_SIZE
    selector_rank: int = 0
    selector_top_k: int = schema.DEFAULT_SELECTOR_TOP_K
    output_multiplier: float = schema.DEFAULT_OUTPUT_MULTIPLIER
    final_logit_softcapping: float | None = schema.DEFAULT_FINAL_LOGIT_SOFTCAPPING
    markov_rank: int | None = None  # declared in DSpark configs; the weights decide
    sample_from_anchor: bool | None = None
    causal: bool | None = None      # the checkpoint's explicit in-block direction, if it states one


def _first(sources: list[dict], *keys):
    """The first present value of any key, scanning sources in precedence order."""
    for src in sources:
        for key in keys:
            if key in src and src[key] is not None:
                return src[key]
    return None


def _need(value, name: str):
    if value is None:
        raise LuceError(f"config.json has no {name}")
    return value


def _as_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LuceError(f"config.json: {name} must be an integer, got {value!r}")
    return value


def _positive_float(value, name: str) -> float:
    """A finite number > 0 (the DFlash 2 logit scalars: a cap of 0 would divide by zero, and a
    non-positive multiplier would reorder or flatten the candidates)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LuceError(f"config.json: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _sub(cfg: dict, key: str) -> dict:
    value = cfg.get(key) or {}
    if not isinstance(value, dict):
        raise LuceError(f"config.json: {key} must be an object")
    return value


def normalise(cfg: dict, kind: str, no_yarn: bool = False) -> DraftConfig:
    dflash_cfg, dspark_cfg = _sub(cfg, "dflash_config"), _sub(cfg, "dspark_config")
    inner_first = [dflash_cfg, dspark_cfg, cfg]     # dflash_config wins over the top level

    ids, id_base = _first([dflash_cfg, dspark_cfg, cfg], "target_layer_ids"), 0
    if ids is None and cfg.get("aux_hidden_state_layer_ids") is not None:
        ids, id_base = cfg["aux_hidden_state_layer_ids"], 1
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise LuceError(f"config.json: target_layer_ids must be a list of integers, got {ids!r}")
        ids = [i - id_base for i in ids]

    rope = _rope_dict(cfg)
    theta = _first([rope, cfg], "rope_theta")
    n_head_kv = _first([cfg], "num_key_value_heads")
    dc = DraftConfig(
        kind=kind,
        hidden=_as_int(_need(cfg.get("hidden_size"), "hidden_size"), "hidden_size"),
        n_layer=_as_int(_need(cfg.get("num_hidden_layers"), "num_hidden_layers"), "num_hidden_layers"),
        n_head=_as_int(_need(cfg.get("num_attention_heads"), "num_attention_heads"), "num_attention_heads"),
        n_head_kv=_as_int(n_head_kv if n_head_kv is not None else cfg.get("num_attention_heads"),
                          "num_key_value_heads"),
        head_dim=_as_int(cfg["head_dim"], "head_dim") if cfg.get("head_dim") is not None else None,
        ff=_as_int(cfg["intermediate_size"], "intermediate_size") if cfg.get("intermediate_size") is not None else None,
        vocab=_as_int(_need(cfg.get("vocab_size"), "vocab_size"), "vocab_size"),
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_need(theta, "rope_theta (top level or in rope_parameters)")),
        context_length=_as_int(cfg.get("max_position_embeddings", schema.DEFAULT_CONTEXT_LENGTH),
                               "max_position_embeddings"),
        block_size=_as_int(_need(_first(inner_first, "block_size", "draft_block_size"), "block_size"),
                           "block_size"),
        mask_token_id=_as_int(_need(_first(inner_first, "mask_token_id"), "mask_token_id"), "mask_token_id"),
        target_layer_ids=ids,
    )
    if not no_yarn:
        dc.yarn = _yarn(rope, cfg)
    _sliding_window(cfg, dflash_cfg, dc)
    if kind == "dflash2":
        dc.conv_kernel = _as_int(_need(_first(inner_first, "conv_kernel_size"), "dflash_config.conv_kernel_size"),
                                 "conv_kernel_size")
        dc.conv_group = _as_int(_first(inner_first, "conv_group_size") or schema.DEFAULT_CONV_GROUP_SIZE,
                                "conv_group_size")
        rank = _first(inner_first, "selector_rank")
        dc.selector_rank = _as_int(rank, "selector_rank") if rank is not None else 0
        dc.selector_top_k = _as_int(_first(inner_first, "selector_top_k") or schema.DEFAULT_SELECTOR_TOP_K,
                                    "selector_top_k")
        multiplier = _first(inner_first, "output_multiplier")
        if multiplier is not None:
            dc.output_multiplier = _positive_float(multiplier, "output_multiplier")
        cap = _first(inner_first, "final_logit_softcapping")
        if cap is not None:
            dc.final_logit_softcapping = _positive_float(cap, "final_logit_softcapping")
    if kind == "dspark":
        rank = _first(inner_first, "markov_rank")
        dc.markov_rank = _as_int(rank, "markov_rank") if rank is not None else None
        # DeepSpec, SpecForge and RadixArk DSpark drafters use next-token slots; speculators
        # configs say so explicitly.
        declared = _first(inner_first, "sample_from_anchor")
        dc.sample_from_anchor = True if declared is None else bool(declared)
    return dc


def _rope_dict(cfg: dict) -> dict:
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.get(key)
        if isinstance(value, dict):
            return value
        if value is not None:
            raise LuceError(f"config.json: {key} must be an object, got {value!r}")
    return {}


def _yarn(rope: dict, cfg: dict) -> Yarn | None:
    rope_type = str(rope.get("rope_type") or rope.get("type") or "").lower()
    if rope_type != schema.YARN:
        return None
    factor = float(rope.get("factor") or 0)
    if factor <= 1:
        return None
    original = _first([rope, cfg], "original_max_position_embeddings")
    if not original:
        raise LuceError(f"config.json: YaRN factor {factor:g} has no original_max_position_embeddings; "
                        f"add it to the rope dict or pass --no-yarn for plain RoPE")
    return Yarn(factor, _as_int(original, "original_max_position_embeddings"),
                float(rope.get("beta_fast", schema.DEFAULT_BETA_FAST)),
                float(rope.get("beta_slow", schema.DEFAULT_BETA_SLOW)))


def _sliding_window(cfg: dict, dflash_cfg: dict, dc: DraftConfig) -> None:
    layer_types = cfg.get("layer_types")
    causal = _first([cfg, dflash_cfg], "is_causal")
    if causal is None:
        causal = dflash_cfg.get("causal")
    dc.causal = None if causal is None else bool(causal)
    if not layer_types or SLIDING not in layer_types:
        return
    if len(layer_types) != dc.n_layer:
        raise LuceError(f"config.json: layer_types has {len(layer_types)} entries but num_hidden_layers "
                        f"is {dc.n_layer}")
    if causal is False and not cfg.get("use_sliding_window"):
        # A bidirectional sliding layer keeps a window only where the config switches windows on:
        # transformers' Qwen3Config (so z-lab's reference) and llama.cpp's converter drop
        # sliding_window otherwise. In-block causal sliding layers always keep theirs (the
        # Lucebox producer's rule; unchanged).
        return
    window = cfg.get("sliding_window")
    if not window:
        raise LuceError("config.json: layer_types has sliding_attention layers but no sliding_window")
    dc.sliding_window = _as_int(window, "sliding_window")
    dc.swa_pattern = [t == SLIDING for t in layer_types]


def check_against_shapes(dc: DraftConfig, n_layer_found: int, hidden_found: int, k_rows: int,
                         q_rows: int, ff_found: int, fc_cols: int) -> int:
    """Cross-check config values against the weights; returns n_target_layers (N = fc cols / H)."""
    def same(name, config_value, weight_value, weight_what):
        if config_value != weight_value:
            raise LuceError(f"config.json {name}={config_value} but the weights say {weight_value} "
                            f"({weight_what})")

    same("num_hidden_layers", dc.n_layer, n_layer_found, "layers.N tensors")
    same("hidden_size", dc.hidden, hidden_found, "fc.weight rows")
    if dc.head_dim is None:
        if k_rows % dc.n_head_kv:
            raise LuceError(f"k_proj has {k_rows} rows, not a multiple of num_key_value_heads={dc.n_head_kv}; "
                            f"fix config.json")
        dc.head_dim = k_rows // dc.n_head_kv
    same("num_key_value_heads*head_dim", dc.n_head_kv * dc.head_dim, k_rows, "k_proj rows")
    same("num_attention_heads*head_dim", dc.n_head * dc.head_dim, q_rows, "q_proj rows")
    if dc.ff is None:
        dc.ff = ff_found
    same("intermediate_size", dc.ff, ff_found, "gate_proj rows")
    if fc_cols % dc.hidden:
        raise LuceError(f"fc.weight has {fc_cols} columns, not a multiple of hidden_size={dc.hidden}")
    n_target = fc_cols // dc.hidden
    if dc.target_layer_ids is not None:
        same("len(target_layer_ids)", len(dc.target_layer_ids), n_target, "fc.weight columns / hidden")
    return n_target
