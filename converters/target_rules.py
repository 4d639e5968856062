"""The rules a qwen35 target GGUF must pass, in the order the native loader applies them.

`luce inspect` and `luce.Engine` judge a target with these rules; native/src/model.cpp applies
the same ones in C++ before it sizes anything by the file (it must: it is the last line of
defence and runs without Python). The two are kept in step by construction and by test:
  - every bound below is the `constexpr` of the same name in model.cpp
    (tests/test_validator_parity.py reads them out of the C++ source and compares);
  - each rule fails with the message the native loader gives, word for word, and the checks run
    in the loader's order, so the first refusal is the same one-line reason on both sides;
  - tests/test_validator_parity.py crafts bad targets (every hparam zero, negative, absurd or of
    the wrong type, arrays of the wrong element type or length, tensors of the wrong shape, rope
    sections out of range) and asserts inspect says invalid exactly when the loader refuses,
    with the same reason.
Python-only rules come last (the tokenizer arrays, which only the Python side reads): the native
loader never sees them, and Engine applies them after the native load.

Shapes are GGUF order (ne0 first). E hidden, F ffn width, H/Hkv heads, D head_dim, V vocab.
"""
from __future__ import annotations

import struct

from gguf.constants import GGMLQuantizationType, Keys

from luce.converters.gguf_reader import FLOAT_TYPES, INTEGER_TYPES, GGUFFile, GGUFValueType

VT = GGUFValueType
ARCH = "qwen35"

# Bounds: generous for any real model, small enough that nothing sized by them is a huge
# allocation. Each is model.cpp's constexpr of the same name.
MAX_LAYERS = 512
MAX_EMBD = 1 << 16
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_FF = 1 << 20
MAX_VOCAB = 1 << 22
MAX_CTX = 1 << 24
MAX_CONV = 64
MAX_SSM_DIM = 1024
MAX_ROPE_SECTIONS = 4           # llama.cpp reads at most four M-RoPE sections
DEFAULT_INTERVAL = 4            # llama.cpp's default when the key is absent
DEFAULT_ROPE_BASE = 10000.0

# Weight formats the runtime computes with (DESIGN.md §4, native quants.h `supported`).
SUPPORTED_TYPES = tuple(GGMLQuantizationType[n] for n in
                        ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                         "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                         "IQ1_M", "BF16"))


def _key(suffix: str) -> str:
    return f"{ARCH}.{suffix}"


K_BLOCK_COUNT = _key("block_count")
K_NEXTN = _key("nextn_predict_layers")
K_CTX = _key("context_length")
K_EMBD = _key("embedding_length")
K_FF = _key("feed_forward_length")
K_HEAD = _key("attention.head_count")
K_HEAD_KV = _key("attention.head_count_kv")
K_KEY_LEN = _key("attention.key_length")
K_VALUE_LEN = _key("attention.value_length")
K_EPS = _key("attention.layer_norm_rms_epsilon")
K_RECURRENT = _key("attention.recurrent_layers")
K_INTERVAL = _key("full_attention_interval")
K_ROPE_DIM = _key("rope.dimension_count")
K_ROPE_SECTIONS = _key("rope.dimension_sections")
K_ROPE_BASE = _key("rope.freq_base")
K_SSM_CONV = _key("ssm.conv_kernel")
K_SSM_STATE = _key("ssm.state_size")
K_SSM_GROUPS = _key("ssm.group_count")
K_SSM_RANK = _key("ssm.time_step_rank")
K_SSM_INNER = _key("ssm.inner_size")
K_SPLIT_COUNT = "split.count"

# gguf.cpp's type_name
_TYPE_NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
               VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string", VT.ARRAY: "array",
               VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}
INT64_MAX = (1 << 63) - 1


