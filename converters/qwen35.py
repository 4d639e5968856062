"""Hugging Face Qwen3.5 checkpoint -> llama.cpp `qwen35` GGUF (spec/qwen35.md §3).

Accepts `Qwen3_5ForCausalLM` checkpoints (`model.*` names) and the text part of
`Qwen3_5ForConditionalGeneration` (`model.language_model.*`, config in `text_config`; the vision
tower `model.visual.*` is skipped: llama.cpp puts it in a separate mmproj file). The output follows
llama.cpp's converter exactly, so files we write and files users download are the same format:

  1. names: gguf-py's tensor names (`blk.{i}.attn_qkv.weight` ...), `lm_head` -> `output`;
  2. every zero-centred RMSNorm weight is stored as `1 + w`, except the DeltaNet gated norm
     (`linear_attn.norm` -> `ssm_norm`), whose weight is a plain multiplier in HF too;
  3. `ssm_a = -exp(A_log)`; `dt_bias` becomes `ssm_dt.bias`;
  4. conv1d [C, 1, K] is squeezed to [C, K];
  5. value heads are regrouped "grouped -> tiled" (see `grouped_to_tiled`), on every tensor
     with a row, element or column per value head;
  6. rope.dimension_count = head_dim * partial_rotary_factor and the mRoPE sections padded to 4;
  7. the MTP head (`mtp.*`) becomes block `blk.{n_layers}` with `nextn.*` tensors, counted in
     block_count, and `nextn_predict_layers` says so.

Shapes below: E hidden, HK/HV DeltaNet key/value heads, DK/DV their head dims, r = HV / HK.
Every array is handled in float32 (bf16 checkpoints are widened exactly first, as llama.cpp does),
one tensor at a time: the tensor table is written first, then each tensor is loaded, transformed,
encoded and appended.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, LlamaFileType, MODEL_ARCH_NAMES, MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION
from gguf.quants import quant_shape_to_byte_shape, quantize

from luce.converters.detect import TARGET_ARCHITECTURES, is_target_config
from luce.converters.output import atomic_output
from luce.converters.qwen35_vocab import add_tokenizer_metadata
from luce.converters.safetensors_source import Checkpoint, open_checkpoint
from luce.errors import LuceError

log = logging.getLogger(__name__)

ARCH = MODEL_ARCH_NAMES[MODEL_ARCH.QWEN35]

# --outtype -> (ggml type of 2-D weights, general.file_type)
OUTTYPES = {
    "f32": (QT.F32, LlamaFileType.ALL_F32),
    "f16": (QT.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (QT.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (QT.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    # Every 2-D weight in the type (as llama-quantize --pure writes it), quantized by gguf-py,
    # which rounds exactly as ggml's reference quantizer does.
    "q4_0": (QT.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (QT.Q4_1, LlamaFileType.MOSTLY_Q4_1),
}
DEFAULT_OUTTYPE = "f32"

# Defaults of transformers' Qwen3_5TextConfig for fields a config.json may leave out.
_DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25
_DEFAULT_FULL_ATTENTION_INTERVAL = 4
_DEFAULT_MROPE_SECTION = (11, 11, 10)
_DEFAULT_CONTEXT_LENGTH = 32768
_MROPE_SLOTS = 4  # llama.cpp reads exactly four sections (T, H, W, unused)


# --------------------------------------------------------------------------------------------
# config


@dataclass(frozen=True)
class Qwen35Config:
    """The hyperparameters the GGUF states, read from a `qwen3_5_text` config (spec §1.1, §3.2)."""

    vocab_size: int
    hidden_size: int  # E
    intermediate_size: int
    num_layers: int  # main stack, without the MTP block
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int  # head_dim * partial_rotary_factor
    mrope_sections: tuple[int, ...]  # padded to 4
    context_length: int
    conv_kernel: int
    key_heads: int  # HK
    value_heads: int  # HV
    key_head_dim: int  # DK
    value_head_dim: int  # DV
    full_attention_interval: int
    tied_embeddings: bool

    @classmethod
    def from_hf(cls, config: dict) -> Qwen35Config:
        text = config.get("text_config") or config
        if not isinstance(text, dict):
            raise LuceError("config.json: text_config is not an object")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}

        def need(key):
            # a config.json is untrusted: every size must be a positive integer before it sizes anything
            value = text.get(key)
            if value is None:
                raise LuceError(f"config.json: missing {key!r}")
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise LuceError(f"config.json: {key} must be a positive integer, got {value!r}")
            return value

        def get(key, default):
            return default if text.get(key) is None else need(key)

        def number(value, key):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise LuceError(f"config.json: {key} must be a positive number, got {value!r}")
            return float(value)

        head_dim = get("head_dim", need("hidden_size") // need("num_attention_heads"))
        partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY_FACTOR))
        theta = rope.get("rope_theta", text.get("rope_theta"))
        if theta is None:
            raise LuceError("config.json: missing rope_theta (in rope_parameters or at the top level)")
        sections = list(rope.get("mrope_section") or _DEFAULT_MROPE_SECTION)
        if len(sections) > _MROPE_SLOTS or not all(isinstance(x, int) and x >= 0 for x in sections):
            raise LuceError(f"config.json: mrope_section must be at most {_MROPE_SLOTS} counts, got {sections}")
        # the multimodal wrapper keeps tie_word_embeddings at its own top level
        tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
        cfg = cls(
            vocab_size=need("vocab_size"),
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=need("num_attention_heads"),
            num_kv_heads=need("num_key_value_heads"),
            head_dim=head_dim,
            rms_norm_eps=number(text.get("rms_norm_eps"), "rms_norm_eps"),
            rope_theta=number(theta, "rope_theta"),
            rotary_dim=int(round(head_dim * number(partial, "partial_rotary_factor"))),
            mrope_sections=tuple(sections + [0] * (_MROPE_SLOTS - len(sections))),
            context_length=get("max_position_embeddings", _DEFAULT_CONTEXT_LENGTH),
            conv_kernel=need("linear_conv_kernel_dim"),
            key_heads=need("linear_num_key_heads"),
            value_heads=need("linear_num_value_heads"),
            key_head_dim=need("linear_key_head_dim"),
            value_head_dim=need("linear_value_head_dim"),
            full_attention_interval=get("full_attention_interval", _DEFAULT_FULL_ATTENTION_INTERVAL),
            tied_embeddings=bool(tied),
        )
        cfg._check(text.get("layer_types"))
        return cfg

    def _check(self, layer_types) -> None:
        if self.key_heads <= 0 or self.value_heads % self.key_heads:
            raise LuceError(f"config.json: {self.value_heads} value heads are not a multiple of {self.key_heads} key heads")
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise LuceError(f"config.json: {self.num_heads} attention heads are not a multiple of {self.num_kv_heads} kv heads")
        if self.full_attention_interval <= 0:
            raise LuceError("config.json: full_attention_interval must be positive")
        if layer_types is not None:
            # a qwen35 GGUF has no per-layer kind list: the kinds must follow the interval rule
            expected = ["linear_attention" if self.is_recurrent(i) else "full_attention" for i in range(self.num_layers)]
            if list(layer_types) != expected:
                raise LuceError(
                    "config.json: layer_types do not follow the full_attention_interval rule "
                    f"(every {self.full_attention_interval}th layer full attention), which qwen35 GGUFs cannot express"
                )

    def is_recurrent(self, layer: int) -> bool:
        """Gated DeltaNet layer (else full attention): llama.cpp's `(i + 1) % interval != 0` rule."""
        return (layer + 1) % self.full_attention_interval != 0


