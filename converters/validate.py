"""`luce inspect` rules: a drafter GGUF (either layout), a qwen35 target GGUF, and the pair.

The rules mirror the Lucebox drafter loader (spec/engine.md §3, §11.6) plus luce's own (§9:
YaRN without an original context, DSpark without sample_from_anchor). Every file is untrusted:
it is opened with the bounded reader first, so a crafted container never reaches these rules.
Each rule adds Findings; any error makes the report invalid (exit 1); warnings do not.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

from gguf.constants import Keys, MODEL_TENSOR, TENSOR_NAMES

from luce.converters import schema, target_rules
from luce.converters.gguf_reader import FLOAT_TYPES, INTEGER_TYPES, GGUFFile, GGUFValueType
from luce.converters.schema import ROLE

ERROR, WARNING = "error", "warning"
# Frozen copies of the target's embedding / head that some drafters ship (llama.cpp keeps them).
OWN_EMBEDDING_TENSORS = tuple(TENSOR_NAMES[t] + ".weight" for t in (MODEL_TENSOR.TOKEN_EMBD, MODEL_TENSOR.OUTPUT))
TARGET_ARCHS = (schema.TARGET_ARCH,)


@dataclass
class Finding:
    severity: str
    code: str
    message: str


@dataclass
class Report:
    path: str
    kind: str                       # drafter | target | unknown
    arch: str | None
    summary: dict = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    target: "Report | None" = None

    @property
    def valid(self) -> bool:
        own = all(f.severity != ERROR for f in self.findings)
        return own and (self.target is None or self.target.valid)

    @property
    def exit_code(self) -> int:
        return 0 if self.valid else 1

    def error(self, code: str, message: str) -> None:
        self.findings.append(Finding(ERROR, code, message))

    def warn(self, code: str, message: str) -> None:
        self.findings.append(Finding(WARNING, code, message))

    def to_dict(self) -> dict:
        out = {"valid": self.valid, "kind": self.kind, "arch": self.arch, "path": self.path,
               **self.summary, "findings": [f.__dict__ for f in self.findings]}
        if self.target is not None:
            out["target"] = self.target.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_jsonable)


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


def inspect_gguf(path, target=None) -> Report:
    """Validate one GGUF (and a target, if given). GGUFFormatError (exit 2) if unreadable."""
    with GGUFFile.open(path) as gf:
        report, view = _inspect_open(gf)
        if target is not None:
            with GGUFFile.open(target) as tf:
                report.target, _ = _inspect_open(tf)
            if view is not None:
                _check_pair(report, report.target, view)
    return report


def _inspect_open(gf: GGUFFile) -> tuple[Report, "DraftView | None"]:
    arch, view = gf.arch, None
    if arch in schema.DRAFT_ARCHS:
        report = Report(str(gf.path), "drafter", arch)
        view = check_drafter(gf, report)
    elif arch in TARGET_ARCHS:
        report = Report(str(gf.path), "target", arch)
        check_target(gf, report)
    else:
        report = Report(str(gf.path), "unknown", arch)
        report.error("arch", f"unexpected architecture {arch!r}; expected a drafter "
                             f"({', '.join(schema.DRAFT_ARCHS)}) or a {schema.TARGET_ARCH} target")
    report.summary["file_size"] = gf.file_size
    return report, view


# ---- typed key access ------------------------------------------------------------------------

class _Keys:
    """Typed reads with findings instead of exceptions; the first present name wins."""

    def __init__(self, gf: GGUFFile, report: Report):
        self.gf, self.report = gf, report

    def _find(self, names):
        return next((n for n in names if n in self.gf.kv), None)

    def int(self, *names):
        name = self._find(names)
        if name is None:
            return None
        if self.gf.kv_type[name][0] not in INTEGER_TYPES:
            self.report.error("key-type", f"{name} has type {self.gf.type_name(name)}, expected an integer")
            return None
        return int(self.gf.kv[name])

    def float(self, *names):
        name = self._find(names)
        if name is None:
            return None
        if self.gf.kv_type[name][0] not in FLOAT_TYPES | INTEGER_TYPES:
            self.report.error("key-type", f"{name} has type {self.gf.type_name(name)}, expected a number")
            return None
        return float(self.gf.kv[name])

    def bool(self, *names):
        name = self._find(names)
        if name is None:
            return None
        if self.gf.kv_type[name][0] != GGUFValueType.BOOL:
            self.report.error("key-type", f"{name} has type {self.gf.type_name(name)}, expected a bool")
            return None
        return bool(self.gf.kv[name])

    def str(self, *names):
        name = self._find(names)
        if name is None:
            return None
        if self.gf.kv_type[name][0] != GGUFValueType.STRING:
            self.report.error("key-type", f"{name} has type {self.gf.type_name(name)}, expected a string")
            return None
        return self.gf.kv[name]

    def array(self, name, element_types):
        """(values as a list, or None) for an array of one of element_types."""
        if name not in self.gf.kv:
            return None
        vtype, etype = self.gf.kv_type[name]
        if vtype != GGUFValueType.ARRAY or etype not in element_types:
            self.report.error("key-type", f"{name} has type {self.gf.type_name(name)}, expected an array of "
                                          f"{'/'.join(t.name for t in element_types)}")
            return None
        return [v.item() if hasattr(v, "item") else v for v in self.gf.kv[name]]

    def int_or_layer_array(self, name, n_layer):
        """qwen35 hparams that llama.cpp reads as a scalar or a per-layer array."""
        if name in self.gf.kv and self.gf.kv_type[name][0] == GGUFValueType.ARRAY:
            values = self.array(name, INTEGER_TYPES)
            if values is None:
                return None
            if n_layer is not None and len(values) != n_layer:
                self.report.error("layer-array-length", f"{name} has {len(values)} entries but block_count "
                                                        f"is {n_layer}")
                return None
            return values
        return self.int(name)


# ---- drafter ---------------------------------------------------------------------------------

@dataclass
class DraftView:
    """A drafter GGUF in layout-independent terms (values None when absent or invalid)."""
    layout: str
    hidden: int | None = None
    n_layer: int | None = None
    ff: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    head_dim: int | None = None
    vocab: int | None = None
    block_size: int | None = None
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = None
    n_target_layers: int | None = None
    tensors: dict = field(default_factory=dict)   # (role, layer) -> TensorInfo
    selector_vocab: int | None = None
    selector_top_k: int | None = None
    markov_vocab: int | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    sliding: list[bool] | None = None      # per layer: keeps only the last W context keys
    causal: bool | None = None             # attention.causal as stored (None: absent)


def _find_tensors(gf: GGUFFile, n_layer: int | None):
    """(role, layer) -> TensorInfo for both layouts' names; also the names nobody claimed."""
    found, claimed = {}, set()
    layers = range(n_layer) if n_layer else range(0)
    for role in schema.ROLES:
        for layer in (layers if role.per_layer else [None]):
            for name in role.read_names(layer):
                if name in gf.tensors:
                    found[(role.role, layer)] = gf.tensors[name]
                    claimed.add(name)
                    break
    return found, [n for n in gf.tensors if n not in claimed]


