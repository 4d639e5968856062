"""Synthetic qwen35 GGUFs with real Qwen3.5-family shapes and random quantized blocks.

Benchmarks need files of the real size and the real quant mix, not real weights: a 15 GB 27B
file is generated on the machine where it is measured instead of being shipped. Every block is
random bytes with sane f16 scales (no NaN/Inf), so kernels see the exact memory traffic and
dequantization work of a real file.

    python models/synthetic_qwen35.py --shape 27b --mix iq4_xs -o /tmp/q27b.gguf
    python models/synthetic_qwen35.py --shape 0.8b --mix q8_0 -o /tmp/q08b.gguf

Mixes follow the upstream recipe (spec/engine.md §2.7: `llama-quantize --pure --output-tensor-type
q5_k --tensor-type ssm_out=q6_k --tensor-type attn_v=q6_k ... iq4_xs`): body in the mix's type,
ssm_out and attn_v Q6_K, output Q5_K; 1-D tensors and ssm_conv1d F32. The tokenizer metadata is
a byte-level vocabulary padded with filler tokens to the real vocab size, enough for loaders
(luce, llama.cpp) that need a vocabulary to open the file.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES


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

MIXES = {
    "iq4_xs": dict(body=T.IQ4_XS, ssm_out=T.Q6_K, attn_v=T.Q6_K, output=T.Q5_K),
    "q4_k": dict(body=T.Q4_K, ssm_out=T.Q6_K, attn_v=T.Q6_K, output=T.Q6_K),
    "q8_0": dict(body=T.Q8_0, ssm_out=T.Q8_0, attn_v=T.Q8_0, output=T.Q8_0),
    "f16": dict(body=T.F16, ssm_out=T.F16, attn_v=T.F16, output=T.F16),
}


def tensor_plan(s: Shape, mix: dict, mtp: bool = True) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ne (innermost first), type) for every tensor of the file, in file order.

    With mtp, a multi-token-prediction block follows the main layers as blk.{n_layer} (a full-
    attention block plus nextn.* tensors), as in llama.cpp conversions that keep it; runtimes skip it."""
    key_dim, value_dim = s.ssm_k_heads * s.ssm_head_dim, s.ssm_v_heads * s.ssm_head_dim
    conv_dim = 2 * key_dim + value_dim
    body = mix["body"]
    plan = [("token_embd.weight", (s.n_embd, s.n_vocab), body),
            ("output_norm.weight", (s.n_embd,), T.F32),
            ("output.weight", (s.n_embd, s.n_vocab), mix["output"])]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        plan.append((p + "attn_norm.weight", (s.n_embd,), T.F32))
        if (i + 1) % s.interval == 0:  # gated full attention
            plan += _attention(p, s, mix)
        else:  # Gated DeltaNet
            plan += [(p + "attn_qkv.weight", (s.n_embd, conv_dim), body),
                     (p + "attn_gate.weight", (s.n_embd, value_dim), body),
                     (p + "ssm_beta.weight", (s.n_embd, s.ssm_v_heads), body),
                     (p + "ssm_alpha.weight", (s.n_embd, s.ssm_v_heads), body),
                     (p + "ssm_conv1d.weight", (s.conv_kernel, conv_dim), T.F32),
                     (p + "ssm_dt.bias", (s.ssm_v_heads,), T.F32),
                     (p + "ssm_a", (s.ssm_v_heads,), T.F32),
                     (p + "ssm_norm.weight", (s.ssm_head_dim,), T.F32),
                     (p + "ssm_out.weight", (value_dim, s.n_embd), mix["ssm_out"])]
        plan += _post_attention_and_ffn(p, s, body)
    if mtp:
        p = f"blk.{s.n_layer}."
        plan += [(p + "attn_norm.weight", (s.n_embd,), T.F32)] + _attention(p, s, mix)
        plan += _post_attention_and_ffn(p, s, body)
        plan += [(p + "nextn.eh_proj.weight", (2 * s.n_embd, s.n_embd), body),
                 (p + "nextn.enorm.weight", (s.n_embd,), T.F32),
                 (p + "nextn.hnorm.weight", (s.n_embd,), T.F32),
                 (p + "nextn.shared_head_norm.weight", (s.n_embd,), T.F32)]
    return plan