# --------------------------------------------------------------------------------------------
# tensor transforms (each takes and returns float32, HF layout -> GGUF layout)


def grouped_to_tiled(x: np.ndarray, key_heads: int, rows_per_head: int, axis: int = 0) -> np.ndarray:
    """Reorder value heads along `axis` from HF's grouped order to llama.cpp's tiled order.

    HF stores value head `kh * r + m` (m < r) next to the others of key head kh, so value head j uses
    key head j // r. llama.cpp's qwen35 broadcasts the HK key heads over HV value heads by tiling
    (value head j uses key head j % HK), so position `m * HK + kh` must hold HF head `kh * r + m`.
    Along `axis`: [HK, r, rows_per_head] -> [r, HK, rows_per_head].
    """
    moved = np.moveaxis(x, axis, 0)
    rest = moved.shape[1:]
    tiled = moved.reshape(key_heads, -1, rows_per_head, *rest).swapaxes(0, 1).reshape(moved.shape)
    return np.moveaxis(tiled, 0, axis)


def _neg_exp(a_log: np.ndarray) -> np.ndarray:
    """ssm_a = -exp(A_log), rounded once from float64.

    HF computes `-A_log.float().exp()` with torch's (correctly rounded) float32 exp; numpy's float32
    exp differs from it in the last bit for ~40% of inputs, while exp in float64 rounded to float32
    agrees ~99% of the time, so the runtime's decay matches HF's as closely as a stored value can.
    """
    return (-np.exp(a_log.astype(np.float64))).astype(np.float32)


