"""Bounded memory: a conversion holds about one tensor at a time, never the checkpoint.

Measured with tracemalloc (numpy reports its buffers to it) on the demo checkpoint
(models/make_demo_drafter.py), whose float32 size is several times its largest tensor."""
from __future__ import annotations

import importlib.util
import tracemalloc
from pathlib import Path

from luce.converters.convert import ConvertOptions, convert_checkpoint
from luce.converters.safetensors_source import read_header

ROOT = Path(__file__).resolve().parents[1]


def _demo_module():
    spec = importlib.util.spec_from_file_location("make_demo_drafter", ROOT / "models" / "make_demo_drafter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peak_memory_is_about_one_tensor(tmp_path):
    src = tmp_path / "demo"
    _demo_module().main(str(src))
    header = read_header(src / "model.safetensors")
    f32_sizes = [t.nbytes * 2 for t in header.values()]          # BF16 -> float32
    total, largest = sum(f32_sizes), max(f32_sizes)
    assert total > 6 * largest                                   # the test means something
    tracemalloc.start()
    try:
        convert_checkpoint(src, tmp_path / "d.gguf", ConvertOptions(outtype="q8_0"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one widened tensor + its encoded copy + bookkeeping; far below the whole checkpoint
    assert peak < 3 * largest, (peak, largest, total)