def _attention(p: str, s: Shape, mix: dict) -> list:
    body = mix["body"]
    return [(p + "attn_q.weight", (s.n_embd, 2 * s.n_head * s.head_dim), body),
            (p + "attn_k.weight", (s.n_embd, s.n_head_kv * s.head_dim), body),
            (p + "attn_v.weight", (s.n_embd, s.n_head_kv * s.head_dim), mix["attn_v"]),
            (p + "attn_output.weight", (s.n_head * s.head_dim, s.n_embd), body),
            (p + "attn_q_norm.weight", (s.head_dim,), T.F32),
            (p + "attn_k_norm.weight", (s.head_dim,), T.F32)]


def _post_attention_and_ffn(p: str, s: Shape, body: T) -> list:
    return [(p + "post_attention_norm.weight", (s.n_embd,), T.F32),
            (p + "ffn_gate.weight", (s.n_embd, s.n_ff), body),
            (p + "ffn_up.weight", (s.n_embd, s.n_ff), body),
            (p + "ffn_down.weight", (s.n_ff, s.n_embd), body)]


# Rough mean |sub-scale x quant| of a random block, so that d = scale / this gives elements of
# about 1/sqrt(fan_in), like a trained layer (keeps a random model's activations finite).
TYPICAL_QUANT_MAGNITUDE = {T.Q8_0: 64, T.Q4_K: 256, T.Q5_K: 512, T.Q6_K: 1024, T.IQ4_XS: 960}


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(len(values), 2)


def random_blocks(qtype: T, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """[n_blocks, block_bytes] uint8 of random blocks whose f16 fields are finite and small."""
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d = _f16_bytes(rng.uniform(0.25, 1.0, n_blocks) * scale)
    if qtype == T.Q8_0:
        raw[:, 0:2] = d
    elif qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:2] = d
        raw[:, 2:4] = _f16_bytes(rng.uniform(0.0, 0.5, n_blocks) * scale)  # dmin
    elif qtype == T.Q6_K:
        raw[:, 208:210] = d  # d is the last field of a Q6_K block
    elif qtype == T.IQ4_XS:
        raw[:, 0:2] = d
    else:
        raise ValueError(f"no random block recipe for {qtype.name}")
    return raw


def random_tensor(ne: tuple[int, ...], qtype: T, rng: np.random.Generator) -> np.ndarray:
    """Random data for one tensor, as the array GGUFWriter stores (floats or raw block bytes)."""
    n = int(np.prod(ne))
    fan_in = ne[0]
    scale = 1.0 / np.sqrt(fan_in)
    if qtype == T.F32:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32).reshape(ne[::-1])
    if qtype == T.F16:
        return (scale * rng.standard_normal(n, dtype=np.float32)).astype(np.float16).reshape(ne[::-1])
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    rows = n // ne[0]
    blocks = random_blocks(qtype, n // block_elems, rng, scale / TYPICAL_QUANT_MAGNITUDE[qtype])
    return blocks.reshape(rows, (ne[0] // block_elems) * block_bytes)


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
    for name, ne, qtype in plan:
        if qtype in (T.F32, T.F16):
            dtype = np.dtype(np.float32 if qtype == T.F32 else np.float16)
            w.add_tensor_info(name, ne[::-1], dtype, int(np.prod(ne)) * dtype.itemsize)
        else:
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(ne)) // ne[0]
            w.add_tensor_info(name, (rows, ne[0] // block_elems * block_bytes), np.dtype(np.uint8),
                              rows * (ne[0] // block_elems) * block_bytes, raw_dtype=qtype)


def write(path: Path, shape: Shape, mix_name: str, seed: int = 0, mtp: bool = True, log=print) -> Path:
    mix = MIXES[mix_name]
    plan = tensor_plan(shape, mix, mtp)
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
        data = special_recurrent_f32(name, ne, rng) if qtype == T.F32 else None
        w.write_tensor_data(data if data is not None else random_tensor(ne, qtype, rng))
        if log and i % 50 == 0:
            log(f"  {i + 1}/{len(plan)} {name}", file=sys.stderr)
    w.close()
    return path


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
