"""KV cache types (f16, q8_0, q4_0) and the Walsh-Hadamard K rotation.

Rows are held to gguf.quants, the format's own Python implementation: a cached row gives back
exactly what dequantize(quantize(row)) gives. Logits are held to the Hugging Face model the tiny
GGUF was converted from, within a bar set by each type's rounding unit (f16: 2^-11; q8_0: a
127th of a block's largest value; q4_0: an 8th), and each coarser type must move the logits more
than the finer one (the quantized path really ran). The rotation is exact in math, so an f32
cache gives the unrotated logits to float rounding.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from fixtures.emulated_gpu import run_on_emulated_cuda
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine, LuceError
from luce.binding import check, ffi, lib

torch.set_num_threads(1)

N_PROMPT = 600
CTX = 1024
GGML_TYPE = {"f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}
KV_TYPE = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3}
# Max |logit error| / logit scale against HF allowed per cache type: ten times the type's rounding
# unit for f16 and q8_0, five for q4_0 (whose unit, 1/8 of the block's largest value, is coarse).
LOGIT_BAR = {"f32": 1e-4, "f16": 5e-3, "q8_0": 4e-2, "q4_0": 0.3}


def round_trip(kind: str, x: np.ndarray, n_dim: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    check(lib().luce_kv_round_trip(KV_TYPE[kind], ffi.from_buffer("float[]", x), x.size, n_dim,
                                   ffi.from_buffer("float[]", out)))
    return out


def awkward_rows(n_dim: int) -> np.ndarray:
    """Seeded rows with what block scales must survive: an all-zero block, a lone outlier, a block
    whose largest magnitude is negative, and plain normal values."""
    rows = np.random.default_rng(7).normal(size=(6, n_dim)).astype(np.float32)
    rows[0, :32] = 0.0
    rows[1, 5] = 40.0
    rows[2, 32:64] = np.linspace(-3.0, 1.0, 32)
    rows[3] *= 1e-3
    return rows


@pytest.mark.parametrize("kind", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n_dim", [64, 256])
def test_cached_rows_equal_gguf_quants(kind, n_dim):
    rows = awkward_rows(n_dim)
    expected = dequantize(quantize(rows, GGML_TYPE[kind]), GGML_TYPE[kind]).astype(np.float32)
    np.testing.assert_array_equal(round_trip(kind, rows, n_dim), expected)


def test_f32_rows_come_back_unchanged():
    rows = awkward_rows(64)
    np.testing.assert_array_equal(round_trip("f32", rows, 64), rows)


@pytest.mark.parametrize("kind, n, n_dim", [("q8_0", 48, 48), ("q4_0", 64, 48), ("f16", 10, 4), ("q8_0", 64, 0)])
def test_round_trip_refuses_rows_a_block_type_cannot_hold(kind, n, n_dim):
    x = np.zeros(n, dtype=np.float32)
    status = lib().luce_kv_round_trip(KV_TYPE[kind], ffi.from_buffer("float[]", x), n, n_dim,
                                      ffi.from_buffer("float[]", x))
    assert status == lib().LUCE_ERR_INVALID_ARGUMENT


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    ids = [int(i) for i in np.random.default_rng(1).integers(0, model.config.vocab_size, N_PROMPT)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].double().numpy()
    return gguf_path, ids, ref


def logit_error(path, ids, ref, k: str, v: str, rotate: bool) -> float:
    with Engine(path, threads=2, ctx_size=CTX, cache_type_k=k, cache_type_v=v, kv_rotate=rotate) as eng:
        out = eng.logits(ids)
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def test_each_cache_type_stays_within_its_bar_of_hf(tiny):
    path, ids, ref = tiny
    err = {kind: logit_error(path, ids, ref, kind, kind, False) for kind in ("f32", "f16", "q8_0", "q4_0")}
    for kind, e in err.items():
        assert e <= LOGIT_BAR[kind], f"{kind}: {e:.3g} > {LOGIT_BAR[kind]}"
    assert err["f32"] < err["f16"] < err["q8_0"] < err["q4_0"], err


@pytest.mark.parametrize("k, v", [("q8_0", "f16"), ("q4_0", "q8_0")])
def test_k_and_v_types_apart_and_rotated(tiny, k, v):
    """K and V of different types, K rotated: within the coarser type's bar."""
    path, ids, ref = tiny
    e = logit_error(path, ids, ref, k, v, True)
    assert 0 < e <= max(LOGIT_BAR[k], LOGIT_BAR[v])


