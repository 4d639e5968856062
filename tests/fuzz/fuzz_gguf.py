"""atheris target: GGUF bytes -> luce's GGUF reader and `luce inspect`'s validator.

    python tests/fuzz/fuzz_gguf.py tests/fuzz/corpus/gguf -runs=N    (libFuzzer flags)

Each input is parsed once by luce.converters.gguf_reader, validated as `luce inspect` does
(converters/validate.py's inspect_gguf, step by step so the file is parsed once: as a drafter it
is also paired with the corpus' tiny target, whose report is made once), reported as JSON, and
every tensor it declares is read. Anything but a one-line LuceError is a crash.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import refusal, run_fuzzer, scratch_file  # noqa: E402

TARGET = Path(__file__).resolve().parent / "corpus" / "native_loader" / "target-tiny.gguf"


def make_check():
    from luce.converters.gguf_reader import GGUFFile
    from luce.converters.validate import _check_pair, _inspect_open

    path = scratch_file(".gguf")
    with GGUFFile.open(TARGET) as tf:
        target_report, _ = _inspect_open(tf)

    def check(data: bytes) -> None:
        path.write_bytes(data)
        with GGUFFile.open(path) as gf:
            report, view = _inspect_open(gf)
            if view is not None:
                report.target = target_report
                _check_pair(report, target_report, view)
            report.to_json()
            for name in gf.tensors:
                gf.tensor_array(name)
    return check


def check_bytes(data: bytes) -> str | None:
    """For tests: the one-line refusal of `data`, or None if it is accepted."""
    return refusal(make_check(), data)


if __name__ == "__main__":
    run_fuzzer(make_check, sys.argv)
