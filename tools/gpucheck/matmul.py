"""Stage "matmul": every weight type's matmul on the device against two oracles, gguf.quants'
dequantization times fp32 activations (exact kernels) and tests/fixtures/int8_acts.py's int8
activations (fast kernels), with batch invariance and every forced kernel's bits compared. Also the
case maker and hook wrapper that tools/ncu_matmul.py and tests/test_gpu_emu.py reuse."""
from __future__ import annotations


from .device import _hook, _ptr, env, gpu_device_info, kernels


MATMUL_TOL = 1e-5  # max |y - ref| / max (|x| @ |W|^T): fp32 sums of exactly dequantized weights
MATMUL_WIDTHS = (1, 3, 8, 17, 40)  # 40: the fragment kernel's second, ragged 32-token slice
PREFILL_WIDTH = 512  # a prefill chunk (session.h PREFILL_STEP): GPU only (the dry run's CPU time)
MMA_FRAG_MAX_TOKENS = 64  # LUCE_GPU_MATMUL=frag serves up to this width, the staged kernel past it


def _matmul_fn(dut: str):
    """f(type, raw, n_rows, n_cols, x) -> y on the device under test, through its C test hook
    (libluce_gpu's luce_gpu_matmul; on the CPU dry run, libluce's luce_matmul)."""
    import ctypes

    import numpy as np

    fn = _hook("libluce_gpu.so", "luce_gpu_matmul") if dut == "gpu" else _hook("libluce.so", "luce_matmul")

    def call(qtype: int, raw: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray, timing_reps: int = 0):
        """y; with timing_reps (GPU only), (y, microseconds per matmul kernel)."""
        raw = np.ascontiguousarray(raw)
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.zeros((x.shape[0], n_rows), dtype=np.float32)
        err = ctypes.create_string_buffer(512)
        us = ctypes.c_float(0.0)
        ptr = _ptr
        if dut == "gpu":
            st = fn(ctypes.c_int32(0), ctypes.c_int32(qtype), ptr(raw), ctypes.c_size_t(raw.nbytes),
                    ctypes.c_int64(n_rows), ctypes.c_int64(n_cols), ptr(x), ctypes.c_int64(x.shape[0]), ptr(y),
                    ctypes.c_int32(timing_reps), ctypes.byref(us), err, ctypes.c_size_t(len(err)))
        else:
            st = fn(ctypes.c_int32(qtype), ptr(raw), ctypes.c_size_t(raw.nbytes), ctypes.c_int64(n_rows),
                    ctypes.c_int64(n_cols), ptr(x), ctypes.c_int64(x.shape[0]), ptr(y))
        if st != 0:
            raise RuntimeError(f"matmul hook failed with status {st}: {err.value.decode()}")
        return (y, us.value) if timing_reps else y

    return call


def _worst(y, ref, scale: float, T: int) -> tuple[float, list[int]]:
    """(max |y - ref| / scale, [T, token, row] where it occurs)."""
    import numpy as np

    diff = np.abs(y - ref)
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[at]) / scale, [T, int(at[0]), int(at[1])]


# Fast kernels are held to the int8-activation oracle of tests/fixtures/int8_acts.py.
INVARIANCE_TOKENS = 48
INVARIANCE_WIDTHS = (2, 4, 8, 16, 32, 48)