def _transforms(cfg: Qwen35Config) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    hk, dv = cfg.key_heads, cfg.value_head_dim
    qk_channels = 2 * cfg.key_heads * cfg.key_head_dim  # q and k blocks ahead of v in in_proj_qkv / conv1d

    def v_block_tiled(x):  # [q | k | v] rows: only the V block is reordered
        return np.concatenate([x[:qk_channels], grouped_to_tiled(x[qk_channels:], hk, dv)])

    return {
        "plain": lambda x: x,
        # zero-centred RMSNorm: HF computes x_hat * (1 + w); GGUF runtimes multiply by the stored weight
        "norm_plus_one": lambda x: x + np.float32(1.0),
        "v_block": v_block_tiled,
        "v_rows": lambda x: grouped_to_tiled(x, hk, dv),  # in_proj_z: DV rows per head
        "v_heads": lambda x: grouped_to_tiled(x, hk, 1),  # one row or element per head
        "neg_exp_v_heads": lambda x: grouped_to_tiled(_neg_exp(x), hk, 1),  # ssm_a = -exp(A_log)
        "conv": lambda x: v_block_tiled(x.reshape(x.shape[0], x.shape[-1])),  # [C, 1, K] -> [C, K]
        "v_columns": lambda x: grouped_to_tiled(x, hk, dv, axis=1),  # out_proj consumes the value dim
    }


# --------------------------------------------------------------------------------------------
# names: HF leaf -> (gguf tensor, name suffix, transform)

_W, _B, _NONE = ".weight", ".bias", ""

_GLOBAL = {
    "embed_tokens.weight": (MODEL_TENSOR.TOKEN_EMBD, _W, "plain"),
    "norm.weight": (MODEL_TENSOR.OUTPUT_NORM, _W, "norm_plus_one"),
}
_OUTPUT = (MODEL_TENSOR.OUTPUT, _W, "plain")  # from `lm_head.weight`

_COMMON_LAYER = {
    "input_layernorm.weight": (MODEL_TENSOR.ATTN_NORM, _W, "norm_plus_one"),
    "post_attention_layernorm.weight": (MODEL_TENSOR.ATTN_POST_NORM, _W, "norm_plus_one"),
    "mlp.gate_proj.weight": (MODEL_TENSOR.FFN_GATE, _W, "plain"),
    "mlp.up_proj.weight": (MODEL_TENSOR.FFN_UP, _W, "plain"),
    "mlp.down_proj.weight": (MODEL_TENSOR.FFN_DOWN, _W, "plain"),
}
_ATTENTION_LAYER = _COMMON_LAYER | {
    # q_proj rows are [q_0 | gate_0 | q_1 | gate_1 ...] per head in both formats: no reorder
    "self_attn.q_proj.weight": (MODEL_TENSOR.ATTN_Q, _W, "plain"),
    "self_attn.k_proj.weight": (MODEL_TENSOR.ATTN_K, _W, "plain"),
    "self_attn.v_proj.weight": (MODEL_TENSOR.ATTN_V, _W, "plain"),
    "self_attn.o_proj.weight": (MODEL_TENSOR.ATTN_OUT, _W, "plain"),
    "self_attn.q_norm.weight": (MODEL_TENSOR.ATTN_Q_NORM, _W, "norm_plus_one"),
    "self_attn.k_norm.weight": (MODEL_TENSOR.ATTN_K_NORM, _W, "norm_plus_one"),
}
_DELTANET_LAYER = _COMMON_LAYER | {
    "linear_attn.in_proj_qkv.weight": (MODEL_TENSOR.ATTN_QKV, _W, "v_block"),
    "linear_attn.in_proj_z.weight": (MODEL_TENSOR.ATTN_GATE, _W, "v_rows"),
    "linear_attn.in_proj_b.weight": (MODEL_TENSOR.SSM_BETA, _W, "v_heads"),
    "linear_attn.in_proj_a.weight": (MODEL_TENSOR.SSM_ALPHA, _W, "v_heads"),
    "linear_attn.conv1d.weight": (MODEL_TENSOR.SSM_CONV1D, _W, "conv"),
    "linear_attn.A_log": (MODEL_TENSOR.SSM_A, _NONE, "neg_exp_v_heads"),
    "linear_attn.dt_bias": (MODEL_TENSOR.SSM_DT, _B, "v_heads"),
    # the gated output norm multiplies by a plain weight in HF: never +1
    "linear_attn.norm.weight": (MODEL_TENSOR.SSM_NORM, _W, "plain"),
    "linear_attn.out_proj.weight": (MODEL_TENSOR.SSM_OUT, _W, "v_columns"),
}
# The MTP head (after `mtp.`): one full-attention decoder block plus the fusion projection and norms.
_MTP = {
    "fc.weight": (MODEL_TENSOR.NEXTN_EH_PROJ, _W, "plain"),
    "pre_fc_norm_embedding.weight": (MODEL_TENSOR.NEXTN_ENORM, _W, "norm_plus_one"),
    "pre_fc_norm_hidden.weight": (MODEL_TENSOR.NEXTN_HNORM, _W, "norm_plus_one"),
    "norm.weight": (MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM, _W, "norm_plus_one"),
} | {f"layers.0.{leaf}": entry for leaf, entry in _ATTENTION_LAYER.items()}
_MTP_OPTIONAL = {"embed_tokens.weight": (MODEL_TENSOR.NEXTN_EMBED_TOKENS, _W, "plain")}

