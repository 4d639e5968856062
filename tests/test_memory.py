"""The engine's memory account (luce_model_memory, Engine.memory): every backend allocation counted
when it is made and when it is freed, on the CPU and on the emulated GPU.

The oracle is the KV cache's size, computed here from the model's shape (spec/qwen35.md: each
attention layer keeps K and V of n_head_kv x head_dim values per position, 4 bytes each in f32, 2 in
f16): two engines that differ only in context length differ by exactly that in memory held.
Speculative decoding's per-generation buffers come and go: after it the account is back where it was.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from luce import Engine, LuceError, reference_target

REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference"
EMU_CUDA = Path(__file__).resolve().parents[1] / "build" / "gpu-emu-cuda" / "libluce_gpu_emu.so"


def kv_bytes(info, n_ctx: int, value_bytes: int) -> int:
    return info.n_full_attention * 2 * n_ctx * info.n_head_kv * info.head_dim * value_bytes


def held(device: str, ctx: int, kv_cache: str = "f32") -> tuple[int, object]:
    with Engine(reference_target(), device=device, threads=2, ctx_size=ctx, kv_cache=kv_cache) as eng:
        m = eng.memory()
        assert m.peak_bytes >= m.in_use_bytes > 0
        return m.in_use_bytes, eng.info


@pytest.mark.parametrize("kv_cache,value_bytes", [("f32", 4), ("f16", 2)])
def test_context_length_costs_exactly_its_kv_cache(kv_cache, value_bytes):
    small, info = held("cpu", 256, kv_cache)
    large, _ = held("cpu", 1280, kv_cache)
    assert large - small == kv_bytes(info, 1280 - 256, value_bytes)


def test_cpu_has_no_device_figures():
    with Engine(reference_target(), device="cpu", threads=2, ctx_size=64) as eng:
        m = eng.memory()
        assert m.device_free_bytes is None and m.device_total_bytes is None


def test_speculative_buffers_are_returned_and_the_peak_remembers_them():
    with Engine(reference_target(), device="cpu", threads=2, ctx_size=512,
                draft=REFERENCE / "dflash2-q8_0.gguf") as eng:
        before = eng.memory()
        g = eng.generate(prompt_ids=list(range(10, 30)), max_tokens=24, ignore_eos=True)
        after = eng.memory()
        assert after.in_use_bytes == before.in_use_bytes
        assert after.peak_bytes > before.peak_bytes
        assert g.stats["peak_memory_bytes"] == after.peak_bytes and g.stats["memory_on"] == "host"


def test_closed_engine_has_no_account():
    eng = Engine(reference_target(), device="cpu", threads=2, ctx_size=64)
    eng.close()
    with pytest.raises(LuceError, match="closed"):
        eng.memory()


_GPU_PROBE = """
import json
from luce import Engine, reference_target
out = {}
for ctx in (64, 256, 1280):
    with Engine(reference_target(), device="gpu", threads=2, ctx_size=ctx) as eng:
        m, info = eng.memory(), eng.info
        out[ctx] = [m.in_use_bytes, m.peak_bytes, m.device_free_bytes, m.device_total_bytes]
out["info"] = [info.n_full_attention, info.n_head_kv, info.head_dim, info.weight_bytes]
print(json.dumps(out))
"""


def test_emulated_gpu_counts_weights_and_cache():
    """On a GPU the weights are device memory too, and the device's own free and total bytes are
    reported. (In a child process: the GPU library, once loaded, stays loaded.)"""
    if not EMU_CUDA.exists():
        pytest.fail(f"{EMU_CUDA} is missing: `make gpu-emu-cuda` builds it (`make test` does)")
    proc = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LUCE_GPU_LIBRARY": str(EMU_CUDA)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    n_attn, n_head_kv, head_dim, weight_bytes = out["info"]
    kv = 2 * n_attn * n_head_kv * head_dim * 4  # bytes per position, f32 cache
    assert out["1280"][0] - out["256"][0] == (1280 - 256) * kv
    in_use, peak, free, total = out["64"]
    assert peak >= in_use > weight_bytes and 0 < free <= total
