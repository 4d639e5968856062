"""Quant kernels (native/src/quants*.cpp) against oracles we did not write.

- Dequantization of every supported type equals gguf-py's `gguf.quants.dequantize` bit for bit,
  on random blocks (every bit pattern of the quant payload, sane f16 scales) and on blocks that
  the `libgguf` package quantizes from real-looking data exactly as llama.cpp does.
- The matmul (luce_matvec / luce_matmul; every SIMD level the CPU has; several shapes, token
  counts, column passes and row blocks) matches float64 `x_k @ dequantize(W).T` within Higham's
  fp32 summation bound (`fp32_sum_bound`), x_k being x after the documented int8 activation
  quantization (`kernel_activations`); on llama.cpp-quantized data it also matches the exact
  `x @ W.T` within the activation-rounding bound (`activation_rounding_bound`).
- Sizes are validated at the ABI: wrong nbytes, unsupported types, ragged rows -> LuceError.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize

from fixtures.int8_acts import ACT_BLOCK, quantized_activations
from luce.binding import check, ffi, lib
from luce.errors import LuceError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import synthetic_qwen35 as synth  # noqa: E402

# The 32-element legacy types and IQ4_NL take int8 activations in blocks of 32, as Q8_0 does.
BLOCK32 = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL]
LOWBIT = [T.Q2_K, T.Q3_K, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
SUPPORTED = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS] + BLOCK32 + LOWBIT
QUANTIZED = [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS] + BLOCK32 + LOWBIT  # over int8 activations
# libgguf reproduces llama.cpp's quantizers for these (gguf-py cannot quantize them).
LIBGGUF_TYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.IQ4_NL] + LOWBIT

# Byte offsets of the f16 scale fields inside one block (spec/qwen35.md §4).
F16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0],
              T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.IQ4_NL: [0],
              T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0],
              T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0], T.IQ1_M: []}
# IQ1_M's f16 d is spread over its scale words (synth.set_iq1_m_scale).

U = 2.0 ** -24  # unit roundoff of fp32


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# Matmul kernel levels (native/src/quants_dispatch.cpp); each is run where the CPU has it.
_FLAGS = _cpu_flags()
KERNEL_LEVELS = {
    "scalar": True,
    "avx2": {"avx2", "fma", "f16c"} <= _FLAGS,
    "avx512": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "bmi2"} <= _FLAGS,
}


@pytest.fixture(params=list(KERNEL_LEVELS))
def kernel_level(request, monkeypatch):
    """Caps the SIMD level of luce's matmul for one test (LUCE_CPU_KERNELS is read per call)."""
    if not KERNEL_LEVELS[request.param]:
        pytest.skip(f"this CPU has no {request.param}")
    monkeypatch.setenv("LUCE_CPU_KERNELS", request.param)
    return request.param


# ------------------------------------------------------------------------------------------------
# data