def test_rotation_is_exact_in_math(tiny):
    """(H q).(H k) = q.k: with an f32 cache the rotated logits are the plain ones up to float
    rounding, far below any cache type's error."""
    path, ids, _ = tiny
    with Engine(path, threads=2, ctx_size=CTX) as eng:
        plain = eng.logits(ids)
    with Engine(path, threads=2, ctx_size=CTX, kv_rotate=True) as eng:
        rotated = eng.logits(ids)
    assert np.abs(rotated - plain).max() <= 1e-5 * np.abs(plain).max()


def test_quantized_cache_memory_is_its_row_bytes(tiny):
    """The session's cache costs n_ctx rows of the type's bytes per KV head and layer: q8_0 a byte
    a value plus a 2-byte scale per 32, q4_0 half a byte plus the scale, each row padded to whole
    4-byte words."""
    path, _, _ = tiny
    held = {}
    for kind in ("f32", "q8_0", "q4_0"):
        with Engine(path, threads=2, ctx_size=CTX, kv_cache=kind) as eng:
            held[kind], info = eng.memory().peak_bytes, eng.info
    rows = 2 * info.n_full_attention * info.n_head_kv * CTX  # K and V
    d = info.head_dim

    def words(n):
        return (n + 3) // 4 * 4
    assert held["f32"] - held["q8_0"] == rows * (4 * d - words(d + 2 * d // 32))
    assert held["f32"] - held["q4_0"] == rows * (4 * d - words(d // 2 + 2 * d // 32))


def test_unknown_cache_type_is_one_clear_error(tiny):
    path, _, _ = tiny
    with pytest.raises(LuceError, match="unknown KV cache type 'q5_0'"):
        Engine(path, cache_type_k="q5_0")


_EMU_PROBE = r"""
import json, sys
import numpy as np
from luce import Engine
ids = [int(i) for i in np.random.default_rng(3).integers(0, 200, 150)]
out = {}
for name, kw in json.loads(sys.argv[2]).items():
    res = {}
    for dev in ("cpu", "gpu"):
        with Engine(sys.argv[1], device=dev, threads=2, ctx_size=256, **kw) as eng:
            res[dev] = eng.logits(ids)
            res[dev + " tokens"] = eng.generate(prompt_ids=ids[:20], max_tokens=12, ignore_eos=True).tokens
    out[name] = [float(np.abs(res["gpu"] - res["cpu"]).max() / np.abs(res["cpu"]).max()),
                 res["gpu tokens"] == res["cpu tokens"]]
print(json.dumps(out))
"""
EMU_CACHES = {"f16": dict(kv_cache="f16"), "q8_0": dict(kv_cache="q8_0"), "q4_0 rotated": dict(kv_cache="q4_0", kv_rotate=True),
              "q8_0 / f16 rotated": dict(cache_type_k="q8_0", cache_type_v="f16", kv_rotate=True)}


def test_gpu_cache_rows_are_the_cpu_rows(tiny):
    """The GPU backend stores and reads every cache type as the CPU does (the same block math, the
    same rotation butterflies): on the emulated CUDA backend (a child process) each type's logits
    of a 150-token prompt (prefill kernel and one-query kernels) are the CPU's on the same cache
    within the f32 cache's GPU-vs-CPU bar (1e-4), widened for a block type to a quarter of its
    rounding step (the GPU's fused prologue may leave a k value one ulp off the CPU's, which can
    round to the next quant), and greedy tokens are equal."""
    path, _, _ = tiny
    got = run_on_emulated_cuda(_EMU_PROBE, path, json.dumps(EMU_CACHES))
    step = {"f16": 0.0, "q8_0": 1 / 127, "q4_0 rotated": 1 / 8, "q8_0 / f16 rotated": 1 / 127}
    for name, (err, same_tokens) in got.items():
        assert err <= max(1e-4, step[name] / 4) and same_tokens, (name, err, same_tokens)