class Refused(Exception):
    """One rule failed: the message is the native loader's; `code` names the rule for inspect."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# ---- typed reads with gguf.cpp's semantics ----------------------------------------------------

class Meta:
    def __init__(self, gf: GGUFFile):
        self.gf = gf

    def has(self, key: str) -> bool:
        return key in self.gf.kv

    def _type(self, key: str) -> VT:
        return self.gf.kv_type[key][0]

    def get_int(self, key: str, fallback=None) -> int:
        if key not in self.gf.kv:
            if fallback is not None:
                return fallback
            raise Refused("hparam-missing", f"missing metadata key '{key}'")
        if self._type(key) not in INTEGER_TYPES:
            raise Refused("key-type", f"key '{key}' must be an integer, found {_TYPE_NAMES[self._type(key)]}")
        value = int(self.gf.kv[key])
        if value > INT64_MAX:
            raise Refused("hparam-range", f"key '{key}': value out of range")
        return value

    def get_float(self, key: str, fallback=None) -> float:
        if key not in self.gf.kv:
            if fallback is not None:
                return fallback
            raise Refused("hparam-missing", f"missing metadata key '{key}'")
        vtype = self._type(key)
        if vtype in FLOAT_TYPES or (vtype in INTEGER_TYPES and int(self.gf.kv[key]) <= INT64_MAX):
            return float(self.gf.kv[key])
        raise Refused("key-type", f"key '{key}' must be a number, found {_TYPE_NAMES[vtype]}")

    def _array(self, key: str) -> list:
        return [v.item() if hasattr(v, "item") else v for v in self.gf.kv[key]]

    def get_int_per_layer(self, key: str, n: int) -> list[int]:
        """An integer array of n entries, or a scalar broadcast to n."""
        if key not in self.gf.kv:
            raise Refused("hparam-missing", f"missing metadata key '{key}'")
        if self._type(key) != VT.ARRAY:
            return [self.get_int(key)] * n
        values, etype = self._array(key), self.gf.kv_type[key][1]
        if len(values) != n:
            raise Refused("layer-array-length", f"key '{key}': per-layer array has {len(values)} entries, "
                                                f"expected {n}")
        if etype not in INTEGER_TYPES:
            raise Refused("key-type", f"key '{key}': expected an integer array, found {_TYPE_NAMES[etype]} elements")
        if any(int(v) > INT64_MAX for v in values):
            raise Refused("hparam-range", f"key '{key}': value out of range")
        return [int(v) for v in values]

    def get_bool_array(self, key: str, n: int) -> list[bool]:
        if self._type(key) != VT.ARRAY or self.gf.kv_type[key][1] != VT.BOOL:
            raise Refused("key-type", f"key '{key}' must be a bool array")
        values = self._array(key)
        if len(values) != n:
            raise Refused("layer-array-length", f"key '{key}': per-layer array has {len(values)} entries, "
                                                f"expected {n}")
        return [bool(v) for v in values]


def bounded(value: int, lo: int, hi: int, what: str) -> int:
    if not lo <= value <= hi:
        raise Refused("hparam-range", f"{what} = {value} is out of range [{lo}, {hi}]")
    return value


# ---- the rules --------------------------------------------------------------------------------

def ggml_type_name(t: int) -> str:
    """ggml's own spelling (lower case but for the K-quants' `_K`), as the native loader prints it."""
    name = GGMLQuantizationType(t).name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


def check_weight_types(gf: GGUFFile) -> None:
    unsupported: dict[str, list] = {}          # type name -> [count, first tensor]
    for t in gf.tensors.values():
        if t.ggml_type not in SUPPORTED_TYPES:
            entry = unsupported.setdefault(ggml_type_name(t.ggml_type), [0, t.name])
            entry[0] += 1
    if unsupported:
        hist = ", ".join(f"{name} x{count} (first {first})" for name, (count, first) in sorted(unsupported.items()))
        supported = " ".join(ggml_type_name(t) for t in sorted(SUPPORTED_TYPES, key=int))
        raise Refused("tensor-type", f"unsupported weight types: {hist} (supported: {supported})")


def read_hparams(m: Meta) -> dict:
    """model.cpp read_hparams: every hyperparameter bounded, per-layer arrays checked."""
    hp: dict = {}
    n_total = bounded(m.get_int(K_BLOCK_COUNT), 1, MAX_LAYERS, K_BLOCK_COUNT)
    nextn = bounded(m.get_int(K_NEXTN, 0), 0, n_total - 1, K_NEXTN)
    n_layer = n_total - nextn
    hp.update(n_layer_total=n_total, n_layer=n_layer)
    hp["ctx"] = bounded(m.get_int(K_CTX), 1, MAX_CTX, K_CTX)
    hp["hidden"] = bounded(m.get_int(K_EMBD), 1, MAX_EMBD, K_EMBD)
    eps = m.get_float(K_EPS)
    if not 0.0 < _f32(eps) < 1.0:
        raise Refused("hparam-range", f"{K_EPS} = {eps:g} is not in (0, 1)")

    if m.has(K_RECURRENT):
        recurrent = m.get_bool_array(K_RECURRENT, n_total)[:n_layer]
    else:
        interval = bounded(m.get_int(K_INTERVAL, DEFAULT_INTERVAL), 1, MAX_LAYERS, K_INTERVAL)
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    hp["recurrent"] = recurrent

    ff = m.get_int_per_layer(K_FF, n_total)
    heads = m.get_int_per_layer(K_HEAD, n_total)
    heads_kv = m.get_int_per_layer(K_HEAD_KV, n_total)
    hp["ff"], hp["heads"], hp["heads_kv"] = [], [0] * n_layer, [0] * n_layer
    for i in range(n_layer):
        hp["ff"].append(bounded(ff[i], 1, MAX_FF, K_FF))
        if recurrent[i]:
            continue            # per-layer arrays may hold 0 for DeltaNet layers
        h = bounded(heads[i], 1, MAX_HEADS, K_HEAD)
        hkv = bounded(heads_kv[i], 1, MAX_HEADS, K_HEAD_KV)
        if h % hkv:
            raise Refused("hparam-range", f"layer {i}: {h} query heads are not a multiple of {hkv} kv heads")
        hp["heads"][i], hp["heads_kv"][i] = h, hkv

    if nextn == 1:  # the MTP block's sizes, checked only if its tensors are there (_bind_mtp)
        hp["mtp"] = [min(max(v, 0), hi + 1) for v, hi in ((ff[n_layer], MAX_FF), (heads[n_layer], MAX_HEADS),
                                                           (heads_kv[n_layer], MAX_HEADS))]
    if not all(recurrent):
        _attention_hparams(m, hp)
    if any(recurrent):
        _deltanet_hparams(m, hp)
    return hp


def _f32(x: float) -> float:
    """The value as the loader holds it (a C float)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


