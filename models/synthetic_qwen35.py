"""Synthetic qwen35 GGUFs with real Qwen3.5-family shapes and random quantized blocks.

Benchmarks need files of the real size and the real quant mix, not real weights: a 15 GB 27B
file is generated on the machine where it is measured instead of being shipped. Every block is
random bytes with sane f16 scales (no NaN/Inf), so kernels see the exact memory traffic and
dequantization work of a real file.

    python models/synthetic_qwen35.py --shape 27b --mix iq4_xs -o /tmp/q27b.gguf
    python models/synthetic_qwen35.py --shape 0.8b --mix q8_0 -o /tmp/q08b.gguf

Mixes (`--mix`, MIXES): the pure ones put every body tensor in one type (the `iq4_xs` one is the
upstream DFlash recipe, spec/engine.md §2.7: `llama-quantize --pure --output-tensor-type q5_k
--tensor-type ssm_out=q6_k --tensor-type attn_v=q6_k ... iq4_xs`); the recipe ones give each tensor
the type the files people download have (quant_recipes.py: llama-quantize's own choice per ftype,
third-party variants). 1-D tensors and ssm_conv1d are F32. The tokenizer metadata is
a byte-level vocabulary padded with filler tokens to the real vocab size, enough for loaders
(luce, llama.cpp) that need a vocabulary to open the file.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

try:  # run as a script from models/, or imported as models.synthetic_qwen35
    import quant_recipes
except ImportError:  # pragma: no cover
    from models import quant_recipes


@dataclasses.dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    ssm_k_heads: int   # HK
    ssm_v_heads: int   # HV
    ssm_head_dim: int  # DK = DV
    conv_kernel: int
    n_ff: int
    n_vocab: int
    interval: int = 4
    ctx: int = 262144


# 27b: Qwen3.5/3.6/3.8-27B (spec/qwen35.md §1.1). 0.8b: a Qwen3.5-0.8B-sized model (24 layers,
# hidden 1024) with the 27B head layout scaled down, for CPU benchmarks.
SHAPES = {
    "27b": Shape(5120, 64, 24, 4, 256, 64, 16, 48, 128, 4, 17408, 248320),
    "0.8b": Shape(1024, 24, 8, 2, 256, 64, 16, 16, 128, 4, 3584, 248320),
    "tiny": Shape(256, 8, 4, 2, 64, 16, 4, 8, 32, 4, 768, 4096, ctx=8192),
}

# Pure mixes: every 2-D body tensor in one type, as `llama-quantize --pure` writes them (the
# "iq4_xs" mix is the upstream DFlash recipe, spec/engine.md section 2.7).
PURE_MIXES = {
    "iq4_xs": dict(body=T.IQ4_XS, ssm_out=T.Q6_K, attn_v=T.Q6_K, output=T.Q5_K),
    "q4_k": dict(body=T.Q4_K, ssm_out=T.Q6_K, attn_v=T.Q6_K, output=T.Q6_K),
    "q8_0": dict(body=T.Q8_0, ssm_out=T.Q8_0, attn_v=T.Q8_0, output=T.Q8_0),
    "f16": dict(body=T.F16, ssm_out=T.F16, attn_v=T.F16, output=T.F16),
}
# The recipes files are downloaded in (quant_recipes.py): `lq-<ftype>` is llama-quantize's own
# per-tensor choice for that ftype; `-small-<type>` keeps the DeltaNet alpha/beta projections in
# that type, as third-party files do; `ud-q4_k_xl` is an unsloth-"UD"-style dynamic mix.
RECIPE_MIXES = ("lq-iq4_xs", "lq-q4_k_m", "lq-q8_0", "lq-iq4_xs-small-f32", "lq-iq4_xs-small-bf16",
                "lq-iq4_xs-small-q8_0", "ud-q4_k_xl",
                # the 16-24 GB cards' files: 4-bit legacy, 3- and 2-bit K, 3-, 2- and 1-bit IQ
                "lq-q4_0", "lq-q3_k_m", "lq-q2_k", "lq-iq3_xxs", "lq-iq2_xxs", "lq-iq2_m", "lq-iq1_m")
MIXES = tuple(PURE_MIXES) + RECIPE_MIXES


def tensor_shapes(s: Shape, mtp: bool = True) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ne (innermost first), source type) for every tensor of the file, in file order, the
    source type being what a converted checkpoint holds before quantization: BF16 for the 2-D
    weights, F32 for norms, biases, ssm_a and ssm_conv1d.

    With mtp, a multi-token-prediction block follows the main layers as blk.{n_layer} (a full-
    attention block plus nextn.* tensors), as in llama.cpp conversions that keep it; runtimes skip it."""
    key_dim, value_dim = s.ssm_k_heads * s.ssm_head_dim, s.ssm_v_heads * s.ssm_head_dim
    conv_dim = 2 * key_dim + value_dim
    W, V = T.BF16, T.F32  # weights, vectors
    plan = [("token_embd.weight", (s.n_embd, s.n_vocab), W),
            ("output_norm.weight", (s.n_embd,), V),
            ("output.weight", (s.n_embd, s.n_vocab), W)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        plan.append((p + "attn_norm.weight", (s.n_embd,), V))
        if (i + 1) % s.interval == 0:  # gated full attention
            plan += _attention(p, s)
        else:  # Gated DeltaNet
            plan += [(p + "attn_qkv.weight", (s.n_embd, conv_dim), W),
                     (p + "attn_gate.weight", (s.n_embd, value_dim), W),
                     (p + "ssm_beta.weight", (s.n_embd, s.ssm_v_heads), W),
                     (p + "ssm_alpha.weight", (s.n_embd, s.ssm_v_heads), W),
                     (p + "ssm_conv1d.weight", (s.conv_kernel, conv_dim), V),
                     (p + "ssm_dt.bias", (s.ssm_v_heads,), V),
                     (p + "ssm_a", (s.ssm_v_heads,), V),
                     (p + "ssm_norm.weight", (s.ssm_head_dim,), V),
                     (p + "ssm_out.weight", (value_dim, s.n_embd), W)]
        plan += _post_attention_and_ffn(p, s)
    if mtp:
        p = f"blk.{s.n_layer}."
        plan += [(p + "attn_norm.weight", (s.n_embd,), V)] + _attention(p, s)
        plan += _post_attention_and_ffn(p, s)
        plan += [(p + "nextn.eh_proj.weight", (2 * s.n_embd, s.n_embd), W),
                 (p + "nextn.enorm.weight", (s.n_embd,), V),
                 (p + "nextn.hnorm.weight", (s.n_embd,), V),
                 (p + "nextn.shared_head_norm.weight", (s.n_embd,), V)]
    return plan


def _pure_type(mix: dict, name: str, src: T) -> T:
    if src != T.BF16:
        return src
    if name == "output.weight":
        return mix["output"]
    if name.endswith(("ssm_out.weight", "attn_v.weight")):
        return mix[name.split(".")[-2]]
    return mix["body"]


def mix_types(s: Shape, mix_name: str, shapes: list) -> dict[str, T]:
    """{tensor name: type} of the named mix (MIXES) for these tensor shapes."""
    if mix_name in PURE_MIXES:
        return {name: _pure_type(PURE_MIXES[mix_name], name, src) for name, _, src in shapes}
    if mix_name not in RECIPE_MIXES:
        raise ValueError(f"unknown mix {mix_name!r} (known: {', '.join(MIXES)})")
    n_gqa = s.n_head // s.n_head_kv
    if mix_name == "ud-q4_k_xl":
        return quant_recipes.unsloth_dynamic_types(shapes, n_gqa)
    ftype, _, small = mix_name.removeprefix("lq-").partition("-small-")
    types = quant_recipes.llama_quantize_types(ftype.upper(), shapes, n_gqa)
    return quant_recipes.with_small_projections(types, T[small.upper()]) if small else types


def tensor_plan(s: Shape, mix_name: str, mtp: bool = True) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ne (innermost first), type) for every tensor of the file, in file order."""
    shapes = tensor_shapes(s, mtp)
    types = mix_types(s, mix_name, shapes)
    return [(name, ne, types[name]) for name, ne, _ in shapes]


def _attention(p: str, s: Shape) -> list:
    return [(p + "attn_q.weight", (s.n_embd, 2 * s.n_head * s.head_dim), T.BF16),
            (p + "attn_k.weight", (s.n_embd, s.n_head_kv * s.head_dim), T.BF16),
            (p + "attn_v.weight", (s.n_embd, s.n_head_kv * s.head_dim), T.BF16),
            (p + "attn_output.weight", (s.n_head * s.head_dim, s.n_embd), T.BF16),
            (p + "attn_q_norm.weight", (s.head_dim,), T.F32),
            (p + "attn_k_norm.weight", (s.head_dim,), T.F32)]


def _post_attention_and_ffn(p: str, s: Shape) -> list:
    return [(p + "post_attention_norm.weight", (s.n_embd,), T.F32),
            (p + "ffn_gate.weight", (s.n_embd, s.n_ff), T.BF16),
            (p + "ffn_up.weight", (s.n_embd, s.n_ff), T.BF16),
            (p + "ffn_down.weight", (s.n_ff, s.n_embd), T.BF16)]


# Rough mean |sub-scale x quant| of a random block, so that d = scale / this gives elements of
# about 1/sqrt(fan_in), like a trained layer (keeps a random model's activations finite).
TYPICAL_QUANT_MAGNITUDE = {T.Q8_0: 64, T.Q4_K: 256, T.Q5_K: 512, T.Q6_K: 1024, T.IQ4_XS: 960,
                           T.Q4_0: 4, T.Q4_1: 8, T.Q5_0: 8, T.Q5_1: 16, T.IQ4_NL: 60,
                           T.Q2_K: 8, T.Q3_K: 40, T.IQ2_XXS: 50, T.IQ2_XS: 50, T.IQ2_S: 50,
                           T.IQ3_XXS: 120, T.IQ3_S: 110, T.IQ1_S: 6, T.IQ1_M: 6}
# Where the f16 scale d sits in the block of each type that has one plain d (spec/qwen35.md §4).
D_OFFSET = {T.Q8_0: 0, T.Q4_0: 0, T.Q5_0: 0, T.IQ4_NL: 0, T.IQ4_XS: 0, T.Q6_K: 208, T.Q3_K: 108,
            T.IQ2_XXS: 0, T.IQ2_XS: 0, T.IQ2_S: 0, T.IQ3_XXS: 0, T.IQ3_S: 0, T.IQ1_S: 0}
# (offset of d, offset of the second f16: the minimum m or dmin) of the types with a minimum.
D_MIN_OFFSETS = {T.Q4_1: (0, 2), T.Q5_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q2_K: (80, 82)}
IQ1_M_SCALES = 48


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(len(values), 2)


RANDOM_CHUNK_WORDS = 1 << 23  # 64 MiB of random bytes per generator


def random_bytes(n: int, key: int) -> np.ndarray:
    """n random bytes that depend on `key` alone: 64 MiB chunks, each from its own generator
    (SeedSequence([key, chunk])), drawn on all cores (a 27B file is ~15-29 GB of them; one
    generator makes ~0.5 GB/s)."""
    words = -(-n // 8)
    out = np.empty(words, dtype=np.uint64)

    def fill(chunk: int) -> None:
        lo = chunk * RANDOM_CHUNK_WORDS
        hi = min(words, lo + RANDOM_CHUNK_WORDS)
        out[lo:hi] = np.random.SFC64(np.random.SeedSequence([key, chunk])).random_raw(hi - lo)

    chunks = range(-(-words // RANDOM_CHUNK_WORDS))
    if len(chunks) > 1:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # random_raw releases the GIL
            list(pool.map(fill, chunks))
    else:
        for chunk in chunks:
            fill(chunk)
    return out.view(np.uint8)[:n]


def random_blocks(qtype: T, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """[n_blocks, block_bytes] uint8 of random blocks whose f16 fields are finite and small."""
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = random_bytes(n_blocks * block_bytes, int(rng.integers(2**63))).reshape(n_blocks, block_bytes)
    d = _f16_bytes(rng.uniform(0.25, 1.0, n_blocks) * scale)
    if qtype in D_OFFSET:
        raw[:, D_OFFSET[qtype]:D_OFFSET[qtype] + 2] = d
    elif qtype in D_MIN_OFFSETS:
        d_at, m_at = D_MIN_OFFSETS[qtype]
        raw[:, d_at:d_at + 2] = d
        # Q4_1/Q5_1 add m; the K-quants subtract dmin x a 4- or 6-bit min: either way below zero.
        m = rng.uniform(-0.5, 0.0, n_blocks) if qtype in (T.Q4_1, T.Q5_1) else rng.uniform(0.0, 0.5, n_blocks)
        raw[:, m_at:m_at + 2] = _f16_bytes(m * scale)
    elif qtype == T.IQ1_M:
        set_iq1_m_scale(raw, d.copy().view(np.float16).reshape(-1))
    else:
        raise ValueError(f"no random block recipe for {qtype.name}")
    return raw


def set_iq1_m_scale(raw: np.ndarray, d: np.ndarray) -> None:
    """Writes d (float16, one per block) into IQ1_M blocks [n_blocks, 56]: its four nibbles are the
    top nibbles of the four u16 scale words at byte 48."""
    words = raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8].copy().view(np.uint16)
    bits = d.view(np.uint16)
    for k in range(4):
        words[:, k] = (words[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
    raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8] = words.view(np.uint8)


def random_tensor(ne: tuple[int, ...], qtype: T, rng: np.random.Generator) -> np.ndarray:
    """Random data for one tensor, as the array GGUFWriter stores (floats or raw block bytes)."""
    n = int(np.prod(ne))
    fan_in = ne[0]
    scale = 1.0 / np.sqrt(fan_in)
    if qtype == T.F32:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32).reshape(ne[::-1])
    if qtype == T.F16:
        return (scale * rng.standard_normal(n, dtype=np.float32)).astype(np.float16).reshape(ne[::-1])
    if qtype == T.BF16:
        return bf16_bits(scale * rng.standard_normal(n, dtype=np.float32)).reshape(ne[::-1])
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    rows = n // ne[0]
    blocks = random_blocks(qtype, n // block_elems, rng, scale / TYPICAL_QUANT_MAGNITUDE[qtype])
    return blocks.reshape(rows, (ne[0] // block_elems) * block_bytes)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def special_recurrent_f32(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray | None:
    """Values that keep a random DeltaNet stable: ssm_a < 0 (decay), small dt bias."""
    if name.endswith("ssm_a"):
        return -np.exp(rng.uniform(-2.0, 0.5, ne[0])).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-1.0, 1.0, ne[0]).astype(np.float32)
    if name.endswith(("ssm_beta.weight", "ssm_alpha.weight", "ssm_conv1d.weight")):
        n = int(np.prod(ne))
        return (rng.standard_normal(n, dtype=np.float32) / np.float32(np.sqrt(ne[0]))).reshape(ne[::-1])
    return None


def byte_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary (GPT-2 byte map) padded with fillers, plus the qwen35 specials
    at their real ids when they fit (<|endoftext|> 248044, <|im_start|> 248045, <|im_end|> 248046)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_tokens = [chr(c) for _, c in sorted(zip(bs, cs))]
    # A few real merges (llama.cpp refuses a BPE vocabulary without any).
    letters = "etaoinshrdlu"
    merges = [f"{a} {b}" for a in letters for b in letters]
    merged = [m.replace(" ", "") for m in merges]
    tokens = byte_tokens + merged + [f"[PAD{i}]" for i in range(256 + len(merged), n_vocab)]
    types = [1] * (256 + len(merged)) + [5] * (n_vocab - 256 - len(merged))
    specials = {248044: "<|endoftext|>", 248045: "<|im_start|>", 248046: "<|im_end|>"}
    if n_vocab <= 248046:
        specials = {n_vocab - 3: "<|endoftext|>", n_vocab - 2: "<|im_start|>", n_vocab - 1: "<|im_end|>"}
    for i, text in specials.items():
        tokens[i], types[i] = text, 3
    return tokens, types, merges


def declare_tensors(w: GGUFWriter, plan: list[tuple[str, tuple[int, ...], T]]) -> None:
    """The plan's tensor infos (float tensors as themselves, quantized ones as raw block bytes),
    so the data can follow one tensor at a time instead of all of it held in memory."""
    float_dtypes = {T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}
    for name, ne, qtype in plan:
        if qtype in float_dtypes:
            dtype = np.dtype(float_dtypes[qtype])
            w.add_tensor_info(name, ne[::-1], dtype, int(np.prod(ne)) * dtype.itemsize,
                              raw_dtype=T.BF16 if qtype == T.BF16 else None)
        else:
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(ne)) // ne[0]
            w.add_tensor_info(name, (rows, ne[0] // block_elems * block_bytes), np.dtype(np.uint8),
                              rows * (ne[0] // block_elems) * block_bytes, raw_dtype=qtype)


def write(path: Path, shape: Shape, mix_name: str, seed: int = 0, mtp: bool = True, log=print) -> Path:
    plan = tensor_plan(shape, mix_name, mtp)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen35")
    w.add_name(f"synthetic-qwen35-{mix_name}")
    w.add_block_count(shape.n_layer + int(mtp))
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_context_length(shape.ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(shape.n_rot)
    w.add_rope_dimension_sections(_sections(shape.n_rot))
    w.add_rope_freq_base(1e7)
    w.add_ssm_conv_kernel(shape.conv_kernel)
    w.add_ssm_state_size(shape.ssm_head_dim)
    w.add_ssm_group_count(shape.ssm_k_heads)
    w.add_ssm_time_step_rank(shape.ssm_v_heads)
    w.add_ssm_inner_size(shape.ssm_v_heads * shape.ssm_head_dim)
    w.add_full_attention_interval(shape.interval)
    tokens, types, merges = byte_vocab(shape.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    declare_tensors(w, plan)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (name, ne, qtype) in enumerate(plan):
        w.write_tensor_data(_tensor_data(name, ne, qtype, rng))
        if log and i % 50 == 0:
            log(f"  {i + 1}/{len(plan)} {name}", file=sys.stderr)
    w.close()
    return path


def _tensor_data(name: str, ne: tuple[int, ...], qtype: T, rng: np.random.Generator) -> np.ndarray:
    """A tensor's random data; the DeltaNet's recurrent parameters get stable values when stored
    as floats (quantized ones are random blocks like the rest)."""
    special = special_recurrent_f32(name, ne, rng) if qtype in (T.F32, T.F16, T.BF16) else None
    if special is None:
        return random_tensor(ne, qtype, rng)
    if qtype == T.BF16:
        return bf16_bits(special)
    return special.astype(np.float16) if qtype == T.F16 else special


def _sections(n_rot: int) -> list[int]:
    """mRoPE sections [t, h, w, 0] summing to n_rot/2, split like Qwen3.5's [11, 11, 10] for 32."""
    pairs = n_rot // 2
    t = h = (pairs + 2) // 3
    return [t, h, pairs - t - h, 0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    ap.add_argument("--mix", choices=sorted(MIXES), default="iq4_xs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mtp", dest="mtp", action="store_false", help="omit the MTP block")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    write(args.output, SHAPES[args.shape], args.mix, args.seed, args.mtp)
    print(f"wrote {args.output} ({args.output.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
