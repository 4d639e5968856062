"""The drafter GGUF format: every key, tensor name, shape and dtype rule, in one place.

Two layouts carry the same drafter (spec/engine.md §2.4-2.6 and §2.9):
  lucebox    arch `qwen35-dflash-draft` — the Lucebox engine's format and luce's default.
  llama.cpp  arch `dflash` — what llama.cpp's own convert_hf_to_gguf.py writes (0c1e570): 1-based
             `target_layers`, flat dflash2 keys, `selector_*` / `markov_*` / `conf_proj`
             tensors, no vocab_size, and the target's tokenizer.* keys (its loader needs them).
`convert` writes through this module and `inspect` validates through it; a GGUF key or tensor
name spelled anywhere else is a bug. Generic keys come from gguf-py's `Keys` templates.

Shapes are GGUF order (ne0 first, = HF shape reversed). Legend:
  H hidden, L layers, I ffn width, nh / nkv heads, d head_dim, N target taps, K conv taps,
  G = H / conv_group_size, R selector or Markov rank, V vocab, C confidence input width.
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, GGUFValueType, Keys

VT = GGUFValueType

ARCH = "qwen35-dflash-draft"
UPSTREAM_ARCH = "dflash"
LEGACY_ARCHS = ("dflash-draft", "gemma4-dflash-draft")     # read, never written
DRAFT_ARCHS = (ARCH, UPSTREAM_ARCH, *LEGACY_ARCHS)
TARGET_ARCH = "qwen35"
LAYOUTS = ("lucebox", "llama.cpp")


@dataclass(frozen=True)
class Key:
    template: str                  # "{arch}.…" or a fixed "general.…" / "tokenizer.…" name
    vtype: GGUFValueType
    etype: GGUFValueType | None = None   # element type of an array
    meaning: str = ""

    def at(self, arch: str) -> str:
        return self.template.format(arch=arch)


def _own(suffix: str, vtype, meaning: str, etype=None) -> Key:
    return Key("{arch}." + suffix, vtype, etype, meaning)


# ---- hparams shared by both layouts (gguf-py spells them) -------------------------------------
NAME = Key(Keys.General.NAME, VT.STRING, meaning="DFlash-Draft-{hidden}h-{layers}L")
CONTEXT_LENGTH = Key(Keys.LLM.CONTEXT_LENGTH, VT.UINT32, meaning="max_position_embeddings")
EMBEDDING_LENGTH = Key(Keys.LLM.EMBEDDING_LENGTH, VT.UINT32, meaning="hidden size H")
BLOCK_COUNT = Key(Keys.LLM.BLOCK_COUNT, VT.UINT32, meaning="drafter layers L")
FEED_FORWARD_LENGTH = Key(Keys.LLM.FEED_FORWARD_LENGTH, VT.UINT32, meaning="FFN width I")
HEAD_COUNT = Key(Keys.Attention.HEAD_COUNT, VT.UINT32, meaning="query heads")
HEAD_COUNT_KV = Key(Keys.Attention.HEAD_COUNT_KV, VT.UINT32, meaning="key/value heads")
KEY_LENGTH = Key(Keys.Attention.KEY_LENGTH, VT.UINT32, meaning="head_dim (nh*d need not equal H)")
VALUE_LENGTH = Key(Keys.Attention.VALUE_LENGTH, VT.UINT32, meaning="head_dim")
VOCAB_SIZE = Key(Keys.LLM.VOCAB_SIZE, VT.UINT32, meaning="vocabulary (the target's)")
RMS_EPS = Key(Keys.Attention.LAYERNORM_RMS_EPS, VT.FLOAT32, meaning="RMSNorm epsilon")
ROPE_FREQ_BASE = Key(Keys.Rope.FREQ_BASE, VT.FLOAT32, meaning="rope theta")
ROPE_SCALING_TYPE = Key(Keys.Rope.SCALING_TYPE, VT.STRING, meaning='"yarn"; only when factor > 1')
ROPE_SCALING_FACTOR = Key(Keys.Rope.SCALING_FACTOR, VT.FLOAT32, meaning="YaRN factor")
ROPE_SCALING_ORIG_CTX = Key(Keys.Rope.SCALING_ORIG_CTX_LEN, VT.UINT32,
                            meaning="original_max_position_embeddings (luce never writes 0)")
ROPE_SCALING_ATTN_FACTOR = Key(Keys.Rope.SCALING_ATTN_FACTOR, VT.FLOAT32,
                               meaning="YaRN attention factor (read only; default 1)")
# Lucebox spells the betas without gguf-py's `yarn_` prefix.
ROPE_BETA_FAST = _own("rope.scaling.beta_fast", VT.FLOAT32, "YaRN beta_fast (default 32)")
ROPE_BETA_SLOW = _own("rope.scaling.beta_slow", VT.FLOAT32, "YaRN beta_slow (default 1)")
# A layer's context window and its in-block direction are separate facts (spec/drafters.md §1.5):
# the pattern says which layers keep only the last W context keys; `attention.causal` says whether
# those sliding layers see block slots 0..j only (absent: true where a pattern is present, the
# Lucebox reading). Full-attention layers are bidirectional inside the block.
SLIDING_WINDOW = Key(Keys.Attention.SLIDING_WINDOW, VT.UINT32, meaning="SWA width W")
SLIDING_WINDOW_PATTERN = Key(Keys.Attention.SLIDING_WINDOW_PATTERN, VT.ARRAY, VT.BOOL,
                             "one per layer, true = sliding-window layer")
CAUSAL = Key(Keys.Attention.CAUSAL, VT.BOOL, meaning="sliding layers are in-block causal (absent = true)")

# ---- lucebox layout: DFlash keys under `{arch}.dflash.` -----------------------------------------
N_TARGET_LAYERS = _own("dflash.n_target_layers", VT.UINT32, "N taps; fc input = N*H")
BLOCK_SIZE = _own("dflash.block_size", VT.UINT32, "checkpoint draft block size B")
MASK_TOKEN_ID = _own("dflash.mask_token_id", VT.UINT32, "mask/noise token id")
TARGET_LAYER_IDS = _own("dflash.target_layer_ids", VT.ARRAY, "0-based target layers tapped", VT.INT32)
SAMPLE_FROM_ANCHOR = _own("dflash.sample_from_anchor", VT.BOOL,
                          "slot j predicts position p+j+1 (DSpark next-token slots)")
CONV_KERNEL_SIZE = _own("dflash.dflash2.conv_kernel_size", VT.UINT32, "DFlash 2 conv taps K")
CONV_GROUP_SIZE = _own("dflash.dflash2.conv_group_size", VT.UINT32, "channels per dynamic group")
SELECTOR_RANK = _own("dflash.dflash2.selector_rank", VT.UINT32, "selector rank R")
SELECTOR_TOP_K = _own("dflash.dflash2.selector_top_k", VT.UINT32, "selector candidates (1..256)")
# The DFlash 2 unary logits U = lm_head(h) are transformed in fp32 before the top-k:
# U*m, then tanh(U*m / cap)*cap when a cap is set (spec/drafters.md §2.2). Written only when
# they differ from the defaults below, so drafters that do not use them keep their bytes.
OUTPUT_MULTIPLIER = _own("dflash.dflash2.output_multiplier", VT.FLOAT32,
                         "unary logit scale m > 0 (absent = 1)")
FINAL_LOGIT_SOFTCAPPING = _own("dflash.dflash2.final_logit_softcapping", VT.FLOAT32,
                               "unary logit soft cap > 0 (absent = off)")
DSPARK_ENABLED = _own("dflash.dspark.enabled", VT.UINT32, "1 for DSpark drafters")
DSPARK_MARKOV_RANK = _own("dflash.dspark.markov_rank", VT.UINT32, "Markov rank R (from w1)")
DSPARK_VOCAB_SIZE = _own("dflash.dspark.vocab_size", VT.UINT32, "Markov vocab V (from w1)")
DSPARK_CONFIDENCE_DIM = _own("dflash.dspark.confidence_dim", VT.UINT32,
                             "C: H (hidden only) or H+R (conditioned on the Markov embedding)")
DSPARK_CONFIDENCE_ENABLED = _own("dflash.dspark.confidence.enabled", VT.UINT32,
                                 "1 when the confidence head is present")

# ---- llama.cpp (`dflash`) layout: flat keys; also the loader's fallbacks for other archs ------
# Spelled as llama.cpp's converter writes them (conversion/qwen.py DFlashModel / DSparkModel).
UP_BLOCK_SIZE = _own("block_size", VT.UINT32, "draft block size B")
UP_MASK_TOKEN_ID = _own("mask_token_id", VT.UINT32, "mask/noise token id")
UP_TARGET_LAYERS = _own("target_layers", VT.ARRAY, "1-based target layers (= id + 1)", VT.INT32)
UP_SAMPLE_FROM_ANCHOR = _own("sample_from_anchor", VT.BOOL, "next-token slots (absent = false)")
UP_CONV_KERNEL_SIZE = _own("conv_kernel_size", VT.UINT32, "DFlash 2 conv taps K")
UP_CONV_GROUP_SIZE = _own("conv_group_size", VT.UINT32, "channels per dynamic group")
UP_SELECTOR_RANK = _own("selector_rank", VT.UINT32, "selector rank R")
UP_SELECTOR_TOP_K = _own("selector_top_k", VT.UINT32, "selector candidates")
UP_HAS_CONFIDENCE = _own("has_confidence_head", VT.BOOL, "DSpark confidence head present")
UP_LOGIT_SCALE = Key(Keys.LLM.LOGIT_SCALE, VT.FLOAT32, meaning="DFlash 2 unary logit scale m (absent = 1)")
UP_FINAL_LOGIT_SOFTCAPPING = Key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, VT.FLOAT32,
                                 meaning="DFlash 2 unary logit soft cap (absent = off)")
UP_ROPE_BETA_FAST = Key(Keys.Rope.SCALING_YARN_BETA_FAST, VT.FLOAT32, meaning="YaRN beta_fast (default 32)")
UP_ROPE_BETA_SLOW = Key(Keys.Rope.SCALING_YARN_BETA_SLOW, VT.FLOAT32, meaning="YaRN beta_slow (default 1)")
# Drafts of an M-RoPE target (qwen35) rope on the temporal section only: [d/2, 0, 0, 0].
UP_ROPE_SECTIONS = Key(Keys.Rope.DIMENSION_SECTIONS, VT.ARRAY, VT.INT32, "[d/2, 0, 0, 0] for an M-RoPE target")
# Upstream features that change the drafter's math and that luce does not implement (other model
# families' drafters): `inspect` and `generate` refuse a file that uses them rather than draft
# with other numbers than the checkpoint's.
UP_VALUE_SCALE = _own("attention.value_scale", VT.FLOAT32, "attention value scale (refused)")
UP_EMBEDDING_SCALE = Key(Keys.LLM.EMBEDDING_SCALE, VT.FLOAT32, meaning="input embedding scale (refused)")
UP_HIDDEN_ACT = _own("hidden_activation", VT.STRING, "FFN activation: silu only (others refused)")
UP_ROPE_DIMENSION_COUNT = Key(Keys.Rope.DIMENSION_COUNT, VT.UINT32,
                              meaning="rotary dims: head_dim only (partial rotary refused)")
UP_D2T = "d2t"      # tensor: reduced draft vocabulary -> target ids (refused)
SILU = "silu"

# The mask token of the llama.cpp layout (upstream writes it with the target's tokenizer); the
# Lucebox loader also honours it in its own layout.
TOKENIZER_MASK_TOKEN_ID = Key(Keys.Tokenizer.MASK_ID, VT.UINT32, meaning="mask id (highest precedence)")
TOKENIZER_PREFIX = "tokenizer."     # every key copied from the target for the llama.cpp layout
TOKENIZER_MODEL = Key(Keys.Tokenizer.MODEL, VT.STRING, meaning="llama.cpp's loader requires it")
TOKENIZER_TOKENS = Key(Keys.Tokenizer.LIST, VT.ARRAY, VT.STRING, meaning="the target's vocabulary")

DEFAULT_CONV_GROUP_SIZE = 16
DEFAULT_SELECTOR_TOP_K = 16
MAX_SELECTOR_TOP_K = 256
DEFAULT_OUTPUT_MULTIPLIER = 1.0
DEFAULT_FINAL_LOGIT_SOFTCAPPING = None   # off
DEFAULT_BETA_FAST = 32.0
DEFAULT_BETA_SLOW = 1.0
DEFAULT_CONTEXT_LENGTH = 32768
YARN = "yarn"

# Loader bounds (spec/engine.md §3, plus what luce's runtime allocates): native/src/drafter_load.cpp
# holds the same numbers under the same names (tests/test_validator_parity_drafter.py compares).
MAX_LAYERS, MAX_EMBD, MAX_FF, MAX_HEADS, MAX_HEAD_DIM = 1024, 131072, 524288, 1024, 1024
MAX_TAPS = 64            # target layers tapped
MAX_BLOCK = 32           # draft block size: the runtime's block buffers are this many rows
MAX_CONV_K = 16          # DFlash 2 conv taps
MAX_RANK = 65536         # selector / Markov rank
MAX_VOCAB = 2**31 - 1
MAX_CTX = 1 << 24        # sliding window, YaRN original context


# ---- tensors ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorRole:
    """One logical drafter tensor: its name in each layout, whether it is per layer, and
    whether it is always stored as F32 (norms, conv bases, biases: ggml wants F32 operands)."""
    role: str
    lucebox: str          # name template; {bid} = layer index
    upstream: str
    per_layer: bool
    force_f32: bool
    group: str            # trunk | dflash2_conv | selector | dspark
    legacy: str = ""      # read only: how luce spelled the upstream name before it matched llama.cpp

    def name(self, layout: str, bid: int | None = None) -> str:
        return (self.lucebox if layout == "lucebox" else self.upstream).format(bid=bid)

    def read_names(self, bid: int | None = None) -> tuple[str, ...]:
        """Every name a reader accepts for this role, lucebox first."""
        return tuple(n.format(bid=bid) for n in (self.lucebox, self.upstream, self.legacy) if n)


def _blk(t: MODEL_TENSOR) -> str:
    return TENSOR_NAMES[t] + ".weight"


def _trunk(role: str, t: MODEL_TENSOR, f32=False) -> TensorRole:
    name = _blk(t)
    return TensorRole(role, name, name, "{bid}" in name, f32, "trunk")


ROLES: tuple[TensorRole, ...] = (
    TensorRole("fc", "dflash.fc.weight", "fc.weight", False, False, "trunk"),
    TensorRole("hidden_norm", "dflash.hidden_norm.weight", "enc.output_norm.weight", False, True, "trunk"),
    _trunk("output_norm", MODEL_TENSOR.OUTPUT_NORM, f32=True),
    _trunk("attn_norm", MODEL_TENSOR.ATTN_NORM, f32=True),
    _trunk("ffn_norm", MODEL_TENSOR.FFN_NORM, f32=True),
    _trunk("attn_q", MODEL_TENSOR.ATTN_Q),
    _trunk("attn_k", MODEL_TENSOR.ATTN_K),
    _trunk("attn_v", MODEL_TENSOR.ATTN_V),
    _trunk("attn_output", MODEL_TENSOR.ATTN_OUT),
    _trunk("attn_q_norm", MODEL_TENSOR.ATTN_Q_NORM, f32=True),
    _trunk("attn_k_norm", MODEL_TENSOR.ATTN_K_NORM, f32=True),
    _trunk("ffn_gate", MODEL_TENSOR.FFN_GATE),
    _trunk("ffn_up", MODEL_TENSOR.FFN_UP),
    _trunk("ffn_down", MODEL_TENSOR.FFN_DOWN),
    TensorRole("attn_conv_base", "blk.{bid}.attn_conv.base", "blk.{bid}.attn_conv_base", True, True, "dflash2_conv"),
    TensorRole("attn_conv_proj", "blk.{bid}.attn_conv.proj.weight", "blk.{bid}.attn_conv_proj.weight", True, False,
               "dflash2_conv", legacy="blk.{bid}.attn_conv_proj"),
    TensorRole("ffn_conv_base", "blk.{bid}.ffn_conv.base", "blk.{bid}.ffn_conv_base", True, True, "dflash2_conv"),
    TensorRole("ffn_conv_proj", "blk.{bid}.ffn_conv.proj.weight", "blk.{bid}.ffn_conv_proj.weight", True, False,
               "dflash2_conv", legacy="blk.{bid}.ffn_conv_proj"),
    TensorRole("selector_hproj", "dflash.selector.hproj.weight", "selector_hidden.weight", False, False, "selector"),
    TensorRole("selector_pred_cb", "dflash.selector.pred_cb", "selector_predecessor.weight", False, False, "selector"),
    TensorRole("selector_succ_cb", "dflash.selector.succ_cb", "selector_successor.weight", False, False, "selector"),
    TensorRole("markov_w1", "dflash.dspark.markov.w1", "markov_w1.weight", False, False, "dspark"),
    TensorRole("markov_w2", "dflash.dspark.markov.w2", "markov_w2.weight", False, False, "dspark"),
    TensorRole("confidence_weight", "dflash.dspark.confidence.weight", "conf_proj.weight", False, False, "dspark"),
    TensorRole("confidence_bias", "dflash.dspark.confidence.bias", "conf_proj.bias", False, True, "dspark"),
)
ROLE = {r.role: r for r in ROLES}
LAYER_ROLES = tuple(r.role for r in ROLES if r.per_layer and r.group == "trunk")
CONV_ROLES = ("attn_conv_base", "attn_conv_proj", "ffn_conv_base", "ffn_conv_proj")
SELECTOR_ROLES = ("selector_hproj", "selector_pred_cb", "selector_succ_cb")
MARKOV_ROLES = ("markov_w1", "markov_w2")
CONFIDENCE_ROLES = ("confidence_weight", "confidence_bias")


@dataclass(frozen=True)
class DraftShape:
    """Everything the tensor shapes depend on."""
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ff: int
    n_target_layers: int
    conv_kernel: int = 0
    conv_group: int = DEFAULT_CONV_GROUP_SIZE
    selector_rank: int = 0
    selector_vocab: int = 0
    markov_rank: int = 0
    markov_vocab: int = 0
    confidence_dim: int = 0


def expected_shape(role: str, s: DraftShape) -> tuple[int, ...]:
    """GGUF shape (ne0 first) of a role, from the hparams."""
    H, d = s.hidden, s.head_dim
    K, G = s.conv_kernel, (s.hidden // s.conv_group if s.conv_group else 0)
    return {
        "fc": (s.n_target_layers * H, H),
        "hidden_norm": (H,), "output_norm": (H,), "attn_norm": (H,), "ffn_norm": (H,),
        "attn_q": (H, s.n_head * d), "attn_k": (H, s.n_head_kv * d), "attn_v": (H, s.n_head_kv * d),
        "attn_output": (s.n_head * d, H), "attn_q_norm": (d,), "attn_k_norm": (d,),
        "ffn_gate": (H, s.ff), "ffn_up": (H, s.ff), "ffn_down": (s.ff, H),
        "attn_conv_base": (H, K, 2), "ffn_conv_base": (H, K, 2),
        "attn_conv_proj": (H, 2 * K * G), "ffn_conv_proj": (H, 2 * K * G),
        "selector_hproj": (H, s.selector_rank),
        "selector_pred_cb": (s.selector_rank, s.selector_vocab),
        "selector_succ_cb": (s.selector_rank, s.selector_vocab),
        "markov_w1": (s.markov_rank, s.markov_vocab), "markov_w2": (s.markov_rank, s.markov_vocab),
        "confidence_weight": (s.confidence_dim, 1), "confidence_bias": (1,),
    }[role]


# ---- output dtypes ----------------------------------------------------------------------------
OUTTYPES = {
    "f16": GGMLQuantizationType.F16, "bf16": GGMLQuantizationType.BF16,
    "f32": GGMLQuantizationType.F32, "q8_0": GGMLQuantizationType.Q8_0,
}
DEFAULT_OUTTYPE = "f16"
Q8_0_BLOCK = 32


def stored_type(role: str, gguf_shape: tuple[int, ...], outtype: str) -> GGMLQuantizationType:
    """Norms, conv bases and biases stay F32; with q8_0 only 2-D matrices whose rows split into
    32-value blocks are quantized (as Lucebox's quantizer does); the rest fall back to F16."""
    if ROLE[role].force_f32:
        return GGMLQuantizationType.F32
    wanted = OUTTYPES[outtype]
    if wanted == GGMLQuantizationType.Q8_0 and (len(gguf_shape) != 2 or gguf_shape[0] % Q8_0_BLOCK):
        return GGMLQuantizationType.F16
    return wanted


def all_keys() -> dict[str, Key]:
    """Every Key constant of this module by its Python name (docs and tests enumerate them)."""
    return {n: v for n, v in globals().items() if isinstance(v, Key)}
