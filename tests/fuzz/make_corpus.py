"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<target>/), deterministically.

    python tests/fuzz/make_corpus.py [--out tests/fuzz/corpus]

Seeds are small on purpose (a fuzzer mutates bytes; a seed that is mostly tensor data wastes its
mutations there): a 2-layer qwen35 target with hidden size 16, the three drafter kinds converted
by `luce convert` at the same width, the crafted files of tests/fixtures/crafted_gguf.py, and
valid and crafted safetensors files. Same bytes on every run (seeded RNGs, no timestamps).

    gguf/           luce.converters.gguf_reader + `luce inspect` (tests/fuzz/fuzz_gguf.py)
    safetensors/    luce.converters.safetensors_source (tests/fuzz/fuzz_safetensors.py)
    native_loader/  luce_model_load + luce_drafter_load (tests/fuzz/native_loader.cpp); binds
                    drafters to target-tiny.gguf, which is also its first seed
"""
from __future__ import annotations

import argparse
import contextlib
import json
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))          # tests/, for fixtures.*

from fixtures import crafted_gguf as cg         # noqa: E402
from fixtures import drafter_checkpoints as dc  # noqa: E402

# The tiny target every native seed binds to: layers 0-2 Gated DeltaNet, layer 3 full attention.
TINY_TARGET = cg.TinyQwen35(hidden=16, n_layer=4, interval=4, n_head=2, n_kv=1, head_dim=16, ff=16,
                            vocab=32, conv_kernel=4, state_size=4, group_count=1, time_step_rank=2,
                            ctx=256)
TARGET_NAME = "target-tiny.gguf"

# Drafter checkpoint dimensions matching TINY_TARGET (drafter_checkpoints' own are 64 wide;
# its three taps [0, 1, 2] stay).
_TINY_DRAFTER = dict(H=16, L=1, NH=2, NKV=1, D=8, FF=16, V=32, BLOCK=4, MASK=30,
                     CONV_K=2, CONV_GROUP=8, SEL_RANK=4, SEL_TOP_K=2, MARKOV_RANK=4)


@contextlib.contextmanager
def _tiny_drafter_dims():
    """drafter_checkpoints reads its dimensions from module globals at call time: shrink them."""
    saved = {k: getattr(dc, k) for k in _TINY_DRAFTER}
    for k, v in _TINY_DRAFTER.items():
        setattr(dc, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(dc, k, v)


def _target_seeds() -> dict[str, bytes]:
    parts = cg.qwen35_gguf_parts(TINY_TARGET, seed=0)
    seeds = {TARGET_NAME: cg.build(parts)}
    # The same target with F16 weights and an explicit recurrent-layer array (the other branch).
    f16 = cg.qwen35_gguf_parts(TINY_TARGET, seed=1)
    for t in f16.tensors:
        if len(t.shape) == 2:
            t.ggml_type = cg.GGMLQuantizationType.F16
            t.data = np.frombuffer(t.data, "<f4").astype("<f2").tobytes()
    f16.kvs.append(cg.KV("qwen35.attention.recurrent_layers", cg.VT.ARRAY, [1, 1, 1, 0], cg.VT.BOOL))
    seeds["target-tiny-f16.gguf"] = cg.build(f16)
    return seeds


def _tiny_dspark(folder):
    """dc.dspark_radixark at the tiny width (its confidence width default is fixed at import)."""
    gen = dc._gen(4)
    heads = dc.dspark_heads(gen, conf_dim=dc.H + dc.MARKOV_RANK)
    return dc.write_checkpoint(folder, dc._dspark_config("DSparkDraftModel", num_target_layers=4),
                               {**dc.trunk_tensors(gen), **heads})


def _drafter_seeds() -> dict[str, bytes]:
    from luce.converters.convert import ConvertOptions, convert_checkpoint

    makers = {"dflash": lambda d: dc.zlab_dflash(d, num_target_layers=4),
              "dflash2": lambda d: dc.dflash2(d, num_target_layers=4),
              "dspark": _tiny_dspark}
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp, _tiny_drafter_dims():
        for kind, make in makers.items():
            src = make(Path(tmp) / kind)
            for layout in ("lucebox", "llama.cpp"):
                out = Path(tmp) / f"{kind}-{layout}.gguf"
                opts = ConvertOptions(outtype="f16", layout=layout, force=True,
                                      target_model=Path(tmp) / TARGET_NAME)
                (Path(tmp) / TARGET_NAME).write_bytes(cg.build(cg.qwen35_gguf_parts(TINY_TARGET)))
                convert_checkpoint(src, out, opts)
                seeds[f"drafter-{kind}-{layout.replace('.', '')}.gguf"] = out.read_bytes()
    return seeds


def _crafted_seeds() -> dict[str, bytes]:
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in sorted(cg.CRAFTED.items()):
            seeds[f"crafted-{name}.gguf"] = Path(write(Path(tmp) / name)).read_bytes()
    seeds["valid-small.gguf"] = cg.build(cg._small_parts())
    return seeds


# ---- safetensors -------------------------------------------------------------------------------

def _safetensors(header: dict, data: bytes, header_len: int | None = None) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


def _safetensors_seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3)).astype("<f4").tobytes()
    b = rng.standard_normal(4).astype("<f2").tobytes()
    c = (rng.integers(0, 1 << 16, 3, dtype=np.uint32)).astype("<u2").tobytes()
    entries = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
               "b": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
               "c": {"dtype": "BF16", "shape": [3], "data_offsets": [32, 38]},
               "s": {"dtype": "F32", "shape": [], "data_offsets": [38, 42]}}
    data = a + b + c + b"\0\0\x80\x3f"
    valid = {"__metadata__": {"format": "pt"}, **entries}
    seeds = {
        "valid.safetensors": _safetensors(valid, data),
        "empty-header.safetensors": _safetensors({}, b""),
        "zero-size-tensor.safetensors": _safetensors(
            {"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}, b""),
        "truncated-data.safetensors": _safetensors(valid, data[:20]),
        "header-length-past-eof.safetensors": _safetensors(valid, data, header_len=1 << 40),
        "header-not-json.safetensors": struct.pack("<Q", 8) + b"{nope!!}",
        "header-not-object.safetensors": _safetensors([1, 2], b""),       # type: ignore[arg-type]
        "bad-dtype.safetensors": _safetensors({"a": {**entries["a"], "dtype": "I64"}}, data),
        "shape-mismatch.safetensors": _safetensors({"a": {**entries["a"], "shape": [3, 3]}}, data),
        "offsets-reversed.safetensors": _safetensors({"a": {**entries["a"], "data_offsets": [24, 0]}}, data),
        "entry-not-object.safetensors": _safetensors({"a": 7}, data),
        "short-file.safetensors": b"\x10\0\0",
        # The shards a shard index (an input starting with "{") is opened beside, and indexes.
        "model-00001-of-00002.safetensors": _safetensors({k: entries[k] for k in "ab"}, data[:32]),
        "model-00002-of-00002.safetensors": _safetensors(
            {"c": {**entries["c"], "data_offsets": [0, 6]}, "s": {**entries["s"], "data_offsets": [6, 10]}},
            data[32:]),
    }
    index = {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
             "c": "model-00002-of-00002.safetensors", "s": "model-00002-of-00002.safetensors"}
    indexes = {"index-valid.json": {"metadata": {"total_size": 42}, "weight_map": index},
               "index-missing-shard.json": {"weight_map": {**index, "d": "model-00003-of-00003.safetensors"}},
               "index-tensor-not-in-shard.json": {"weight_map": {**index, "e": "model-00001-of-00002.safetensors"}},
               "index-shard-not-a-name.json": {"weight_map": {**index, "a": 5}},
               "index-empty-map.json": {"weight_map": {}}}
    for name, value in indexes.items():
        seeds[name] = json.dumps(value, separators=(",", ":")).encode()
    return seeds


def write_corpus(out: Path) -> dict[str, int]:
    targets = _target_seeds()
    drafters = _drafter_seeds()
    crafted = _crafted_seeds()
    layout = {"gguf": {**targets, **drafters, **crafted},
              "native_loader": {**targets, **drafters, **{k: v for k, v in crafted.items() if "small" in k
                                                          or "truncated" in k or "overlap" in k}},
              "safetensors": _safetensors_seeds()}
    counts = {}
    for target, files in layout.items():
        folder = out / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        counts[target] = len(files)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "corpus")
    args = ap.parse_args()
    for target, n in write_corpus(args.out).items():
        print(f"{args.out / target}: {n} seeds")


if __name__ == "__main__":
    main()