def check_drafter(gf: GGUFFile, report: Report) -> DraftView:
    a, k = gf.arch, _Keys(gf, report)
    S = schema
    view = DraftView(layout="llama.cpp" if a == S.UPSTREAM_ARCH else "lucebox")
    view.hidden = k.int(S.EMBEDDING_LENGTH.at(a))
    view.n_layer = k.int(S.BLOCK_COUNT.at(a))
    view.ff = k.int(S.FEED_FORWARD_LENGTH.at(a))
    view.n_head = k.int(S.HEAD_COUNT.at(a))
    view.n_head_kv = k.int(S.HEAD_COUNT_KV.at(a))
    view.head_dim = k.int(S.KEY_LENGTH.at(a))
    value_len = k.int(S.VALUE_LENGTH.at(a))
    view.vocab = k.int(S.VOCAB_SIZE.at(a))
    if view.vocab is None and view.layout == "llama.cpp" and S.VOCAB_SIZE.at(a) not in gf.kv:
        # llama.cpp's converter writes no vocab_size: the vocabulary is the (target's) tokenizer's.
        tokens = gf.kv.get(S.TOKENIZER_TOKENS.template)
        view.vocab = len(tokens) if isinstance(tokens, list) else None
    eps = k.float(S.RMS_EPS.at(a))
    _check_hparams(report, view, eps, a, gf.kv)
    if view.head_dim and S.UP_ROPE_SECTIONS.at(a) in gf.kv and view.head_dim % 2 == 0:
        try:     # the target's rule; the drafter ropes the whole head (partial rotary is refused)
            target_rules.check_rope_sections(target_rules.Meta(gf), view.head_dim, S.UP_ROPE_SECTIONS.at(a),
                                             S.KEY_LENGTH.at(a))
        except target_rules.Refused as e:
            report.error(e.code, str(e))
    if value_len is not None and view.head_dim is not None and value_len != view.head_dim:
        report.warn("head-dim", f"value_length {value_len} differs from key_length {view.head_dim}")

    n_layer = view.n_layer if view.n_layer and view.n_layer <= S.MAX_LAYERS else None
    view.tensors, unknown = _find_tensors(gf, n_layer)
    for name in unknown:
        if name in OWN_EMBEDDING_TENSORS:
            report.warn("own-embedding", f"drafter carries its own {name}; luce drafts with the target's token "
                                         f"embedding and output head instead")
        else:
            report.warn("tensor-unknown", f"tensor {name!r} is not part of the drafter schema")

    _check_block_and_mask(k, report, view, a)
    _check_target_layers(k, report, view, a)
    _check_rope(k, report, a)
    _check_swa(k, report, view, a)
    _check_trunk_tensors(report, view)
    conv_k = _check_conv(k, report, view, a)
    _check_selector(k, report, view, a)
    _check_logit_transform(k, report, view, a)
    _check_unsupported(k, report, view, a)
    dspark = _check_dspark(k, report, view, a)
    _summarise_drafter(gf, report, view, conv_k, dspark)
    return view