def random_raw(qtype: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for n_blocks blocks: every payload bit random, f16 scales finite and moderate
    (random bits there would make NaN/Inf, whose comparison says nothing about the layout)."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        # All finite bit patterns, subnormals included: exponent field != 31.
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
        return bits.view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = random_f16(n_blocks, rng)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.IQ1_M:
        synth.set_iq1_m_scale(raw, random_f16(n_blocks, rng))
    return raw.reshape(-1)


def random_f16(n: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.uniform(-1, 1, n) * 2.0 ** rng.integers(-12, 2, n)).astype(np.float16)


def matmul_raw(qtype: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Weights for matmul tests: random blocks, but float types from normal values (random
    f16/bf16 bits reach 1e38 and overflow any sum)."""
    if qtype in (T.F16, T.BF16):
        from gguf.quants import quantize as gguf_quantize

        return gguf_quantize(rng.standard_normal(n_blocks).astype(np.float32), qtype).view(np.uint8).reshape(-1)
    return random_raw(qtype, n_blocks, rng)


def realistic_rows(n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    """Weight-like rows: heavy-ish tails, per-row scale spread, a few outlier columns."""
    w = rng.standard_t(5, (n_rows, n_cols)).astype(np.float32) * 0.02
    w *= rng.uniform(0.5, 2.0, (n_rows, 1)).astype(np.float32)
    w[:, rng.choice(n_cols, max(1, n_cols // 64), replace=False)] *= 8
    return w


def libgguf_quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    import libgguf

    return libgguf.quantize_rows(w, int(qtype)).reshape(-1)


# ------------------------------------------------------------------------------------------------
# the native hooks

def dequantize(qtype: T, raw: np.ndarray, n: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, dtype=np.float32)
    check(lib().luce_dequantize(int(qtype), ffi.from_buffer(raw), raw.nbytes,
                                ffi.from_buffer("float[]", out), n))
    return out


def matmul(qtype: T, raw: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray, prefill: bool = False) -> np.ndarray:
    """y [n_tok, n_rows] for x [n_tok, n_cols] (luce_matvec when n_tok is 1; prefill: the
    kernels prompt prefill runs, luce_matmul_prefill)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.full((x.shape[0], n_rows), np.nan, dtype=np.float32)
    if prefill:
        check(lib().luce_matmul_prefill(int(qtype), ffi.from_buffer(raw), raw.nbytes, n_rows, n_cols,
                                        ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y)))
    elif x.shape[0] == 1:
        check(lib().luce_matvec(int(qtype), ffi.from_buffer(raw), raw.nbytes, n_rows, n_cols,
                                ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)))
    else:
        check(lib().luce_matmul(int(qtype), ffi.from_buffer(raw), raw.nbytes, n_rows, n_cols,
                                ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y)))
    return y


# ------------------------------------------------------------------------------------------------
# comparisons

