"""Plan and write a drafter GGUF from a checkpoint.

plan_drafter: map every source tensor to a schema role, normalise the config, cross-check
    config values against tensor shapes and build the key list. Nothing is read but headers.
write_drafter: stream the plan through gguf-py's GGUFWriter: header, KV, tensor infos, then
    tensor data one at a time (read lazily, converted, written, dropped), so peak memory is one
    tensor, not the checkpoint.

Data rules (spec/engine.md §2.6): GGUF dims are HF dims reversed, which is what writing the
row-major HF array gives; BF16 sources are widened exactly to f32 first; f16 / bf16 / q8_0 come
from that f32 through gguf.quants (bit-exact with ggml); norms, conv bases and biases stay F32.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from gguf import GGUFWriter
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from luce.converters import dflash, dflash2, dspark, schema
from luce.converters.drafter_config import DraftConfig, check_against_shapes, normalise
from luce.converters.safetensors_source import Checkpoint, SourceTensor
from luce.converters.target_vocab import TargetVocab, check_mask
from luce.errors import LuceError

Q = GGMLQuantizationType


@dataclass
class PlannedTensor:
    role: str
    layer: int | None
    gguf_name: str
    source: str                    # HF name (or a note for synthesised tensors)
    hf_shape: tuple[int, ...]
    stored: GGMLQuantizationType
    load: Callable[[], np.ndarray]  # float32/float16 array in HF shape

    @property
    def gguf_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.hf_shape))

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.stored]
        return int(np.prod(self.hf_shape)) // block * size


@dataclass
class DraftPlan:
    kind: str
    variant: str
    layout: str
    arch: str
    config: DraftConfig
    n_target_layers: int
    tensors: list[PlannedTensor]
    keys: list[tuple[schema.Key, object]]
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    target_vocab: TargetVocab | None = None     # llama.cpp layout: the tokenizer to copy

    def type_counts(self) -> dict[str, int]:
        return dict(Counter(t.stored.name for t in self.tensors))

    @property
    def heads(self) -> list[str]:
        groups = {schema.ROLE[t.role].group for t in self.tensors} - {"trunk"}
        roles = {t.role for t in self.tensors}
        named = {"dflash2_conv": "conv", "selector": "selector"}
        heads = sorted(named[g] for g in groups if g in named)
        if "markov_w1" in roles:
            heads.append("markov")
        if "confidence_weight" in roles:
            heads.append("confidence")
        return heads


NEEDS_TARGET = ("the llama.cpp layout needs --target-model (the target GGUF or its Hugging Face folder): "
                "llama.cpp loads a drafter only with the target's tokenizer in it")


def _loader(ckpt: Checkpoint, t: SourceTensor):
    return lambda: ckpt.read(t)


def _map_main(ckpt: Checkpoint, kind: str):
    """Main-file tensors -> [(role, layer, SourceTensor)], plus dropped names."""
    mapper = dflash2.map_name if kind == "dflash2" else dflash.map_name
    mapped, dropped = [], []
    for name, t in ckpt.tensors.items():
        bare = dflash.strip_prefix(name)
        if bare in dflash.DROPPED:
            dropped.append(name)
            continue
        if kind == "dspark" and bare in dspark.HEAD_NAMES:
            continue                       # picked up by dspark.find_heads
        hit = mapper(name)
        if hit is None:
            raise LuceError(f"unmapped tensor {name!r} in a {kind} checkpoint (shape {list(t.shape)})")
        mapped.append((hit[0], hit[1], t))
    return mapped, dropped


def _dspark_heads(ckpt: Checkpoint, hidden: int, warnings: list[str]):
    bare_main = {dflash.strip_prefix(n): t for n, t in ckpt.tensors.items()}
    heads = dspark.find_heads(bare_main, ckpt.sidecar)
    if "markov_w1" not in heads or "markov_w2" not in heads:
        raise LuceError("DSpark checkpoint has an incomplete Markov head: need both markov_w1 and "
                        "markov_w2 (found " + (", ".join(sorted(heads)) or "none") + ")")
    w1, w2 = heads["markov_w1"][0], heads["markov_w2"][0]
    if len(w1.shape) != 2 or w1.shape != w2.shape:
        raise LuceError(f"Markov head shapes differ: markov_w1 {list(w1.shape)} vs markov_w2 {list(w2.shape)} "
                        f"(both must be [V, R])")
    vocab, rank = w1.shape
    out = [("markov_w1", None, w1), ("markov_w2", None, w2)]
    conf = heads.get("confidence_weight")
    if conf is None:
        if "confidence_bias" in heads:
            raise LuceError("DSpark confidence bias present without its weight")
        warnings.append("no DSpark confidence head; the Markov head still loads")
        return out, vocab, rank, 0
    cw = conf[0]
    if len(cw.shape) != 2 or cw.shape[0] != 1 or cw.shape[1] not in (hidden, hidden + rank):
        raise LuceError(f"confidence head weight has shape {list(cw.shape)}; expected [1, {hidden}] or "
                        f"[1, {hidden + rank}] (hidden or hidden + markov rank)")
    out.append(("confidence_weight", None, cw))
    if "confidence_bias" in heads:
        cb = heads["confidence_bias"][0]
        if cb.shape != (1,):
            raise LuceError(f"confidence head bias has shape {list(cb.shape)}; expected [1]")
        out.append(("confidence_bias", None, cb))
    else:
        warnings.append("DSpark confidence bias missing; writing a zero bias")
        out.append(("confidence_bias", None, None))
    return out, vocab, rank, cw.shape[1]


def _variant(ckpt: Checkpoint, kind: str, used_sidecar: bool) -> str:
    if kind != "dspark":
        return {"dflash": "DFlash", "dflash2": "DFlash 2"}[kind]
    archs = ckpt.config.get("architectures") or []
    if used_sidecar:
        return "DSpark (SpecForge sidecar)"
    if "Qwen3DSparkModel" in archs:
        return "DSpark (DeepSpec native)"
    return "DSpark (single file)"


def plan_drafter(ckpt: Checkpoint, kind: str, layout: str = "lucebox",
                 outtype: str = schema.DEFAULT_OUTTYPE, no_yarn: bool = False,
                 target_vocab: TargetVocab | None = None) -> DraftPlan:
    if layout not in schema.LAYOUTS:
        raise LuceError(f"unknown layout {layout!r}; choose one of {', '.join(schema.LAYOUTS)}")
    if layout == "llama.cpp" and target_vocab is None:
        raise LuceError(NEEDS_TARGET)
    if outtype not in schema.OUTTYPES:
        raise LuceError(f"unknown outtype {outtype!r}; choose one of {', '.join(schema.OUTTYPES)}")
    cfg = normalise(ckpt.config, kind, no_yarn=no_yarn)
    mapped, dropped = _map_main(ckpt, kind)
    warnings = list(ckpt.warnings)

    by_role = {(role, layer): t for role, layer, t in mapped}
    layers = sorted({layer for _, layer, _ in mapped if layer is not None})
    for key in [("fc", None), ("hidden_norm", None), ("output_norm", None), ("attn_k", 0),
                ("attn_q", 0), ("ffn_gate", 0)]:
        if key not in by_role:
            raise LuceError(f"checkpoint is missing the {key[0]} tensor" + (" of layer 0" if key[1] == 0 else ""))
    fc = by_role[("fc", None)]
    n_target = check_against_shapes(
        cfg, n_layer_found=(layers[-1] + 1 if layers else 0), hidden_found=fc.shape[0],
        k_rows=by_role[("attn_k", 0)].shape[0], q_rows=by_role[("attn_q", 0)].shape[0],
        ff_found=by_role[("ffn_gate", 0)].shape[0], fc_cols=fc.shape[1])

    markov_vocab = markov_rank = conf_dim = 0
    heads, used_sidecar = [], False
    if kind == "dspark":
        heads, markov_vocab, markov_rank, conf_dim = _dspark_heads(ckpt, cfg.hidden, warnings)
        if cfg.markov_rank is not None and cfg.markov_rank != markov_rank:
            raise LuceError(f"config.json markov_rank={cfg.markov_rank} but the weights say {markov_rank} "
                            f"(markov_w1 columns)")
    used = {t.name for _, _, t in heads if t is not None and t.file == ckpt.sidecar_path}
    used_sidecar = bool(used)
    unused = sorted(set(ckpt.sidecar) - used)
    if unused:
        # e.g. Domino GRU heads (domino_*), which luce does not convert
        warnings.append(f"{len(unused)} sidecar tensors not converted ({unused[0]}, ...)")
    shape = _draft_shape(cfg, n_target, by_role, markov_rank, markov_vocab, conf_dim)
    _check_conv_config(cfg, by_role, kind)

    tensors = []
    for role, layer, t in mapped + heads:
        gguf_name = schema.ROLE[role].name(layout, layer)
        expected = schema.expected_shape(role, shape)
        hf_shape = t.shape if t is not None else (1,)
        if tuple(reversed(hf_shape)) != expected:
            raise LuceError(f"tensor {t.name if t else gguf_name!r} has shape {list(hf_shape)}, expected "
                            f"{list(reversed(expected))} for {gguf_name}")
        load = _loader(ckpt, t) if t is not None else (lambda: np.zeros(1, dtype=np.float32))
        source = t.name if t is not None else "(zero bias)"
        tensors.append(PlannedTensor(role, layer, gguf_name, source, tuple(hf_shape),
                                     schema.stored_type(role, expected, outtype), load))
    _check_complete(tensors, cfg, kind)
    tensors.sort(key=_order)
    plan = DraftPlan(kind, _variant(ckpt, kind, used_sidecar), layout,
                     schema.ARCH if layout == "lucebox" else schema.UPSTREAM_ARCH,
                     cfg, n_target, tensors, [], dropped, warnings,
                     target_vocab if layout == "llama.cpp" else None)
    if plan.target_vocab is not None:
        check_mask(plan.target_vocab, cfg.mask_token_id)
    plan.keys = drafter_keys(plan, shape)
    return plan


def _order(t: PlannedTensor):
    # Lucebox order: dflash.* by name, output_*, blk.N.* by layer; DSpark heads come last
    # (the reference producer appends them in its aux pass).
    group = schema.ROLE[t.role].group
    if group == "dspark":
        return (3, schema.ROLES.index(schema.ROLE[t.role]), t.gguf_name)   # w1, w2, weight, bias
    if t.layer is not None:
        return (2, t.layer, t.gguf_name)
    return (1 if t.role == "output_norm" else 0, 0, t.gguf_name)


def _draft_shape(cfg, n_target, by_role, markov_rank, markov_vocab, conf_dim) -> schema.DraftShape:
    sel = by_role.get(("selector_hproj", None))
    pred = by_role.get(("selector_pred_cb", None))
    sel_rank = sel.shape[0] if sel is not None else 0
    if cfg.selector_rank and sel is not None and cfg.selector_rank != sel_rank:
        raise LuceError(f"config.json selector_rank={cfg.selector_rank} but the weights say {sel_rank} "
                        f"(hidden_projection rows)")
    if sel is not None:
        cfg.selector_rank = sel_rank
    return schema.DraftShape(
        hidden=cfg.hidden, n_layer=cfg.n_layer, n_head=cfg.n_head, n_head_kv=cfg.n_head_kv,
        head_dim=cfg.head_dim, ff=cfg.ff, n_target_layers=n_target,
        conv_kernel=cfg.conv_kernel, conv_group=cfg.conv_group, selector_rank=sel_rank,
        selector_vocab=pred.shape[0] if pred is not None else 0,
        markov_rank=markov_rank, markov_vocab=markov_vocab, confidence_dim=conf_dim)


def _check_conv_config(cfg: DraftConfig, by_role, kind: str) -> None:
    if kind != "dflash2":
        return
    base = by_role.get(("attn_conv_base", 0))
    if base is not None and base.shape[1] != cfg.conv_kernel:
        raise LuceError(f"config.json conv_kernel_size={cfg.conv_kernel} but the weights say "
                        f"{base.shape[1]} (attention_conv.base_kernel taps)")
    if cfg.conv_group <= 0 or cfg.hidden % cfg.conv_group:
        raise LuceError(f"conv_group_size={cfg.conv_group} must be positive and divide hidden_size={cfg.hidden}")
    proj = by_role.get(("attn_conv_proj", 0))
    if proj is not None and proj.shape[0] != 2 * cfg.conv_kernel * (cfg.hidden // cfg.conv_group):
        groups = proj.shape[0] / (2 * cfg.conv_kernel)
        raise LuceError(f"config.json conv_group_size={cfg.conv_group} but the weights say "
                        f"{cfg.hidden / groups:g} (kernel_projection rows {proj.shape[0]})")


def _check_complete(tensors: list[PlannedTensor], cfg: DraftConfig, kind: str) -> None:
    have = {(t.role, t.layer) for t in tensors}
    need = [(r, i) for i in range(cfg.n_layer) for r in schema.LAYER_ROLES]
    if kind == "dflash2":
        need += [(r, i) for i in range(cfg.n_layer) for r in schema.CONV_ROLES]
        if any(r in schema.SELECTOR_ROLES for r, _ in have):
            need += [(r, None) for r in schema.SELECTOR_ROLES]
    for role, layer in need:
        if (role, layer) not in have:
            where = f" of layer {layer}" if layer is not None else ""
            raise LuceError(f"checkpoint is missing the {role} tensor{where} "
                            f"({schema.ROLE[role].name('lucebox', layer)})")


def drafter_keys(plan: DraftPlan, shape: schema.DraftShape) -> list[tuple[schema.Key, object]]:
    """(Key, value) in write order. The layout picks the DFlash-specific spellings."""
    c, S = plan.config, schema
    up = plan.layout == "llama.cpp"
    keys = [
        (S.NAME, f"DFlash-Draft-{c.hidden}h-{c.n_layer}L"),
        (S.CONTEXT_LENGTH, c.context_length), (S.EMBEDDING_LENGTH, c.hidden),
        (S.BLOCK_COUNT, c.n_layer), (S.FEED_FORWARD_LENGTH, c.ff),
        (S.HEAD_COUNT, c.n_head), (S.HEAD_COUNT_KV, c.n_head_kv),
        (S.KEY_LENGTH, c.head_dim), (S.VALUE_LENGTH, c.head_dim),
    ]
    # Upstream files have no vocab_size: the vocabulary is the tokenizer's (the target's).
    keys += [] if up else [(S.VOCAB_SIZE, c.vocab)]
    keys += [(S.RMS_EPS, c.eps), (S.ROPE_FREQ_BASE, c.rope_theta)]
    if c.yarn is not None:
        keys += [(S.ROPE_SCALING_TYPE, S.YARN), (S.ROPE_SCALING_FACTOR, c.yarn.factor),
                 (S.ROPE_SCALING_ORIG_CTX, c.yarn.original_context),
                 (S.UP_ROPE_BETA_FAST if up else S.ROPE_BETA_FAST, c.yarn.beta_fast),
                 (S.UP_ROPE_BETA_SLOW if up else S.ROPE_BETA_SLOW, c.yarn.beta_slow)]
    if up:
        # The mask id goes in tokenizer.ggml.mask_token_id, written with the target's tokenizer.
        keys.append((S.UP_BLOCK_SIZE, c.block_size))
        if c.target_layer_ids is not None:
            keys.append((S.UP_TARGET_LAYERS, [i + 1 for i in c.target_layer_ids]))
        if plan.target_vocab is not None and plan.target_vocab.mrope:
            keys.append((S.UP_ROPE_SECTIONS, [c.head_dim // 2, 0, 0, 0]))
    else:
        keys += [(S.N_TARGET_LAYERS, plan.n_target_layers), (S.BLOCK_SIZE, c.block_size),
                 (S.MASK_TOKEN_ID, c.mask_token_id)]
        if c.target_layer_ids is not None:
            keys.append((S.TARGET_LAYER_IDS, list(c.target_layer_ids)))
    if c.swa_pattern is not None:
        keys += [(S.SLIDING_WINDOW, c.sliding_window), (S.SLIDING_WINDOW_PATTERN, list(c.swa_pattern))]
    keys += _causal_key(c, up)
    if plan.kind == "dflash2":
        has_selector = shape.selector_rank > 0
        keys += [(S.UP_CONV_KERNEL_SIZE if up else S.CONV_KERNEL_SIZE, c.conv_kernel),
                 (S.UP_CONV_GROUP_SIZE if up else S.CONV_GROUP_SIZE, c.conv_group)]
        if has_selector:
            keys += [(S.UP_SELECTOR_RANK if up else S.SELECTOR_RANK, shape.selector_rank),
                     (S.UP_SELECTOR_TOP_K if up else S.SELECTOR_TOP_K, c.selector_top_k)]
        keys += _logit_transform_keys(c, up)
    if plan.kind == "dspark":
        keys.append((S.UP_SAMPLE_FROM_ANCHOR if up else S.SAMPLE_FROM_ANCHOR, bool(c.sample_from_anchor)))
        if up:
            keys.append((S.UP_HAS_CONFIDENCE, shape.confidence_dim > 0))
        else:
            keys += [(S.DSPARK_ENABLED, 1), (S.DSPARK_MARKOV_RANK, shape.markov_rank),
                     (S.DSPARK_VOCAB_SIZE, shape.markov_vocab)]
            if shape.confidence_dim:
                keys += [(S.DSPARK_CONFIDENCE_DIM, shape.confidence_dim), (S.DSPARK_CONFIDENCE_ENABLED, 1)]
    return keys


def _causal_key(c: DraftConfig, up: bool) -> list[tuple[schema.Key, object]]:
    """`attention.causal`: whether the sliding layers are in-block causal (full layers never are).
    llama.cpp's layout carries the checkpoint's is_causal as its converter does (true with a
    pattern when the checkpoint is silent). The lucebox layout writes it only where it departs
    from that layout's reading of a pattern, "sliding = causal": bidirectional sliding layers
    (DFlash 2 Qwen3.8), so every other drafter keeps the bytes it had."""
    if up and (c.swa_pattern is not None or c.causal is not None):
        return [(schema.CAUSAL, c.causal if c.causal is not None else True)]
    if not up and c.swa_pattern is not None and c.causal is False:
        return [(schema.CAUSAL, False)]
    return []


def _logit_transform_keys(c: DraftConfig, up: bool) -> list[tuple[schema.Key, object]]:
    """The DFlash 2 unary-logit scalars, only where they differ from the defaults (so a drafter
    without them converts to the same bytes as before they existed). llama.cpp applies the same
    transform from its generic logit_scale / final_logit_softcapping keys."""
    S = schema
    keys = []
    if c.output_multiplier != S.DEFAULT_OUTPUT_MULTIPLIER:
        keys.append((S.UP_LOGIT_SCALE if up else S.OUTPUT_MULTIPLIER, c.output_multiplier))
    if c.final_logit_softcapping != S.DEFAULT_FINAL_LOGIT_SOFTCAPPING:
        keys.append((S.UP_FINAL_LOGIT_SOFTCAPPING if up else S.FINAL_LOGIT_SOFTCAPPING, c.final_logit_softcapping))
    return keys


# ---- writing ---------------------------------------------------------------------------------

def encode(data: np.ndarray, stored: GGMLQuantizationType) -> np.ndarray:
    """HF-shaped float array -> the bytes/values GGUFWriter stores for `stored`."""
    # F32/F16 are plain casts; BF16 rounds to nearest even; Q8_0 packs 32-value blocks.
    return gguf_quants.quantize(np.ascontiguousarray(data, dtype=np.float32), stored)


def _add_tensor_info(w: GGUFWriter, t: PlannedTensor) -> None:
    if t.stored == Q.F32:
        w.add_tensor_info(t.gguf_name, t.hf_shape, np.dtype(np.float32), t.nbytes)
    elif t.stored == Q.F16:
        w.add_tensor_info(t.gguf_name, t.hf_shape, np.dtype(np.float16), t.nbytes)
    elif t.stored == Q.BF16:
        w.add_tensor_info(t.gguf_name, t.hf_shape, np.dtype(np.uint16), t.nbytes, raw_dtype=Q.BF16)
    else:   # quantized: gguf-py takes the byte shape of the last dimension
        block, size = GGML_QUANT_SIZES[t.stored]
        byte_shape = (*t.hf_shape[:-1], t.hf_shape[-1] // block * size)
        w.add_tensor_info(t.gguf_name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.stored)


def add_key(w: GGUFWriter, key: schema.Key, arch: str, value) -> None:
    w.add_key_value(key.at(arch), value, key.vtype, key.etype)


def write_drafter(plan: DraftPlan, path, on_tensor: Callable[[PlannedTensor], None] = lambda t: None) -> None:
    w = GGUFWriter(path, plan.arch)
    try:
        for key, value in plan.keys:
            add_key(w, key, plan.arch, value)
        if plan.target_vocab is not None:
            plan.target_vocab.add_to(w)
            add_key(w, schema.TOKENIZER_MASK_TOKEN_ID, plan.arch, plan.config.mask_token_id)
        for t in plan.tensors:
            _add_tensor_info(w, t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in plan.tensors:
            data = encode(t.load(), t.stored)
            if data.nbytes != t.nbytes:
                raise LuceError(f"internal: {t.gguf_name} encoded to {data.nbytes} bytes, planned {t.nbytes}")
            w.write_tensor_data(data)
            on_tensor(t)
    finally:
        w.close()