_TEXT_PREFIXES = ("model.language_model.", "model.")  # ConditionalGeneration first: it also starts with model.
_SKIPPED_PREFIXES = ("model.visual.",)  # the vision tower goes to a separate mmproj GGUF


@dataclass(frozen=True)
class PlannedTensor:
    """One output tensor: where it comes from, how it is transformed, what it is stored as."""

    gguf_name: str
    hf_name: str
    transform: str
    shape: tuple[int, ...]  # GGUF layout, row-major (numpy) order
    qtype: QT


def _gguf_name(tensor: MODEL_TENSOR, suffix: str, block: int | None = None) -> str:
    return TENSOR_NAMES[tensor].format(bid=block) + suffix


def _expected_names(cfg: Qwen35Config, has_mtp: bool, names: set[str], prefix: str) -> dict[str, tuple]:
    """HF name -> (gguf name, transform) for every tensor the checkpoint must (or may) contain."""
    want = {}
    for leaf, (tensor, suffix, transform) in _GLOBAL.items():
        want[prefix + leaf] = (_gguf_name(tensor, suffix), transform)
    if not cfg.tied_embeddings:
        tensor, suffix, transform = _OUTPUT
        want["lm_head.weight"] = (_gguf_name(tensor, suffix), transform)
    for layer in range(cfg.num_layers):
        table = _DELTANET_LAYER if cfg.is_recurrent(layer) else _ATTENTION_LAYER
        for leaf, (tensor, suffix, transform) in table.items():
            want[f"{prefix}layers.{layer}.{leaf}"] = (_gguf_name(tensor, suffix, layer), transform)
    if has_mtp:
        mtp_block = cfg.num_layers  # llama.cpp appends the MTP block after the main stack
        optional = {f"mtp.{leaf}": entry for leaf, entry in _MTP_OPTIONAL.items() if f"mtp.{leaf}" in names}
        for hf, (tensor, suffix, transform) in ({f"mtp.{leaf}": e for leaf, e in _MTP.items()} | optional).items():
            want[hf] = (_gguf_name(tensor, suffix, mtp_block), transform)
    return want