def _check_hparams(report, v: DraftView, eps, arch, kv) -> None:
    """Missing or out-of-range hparams are reported once and then treated as unknown (None),
    so that no shape rule fires on a value that is already known to be wrong."""
    S = schema
    bounds = [("hidden", S.EMBEDDING_LENGTH, S.MAX_EMBD), ("n_layer", S.BLOCK_COUNT, S.MAX_LAYERS),
              ("ff", S.FEED_FORWARD_LENGTH, S.MAX_FF), ("n_head", S.HEAD_COUNT, S.MAX_HEADS),
              ("n_head_kv", S.HEAD_COUNT_KV, S.MAX_HEADS), ("head_dim", S.KEY_LENGTH, S.MAX_HEAD_DIM),
              ("vocab", S.VOCAB_SIZE, S.MAX_VOCAB)]
    for attr, key, bound in bounds:
        value, name = getattr(v, attr), key.at(arch)
        if value is None:
            if attr == "vocab" and v.layout == "llama.cpp":
                continue        # optional there; the runtime takes the target's vocabulary
            if name not in kv:
                report.error("hparam-missing", f"{name} is missing")
        elif not 1 <= value <= bound:
            report.error("hparam-range", f"{name}={value} is outside 1..{bound}")
            setattr(v, attr, None)
    if eps is None:
        if S.RMS_EPS.at(arch) not in kv:
            report.error("hparam-missing", f"{S.RMS_EPS.at(arch)} is missing")
    elif not 0 < eps < 1:
        report.error("hparam-range", f"{S.RMS_EPS.at(arch)}={eps} is outside (0, 1)")
    if v.head_dim and v.head_dim % 2:
        report.error("hparam-range", f"{S.KEY_LENGTH.at(arch)}={v.head_dim} must be even (RoPE pairs)")
        v.head_dim = None
    if v.n_head and v.n_head_kv and v.n_head % v.n_head_kv:
        report.error("head-ratio", f"head_count {v.n_head} is not divisible by head_count_kv {v.n_head_kv}")


def _check_block_and_mask(k: _Keys, report, v: DraftView, a) -> None:
    S = schema
    v.block_size = k.int(S.BLOCK_SIZE.at(a), S.UP_BLOCK_SIZE.at(a))
    if v.block_size is None:
        if not {S.BLOCK_SIZE.at(a), S.UP_BLOCK_SIZE.at(a)} & k.gf.kv.keys():
            report.error("block-size-missing", f"no {S.BLOCK_SIZE.at(a)} (or {S.UP_BLOCK_SIZE.at(a)})")
    elif v.block_size < 2:
        report.error("block-size-range", f"block_size={v.block_size} must be at least 2")
    elif v.block_size > S.MAX_BLOCK:       # the runtime's block buffers hold MAX_BLOCK rows
        name = S.BLOCK_SIZE.at(a) if S.BLOCK_SIZE.at(a) in k.gf.kv else S.UP_BLOCK_SIZE.at(a)
        report.error("block-size-range", f"{name}={v.block_size} is outside 2..{S.MAX_BLOCK}")
    names = [S.MASK_TOKEN_ID.at(a), S.UP_MASK_TOKEN_ID.at(a), S.UP_MASK_TOKEN_ID.at(S.UPSTREAM_ARCH),
             S.TOKENIZER_MASK_TOKEN_ID.template]
    values = {n: k.int(n) for n in names if n in k.gf.kv}
    values = {n: x for n, x in values.items() if x is not None}
    if not values and not any(n in k.gf.kv for n in names):
        report.error("mask-missing", f"no mask token id ({S.MASK_TOKEN_ID.at(a)})")
        return
    if not values:
        return
    if len(set(values.values())) > 1:
        report.warn("mask-conflict", "mask token ids disagree: " + ", ".join(f"{n}={x}" for n, x in values.items()))
    v.mask_token_id = next(iter(values.values()))
    if v.vocab and not 0 <= v.mask_token_id < v.vocab:
        report.error("mask-range", f"mask_token_id={v.mask_token_id} is outside vocab_size {v.vocab}")


