"""qwen35 GGUF -> transformers Qwen3_5ForCausalLM checkpoint: the inverse of converters/qwen35.py.

    python3 -m models.gguf_to_hf models/reference/target-q8_0.gguf -o models/work/target

The committed reference target exists only as target-q8_0.gguf (its bf16 training checkpoint is
not in the repo), but the drafter pipeline trains against a transformers model. This writes one:
config.json (the committed models/reference/target/config.json, checked key by key against the
GGUF's hyperparameters), model.safetensors (every tensor dequantized with gguf.quants and stored
float32: q8_0 values d * q are not bf16-exact) and the tokenizer files of the committed target.

Each converter transform is undone (converters/qwen35.py docstring, steps 1-5): names back to
HF's, `1 + w` norms back to `w`, ssm_a = -exp(A_log) back to A_log, [C, K] conv back to
[C, 1, K], value heads "tiled -> grouped". A_log is chosen so that the converter's own rounding
of -exp(A_log) gives the stored ssm_a back bit for bit, so `luce convert --outtype q8_0` of the
export reproduces the GGUF's tensors exactly (tests/test_gguf_to_hf.py).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

REF_TARGET = Path(__file__).parent / "reference" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


class ExportError(Exception):
    pass


def tiled_to_grouped(x: np.ndarray, key_heads: int, rows_per_head: int, axis: int = 0) -> np.ndarray:
    """Undo the converter's grouped_to_tiled: along `axis` [r, HK, rows] -> [HK, r, rows]."""
    moved = np.moveaxis(x, axis, 0)
    rest = moved.shape[1:]
    grouped = moved.reshape(-1, key_heads, rows_per_head, *rest).swapaxes(0, 1).reshape(moved.shape)
    return np.moveaxis(grouped, 0, axis)


def a_log_from_ssm_a(ssm_a: np.ndarray) -> np.ndarray:
    """float32 A_log whose converter rounding -exp(float64(A_log)) -> float32 is ssm_a exactly.

    log(-a) rounded to float32 usually is one; where it is not (exp magnifies an A_log ulp by |a|),
    the nearest float32 neighbours that are are searched (a few ulps at most)."""
    from luce.converters.qwen35 import _neg_exp
    a = ssm_a.astype(np.float32).ravel()
    out = np.log(-a.astype(np.float64)).astype(np.float32)
    for i in np.flatnonzero(_neg_exp(out) != a):
        up = down = out[i]
        for _ in range(64):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            hit = next((c for c in (up, down) if _neg_exp(np.array([c]))[0] == a[i]), None)
            if hit is not None:
                out[i] = hit
                break
    return out.reshape(ssm_a.shape)


def inverse_transforms(cfg) -> dict:
    hk, dv = cfg.key_heads, cfg.value_head_dim
    qk = 2 * cfg.key_heads * cfg.key_head_dim

    def v_block(x):
        return np.concatenate([x[:qk], tiled_to_grouped(x[qk:], hk, dv)])

    return {
        "plain": lambda x: x,
        "norm_plus_one": lambda x: x - np.float32(1.0),
        "v_block": v_block,
        "v_rows": lambda x: tiled_to_grouped(x, hk, dv),
        "v_heads": lambda x: tiled_to_grouped(x, hk, 1),
        "neg_exp_v_heads": lambda x: a_log_from_ssm_a(tiled_to_grouped(x, hk, 1)),
        "conv": lambda x: v_block(x)[:, None, :],
        "v_columns": lambda x: tiled_to_grouped(x, hk, dv, axis=1),
    }


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    vals = [f.parts[i] for i in f.data]
    vals = [v.tobytes().decode() if v.dtype == np.uint8 else v.item() if v.size == 1 else v.tolist()
            for v in vals]
    return vals if len(vals) > 1 or key.endswith("dimension_sections") else vals[0]