def _storage_type(gguf_name: str, shape: tuple[int, ...], weight_type: QT) -> QT:
    """llama.cpp's rule: 1-D tensors, norms and the conv kernel stay F32; a quantized type needs
    rows of whole blocks (32 values), else F16."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or ".ssm_conv1d." in gguf_name:
        return QT.F32
    if shape[-1] % GGML_QUANT_SIZES[weight_type][0]:
        return QT.F16
    return weight_type


def _output_shape(transform: str, hf_shape: tuple[int, ...]) -> tuple[int, ...]:
    return (hf_shape[0], hf_shape[-1]) if transform == "conv" else hf_shape


def plan_tensors(cfg: Qwen35Config, ckpt: Checkpoint, weight_type: QT) -> tuple[list[PlannedTensor], bool]:
    """Match the checkpoint's tensors against what a qwen35 GGUF needs. Returns (plan, has_mtp)."""
    names = set(ckpt.tensors)
    prefix = next((p for p in _TEXT_PREFIXES if f"{p}embed_tokens.weight" in names), None)
    if prefix is None:
        raise LuceError("checkpoint has no embed_tokens.weight (not a Qwen3.5 text model?)")
    mtp_layers = {n.split(".")[2] for n in names if n.startswith("mtp.layers.")}
    if len(mtp_layers) > 1:
        raise LuceError(f"checkpoint has {len(mtp_layers)} MTP layers; qwen35 GGUFs carry at most one")
    has_mtp = any(n.startswith("mtp.") for n in names)
    want = _expected_names(cfg, has_mtp, names, prefix)

    missing = [n for n in want if n not in names]
    if missing:
        raise LuceError(f"checkpoint is missing {len(missing)} tensor(s) for this config, first: {missing[0]}")
    extra = [n for n in names if n not in want and not n.startswith(_SKIPPED_PREFIXES)]
    if cfg.tied_embeddings:
        extra = [n for n in extra if n != "lm_head.weight"]  # a tied head is the embedding: not stored twice
    if extra:
        raise LuceError(f"checkpoint has {len(extra)} tensor(s) this converter does not know, first: {sorted(extra)[0]}")

    plan = []
    for hf_name, (gguf_name, transform) in want.items():
        shape = _output_shape(transform, ckpt.tensors[hf_name].shape)
        plan.append(PlannedTensor(gguf_name, hf_name, transform, shape, _storage_type(gguf_name, shape, weight_type)))
    _check_shapes(cfg, ckpt, prefix)
    return plan, has_mtp


def _check_shapes(cfg: Qwen35Config, ckpt: Checkpoint, prefix: str) -> None:
    """The few shapes the config must agree with, so a mismatched config fails here, not at load."""
    e = cfg.hidden_size
    expect = {f"{prefix}embed_tokens.weight": (cfg.vocab_size, e)}
    for layer in range(cfg.num_layers):
        base = f"{prefix}layers.{layer}."
        if cfg.is_recurrent(layer):
            conv_channels = 2 * cfg.key_heads * cfg.key_head_dim + cfg.value_heads * cfg.value_head_dim
            expect[base + "linear_attn.in_proj_qkv.weight"] = (conv_channels, e)
            expect[base + "linear_attn.conv1d.weight"] = (conv_channels, 1, cfg.conv_kernel)
            expect[base + "linear_attn.out_proj.weight"] = (e, cfg.value_heads * cfg.value_head_dim)
            expect[base + "linear_attn.A_log"] = (cfg.value_heads,)
        else:
            expect[base + "self_attn.q_proj.weight"] = (2 * cfg.num_heads * cfg.head_dim, e)
            expect[base + "self_attn.k_proj.weight"] = (cfg.num_kv_heads * cfg.head_dim, e)
        expect[base + "mlp.gate_proj.weight"] = (cfg.intermediate_size, e)
    for name, shape in expect.items():
        got = ckpt.tensors[name].shape
        if tuple(got) != shape:
            raise LuceError(f"{name}: shape {list(got)} does not match config.json (expected {list(shape)})")


# --------------------------------------------------------------------------------------------
# writing


def _add_hparams(w: GGUFWriter, cfg: Qwen35Config, name: str, has_mtp: bool, file_type: LlamaFileType) -> None:
    mtp_layers = 1 if has_mtp else 0
    w.add_name(name)
    w.add_block_count(cfg.num_layers + mtp_layers)  # llama.cpp counts the MTP block as a layer
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(file_type)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_state_size(cfg.key_head_dim)
    w.add_ssm_group_count(cfg.key_heads)
    w.add_ssm_time_step_rank(cfg.value_heads)
    w.add_ssm_inner_size(cfg.value_heads * cfg.value_head_dim)
    w.add_full_attention_interval(cfg.full_attention_interval)
    w.add_rope_dimension_count(cfg.rotary_dim)
    w.add_rope_dimension_sections(list(cfg.mrope_sections))
    if has_mtp:
        w.add_nextn_predict_layers(mtp_layers)
    w.add_quantization_version(GGML_QUANT_VERSION)