def _attention_hparams(m: Meta, hp: dict) -> None:
    hp["head_dim"] = d = bounded(m.get_int(K_KEY_LEN), 1, MAX_HEAD_DIM, K_KEY_LEN)
    if m.get_int(K_VALUE_LEN, d) != d:
        raise Refused("unsupported", f"{K_VALUE_LEN} differs from {K_KEY_LEN}")
    hp["n_rot"] = n_rot = bounded(m.get_int(K_ROPE_DIM), 0, d, K_ROPE_DIM)
    if n_rot % 2:
        raise Refused("hparam-range", f"{K_ROPE_DIM} = {n_rot} must be even")
    if m.has(K_ROPE_SECTIONS):
        check_rope_sections(m, n_rot)
    theta = m.get_float(K_ROPE_BASE, DEFAULT_ROPE_BASE)
    if not _f32(theta) > 1.0:
        raise Refused("hparam-range", f"{K_ROPE_BASE} must be > 1")


def check_rope_sections(m: Meta, n_rot: int, key: str = K_ROPE_SECTIONS, n_rot_name: str = K_ROPE_DIM) -> None:
    """M-RoPE sections count rotary pairs: each >= 0, together at most n_rot / 2 (text positions
    are equal on every axis, so luce ropes them as plain NeoX, but a file whose sections do not
    fit its head describes another model). Drafters in llama.cpp's layout carry them too."""
    vtype, etype = m.gf.kv_type[key]
    if vtype != VT.ARRAY or etype not in INTEGER_TYPES:
        raise Refused("key-type", f"key '{key}' must be an integer array")
    values = m._array(key)
    if len(values) > MAX_ROPE_SECTIONS:
        raise Refused("hparam-range", f"key '{key}' has {len(values)} entries, at most {MAX_ROPE_SECTIONS}")
    if any(int(v) < 0 for v in values) or sum(int(v) for v in values) > n_rot // 2:
        raise Refused("hparam-range", f"{key} = [{', '.join(str(int(v)) for v in values)}] does not fit "
                                      f"{n_rot_name} = {n_rot}: sections must be >= 0 and sum to at most {n_rot // 2}")