def _check_target_layers(k: _Keys, report, v: DraftView, a) -> None:
    S = schema
    ints = (GGUFValueType.INT32, GGUFValueType.UINT32)
    if S.TARGET_LAYER_IDS.at(a) in k.gf.kv:
        v.target_layer_ids = k.array(S.TARGET_LAYER_IDS.at(a), ints)
    elif S.UP_TARGET_LAYERS.at(a) in k.gf.kv:
        one_based = k.array(S.UP_TARGET_LAYERS.at(a), ints)
        v.target_layer_ids = None if one_based is None else [i - 1 for i in one_based]
    declared = k.int(S.N_TARGET_LAYERS.at(a))
    fc = v.tensors.get(("fc", None))
    if declared is not None:
        v.n_target_layers = declared
    elif v.target_layer_ids is not None:
        v.n_target_layers = len(v.target_layer_ids)
    elif fc is not None and v.hidden:
        v.n_target_layers = fc.shape[0] // v.hidden
    if v.target_layer_ids is None:
        report.warn("target-ids-missing", "no target layer ids; the engine will use its default capture layers")
        return
    if v.n_target_layers is not None and len(v.target_layer_ids) != v.n_target_layers:
        report.error("target-ids-length", f"{len(v.target_layer_ids)} target layer ids but n_target_layers "
                                          f"is {v.n_target_layers}")
    if any(i < 0 for i in v.target_layer_ids):
        report.error("target-ids-range", f"target layer ids {v.target_layer_ids} contain a negative id")


def _check_rope(k: _Keys, report, a) -> None:
    S = schema
    theta = k.float(S.ROPE_FREQ_BASE.at(a))
    if theta is None and S.ROPE_FREQ_BASE.at(a) not in k.gf.kv:
        report.warn("rope-theta-missing", f"{S.ROPE_FREQ_BASE.at(a)} is missing; the engine uses a default")
    elif theta is not None and not theta > 1:
        report.error("hparam-range", f"{S.ROPE_FREQ_BASE.at(a)} must be > 1")
    factor = k.float(S.ROPE_SCALING_FACTOR.at(a))
    if factor is None or not factor > 1:
        return                      # plain RoPE: the YaRN keys are not read
    original = k.int(S.ROPE_SCALING_ORIG_CTX.at(a))
    if S.ROPE_SCALING_ORIG_CTX.at(a) in k.gf.kv and original is None:
        return                      # wrong type, reported
    if not original or original <= 0:
        report.error("yarn-no-original", f"YaRN factor {factor:g} without original_context_length: the engine "
                                         f"ignores YaRN and runs plain RoPE")
    elif original > S.MAX_CTX:
        report.error("hparam-range", f"{S.ROPE_SCALING_ORIG_CTX.at(a)}={original} is outside 1..{S.MAX_CTX}")
    for pair in ((S.ROPE_BETA_FAST, S.UP_ROPE_BETA_FAST), (S.ROPE_BETA_SLOW, S.UP_ROPE_BETA_SLOW)):
        k.float(*(key.at(a) for key in pair))       # numbers (a wrong type is reported)


def _check_swa(k: _Keys, report, v: DraftView, a) -> None:
    S = schema
    pattern = k.array(S.SLIDING_WINDOW_PATTERN.at(a), (GGUFValueType.BOOL,))
    window = k.int(S.SLIDING_WINDOW.at(a))
    v.causal = k.bool(S.CAUSAL.at(a))
    if pattern is None:
        return
    v.sliding = pattern
    if v.n_layer is not None and len(pattern) != v.n_layer:
        report.error("swa-pattern-length", f"sliding_window_pattern has {len(pattern)} entries but block_count "
                                           f"is {v.n_layer}")
    if any(pattern) and (not window or window <= 0):
        if window is not None or S.SLIDING_WINDOW.at(a) not in k.gf.kv:
            report.error("swa-window-missing", "sliding_window_pattern marks sliding layers but sliding_window is "
                                               "missing")
    elif any(pattern) and window > S.MAX_CTX:
        report.error("hparam-range", f"{S.SLIDING_WINDOW.at(a)}={window} is outside 1..{S.MAX_CTX}")