def _matmul_case(qtype, rng, dut: str, n_rows: int = 99, n_cols: int = 512):
    """(raw blocks, n_rows, n_cols, float64 dequantized weights) of one weight type."""
    import gguf.quants
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q

    import synthetic_qwen35 as synth

    block_elems, _ = GGML_QUANT_SIZES[qtype]
    if block_elems == 1 and dut == "gpu":
        n_cols = 300  # a partial 32-element unit at the end
    if qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):  # gguf-py quantizes these
        values = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        raw = gguf.quants.quantize(values, qtype).view(np.uint8).reshape(n_rows, -1)
    else:
        raw = synth.random_blocks(qtype, n_rows * n_cols // block_elems, rng, 0.05).reshape(n_rows, -1)
    w = gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(n_rows, n_cols)
    return raw, n_rows, n_cols, w


def check_matmul_ops(dut: str, invariance: bool = True, large: bool = True) -> list[dict]:
    """Every weight type by itself, at the widths decode, verify and prefill use:
    - exact kernels against gguf.quants' dequantization times the fp32 activations;
    - fast kernels (quantized types) against the same weights times the activations quantized by
      the numpy oracle above (both oracles nobody here wrote the weights side of);
    - batch invariance (GPU): row t of a W-token matmul is bit-identical to the one-token matmul
      of token t, for every W; verify steps rely on it to reproduce decode exactly;
    - the dp4a and the tensor-core kernel (CUDA sm_80+) give the same bits at every width, so
      the backend may pick either by width.
    On the CPU dry run the float types are exempt from the size rules and invariance is not
    asserted (the CPU tiles tokens differently by width)."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType as Q

    from fixtures.int8_acts import ACT_BLOCK, quantized_activations

    run = _matmul_fn(dut)
    rng = np.random.default_rng(11)
    rows = []
    # Forcing a tensor-core kernel where the device has none runs dp4a again (HIP, the emulated
    # HIP path): only "fast" runs there. "frag" forced past 64 tokens is the staged kernel.
    tensor_cores = dut == "gpu" and gpu_device_info()[1]
    # 99 rows: ragged (not a multiple of any kernel's rows per block); 12300: also ragged, and
    # past the tensor-core kernel's switch to 32-row tiles (n_out >= 8192); Q8_0 x 480: a row
    # of 15 units, so the last group of eight is partial; IQ4_XS x 8448: the long-row decode path
    # (n_in >= 8192) and a row in two parts (int8_units.cuh), like Q6_K x 6144; Q8_0 x 16416 and
    # Q5_K x 16384: rows in four parts, the first with a partial last group.
    # (large=False: memcheck, whose 180 s would not cover it.)
    cases = [(q, 99, 512) for q in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS,
                                    Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K, Q.IQ2_XXS,
                                    Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M)]
    cases += [(Q.Q8_0, 99, 480), (Q.IQ4_XS, 40, 8448), (Q.Q6_K, 40, 6144), (Q.Q8_0, 24, 16416), (Q.Q5_K, 24, 16384)]
    # Q6_K x 5120: the 27B's attn_v rows (4200 bytes: rows off 16-byte boundaries); IQ4_XS x 5120:
    # the 27B's rows of one part, 20 groups, so the bulk copies' rings wrap (matmul_mma_frag.cu);
    # IQ4_XS x 17408: FFN down's rows, four parts whose first bytes are 8 bytes off a 16-byte
    # boundary (groups 17, 34, 51), which the tensor-map copies must start before; Q8_0 x 17408:
    # a drafter's FFN down, four parts of whole groups on the tensor-map copies.
    cases += [(Q.Q6_K, 64, 5120), (Q.IQ4_XS, 64, 5120), (Q.IQ4_XS, 48, 17408), (Q.Q8_0, 48, 17408)]
    cases += [(Q.IQ4_XS, 12300, 512)] if large else []
    for qtype, n_rows, n_cols in cases:
        raw, n_rows, n_cols, w = _matmul_case(qtype, rng, dut, n_rows, n_cols)
        block = ACT_BLOCK.get(qtype.name, 0)
        # "fast": the dp4a int8 kernel forced for every width; "frag" / "staged": one tensor-core
        # kernel forced (per-warp fragments up to 64 tokens and the staged one past that / the
        # staged one; LUCE_GPU_MATMUL); worst = [width, token, row] of the largest error.
        # "auto": the backend's own choice by width and shape, compared bitwise like the forced ones.
        # "gemm": the prefill GEMM forced (its own summation order: held to the oracle only; types
        # it does not serve fall back to the others).
        err = {"exact": 0.0, "fast": 0.0, "auto": 0.0, "frag": 0.0, "staged": 0.0, "gemm": 0.0}
        worst = {"fast": None, "auto": None, "frag": None, "staged": None, "gemm": None}
        kernels_differ = []
        for T in MATMUL_WIDTHS + ((PREFILL_WIDTH,) if dut == "gpu" else ()):
            x = rng.standard_normal((T, n_cols)).astype(np.float32)
            scale = float((np.abs(x).astype(np.float64) @ np.abs(w).T).max())
            with kernels("exact"):
                y = run(int(qtype), raw, n_rows, n_cols, x)
            err["exact"] = max(err["exact"], float(np.abs(y - x.astype(np.float64) @ w.T).max()) / scale)
            xs = quantized_activations(x, block) if block else x.astype(np.float64)
            ys = {}
            kinds = ("fast", "auto", "frag", "staged", "gemm") if block and tensor_cores else ("fast",)
            for kind in (k for k in kinds if not (k == "frag" and T > MMA_FRAG_MAX_TOKENS)):
                forced = {"fast": "dp4a", "auto": None}.get(kind, kind)
                with kernels("fast"), env(LUCE_GPU_MATMUL=forced):
                    ys[kind] = y = run(int(qtype), raw, n_rows, n_cols, x)
                e, at = _worst(y, xs @ w.T, scale, T)
                if worst[kind] is None or e > err[kind]:
                    err[kind], worst[kind] = e, at
            kernels_differ += [f"{T} ({kind})" for kind in ("auto", "frag", "staged")
                               if kind in ys and not np.array_equal(ys["fast"], ys[kind])]
        x = rng.standard_normal((INVARIANCE_TOKENS if invariance else 0, n_cols)).astype(np.float32)
        with kernels("fast"):
            singles = [run(int(qtype), raw, n_rows, n_cols, x[t:t + 1])[0] for t in range(len(x))]
            varying = [W for W in INVARIANCE_WIDTHS if W <= len(x)
                       and not np.array_equal(run(int(qtype), raw, n_rows, n_cols, x[:W]), np.stack(singles[:W]))]
        ok = max(err.values()) <= MATMUL_TOL and not varying and not kernels_differ
        rows.append({"type": qtype.name, "rows": n_rows, "cols": n_cols, "rel_err": err["exact"],
                     "rel_err_fast": err["fast"], "worst_fast": worst["fast"], "rel_err_frag": err["frag"],
                     "worst_frag": worst["frag"], "rel_err_staged": err["staged"], "worst_staged": worst["staged"],
                     "rel_err_gemm": err["gemm"], "worst_gemm": worst["gemm"],
                     "invariance_broken_at": varying, "kernels_differ_at": kernels_differ,
                     "ok": ok or (dut == "cpu" and (qtype in (Q.F32, Q.F16, Q.BF16) or
                                                     (err["fast"] <= MATMUL_TOL and err["exact"] <= MATMUL_TOL)))})
    return rows
