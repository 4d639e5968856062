"""Synthetic DFlash 2 drafter GGUFs with the real Qwen3.8-27B-DFlash2 shape and random weights.

The GPU bench times a whole speculative step on the synthetic 27B target (synthetic_qwen35.py);
that needs a drafter of the real size bound to it, not a trained one: acceptance is not what is
measured, the drafter's forward and heads are. Shapes follow spec/drafters.md §2.3 (z-lab /
incoai Qwen3.8-27B-DFlash2): 5 layers, hidden 5120, MLP 17408, 32/8 heads of 128, block 8,
mask 248070, taps [5, 19, 33, 47, 61] of the 64-layer target, conv kernel 2 / group 16, selector
rank 256 / top-k 16, every layer sliding (window 2048) and bidirectional. Matrices are Q8_0 (the
usual drafter quantisation), norms and conv bases F32.

    python models/synthetic_drafter.py --shape 27b -o /tmp/dflash2-27b.gguf
    python models/synthetic_drafter.py --shape tiny -o /tmp/dflash2-tiny.gguf   # for the tiny target
    python models/synthetic_drafter.py --shape 0.8b -o /tmp/dflash2-0.8b.gguf   # for the 0.8b target
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

try:  # run as a script from models/, or imported as models.synthetic_drafter
    import synthetic_qwen35 as target_synth
except ImportError:  # pragma: no cover
    from models import synthetic_qwen35 as target_synth

ARCH = "qwen35-dflash-draft"


@dataclasses.dataclass(frozen=True)
class DraftShape:
    target: str            # key of synthetic_qwen35.SHAPES this drafter is bound to
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    taps: tuple[int, ...]  # 0-based target layers (each < target layers - 1)
    block: int = 8
    conv_kernel: int = 2
    conv_group: int = 16
    rank: int = 256
    top_k: int = 16
    window: int = 2048


SHAPES = {
    "27b": DraftShape("27b", 5, 32, 8, 128, 17408, (5, 19, 33, 47, 61)),
    "tiny": DraftShape("tiny", 2, 4, 2, 64, 512, (1, 3, 5), rank=32, top_k=8, window=64),
    # Bound to the 0.8b target: Qwen's 248320-token vocabulary at a size a CPU steps through, for
    # the host's share of a speculative step (sampling, acceptance) at the real vocabulary.
    "0.8b": DraftShape("0.8b", 2, 8, 2, 128, 3584, (1, 11, 21)),
}


def tensor_plan(s: DraftShape, E: int, V: int) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, GGUF ne, type) of every tensor, ne[0] the input (contiguous) dimension."""
    QD, KD, G = s.n_head * s.head_dim, s.n_head_kv * s.head_dim, E // s.conv_group
    plan = [("dflash.fc.weight", (len(s.taps) * E, E), T.Q8_0),
            ("dflash.hidden_norm.weight", (E,), T.F32),
            ("output_norm.weight", (E,), T.F32),
            ("dflash.selector.hproj.weight", (E, s.rank), T.Q8_0),
            ("dflash.selector.pred_cb", (s.rank, V), T.Q8_0),
            ("dflash.selector.succ_cb", (s.rank, V), T.Q8_0)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        plan += [(p + "attn_norm.weight", (E,), T.F32), (p + "ffn_norm.weight", (E,), T.F32),
                 (p + "attn_q.weight", (E, QD), T.Q8_0), (p + "attn_k.weight", (E, KD), T.Q8_0),
                 (p + "attn_v.weight", (E, KD), T.Q8_0), (p + "attn_output.weight", (QD, E), T.Q8_0),
                 (p + "attn_q_norm.weight", (s.head_dim,), T.F32), (p + "attn_k_norm.weight", (s.head_dim,), T.F32),
                 (p + "ffn_gate.weight", (E, s.n_ff), T.Q8_0), (p + "ffn_up.weight", (E, s.n_ff), T.Q8_0),
                 (p + "ffn_down.weight", (s.n_ff, E), T.Q8_0),
                 (p + "attn_conv.base", (E, s.conv_kernel, 2), T.F32),
                 (p + "attn_conv.proj.weight", (E, 2 * s.conv_kernel * G), T.Q8_0),
                 (p + "ffn_conv.base", (E, s.conv_kernel, 2), T.F32),
                 (p + "ffn_conv.proj.weight", (E, 2 * s.conv_kernel * G), T.Q8_0)]
    return plan


def random_data(name: str, ne: tuple[int, ...], qtype: T, rng: np.random.Generator) -> np.ndarray:
    if name.endswith("conv.base"):  # small taps around the identity on the current token
        base = 0.1 * rng.standard_normal(int(np.prod(ne)), dtype=np.float32).reshape(ne[::-1])
        base[:, 0, :] += 1.0
        return base.astype(np.float32)
    return target_synth.random_tensor(ne, qtype, rng)


def write(path: Path, shape: DraftShape, seed: int = 0) -> Path:
    tgt = target_synth.SHAPES[shape.target]
    E, V = tgt.n_embd, tgt.n_vocab
    if max(shape.taps) >= tgt.n_layer - 1:
        raise ValueError(f"taps {shape.taps} must be below the target's last layer {tgt.n_layer - 1}")
    plan = tensor_plan(shape, E, V)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), ARCH)
    w.add_name(f"synthetic-dflash2-{shape.target}")
    w.add_context_length(tgt.ctx)
    w.add_embedding_length(E)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_uint32(f"{ARCH}.vocab_size", V)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e7)
    w.add_uint32(f"{ARCH}.dflash.n_target_layers", len(shape.taps))
    w.add_uint32(f"{ARCH}.dflash.block_size", shape.block)
    w.add_uint32(f"{ARCH}.dflash.mask_token_id", min(248070, V - 4))
    w.add_array(f"{ARCH}.dflash.target_layer_ids", list(shape.taps))
    w.add_uint32(f"{ARCH}.dflash.dflash2.conv_kernel_size", shape.conv_kernel)
    w.add_uint32(f"{ARCH}.dflash.dflash2.conv_group_size", shape.conv_group)
    w.add_uint32(f"{ARCH}.dflash.dflash2.selector_rank", shape.rank)
    w.add_uint32(f"{ARCH}.dflash.dflash2.selector_top_k", shape.top_k)
    # Every layer sliding and bidirectional, as Qwen3.8's layer_types + is_causal: false.
    w.add_uint32(f"{ARCH}.attention.sliding_window", shape.window)
    w.add_array(f"{ARCH}.attention.sliding_window_pattern", [True] * shape.n_layer)
    w.add_bool(f"{ARCH}.attention.causal", False)
    target_synth.declare_tensors(w, plan)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, ne, qtype in plan:
        w.write_tensor_data(random_data(name, ne, qtype, rng))
    w.close()
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="27b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    write(args.output, SHAPES[args.shape], args.seed)
    print(f"wrote {args.output} ({args.output.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
