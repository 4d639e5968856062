"""Per-tensor weight types of the qwen35 files people download, for benchmark files.

A benchmark on one uniform type says little about the files users run: llama.cpp's
`llama-quantize` gives each tensor role its own type (the attention V / DeltaNet qkv projections
and some layers' FFN down get more bits, the head gets Q6_K, ...), and third-party files change
more (the small DeltaNet projections kept F32, BF16 or Q8_0; unsloth's "UD" mixes). This module
says which type each tensor of a qwen35 file gets under each recipe; `synthetic_qwen35.py`
writes files with them.

`llama_quantize_types` re-states llama-quantize's type choice (llama.cpp's src/llama-quant.cpp,
`llama_tensor_get_type`, at 0c1e570, the version llama-cpp-python 0.3.36 vendors) for a dense
qwen35 model without an importance matrix and without --pure or --tensor-type overrides, for
every ftype llama-quantize offers. Its test compares every ftype against the per-tensor snapshot
of Qwen3.6-27B that llama.cpp keeps in its own tests (tests/snapshots/qwen3.6-27b.schema).

The rules, in the order llama-quantize applies them (its "attention V" role covers the DeltaNet
layers' fused attn_qkv as well as attn_v, and counts them together, one per layer):
- only 2-D weights are quantized, never norms nor ssm_conv1d: they keep their source type;
- the head (output.weight) gets Q5_K under the 1- and 2-bit IQ ftypes and IQ3_XXS, Q8_0 under
  Q8_0, Q6_K otherwise; the token embedding Q2_K / IQ3_S under the lowest-bit ftypes;
- V / qkv, FFN down, attention output, q and k get per-ftype bumps, some only in the layers
  `use_more_bits` selects (the first and last eighth, and every third layer between);
- a type whose block does not divide the row falls back to a 32-block type (never for the 27B).
"""
from __future__ import annotations

import re

from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

# llama-quantize's ftypes and the type every quantizable tensor starts from
# (llama_ftype_get_default_type).
FTYPE_DEFAULT = {
    "F32": T.F32, "F16": T.F16, "BF16": T.BF16,
    "Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1, "Q8_0": T.Q8_0,
    "Q2_K": T.Q2_K, "Q2_K_S": T.Q2_K, "Q3_K_S": T.Q3_K, "Q3_K_M": T.Q3_K, "Q3_K_L": T.Q3_K,
    "Q4_K_S": T.Q4_K, "Q4_K_M": T.Q4_K, "Q5_K_S": T.Q5_K, "Q5_K_M": T.Q5_K, "Q6_K": T.Q6_K,
    "IQ1_S": T.IQ1_S, "IQ1_M": T.IQ1_M, "IQ2_XXS": T.IQ2_XXS, "IQ2_XS": T.IQ2_XS, "IQ2_S": T.IQ2_XS,
    "IQ2_M": T.IQ2_S, "IQ3_XXS": T.IQ3_XXS, "IQ3_XS": T.IQ3_S, "IQ3_S": T.IQ3_S, "IQ3_M": T.IQ3_S,
    "IQ4_NL": T.IQ4_NL, "IQ4_XS": T.IQ4_XS,
}

_IQ_LOWEST = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"}  # their own branch upstream
_FLOAT = {T.F32, T.F16, T.BF16}