def _tensor_info(t: PlannedTensor) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape as GGUFWriter wants it, numpy dtype of the encoded array, byte count)."""
    if t.qtype == QT.F32:
        return t.shape, np.dtype(np.float32), 4 * int(np.prod(t.shape))
    if t.qtype == QT.F16:
        return t.shape, np.dtype(np.float16), 2 * int(np.prod(t.shape))
    byte_shape = quant_shape_to_byte_shape(t.shape, t.qtype)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))


class Progress(Protocol):
    """What `luce convert`'s progress bar implements (luce.converters.convert.Progress)."""

    def start(self, n_tensors: int, n_bytes: int) -> None: ...

    def advance(self, name: str, n_bytes: int) -> None: ...


def convert_qwen35(
    src_dir: str | os.PathLike,
    out_path: str | os.PathLike,
    outtype: str = DEFAULT_OUTTYPE,
    progress: Progress | None = None,
    *,
    force: bool = False,
) -> dict:
    """Write `out_path` (a qwen35 GGUF) from the HF checkpoint in `src_dir`; returns a summary.

    `outtype` picks the encoding of 2-D weights (f32, f16, bf16, q8_0, q4_0, q4_1; norms, 1-D
    tensors and the conv kernel are always F32). `progress.start(n_tensors, n_bytes)` is called once the plan is
    known and `progress.advance(name, n_bytes)` after each tensor. The file appears only when
    complete (`atomic_output`); an existing file is replaced only with `force`.
    """
    if outtype not in OUTTYPES:
        raise LuceError(f"unknown outtype {outtype!r} (choose from {', '.join(OUTTYPES)})")
    weight_type, file_type = OUTTYPES[outtype]
    src = Path(src_dir)
    ckpt = open_checkpoint(src, use_sidecar=False)
    try:
        return _convert(ckpt, src if src.is_dir() else src.parent, Path(out_path), weight_type, file_type,
                        progress, force)
    finally:
        ckpt.close()


def _convert(ckpt: Checkpoint, folder: Path, out_path: Path, weight_type: QT, file_type: LlamaFileType,
             progress: Progress | None, force: bool) -> dict:
    if not is_target_config(ckpt.config):  # the rule `luce convert` dispatches on
        raise LuceError(f"{folder}: config.json is not a Qwen3.5 checkpoint ({', '.join(TARGET_ARCHITECTURES)})")
    cfg = Qwen35Config.from_hf(ckpt.config)
    plan, has_mtp = plan_tensors(cfg, ckpt, weight_type)
    transforms = _transforms(cfg)
    infos = [_tensor_info(t) for t in plan]

    with atomic_output(out_path, force) as tmp_path:
        w = GGUFWriter(tmp_path, ARCH)
        _add_hparams(w, cfg, folder.resolve().name, has_mtp, file_type)
        add_tokenizer_metadata(w, folder, cfg.vocab_size)
        for t, (shape, dtype, nbytes) in zip(plan, infos):
            w.add_tensor_info(t.gguf_name, shape, dtype, nbytes, raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        if progress is not None:
            progress.start(len(plan), sum(nbytes for _, _, nbytes in infos))
        for t, (_, _, nbytes) in zip(plan, infos):
            # float32 throughout: +1 and the reorders are exact there (F16 sources widen exactly too)
            data = transforms[t.transform](ckpt.read(ckpt.tensors[t.hf_name]).astype(np.float32, copy=False))
            w.write_tensor_data(quantize(np.ascontiguousarray(data, dtype=np.float32), t.qtype))
            if progress is not None:
                progress.advance(t.gguf_name, nbytes)
        w.close()
    log.info("wrote %s: %d tensors, %s", out_path, len(plan), weight_type.name)
    return {
        "format": f"Qwen3.5 target ({ARCH})",
        "layers": f"{cfg.num_layers} + 1 MTP" if has_mtp else cfg.num_layers,
        "hidden": cfg.hidden_size,
        "tensor_types": dict(Counter(t.qtype.name for t in plan)),
        "n_tensors": len(plan),
        "output_bytes": out_path.stat().st_size,
    }
