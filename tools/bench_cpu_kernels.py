#!/usr/bin/env python3
"""Weights per second of the CPU matmul kernels, one thread, per weight type and SIMD level.

    .venv/bin/python tools/bench_cpu_kernels.py --types IQ4_XS,Q2_K,IQ2_XXS --tokens 1,16
    .venv/bin/python tools/bench_cpu_kernels.py --levels scalar,avx2
    .venv/bin/python tools/bench_cpu_kernels.py --types Q8_0,Q4_0 --tokens 64,512 --prefill

Why: a decode step on the CPU is the weight matmuls, so Gweights/s per type tells which weight
types a CPU user can run at memory speed and which are bound by their unpacking. The blocks are
random bytes with their f16 scales set to 1.0 (timing does not depend on the values); x is
quantized by the kernel as in a real step. Each number is the fastest of --reps calls through
luce_matvec (1 token) or luce_matmul (--prefill: luce_matmul_prefill, the kernels prompt
prefill runs); LUCE_CPU_KERNELS caps the level per call.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from luce.binding import check, ffi, lib

# Byte offsets of each type's f16 scale fields inside one block (set to 1.0 so no Inf/NaN runs).
F16_FIELDS = {"Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
              "IQ1_S": [0], "IQ1_M": [], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0]}
ONE_F16 = (0x00, 0x3C)


def random_weights(name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for off in F16_FIELDS.get(name, []):
        raw[:, off], raw[:, off + 1] = ONE_F16
    return raw.reshape(-1)


def time_matmul(name: str, raw: np.ndarray, rows: int, cols: int, n_tok: int, reps: int, prefill: bool) -> float:
    qtype = int(GGMLQuantizationType[name])
    x = np.random.default_rng(1).standard_normal((n_tok, cols)).astype(np.float32)
    y = np.zeros((n_tok, rows), np.float32)
    L = lib()
    w, xb, yb = ffi.from_buffer(raw), ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y)

    def call():
        if prefill:
            check(L.luce_matmul_prefill(qtype, w, raw.nbytes, rows, cols, xb, n_tok, yb))
        elif n_tok == 1:
            check(L.luce_matvec(qtype, w, raw.nbytes, rows, cols, xb, yb))
        else:
            check(L.luce_matmul(qtype, w, raw.nbytes, rows, cols, xb, n_tok, yb))

    call()  # warm: thread-local activation buffers, page faults
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return rows * cols * n_tok / best / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="IQ4_XS,Q4_K,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,IQ4_NL,Q2_K,Q3_K,IQ2_XXS,IQ2_XS,"
                                       "IQ2_S,IQ3_XXS,IQ3_S,IQ1_S,IQ1_M")
    ap.add_argument("--tokens", default="1,16", help="token counts (1 = decode, more = prefill/verify)")
    ap.add_argument("--levels", default="auto",
                    help="LUCE_CPU_KERNELS caps: auto,scalar,avx2,avx512, or exact (fp32 activations, the reference)")
    ap.add_argument("--shape", default="2048x4096", help="rows x columns (columns a multiple of 256)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--prefill", action="store_true", help="time the kernels prompt prefill runs")
    args = ap.parse_args()
    try:
        rows, cols = (int(v) for v in args.shape.lower().split("x"))
        types = args.types.split(",")
        unknown = [t for t in types if t not in GGMLQuantizationType.__members__]
        if unknown or cols % 256:
            raise ValueError(f"unknown type {unknown[0]}" if unknown else "columns must be a multiple of 256")
        tokens = [int(v) for v in args.tokens.split(",")]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    print(f"{'type':8s} {'level':7s} " + " ".join(f"{f'{n} tok':>10s}" for n in tokens) + "   (Gweights/s, one thread)")
    for name in types:
        raw = random_weights(name, rows, cols, rng)
        for level in args.levels.split(","):
            if level == "auto":
                os.environ.pop("LUCE_CPU_KERNELS", None)
            else:
                os.environ["LUCE_CPU_KERNELS"] = level
            rates = [time_matmul(name, raw, rows, cols, n, args.reps, args.prefill) for n in tokens]
            print(f"{name:8s} {level:7s} " + " ".join(f"{r:10.2f}" for r in rates), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