def assert_bits_equal(qtype: T, ours: np.ndarray, ref: np.ndarray, raw: np.ndarray) -> None:
    """Bit-for-bit equality; on failure name the first bad block, its bytes and the values."""
    ours_bits, ref_bits = ours.view(np.uint32), ref.astype(np.float32).reshape(-1).view(np.uint32)
    bad = np.flatnonzero(ours_bits != ref_bits)
    if bad.size == 0:
        return
    block, size = GGML_QUANT_SIZES[qtype]
    b = int(bad[0]) // block
    lanes = [i - b * block for i in bad if i // block == b][:8]
    raise AssertionError(
        f"{qtype.name}: {bad.size} of {ours.size} values differ; first bad block {b} "
        f"(bytes {raw[b * size:(b + 1) * size][:16].tobytes().hex()}...), lanes {lanes}: "
        f"ours {[float(ours[b * block + i]) for i in lanes]} "
        f"gguf {[float(ref.reshape(-1)[b * block + i]) for i in lanes]}")


def kernel_activations(qtype: T, x: np.ndarray) -> np.ndarray:
    """x as the quantized-weight kernels see it (float64): fixtures/int8_acts.py's oracle of the
    contract in native/src/quants_kernels.h. Float weights use x."""
    if qtype not in QUANTIZED:
        return x.astype(np.float64)
    return quantized_activations(x, ACT_BLOCK[qtype.name])


def fp32_sum_bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|fp32 dot - exact dot| <= gamma_n * sum|w x|, gamma_n = n u / (1 - n u) (Higham,
    Accuracy and Stability, eq. 3.5) for any summation order, so SIMD lanes and chunked partial
    sums are covered. n + 4 counts the extra roundings of the quant kernels (weight and
    activation scales multiplied in fp32, one product with the block scale); factor 2 is slack."""
    n = w.shape[1] + 4
    gamma = n * U / (1 - n * U)
    return 2 * gamma * (np.abs(x) @ np.abs(w).T)


def assert_matmul_close(qtype: T, raw: np.ndarray, w64: np.ndarray, x: np.ndarray, prefill: bool = False) -> None:
    """ours == w64 @ x_kernel up to fp32 rounding, x_kernel being x after the documented
    activation quantization (exactly x for float weights)."""
    n_rows, n_cols = w64.shape
    ours = matmul(qtype, raw, n_rows, n_cols, x, prefill)
    xk = kernel_activations(qtype, x)
    exact = xk @ w64.T
    err = np.abs(ours - exact)
    bound = fp32_sum_bound(w64, xk)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{qtype.name} {n_rows}x{n_cols} n_tok={x.shape[0]}{' prefill' if prefill else ''}: token {worst[0]} row {worst[1]} "
        f"ours {ours[worst]:.9g} exact {exact[worst]:.9g} |err| {err[worst]:.3g} > bound {bound[worst]:.3g}")
    return ours


def activation_rounding_bound(qtype: T, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|w @ x_kernel - w @ x| <= sum_b d_b/2 * sum_{i in b} |w_i| (|x - d q| <= d/2 per value,
    1% slack for d itself being an fp32 quotient)."""
    blk = ACT_BLOCK[qtype.name]
    n_tok, n = x.shape
    d = np.abs(x).reshape(n_tok, n // blk, blk).max(axis=2) / 127  # [n_tok, blocks]
    wsum = np.abs(w).reshape(w.shape[0], n // blk, blk).sum(axis=2)  # [rows, blocks]
    return 0.505 * d @ wsum.T


# ------------------------------------------------------------------------------------------------
# dequantization: bit for bit against gguf-py

@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_dequantize_random_blocks_bit_exact(qtype):
    rng = np.random.default_rng(1000 + int(qtype))
    block, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = 4096 if block == 1 else 512
    raw = random_raw(qtype, n_blocks, rng)
    ours = dequantize(qtype, raw, n_blocks * block)
    assert_bits_equal(qtype, ours, gguf_dequantize(raw, qtype), raw)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_dequantize_every_16_bit_pattern(qtype):
    """All 2^16 encodings (zeros, subnormals, infinities; NaNs left out: their payloads say
    nothing about the format) widen exactly as gguf-py widens them."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    exp_mask, mant_mask = (0x7C00, 0x03FF) if qtype == T.F16 else (0x7F80, 0x007F)
    bits = bits[~(((bits & exp_mask) == exp_mask) & ((bits & mant_mask) != 0))]
    raw = bits.view(np.uint8)
    assert_bits_equal(qtype, dequantize(qtype, raw, bits.size), gguf_dequantize(raw, qtype), raw)


GGUF_PY_QUANTIZED = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]  # gguf-py quantizes these as ggml does


@pytest.mark.parametrize("qtype", LIBGGUF_TYPES + GGUF_PY_QUANTIZED, ids=lambda t: t.name)
def test_dequantize_llama_cpp_quantized_bit_exact(qtype):
    """Blocks as llama.cpp writes them (libgguf for K/IQ types, gguf-py for Q8_0 and the legacy
    32-element types, both byte-identical to ggml's quantizers)."""
    rng = np.random.default_rng(2000 + int(qtype))
    w = realistic_rows(16, 1024, rng)
    if qtype in GGUF_PY_QUANTIZED:
        from gguf.quants import quantize as gguf_quantize

        raw = gguf_quantize(w, qtype).reshape(-1)
    else:
        raw = libgguf_quantize(w, qtype)
    ref = gguf_dequantize(raw, qtype)
    ours = dequantize(qtype, raw, w.size)
    assert_bits_equal(qtype, ours, ref, raw)
    if qtype in LIBGGUF_TYPES:  # and ggml's own dequantizer, which libgguf wraps
        import libgguf

        ggml = np.asarray(libgguf.dequantize_rows(raw.reshape(w.shape[0], -1), int(qtype)), dtype=np.float32)
        assert_bits_equal(qtype, ours, ggml, raw)
    # And the quantizer did its job (so these are realistic blocks, not noise; IQ1_S, the
    # coarsest, keeps a correlation of about 0.8).
    assert np.corrcoef(ref.reshape(-1), w.reshape(-1))[0, 1] > 0.75


def test_iq_grids_header_matches_gguf_py():
    """native/src/iq_grids.h is generated from gguf-py's codebooks (tools/gen_iq_grids.py);
    regenerating it gives the committed file byte for byte."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "tools/gen_iq_grids.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------------
# matmul against float64

SHAPES = [(1, 256, 1), (7, 512, 1), (33, 768, 3), (64, 1024, 8), (16, 512, 32), (5, 2048, 17)]


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows,n_cols,n_tok", SHAPES, ids=lambda v: str(v))
def test_matmul_random_blocks_close_to_float64(qtype, n_rows, n_cols, n_tok, kernel_level):
    rng = np.random.default_rng(n_rows * 1000 + n_cols + n_tok + int(qtype))
    block, size = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    w64 = gguf_dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    x[:, rng.integers(0, n_cols, 4)] *= 10  # activation outliers, as in real hidden states
    assert_matmul_close(qtype, raw, w64, x)


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16, T.Q8_0, *BLOCK32], ids=lambda t: t.name)
def test_matmul_rows_not_multiple_of_256(qtype, kernel_level):
    """Row lengths that are a multiple of the block but not of 256 (tails of every loop)."""
    rng = np.random.default_rng(77 + int(qtype))
    n_rows, n_cols = 9, 32 * 13 if qtype in [T.Q8_0, *BLOCK32] else 301
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    w64 = gguf_dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    for n_tok in (1, 5):
        assert_matmul_close(qtype, raw, w64, rng.standard_normal((n_tok, n_cols)).astype(np.float32))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_matmul_wide_rows_run_in_column_passes(qtype, kernel_level):
    """Rows wider than one L1 pass of a token tile (quants_kernels.h column_chunk: 32 KiB of
    activations, 8192 int8 or 2048 fp32 columns for 4 tokens): passes add into y, the last
    pass carries the float tail."""
    rng = np.random.default_rng(91 + int(qtype))
    block, _ = GGML_QUANT_SIZES[qtype]
    n_cols = 8192 + 512 if qtype in QUANTIZED else 2048 + {1: 301, 32: 320, 256: 512}[block]
    raw = matmul_raw(qtype, 3 * n_cols // block, rng)
    w64 = gguf_dequantize(raw, qtype).reshape(3, n_cols).astype(np.float64)
    assert_matmul_close(qtype, raw, w64, rng.standard_normal((6, n_cols)).astype(np.float32))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_matmul_many_rows_run_in_row_blocks(qtype, kernel_level):
    """More than one tile of tokens over more rows than one L2 row block (1 MiB of weight slice:
    <= 256 rows of 2048 fp32/fp16 columns, <= 3855 rows of 512 quantized columns), an odd count
    so the AVX-512 float row pairs leave one row over."""
    rng = np.random.default_rng(123 + int(qtype))
    n_rows, n_cols = (4001, 512) if qtype in QUANTIZED else (301, 2304)
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    w64 = gguf_dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    assert_matmul_close(qtype, raw, w64, rng.standard_normal((6, n_cols)).astype(np.float32))


@pytest.mark.parametrize("qtype", LIBGGUF_TYPES + GGUF_PY_QUANTIZED[1:], ids=lambda t: t.name)
def test_matmul_llama_cpp_quantized_close_to_float64(qtype, kernel_level):
    rng = np.random.default_rng(3000 + int(qtype))
    w = realistic_rows(48, 1536, rng)
    if qtype in GGUF_PY_QUANTIZED:
        from gguf.quants import quantize as gguf_quantize

        raw = gguf_quantize(w, qtype).reshape(-1)
    else:
        raw = libgguf_quantize(w, qtype)
    w64 = gguf_dequantize(raw, qtype).reshape(w.shape).astype(np.float64)
    for n_tok in (1, 4, 32):
        x = rng.standard_normal((n_tok, w.shape[1])).astype(np.float32)
        ours = assert_matmul_close(qtype, raw, w64, x)
        # Against the unquantized activations: within the worst-case rounding bound of int8
        # activations (the tight check above is what pins the kernels; this states the accuracy).
        exact = x.astype(np.float64) @ w64.T
        bound = activation_rounding_bound(qtype, w64, x) + fp32_sum_bound(w64, x)
        assert np.all(np.abs(ours - exact) <= bound)


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("n_cols", [512, 8192 + 2048], ids=lambda v: f"{v}cols")
def test_matmul_rows_and_tokens_are_independent(qtype, n_cols, kernel_level):
    """Each output y[t][r] depends on x[t] and weight row r only, bit for bit: a batch equals its
    tokens run one at a time (verify steps reproduce decode steps), and every row equals that row
    run alone (kernels that take several rows at once, in groups that 11 rows do not fill). Also
    for rows wider than one column pass of a token tile (quants_kernels.h column_chunk), which a
    lone token must split where a tile does (a 27B's ffn_down rows are 17408 wide)."""
    rng = np.random.default_rng(5 + int(qtype))
    n_rows = 11
    block, size = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    x = rng.standard_normal((6, n_cols)).astype(np.float32)
    batch = matmul(qtype, raw, n_rows, n_cols, x)
    one_by_one = np.concatenate([matmul(qtype, raw, n_rows, n_cols, x[t:t + 1]) for t in range(6)])
    np.testing.assert_array_equal(batch, one_by_one)
    for n_tok in (2, 3, 4):  # every tile width
        np.testing.assert_array_equal(matmul(qtype, raw, n_rows, n_cols, x[:n_tok]), one_by_one[:n_tok])
    row_bytes = n_cols // block * size
    for r in range(n_rows):
        alone = matmul(qtype, raw[r * row_bytes:(r + 1) * row_bytes], 1, n_cols, x)
        np.testing.assert_array_equal(batch[:, r:r + 1], alone)


@pytest.mark.parametrize("qtype", [T.Q8_0, *BLOCK32], ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows,n_cols,n_tok", SHAPES + [(9, 32 * 13, 5), (6, 8192 + 512, 6)], ids=lambda v: str(v))
def test_prefill_matmul_close_to_float64(qtype, n_rows, n_cols, n_tok, kernel_level):
    """The kernels of prompt prefill (the 32-element types' four-row kernels) hold the same
    bound as the one-token ones: rows not filling a group of four, block tails, column passes."""
    rng = np.random.default_rng(n_rows * 1000 + n_cols + n_tok + int(qtype) + 17)
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    w64 = gguf_dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float64)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    x[:, rng.integers(0, n_cols, 4)] *= 10
    assert_matmul_close(qtype, raw, w64, x, prefill=True)


@pytest.mark.parametrize("qtype", [T.Q8_0, *BLOCK32], ids=lambda t: t.name)
def test_prefill_matmul_rows_and_tokens_are_independent(qtype, kernel_level):
    """Prefill rows may sum in another order than one-token steps, but still depend on their
    own token and weight row only: a row equals itself run alone, a token itself run alone."""
    rng = np.random.default_rng(50 + int(qtype))
    n_rows, n_cols = 11, 512
    block, size = GGML_QUANT_SIZES[qtype]
    raw = matmul_raw(qtype, n_rows * n_cols // block, rng)
    x = rng.standard_normal((6, n_cols)).astype(np.float32)
    batch = matmul(qtype, raw, n_rows, n_cols, x, prefill=True)
    one_by_one = np.concatenate([matmul(qtype, raw, n_rows, n_cols, x[t:t + 1], prefill=True) for t in range(6)])
    np.testing.assert_array_equal(batch, one_by_one)
    row_bytes = n_cols // block * size
    for r in range(n_rows):
        alone = matmul(qtype, raw[r * row_bytes:(r + 1) * row_bytes], 1, n_cols, x, prefill=True)
        np.testing.assert_array_equal(batch[:, r:r + 1], alone)


# ------------------------------------------------------------------------------------------------
# sizes validated at the ABI

def test_wrong_nbytes_is_refused():
    raw = np.zeros(144 * 2, dtype=np.uint8)
    out = np.empty(512, dtype=np.float32)
    for nbytes in (0, 144, 144 * 2 - 1, 144 * 2 + 1, 144 * 3):
        with pytest.raises(LuceError, match="expected 288"):
            check(lib().luce_dequantize(int(T.Q4_K), ffi.from_buffer(raw), nbytes,
                                        ffi.from_buffer("float[]", out), 512))
    x = np.zeros(512, dtype=np.float32)
    with pytest.raises(LuceError, match="expected 576"):
        check(lib().luce_matvec(int(T.Q4_K), ffi.from_buffer(raw), raw.nbytes, 2, 512,
                                ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out)))


def test_ragged_row_is_refused():
    raw = np.zeros(34 * 4, dtype=np.uint8)
    out = np.empty(128, dtype=np.float32)
    for qtype, n in ((T.Q8_0, 100), (T.Q4_K, 128), (T.IQ4_XS, 300)):
        with pytest.raises(LuceError, match="not a multiple"):
            check(lib().luce_dequantize(int(qtype), ffi.from_buffer(raw), raw.nbytes,
                                        ffi.from_buffer("float[]", out), n))
    with pytest.raises(LuceError, match="bad shape"):
        check(lib().luce_dequantize(int(T.F32), ffi.from_buffer(raw), raw.nbytes,
                                    ffi.from_buffer("float[]", out), -4))


def test_overflowing_shape_is_refused():
    raw = np.zeros(16, dtype=np.uint8)
    x = np.zeros(16, dtype=np.float32)
    with pytest.raises(LuceError, match="overflows"):
        check(lib().luce_matvec(int(T.F32), ffi.from_buffer(raw), 16, 1 << 62, 1 << 20,
                                ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", x)))


@pytest.mark.parametrize("qtype", [t for t in T if t not in SUPPORTED], ids=lambda t: t.name)
def test_unsupported_type_is_refused_by_name(qtype):
    """Every other type ggml defines is refused, and named as ggml names it (the load-time
    histogram of unsupported types uses the same table)."""
    raw = np.zeros(1024, dtype=np.uint8)
    out = np.empty(1024, dtype=np.float32)
    # case-insensitive: ggml spells q4_K, gguf-py Q4_K
    with pytest.raises(LuceError, match=rf"(?i)\b{qtype.name}\b.*not supported"):
        check(lib().luce_dequantize(int(qtype), ffi.from_buffer(raw), raw.nbytes,
                                    ffi.from_buffer("float[]", out), 256))


def test_unknown_type_id_is_refused():
    raw = np.zeros(64, dtype=np.uint8)
    out = np.empty(64, dtype=np.float32)
    for bad in (4, 31, 99, -1):
        with pytest.raises(LuceError, match="unknown ggml type"):
            check(lib().luce_dequantize(bad, ffi.from_buffer(raw), raw.nbytes, ffi.from_buffer("float[]", out), 16))


@pytest.mark.parametrize("qtype", sorted(QUANTIZED, key=int), ids=lambda t: t.name)
def test_exact_kernels_skip_the_activation_rounding(qtype, monkeypatch):
    """LUCE_CPU_KERNELS=exact (the reference other backends are checked against) multiplies the
    unrounded fp32 activations: within fp32 summation error of float64, far inside the int8 path's
    activation-rounding error."""
    monkeypatch.setenv("LUCE_CPU_KERNELS", "exact")
    rng = np.random.default_rng(7)
    n_rows, n_cols = 24, 512
    raw = matmul_raw(qtype, n_rows * n_cols // GGML_QUANT_SIZES[qtype][0], rng)
    w64 = dequantize(qtype, raw, n_rows * n_cols).reshape(n_rows, n_cols).astype(np.float64)
    x = rng.standard_normal((3, n_cols)).astype(np.float32)
    ours = matmul(qtype, raw, n_rows, n_cols, x)
    exact = x.astype(np.float64) @ w64.T
    assert np.all(np.abs(ours - exact) <= fp32_sum_bound(w64, x.astype(np.float64)))
    assert np.abs(ours - exact).max() < np.abs(kernel_activations(qtype, x) @ w64.T - exact).max()