def check_config(reader, cfg) -> None:
    """The committed config must say what the GGUF says (the converter's hparams, reread)."""
    arch = _field(reader, "general.architecture")
    if arch != "qwen35":
        raise ExportError(f"not a qwen35 GGUF (general.architecture {arch!r})")
    want = {
        "block_count": cfg.num_layers, "context_length": cfg.context_length,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_heads, "attention.head_count_kv": cfg.num_kv_heads,
        "rope.freq_base": cfg.rope_theta, "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        "attention.key_length": cfg.head_dim, "ssm.conv_kernel": cfg.conv_kernel,
        "ssm.state_size": cfg.key_head_dim, "ssm.group_count": cfg.key_heads,
        "ssm.time_step_rank": cfg.value_heads, "ssm.inner_size": cfg.value_heads * cfg.value_head_dim,
        "full_attention_interval": cfg.full_attention_interval,
        "rope.dimension_count": cfg.rotary_dim,
        "rope.dimension_sections": list(cfg.mrope_sections),
    }
    bad = []
    for key, value in want.items():
        got = _field(reader, f"qwen35.{key}")
        same = np.allclose(got, value, rtol=1e-6) if isinstance(value, float) else got == value
        if not same:
            bad.append(f"{key} {got} (config {value})")
    if _field(reader, "qwen35.nextn_predict_layers"):
        bad.append("MTP block present (not exported)")
    if bad:
        raise ExportError("GGUF and config.json disagree: " + "; ".join(bad))


def read_tensor(t) -> np.ndarray:
    """float32, numpy (row-major) order, as the converter wrote it before encoding."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize
    shape = tuple(int(n) for n in reversed(t.shape))   # GGUF lists ne (fastest first)
    if t.tensor_type == QT.F32:
        data = np.asarray(t.data, dtype=np.float32)
    elif t.tensor_type == QT.F16:
        data = np.asarray(t.data, dtype=np.float16).astype(np.float32)
    else:
        data = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    return data.reshape(shape)


def export(gguf_path: Path, out: Path, config_dir: Path = REF_TARGET) -> dict:
    from gguf import GGUFReader
    from luce.converters.qwen35 import Qwen35Config, _expected_names
    from safetensors.numpy import save_file

    hf_config = json.loads((config_dir / "config.json").read_text())
    cfg = Qwen35Config.from_hf(hf_config)
    reader = GGUFReader(str(gguf_path))
    check_config(reader, cfg)
    to_hf = {g: (hf, tr) for hf, (g, tr) in _expected_names(cfg, False, set(), "model.").items()}
    tensors = {t.name: t for t in reader.tensors}
    if set(tensors) != set(to_hf):
        extra, missing = sorted(set(tensors) - set(to_hf)), sorted(set(to_hf) - set(tensors))
        raise ExportError(f"tensor set differs from a qwen35 file of this config: "
                          f"extra {extra[:3]}, missing {missing[:3]}")
    inverse = inverse_transforms(cfg)
    state = {}
    for name, (hf, transform) in to_hf.items():
        state[hf] = np.ascontiguousarray(inverse[transform](read_tensor(tensors[name])), dtype=np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (config_dir / name).is_file():
            shutil.copyfile(config_dir / name, out / name)
    return {"tensors": len(state), "params": int(sum(v.size for v in state.values())),
            "bytes": (out / "model.safetensors").stat().st_size}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--config-dir", type=Path, default=REF_TARGET,
                    help="config.json + tokenizer files of the checkpoint the GGUF came from")
    args = ap.parse_args(argv)
    for need in (args.gguf, args.config_dir / "config.json"):
        if not need.is_file():
            sys.exit(f"error: {need} not found")
    try:
        info = export(args.gguf, args.out, args.config_dir)
    except Exception as e:  # noqa: BLE001 - one line for any bad input
        sys.exit(f"error: {type(e).__name__}: {e}")
    print(f"wrote {args.out}: {info['tensors']} tensors, {info['params'] / 1e6:.2f} M params, "
          f"{info['bytes'] / 2**20:.1f} MiB float32")


if __name__ == "__main__":
    main()