def _shape_ok(report, v: DraftView, role: str, layer, expected) -> bool:
    t = v.tensors.get((role, layer))
    if t is None or expected is None:
        return True
    if t.shape != tuple(expected):
        report.error("tensor-shape", f"{t.name} has shape {list(t.shape)}, expected {list(expected)}")
        return False
    return True


def _check_trunk_tensors(report, v: DraftView) -> None:
    required = [("fc", None), ("hidden_norm", None), ("output_norm", None)]
    required += [(r, i) for i in range(v.n_layer or 0) for r in schema.LAYER_ROLES]
    missing = [(r, i) for r, i in required if (r, i) not in v.tensors]
    for role, layer in missing[:5]:
        report.error("tensor-missing", f"missing tensor {ROLE[role].name(v.layout, layer)}")
    if len(missing) > 5:
        report.error("tensor-missing", f"... and {len(missing) - 5} more missing tensors")
    if None in (v.hidden, v.n_head, v.n_head_kv, v.head_dim, v.ff):
        return
    shape = schema.DraftShape(v.hidden, v.n_layer or 0, v.n_head, v.n_head_kv, v.head_dim, v.ff,
                              v.n_target_layers or 0)
    fc = v.tensors.get(("fc", None))
    if fc is not None:
        if fc.shape[1:] != (v.hidden,) or len(fc.shape) != 2:
            report.error("tensor-shape", f"{fc.name} has shape {list(fc.shape)}, expected [N*{v.hidden}, {v.hidden}]")
        elif v.n_target_layers is not None and fc.shape[0] != v.n_target_layers * v.hidden:
            # An error even when it divides evenly: the runtime sizes the fused features by the taps.
            report.error("fc-width", f"{fc.name} width {fc.shape[0]} != n_target_layers {v.n_target_layers} x "
                                     f"hidden {v.hidden}")
    for (role, layer) in list(v.tensors):
        if schema.ROLE[role].group == "trunk" and role != "fc":
            _shape_ok(report, v, role, layer, schema.expected_shape(role, shape))


def _check_conv(k: _Keys, report, v: DraftView, a) -> int:
    S = schema
    kernel = k.int(S.CONV_KERNEL_SIZE.at(a), S.UP_CONV_KERNEL_SIZE.at(a)) or 0
    group = k.int(S.CONV_GROUP_SIZE.at(a), S.UP_CONV_GROUP_SIZE.at(a))
    group = S.DEFAULT_CONV_GROUP_SIZE if group is None else group
    present = [(r, i) for (r, i) in v.tensors if r in S.CONV_ROLES]
    if not present and kernel <= 0:
        return 0
    missing = [(r, i) for i in range(v.n_layer or 0) for r in S.CONV_ROLES if (r, i) not in v.tensors]
    if kernel > S.MAX_CONV_K:
        report.error("conv-incomplete", f"conv_kernel_size={kernel} is outside 1..{S.MAX_CONV_K}")
        return kernel
    if missing or kernel <= 0:
        what = (f"missing {ROLE[missing[0][0]].name(v.layout, missing[0][1])}" if missing
                else "conv_kernel_size is not set")
        report.error("conv-incomplete", f"DFlash 2 conv tensors/metadata incomplete: {what}")
    if group <= 0 or (v.hidden and v.hidden % group):
        report.error("conv-group", f"conv_group_size={group} must be positive and divide embedding_length {v.hidden}")
        return kernel
    if v.hidden and kernel > 0:
        shape = schema.DraftShape(v.hidden, 0, 0, 0, 0, 0, 0, conv_kernel=kernel, conv_group=group)
        for role, layer in present:
            _shape_ok(report, v, role, layer, schema.expected_shape(role, shape))
    return kernel


