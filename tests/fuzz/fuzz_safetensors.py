"""atheris target: safetensors bytes -> luce's checkpoint reader (converters/safetensors_source.py).

    python tests/fuzz/fuzz_safetensors.py tests/fuzz/corpus/safetensors -runs=N

The header is parsed and bounds-checked, then every tensor is read (BF16 widened) as `luce
convert` reads it. Anything but a one-line LuceError is a crash.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import refusal, run_fuzzer, scratch_file  # noqa: E402


def make_check():
    from luce.converters.safetensors_source import Checkpoint, read_header

    path = scratch_file(".safetensors")

    def check(data: bytes) -> None:
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
