"""Write a small random-weight DFlash 2 drafter checkpoint for `make demo`.

The checkpoint has the published z-lab/Inco layout (config.json with dflash_config,
model.safetensors in BF16: fc, hidden_norm, norm, 2 Qwen3 layers with attention_conv/mlp_conv,
candidate_selector) at toy size, so `luce convert` and `luce inspect` can run on a fresh
machine without downloading anything. Written with numpy + safetensors only (runtime deps).

    python models/make_demo_drafter.py models/work/demo-drafter
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 2, 8, 4, 32, 512, 4096
TAPS, BLOCK, MASK = [1, 8, 15, 22], 16, 4000
CONV_K, CONV_GROUP, SEL_RANK, SEL_TOP_K = 2, 16, 64, 16


def bf16(rng, *shape, scale=0.02, offset=0.0):
    """Random values stored as BF16 bits (the top half of float32, rounded to nearest even)."""
    x = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def tensors(rng) -> dict:
    t = {"fc.weight": bf16(rng, H, len(TAPS) * H), "hidden_norm.weight": bf16(rng, H, offset=1),
         "norm.weight": bf16(rng, H, offset=1)}
    groups = H // CONV_GROUP
    for i in range(LAYERS):
        p = f"layers.{i}."
        t.update({
            p + "input_layernorm.weight": bf16(rng, H, offset=1),
            p + "post_attention_layernorm.weight": bf16(rng, H, offset=1),
            p + "self_attn.q_proj.weight": bf16(rng, HEADS * HEAD_DIM, H),
            p + "self_attn.k_proj.weight": bf16(rng, KV_HEADS * HEAD_DIM, H),
            p + "self_attn.v_proj.weight": bf16(rng, KV_HEADS * HEAD_DIM, H),
            p + "self_attn.o_proj.weight": bf16(rng, H, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": bf16(rng, HEAD_DIM, offset=1),
            p + "self_attn.k_norm.weight": bf16(rng, HEAD_DIM, offset=1),
            p + "mlp.gate_proj.weight": bf16(rng, FFN, H),
            p + "mlp.up_proj.weight": bf16(rng, FFN, H),
            p + "mlp.down_proj.weight": bf16(rng, H, FFN),
        })
        for conv in ("attention_conv", "mlp_conv"):
            t[p + conv + ".base_kernel"] = bf16(rng, 2, CONV_K, H, scale=0.5)
            t[p + conv + ".kernel_projection.weight"] = bf16(rng, 2 * CONV_K * groups, H)
    t["candidate_selector.hidden_projection.weight"] = bf16(rng, SEL_RANK, H)
    t["candidate_selector.predecessor_codebook"] = bf16(rng, VOCAB, SEL_RANK)
    t["candidate_selector.successor_codebook"] = bf16(rng, VOCAB, SEL_RANK)
    return t


def config() -> dict:
    return {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": H,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": FFN, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768, "is_causal": False, "sliding_window": 2048,
        "layer_types": ["sliding_attention"] * LAYERS, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7, "factor": 4.0,
                            "original_max_position_embeddings": 8192},
        "dflash_config": {"block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": TAPS,
                          "conv_kernel_size": CONV_K, "conv_group_size": CONV_GROUP,
                          "selector_rank": SEL_RANK, "selector_top_k": SEL_TOP_K},
    }


def write_bf16_safetensors(path: Path, named: dict) -> None:
    # safetensors.numpy has no bfloat16; write the header ourselves, data as raw BF16 bits.
    header, offset, blobs = {}, 0, []
    for name in sorted(named):
        data = np.ascontiguousarray(named[name])
        header[name] = {"dtype": "BF16", "shape": list(data.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
        blobs.append(data.tobytes())
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for blob in blobs:
            f.write(blob)


def main(folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(), indent=2))
    write_bf16_safetensors(out / "model.safetensors", tensors(np.random.default_rng(0)))
    print(f"wrote {out}/config.json and {out}/model.safetensors")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/work/demo-drafter")
