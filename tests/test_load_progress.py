"""Engine(progress=...) reports the weights being placed (luce_model_params.progress): on the CPU
once, with the model's own weight byte count (luce_model_info.weight_bytes, counted from the
file's tensor table), and an exception raised by the callback reaches the caller instead of
being swallowed by the C frame. The per-tensor GPU reports are checked by tools/gpu_check.py."""
from __future__ import annotations

import pytest

from luce.engine import Engine

TARGET = "models/reference/target-q8_0.gguf"


def test_cpu_load_reports_all_weight_bytes_once():
    calls = []
    with Engine(TARGET, device="cpu", threads=1, ctx_size=64,
                progress=lambda done, total: calls.append((done, total))) as eng:
        assert calls == [(eng.info.weight_bytes, eng.info.weight_bytes)]
        assert eng.info.weight_bytes > 13_000_000  # the committed Q8_0 target is ~13 MiB


def test_callback_exception_reaches_the_caller():
    class Stop(Exception):
        pass

    def fail(done, total):
        raise Stop(f"{done}/{total}")

    with pytest.raises(Stop):
        Engine(TARGET, device="cpu", threads=1, ctx_size=64, progress=fail)


def test_no_callback_loads_as_before():
    with Engine(TARGET, device="cpu", threads=1, ctx_size=64) as eng:
        assert eng.generate(prompt_ids=[1, 2, 3], max_tokens=2, ignore_eos=True).tokens