# A 32-element type for rows that a 256-element type's block does not divide.
_FALLBACK = {T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
             T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0,
             T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """The layers llama-quantize favours: first and last eighth, and every third one between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def role(name: str) -> str:
    """llama-quantize's tensor category, by the same substring tests in the same order."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for needle, cat in (("attn_qkv.weight", "attn_v"), ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                        ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"),
                        ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down")):
        if needle in name:
            return cat
    return "other"


def quantizable(name: str, ne: tuple[int, ...]) -> bool:
    """Whether llama-quantize requantizes this qwen35 tensor (else it keeps the source type)."""
    return len(ne) >= 2 and name.endswith(".weight") and not name.endswith("_norm.weight") \
        and "ssm_conv1d" not in name


def _layer_order(name: str) -> tuple[int, str]:
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


class _Counters:
    """The running indices llama-quantize keeps while it walks the tensors in loader order."""

    def __init__(self, n_attention_v: int, n_layer: int):
        self.n_attention_v, self.n_layer = n_attention_v, n_layer
        self.i_attention_v = self.i_ffn_down = 0
        self.i_ffn = {"ffn_gate": 0, "ffn_up": 0}


def _head(ftype: str, qtype: T) -> T:
    if ftype in _IQ_LOWEST or ftype == "IQ3_XXS":
        return T.Q5_K
    return qtype if qtype == T.Q8_0 else T.Q6_K


def _token_embd(ftype: str, qtype: T) -> T:
    if ftype in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
        return T.Q2_K
    if ftype in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
        return T.IQ3_S
    return qtype


def _lowest_iq(ftype: str, cat: str, qtype: T, c: _Counters, n_gqa: int) -> T:
    """IQ2_* / IQ1_*: their own rules for V, FFN down and attention output."""
    iq3s_family = ftype in ("IQ2_S", "IQ2_M")
    if cat == "attn_v":
        c.i_attention_v += 1
        return T.Q4_K if n_gqa >= 4 else (T.IQ3_S if iq3s_family else T.Q2_K)
    if cat == "ffn_down":
        first_eighth = c.i_ffn_down < c.n_layer // 8
        c.i_ffn_down += 1
        return (T.IQ3_S if iq3s_family else T.Q2_K) if first_eighth else qtype
    if cat == "attn_output":
        if ftype in ("IQ1_S", "IQ1_M"):
            return T.IQ2_XXS
        if iq3s_family:
            return T.IQ3_S
    return qtype


def _attention_v(ftype: str, qtype: T, c: _Counters, n_gqa: int) -> T:
    i, n = c.i_attention_v, c.n_attention_v
    c.i_attention_v += 1
    if ftype == "Q2_K":
        return T.Q4_K if n_gqa >= 4 else T.Q3_K
    if ftype == "Q2_K_S" and n_gqa >= 4:
        return T.Q4_K
    if ftype == "IQ3_XXS":
        return T.Q4_K if n_gqa >= 4 else T.IQ3_S
    if ftype in ("IQ3_XS", "IQ3_S") and n_gqa >= 4:
        return T.Q4_K
    if ftype == "IQ3_M":
        return T.Q4_K
    if ftype == "Q3_K_M":
        return T.Q5_K if i < 2 else T.Q4_K
    if ftype == "Q3_K_L":
        return T.Q5_K
    if ftype in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
        return T.Q5_K
    if ftype in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
        return T.Q6_K
    if ftype == "Q4_K_S" and i < 4:
        return T.Q5_K
    return qtype


def _ffn_down(ftype: str, qtype: T, c: _Counters) -> T:
    i, n = c.i_ffn_down, c.n_layer
    c.i_ffn_down += 1
    if ftype == "Q2_K":
        return T.Q3_K
    if ftype == "Q2_K_S":
        return T.Q4_K if i < n // 8 else qtype
    if ftype == "IQ3_XXS":
        return T.Q4_K if i < n // 8 else T.Q3_K
    if ftype == "Q3_K_M":
        return T.Q5_K if i < n // 16 else T.Q4_K
    if ftype == "IQ3_M" and i < n // 8:
        return T.Q4_K
    if ftype == "Q3_K_L":
        return T.Q5_K
    if ftype == "Q4_K_M":
        return T.Q6_K if use_more_bits(i, n) else qtype
    if ftype in ("IQ4_NL", "IQ4_XS") and i < n // 8:
        return T.Q5_K
    if ftype == "Q5_K_M" and use_more_bits(i, n):
        return T.Q6_K
    if ftype == "Q4_K_S" and i < n // 8:
        return T.Q5_K
    return qtype


_ATTN_OUTPUT = {"Q2_K": T.Q3_K, "IQ3_XXS": T.IQ3_S, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K, "IQ3_M": T.Q4_K}
_ATTN_QK = {"IQ3_XS": T.IQ3_XXS, "IQ3_XXS": T.IQ2_S}


def _ffn_gate_up(ftype: str, cat: str, qtype: T, c: _Counters) -> T:
    i, n = c.i_ffn[cat], c.n_layer
    c.i_ffn[cat] += 1
    return T.IQ3_XXS if ftype == "IQ3_XS" and n // 8 <= i < 7 * n // 8 else qtype


def _choose(ftype: str, name: str, qtype: T, c: _Counters, n_gqa: int, tied: bool) -> T:
    cat = role(name)
    if cat == "output" or (tied and cat == "token_embd"):  # a tied embedding is the head too
        return _head(ftype, qtype)
    if cat == "token_embd":
        return _token_embd(ftype, qtype)
    if ftype in _IQ_LOWEST:
        return _lowest_iq(ftype, cat, qtype, c, n_gqa)
    if cat == "attn_v":
        return _attention_v(ftype, qtype, c, n_gqa)
    if cat in ("attn_k", "attn_q"):
        return _ATTN_QK.get(ftype, qtype)
    if cat == "ffn_down":
        return _ffn_down(ftype, qtype, c)
    if cat == "attn_output":
        return _ATTN_OUTPUT.get(ftype, qtype)
    if cat in ("ffn_gate", "ffn_up"):
        return _ffn_gate_up(ftype, cat, qtype, c)
    return qtype


def _fits(qtype: T, n_cols: int) -> T:
    """A type whose block divides the row: llama-quantize's fallback, then F16."""
    if n_cols % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = _FALLBACK.get(qtype, qtype)
    return fallback if n_cols % GGML_QUANT_SIZES[fallback][0] == 0 else T.F16


def llama_quantize_types(ftype: str, tensors: list[tuple[str, tuple[int, ...], T]], n_gqa: int) -> dict[str, T]:
    """{name: type} as `llama-quantize SRC DST <ftype>` writes a qwen35 file whose tensors (name,
    ne innermost first, source type) are `tensors`; n_gqa = attention heads / KV heads. Tensors it
    does not quantize keep their source type."""
    if ftype not in FTYPE_DEFAULT:
        raise ValueError(f"unknown llama-quantize ftype {ftype!r} (known: {', '.join(FTYPE_DEFAULT)})")
    default = FTYPE_DEFAULT[ftype]
    layers = {_layer_order(name)[0] for name, _, _ in tensors} - {-1}
    ordered = sorted((t for t in tensors if quantizable(t[0], t[1])), key=lambda t: _layer_order(t[0]))
    counters = _Counters(sum(role(name) == "attn_v" for name, _, _ in ordered), len(layers))
    tied = not any(name == "output.weight" for name, _, _ in tensors)
    types = {name: src for name, _, src in tensors}
    for name, ne, _ in ordered:
        qtype = default if default in _FLOAT else _choose(ftype, name, default, counters, n_gqa, tied)
        types[name] = qtype if qtype in _FLOAT else _fits(qtype, ne[0])
    return types


# ---- third-party recipes ----------------------------------------------------------------------

SMALL_PROJECTIONS = ("ssm_alpha.weight", "ssm_beta.weight")  # [n_embd -> 48]: the DeltaNet gates' inputs


def with_small_projections(types: dict[str, T], qtype: T) -> dict[str, T]:
    """The same file with the DeltaNet layers' alpha/beta projections kept in `qtype`, as files
    from other converters and quantizers keep them (F32, BF16 or Q8_0)."""
    return {name: qtype if name.endswith(SMALL_PROJECTIONS) else t for name, t in types.items()}


def unsloth_dynamic_types(tensors: list[tuple[str, tuple[int, ...], T]], n_gqa: int) -> dict[str, T]:
    """An unsloth-"UD"-style Q4_K_XL mix: llama-quantize's Q4_K_M choice, then the DeltaNet's
    ssm_out and small projections Q8_0 in every layer, the attention and DeltaNet input projections
    Q5_K at least, FFN gate/up Q4_K and down Q5_K at least (the published description of
    UD-Q4_K_XL for Qwen3.5-27B: SSM tensors Q8_0 everywhere, attention tensors selectively raised,
    FFN Q4_K/Q5_K). The exact per-tensor list of a published file comes from its imatrix runs;
    this mix reproduces its type families and proportions, which is what a kernel sees."""
    types = llama_quantize_types("Q4_K_M", tensors, n_gqa)
    raise_to_q5 = ("attn_q.weight", "attn_k.weight", "attn_output.weight", "attn_gate.weight", "attn_qkv.weight",
                   "ffn_down.weight")
    for name, t in types.items():
        if name.endswith(("ssm_out.weight",) + SMALL_PROJECTIONS):
            types[name] = T.Q8_0
        elif name.endswith(raise_to_q5) and t == T.Q4_K:
            types[name] = T.Q5_K
    return types