def _check_selector(k: _Keys, report, v: DraftView, a) -> None:
    S = schema
    rank_key = k.int(S.SELECTOR_RANK.at(a), S.UP_SELECTOR_RANK.at(a))
    parts = {r: v.tensors.get((r, None)) for r in S.SELECTOR_ROLES}
    if not any(parts.values()) and rank_key is None:
        return
    if not all(parts.values()):
        absent = [ROLE[r].name(v.layout) for r, t in parts.items() if t is None]
        report.error("selector-incomplete", f"DFlash 2 selector needs all three tensors; missing {', '.join(absent)}")
        return
    hproj, pred, succ = (parts[r] for r in S.SELECTOR_ROLES)
    if len(hproj.shape) != 2 or len(pred.shape) != 2 or len(succ.shape) != 2:
        report.error("selector-rank", "selector tensors must be 2-D")
        return
    ranks = {hproj.shape[1], pred.shape[0], succ.shape[0]} | ({rank_key} if rank_key is not None else set())
    if len(ranks) != 1:
        report.error("selector-rank", f"selector ranks differ: hproj {hproj.shape[1]}, pred_cb {pred.shape[0]}, "
                                      f"succ_cb {succ.shape[0]}" + (f", selector_rank {rank_key}" if rank_key else ""))
    if pred.shape[1] != succ.shape[1]:
        report.error("selector-vocab", f"codebook vocabularies differ: {pred.shape[1]} vs {succ.shape[1]}")
    if v.hidden and hproj.shape[0] != v.hidden:
        report.error("tensor-shape", f"{hproj.name} has shape {list(hproj.shape)}, expected [{v.hidden}, R]")
    v.selector_vocab = pred.shape[1]
    top_k = k.int(S.SELECTOR_TOP_K.at(a), S.UP_SELECTOR_TOP_K.at(a))
    v.selector_top_k = S.DEFAULT_SELECTOR_TOP_K if top_k is None else top_k
    if not 1 <= v.selector_top_k <= S.MAX_SELECTOR_TOP_K or v.selector_top_k > v.selector_vocab:
        report.error("selector-top-k", f"selector_top_k={v.selector_top_k} must be in 1..{S.MAX_SELECTOR_TOP_K} "
                                       f"and <= codebook vocab {v.selector_vocab}")


