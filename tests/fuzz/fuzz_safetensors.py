"""atheris target: safetensors bytes -> luce's checkpoint reader (converters/safetensors_source.py).

    python tests/fuzz/fuzz_safetensors.py tests/fuzz/corpus/safetensors -runs=N

An input is a safetensors file, or, when it starts with "{", a shard index
(model.safetensors.index.json) opened beside two valid shards (SHARDS, also seeds) as a checkpoint
folder is. The headers are parsed and bounds-checked, then every tensor is read (BF16 widened) as
`luce convert` reads it. Anything but a one-line LuceError is a crash.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import refusal, run_fuzzer, scratch_dir, scratch_file  # noqa: E402

SEEDS = Path(__file__).resolve().parent / "corpus" / "safetensors"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def make_check():
    from luce.converters.safetensors_source import INDEX_FILE, Checkpoint, open_checkpoint, read_header

    path = scratch_file(".safetensors")
    folder = scratch_dir()
    (folder / "config.json").write_text("{}")
    for shard in SHARDS:
        (folder / shard).write_bytes((SEEDS / shard).read_bytes())

    def check(data: bytes) -> None:
        if data[:1] == b"{":
            (folder / INDEX_FILE).write_bytes(data)
            ckpt = open_checkpoint(folder, use_sidecar=False)
            tensors = ckpt.tensors
        else:
            path.write_bytes(data)
            tensors = read_header(path)
            ckpt = Checkpoint({}, None, tensors, {}, None, [path])
        try:
            for t in tensors.values():
                ckpt.read(t)
        finally:
            ckpt.close()
    return check


def check_bytes(data: bytes) -> str | None:
    """For tests: the one-line refusal of `data`, or None if it is accepted."""
    return refusal(make_check(), data)


if __name__ == "__main__":
    run_fuzzer(make_check, sys.argv)