def _deltanet_hparams(m: Meta, hp: dict) -> None:
    hp["ssm_conv"] = bounded(m.get_int(K_SSM_CONV), 1, MAX_CONV, K_SSM_CONV)
    hp["ssm_dk"] = bounded(m.get_int(K_SSM_STATE), 1, MAX_SSM_DIM, K_SSM_STATE)
    hp["ssm_hk"] = bounded(m.get_int(K_SSM_GROUPS), 1, MAX_HEADS, K_SSM_GROUPS)
    hp["ssm_hv"] = hv = bounded(m.get_int(K_SSM_RANK), 1, MAX_HEADS, K_SSM_RANK)
    inner = bounded(m.get_int(K_SSM_INNER), 1, MAX_HEADS * MAX_SSM_DIM, K_SSM_INNER)
    if inner % hv:
        raise Refused("hparam-range", f"{K_SSM_INNER} = {inner} is not a multiple of {K_SSM_RANK} = {hv}")
    hp["ssm_dv"] = bounded(inner // hv, 1, MAX_SSM_DIM, "ssm value head dim")
    if hv % hp["ssm_hk"]:
        raise Refused("hparam-range", f"{K_SSM_RANK} = {hv} is not a multiple of {K_SSM_GROUPS} = {hp['ssm_hk']}")


# ---- tensors (model.cpp Binder / bind_layer) --------------------------------------------------

def _find(gf: GGUFFile, name: str):
    t = gf.tensors.get(name)
    if t is None:
        raise Refused("tensor-missing", f"missing tensor {name}")
    return t


def _matrix(gf: GGUFFile, name: str, n_in: int, n_out: int) -> None:
    t = _find(gf, name)
    ne = list(t.shape) + [1] * (4 - len(t.shape))
    if ne != [n_in, n_out, 1, 1]:
        raise Refused("tensor-shape", f"tensor {name} has shape [{', '.join(map(str, ne))}], "
                                      f"expected [{n_in}, {n_out}]")


def _vector(gf: GGUFFile, name: str, n: int) -> None:
    t = _find(gf, name)
    if t.n_elements != n:
        raise Refused("tensor-shape", f"tensor {name} has {t.n_elements} elements, expected {n}")


def bind_tensors(gf: GGUFFile, hp: dict) -> int:
    """Every tensor the forward reads against the shape the hparams imply; returns the vocab."""
    E = hp["hidden"]
    embd = _find(gf, "token_embd.weight")
    if len(embd.shape) != 2 or embd.shape[0] != E:
        raise Refused("tensor-shape", f"token_embd.weight rows have {embd.shape[0]} elements, expected {K_EMBD} = {E}")
    V = bounded(embd.shape[1], 1, MAX_VOCAB, "vocabulary size (token_embd rows)")
    _matrix(gf, "token_embd.weight", E, V)
    _vector(gf, "output_norm.weight", E)
    if "output.weight" in gf.tensors:
        _matrix(gf, "output.weight", E, V)
    for i in range(hp["n_layer"]):
        _bind_layer(gf, hp, i)
    _bind_mtp(gf, hp, V)
    return V


def _bind_mtp(gf: GGUFFile, hp: dict, V: int) -> None:
    """model.cpp bind_mtp: the MTP block blk.{n_layer} when nextn_predict_layers = 1 and its
    nextn.eh_proj is present (and attention layers size its heads)."""
    i, E = hp["n_layer"], hp["hidden"]
    if "mtp" not in hp or f"blk.{i}.nextn.eh_proj.weight" not in gf.tensors or not hp.get("head_dim"):
        return
    F, H, Hkv = hp["mtp"]
    if not 1 <= F <= MAX_FF:
        raise Refused("hparam-range", f"MTP block {i}: {K_FF} is not in 1..{MAX_FF}")
    if not (1 <= H <= MAX_HEADS and 1 <= Hkv <= MAX_HEADS and H % Hkv == 0):
        raise Refused("hparam-range", f"MTP block {i}: the query heads are not a multiple of the kv heads "
                                      f"(both in 1..{MAX_HEADS})")
    view = dict(hp, ff=hp["ff"] + [F], heads=hp["heads"] + [H], heads_kv=hp["heads_kv"] + [Hkv],
                recurrent=hp["recurrent"] + [False])
    _bind_layer(gf, view, i)
    blk = lambda suffix: f"blk.{i}.nextn.{suffix}"      # noqa: E731
    _matrix(gf, blk("eh_proj.weight"), 2 * E, E)
    _vector(gf, blk("enorm.weight"), E)
    _vector(gf, blk("hnorm.weight"), E)
    if blk("shared_head_norm.weight") in gf.tensors:
        _vector(gf, blk("shared_head_norm.weight"), E)
    for name in ("embed_tokens.weight", "shared_head_head.weight"):
        if blk(name) in gf.tensors:
            _matrix(gf, blk(name), E, V)


def _bind_layer(gf: GGUFFile, hp: dict, i: int) -> None:
    E, F = hp["hidden"], hp["ff"][i]
    blk = lambda suffix: f"blk.{i}.{suffix}"      # noqa: E731
    _vector(gf, blk("attn_norm.weight"), E)
    _vector(gf, blk("post_attention_norm.weight"), E)
    _matrix(gf, blk("ffn_gate.weight"), E, F)
    _matrix(gf, blk("ffn_up.weight"), E, F)
    _matrix(gf, blk("ffn_down.weight"), F, E)
    if hp["recurrent"][i]:
        HV, inner = hp["ssm_hv"], hp["ssm_hv"] * hp["ssm_dv"]
        CD = 2 * hp["ssm_hk"] * hp["ssm_dk"] + inner         # conv channels: q, k, v
        _matrix(gf, blk("attn_qkv.weight"), E, CD)
        _matrix(gf, blk("attn_gate.weight"), E, inner)
        _matrix(gf, blk("ssm_beta.weight"), E, HV)
        _matrix(gf, blk("ssm_alpha.weight"), E, HV)
        _matrix(gf, blk("ssm_out.weight"), inner, E)
        _vector(gf, blk("ssm_conv1d.weight"), CD * hp["ssm_conv"])
        _vector(gf, blk("ssm_dt.bias"), HV)
        _vector(gf, blk("ssm_a"), HV)
        _vector(gf, blk("ssm_norm.weight"), hp["ssm_dv"])
    else:
        H, Hkv, D = hp["heads"][i], hp["heads_kv"][i], hp["head_dim"]
        _matrix(gf, blk("attn_q.weight"), E, 2 * H * D)    # [q_h | gate_h] per head
        _matrix(gf, blk("attn_k.weight"), E, Hkv * D)
        _matrix(gf, blk("attn_v.weight"), E, Hkv * D)
        _matrix(gf, blk("attn_output.weight"), H * D, E)
        _vector(gf, blk("attn_q_norm.weight"), D)
        _vector(gf, blk("attn_k_norm.weight"), D)


def check_native(gf: GGUFFile) -> tuple[dict, int]:
    """The native loader's rules, in its order: (hparams, vocab) or Refused with its message."""
    m = Meta(gf)
    split = m.get_int(K_SPLIT_COUNT, 1)
    if split > 1:
        raise Refused("unsupported", f"{gf.path} is part of a split GGUF ({split} parts); merge it first "
                                     f"(llama-gguf-split --merge)")
    check_weight_types(gf)
    hp = read_hparams(m)
    return hp, bind_tensors(gf, hp)


# ---- the tokenizer (Python side only) ---------------------------------------------------------

def check_tokenizer(gf: GGUFFile, vocab: int | None) -> None:
    """The arrays luce's tokenizer reads: tokens (strings), token types (integers) and scores
    (floats) one per vocabulary entry, merges (strings)."""
    T = Keys.Tokenizer
    for key, etypes, what in [(T.LIST, (VT.STRING,), "strings"), (T.TOKEN_TYPE, INTEGER_TYPES, "integers"),
                              (T.SCORES, FLOAT_TYPES, "floats"), (T.MERGES, (VT.STRING,), "strings")]:
        if key not in gf.kv:
            continue
        vtype, etype = gf.kv_type[key]
        if vtype != VT.ARRAY or etype not in etypes:
            raise Refused("key-type", f"key '{key}' must be an array of {what}")
        if key != T.MERGES and vocab is not None and len(gf.kv[key]) != vocab:
            raise Refused("vocab-mismatch", f"{key} has {len(gf.kv[key])} entries but token_embd has {vocab} rows")