def _check_logit_transform(k: _Keys, report, v: DraftView, a) -> None:
    """DFlash 2 unary-logit scalars: the runtime refuses a non-finite or non-positive value (a cap
    of 0 divides by zero; a multiplier <= 0 reverses or flattens the candidate order)."""
    S = schema
    for key, up_key, attr in ((S.OUTPUT_MULTIPLIER, S.UP_LOGIT_SCALE, "output_multiplier"),
                              (S.FINAL_LOGIT_SOFTCAPPING, S.UP_FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping")):
        value = k.float(key.at(a), up_key.at(a))
        if value is None:
            continue
        if not (math.isfinite(value) and value > 0):
            name = key.at(a) if key.at(a) in k.gf.kv else up_key.at(a)
            report.error("logit-scalar-range", f"{name}={value} must be finite and > 0")
            continue
        setattr(v, attr, value)


def _check_unsupported(k: _Keys, report, v: DraftView, a) -> None:
    """llama.cpp's converter writes these for drafters of other families (MiMo, Gemma, reduced-
    vocabulary DSpark); luce's drafter does not compute them, so it refuses instead of drafting
    with other numbers than the checkpoint's."""
    S = schema
    used = [key.at(a) for key in (S.UP_VALUE_SCALE, S.UP_EMBEDDING_SCALE) if key.at(a) in k.gf.kv]
    act = k.str(S.UP_HIDDEN_ACT.at(a))
    if act is not None and act != S.SILU:
        used.append(f"{S.UP_HIDDEN_ACT.at(a)}={act}")
    rot = k.int(S.UP_ROPE_DIMENSION_COUNT.at(a))
    if rot is not None and v.head_dim and rot != v.head_dim:
        used.append(f"{S.UP_ROPE_DIMENSION_COUNT.at(a)}={rot} (partial rotary, head_dim {v.head_dim})")
    if S.UP_D2T in k.gf.tensors:
        used.append(f"tensor {S.UP_D2T} (a reduced draft vocabulary)")
    if used:
        report.error("unsupported", "drafter uses what luce does not implement: " + ", ".join(used))


def _check_dspark(k: _Keys, report, v: DraftView, a) -> dict | None:
    S = schema
    enabled = k.int(S.DSPARK_ENABLED.at(a))
    w1, w2 = v.tensors.get(("markov_w1", None)), v.tensors.get(("markov_w2", None))
    cw, cb = v.tensors.get(("confidence_weight", None)), v.tensors.get(("confidence_bias", None))
    if not (enabled or w1 or w2 or cw or cb):
        return None
    if w1 is None or w2 is None:
        report.error("dspark-markov-incomplete", "incomplete DSpark Markov tensors: need both markov w1 and w2")
        return {}
    if len(w1.shape) != 2 or w1.shape != w2.shape:
        report.error("dspark-markov-shape", f"Markov w1 {list(w1.shape)} and w2 {list(w2.shape)} must both be [R, V]")
        return {}
    rank, vocab = w1.shape
    v.markov_vocab = vocab
    for key, expected in ((S.DSPARK_MARKOV_RANK, rank), (S.DSPARK_VOCAB_SIZE, vocab)):
        declared = k.int(key.at(a))
        if declared is not None and declared != expected:
            report.error("dspark-metadata", f"{key.at(a)}={declared} but the Markov tensors say {expected}")
    conf_dim = 0
    if (cw is None) != (cb is None):
        report.error("dspark-confidence-incomplete", "DSpark confidence weight and bias must come together")
    elif cw is not None:
        conf_dim = cw.shape[0]
        if cw.shape[1:] != (1,) or (v.hidden and conf_dim not in (v.hidden, v.hidden + rank)):
            report.error("dspark-confidence-dim", f"confidence weight {list(cw.shape)} must be [C, 1] with C in "
                                                  f"{{{v.hidden}, {(v.hidden or 0) + rank}}} (hidden or hidden+rank)")
        if cb.shape != (1,):
            report.error("tensor-shape", f"{cb.name} has shape {list(cb.shape)}, expected [1]")
        declared = k.int(S.DSPARK_CONFIDENCE_DIM.at(a))
        if declared is not None and declared != conf_dim:
            report.error("dspark-metadata", f"{S.DSPARK_CONFIDENCE_DIM.at(a)}={declared} but the confidence "
                                            f"weight says {conf_dim}")
    anchor = k.bool(S.SAMPLE_FROM_ANCHOR.at(a), S.UP_SAMPLE_FROM_ANCHOR.at(a))
    if anchor is None:
        report.warn("dspark-anchor", "DSpark drafter without sample_from_anchor: the engine runs the non-anchor "
                                     "path (one proposal fewer per block)")
    return {"markov_rank": rank, "vocab": vocab, "confidence_dim": conf_dim, "sample_from_anchor": anchor}


def _summarise_drafter(gf: GGUFFile, report, v: DraftView, conv_k: int, dspark) -> None:
    S, a = schema, gf.arch
    heads = []
    if conv_k or any(r in S.CONV_ROLES for r, _ in v.tensors):
        heads.append("conv")
    if any(r in S.SELECTOR_ROLES for r, _ in v.tensors):
        heads.append("selector")
    if ("markov_w1", None) in v.tensors:
        heads.append("markov")
    if ("confidence_weight", None) in v.tensors:
        heads.append("confidence")
    fmt = "DSpark" if dspark is not None else ("DFlash 2" if {"conv", "selector"} & set(heads) else "DFlash")
    factor = gf.kv.get(S.ROPE_SCALING_FACTOR.at(a))
    report.summary.update({
        "format": fmt, "layout": v.layout, "layers": v.n_layer, "hidden": v.hidden, "heads": v.n_head,
        "kv_heads": v.n_head_kv, "head_dim": v.head_dim, "ffn": v.ff, "vocab": v.vocab,
        "block_size": v.block_size, "mask_token_id": v.mask_token_id, "n_target_layers": v.n_target_layers,
        "target_layer_ids": v.target_layer_ids, "heads_present": heads,
        "yarn": ({"factor": factor, "original_context": gf.kv.get(S.ROPE_SCALING_ORIG_CTX.at(a))}
                 if factor is not None else None),
        "sliding_window": gf.kv.get(S.SLIDING_WINDOW.at(a)),
        "in_block_causal": _in_block_causal(v),
        "sample_from_anchor": (dspark or {}).get("sample_from_anchor"),
        "output_multiplier": v.output_multiplier, "final_logit_softcapping": v.final_logit_softcapping,
        "tensor_types": _type_histogram(gf), "n_tensors": len(gf.tensors),
    })


def _in_block_causal(v: DraftView) -> list[bool] | None:
    """Per layer: slot j sees block slots 0..j only. The native loader's rule (drafter_load.cpp):
    without attention.causal a pattern's sliding layers are causal; with it, attention.causal
    applies to the sliding layers (to every layer when there is no pattern)."""
    if v.n_layer is None or v.n_layer > schema.MAX_LAYERS:
        return None
    sliding = v.sliding if v.sliding is not None and len(v.sliding) == v.n_layer else None
    if v.causal is None:
        return list(sliding) if sliding is not None else [False] * v.n_layer
    return [v.causal and (sliding is None or s) for s in (sliding or [True] * v.n_layer)]


def _type_histogram(gf: GGUFFile) -> dict[str, int]:
    return dict(Counter(t.type_name for t in gf.tensors.values()).most_common())


# ---- qwen35 target ---------------------------------------------------------------------------

def check_target(gf: GGUFFile, report: Report) -> None:
    """The rules of converters/target_rules.py, which are the native loader's (same order, same
    message: the first refusal is the reason `luce generate` would give), then the tokenizer's."""
    hp, vocab = None, None
    try:
        hp, vocab = target_rules.check_native(gf)
    except target_rules.Refused as e:
        report.error(e.code, str(e))
    try:
        target_rules.check_tokenizer(gf, vocab)
    except target_rules.Refused as e:
        report.error(e.code, str(e))
    _summarise_target(gf, report, hp, vocab)


def _summarise_target(gf: GGUFFile, report: Report, hp: dict | None, vocab: int | None) -> None:
    """From the checked hparams when the file passed, else the raw values (a report, not a promise)."""
    T, R = Keys.Tokenizer, target_rules
    raw = lambda key: gf.kv.get(key) if gf.kv_type.get(key, (None,))[0] in INTEGER_TYPES else None  # noqa: E731
    raw_list = lambda key: (gf.kv[key].tolist() if hasattr(gf.kv.get(key), "tolist") else raw(key))  # noqa: E731
    if hp is not None:
        per_layer = lambda v: v[0] if len(set(v)) == 1 else v   # noqa: E731
        attn = [i for i, r in enumerate(hp["recurrent"]) if not r]
        layers, main = hp["n_layer_total"], hp["n_layer"]
        hidden, head_dim, ffn = hp["hidden"], hp.get("head_dim"), per_layer(hp["ff"])
        heads = hp["heads"][attn[0]] if attn else None
        kv_heads = hp["heads_kv"][attn[0]] if attn else None
    else:
        layers, hidden, head_dim = raw(R.K_BLOCK_COUNT), raw(R.K_EMBD), raw(R.K_KEY_LEN)
        nextn = raw(R.K_NEXTN) or 0
        main = layers - nextn if isinstance(layers, int) else None
        ffn, heads, kv_heads = raw_list(R.K_FF), raw_list(R.K_HEAD), raw_list(R.K_HEAD_KV)
    tokens = gf.kv.get(T.LIST)
    report.summary.update({
        "layers": layers, "main_layers": main, "hidden": hidden, "vocab": vocab, "heads": heads,
        "kv_heads": kv_heads, "head_dim": head_dim, "ffn": ffn,
        "tensor_types": _type_histogram(gf), "n_tensors": len(gf.tensors),
        "tokenizer": {
            "model": gf.kv.get(T.MODEL), "pre": gf.kv.get(T.PRE),
            "tokens": len(tokens) if isinstance(tokens, list) else None,
            "merges": len(gf.kv[T.MERGES]) if isinstance(gf.kv.get(T.MERGES), list) else None,
            "eos_token_id": gf.kv.get(T.EOS_ID), "bos_token_id": gf.kv.get(T.BOS_ID),
            "padding_token_id": gf.kv.get(T.PAD_ID), "chat_template": T.CHAT_TEMPLATE in gf.kv,
        },
    })


# ---- the pair --------------------------------------------------------------------------------

def _check_pair(report: Report, target: Report, v: DraftView) -> None:
    if target.kind != "target":
        report.error("pair-target", f"--target is not a {schema.TARGET_ARCH} GGUF (arch {target.arch!r})")
        return
    t_hidden, t_vocab, t_layers = (target.summary.get(x) for x in ("hidden", "vocab", "main_layers"))
    if v.hidden is not None and t_hidden is not None and v.hidden != t_hidden:
        report.error("pair-hidden", f"drafter hidden {v.hidden} != target hidden {t_hidden} (the drafter uses the "
                                    f"target's embeddings and head)")
    if t_vocab is not None:
        if v.mask_token_id is not None and v.mask_token_id >= t_vocab:
            report.error("pair-mask", f"mask_token_id={v.mask_token_id} is outside the target vocab {t_vocab}")
        if v.vocab is not None and v.vocab != t_vocab:
            report.warn("pair-vocab", f"drafter vocab_size {v.vocab} != target vocab {t_vocab}")
        if v.selector_vocab is not None and v.selector_vocab < t_vocab:
            report.error("pair-codebook", f"selector codebook vocab {v.selector_vocab} < target vocab {t_vocab}")
        if v.selector_top_k is not None and v.selector_top_k > t_vocab:
            report.error("pair-codebook", f"selector_top_k {v.selector_top_k} > target vocab {t_vocab}")
        if v.markov_vocab is not None and v.markov_vocab != t_vocab:
            report.error("pair-markov-vocab", f"Markov head vocab {v.markov_vocab} != target vocab {t_vocab}")
    if t_layers is not None and v.target_layer_ids is not None:
        bad = [i for i in v.target_layer_ids if not 0 <= i < t_layers - 1]
        if bad:
            report.error("pair-target-layers", f"target layer ids {bad} must be < {t_layers - 1} (the target has "
                                               f"{t_layers} layers and its last layer is never tapped)")
