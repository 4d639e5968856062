"""Dev harness: single-thread speed of the quant matmul kernels (luce_matmul) per type.

    .venv/bin/python native/dev/bench_quants.py [--rows 4096 --cols 4096] [--tokens 1,4,32]
    LUCE_CPU_KERNELS=scalar .venv/bin/python native/dev/bench_quants.py   # the portable path

Prints, per type and token count, ms per call (best of 15, thread CPU time), weight GB/s (weight bytes / time: what bounds
decode) and GFLOP/s (2 * rows * cols * n_tok / time). Random block bytes with sane scales;
speed does not depend on the values. Not a test: numbers go to docs/architecture-quants.md.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from luce.binding import check, ffi, lib

TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS]
F16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_XS: [0]}


def weights(qtype: T, rows: int, cols: int, rng) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F32:
        return rng.standard_normal(rows * cols, dtype=np.float32).view(np.uint8)
    if qtype in (T.F16, T.BF16):
        return (rng.standard_normal(rows * cols, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = np.full(n_blocks, 0.01, np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def time_call(fn, repeats=15) -> float:
    """Best-of-N CPU time of this thread: the machine may be shared, and descheduled time
    (which wall-clock would count) says nothing about the kernel."""
    fn()  # warm-up (thread-local buffers, page faults)
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--tokens", default="1,4,32")
    ap.add_argument("--types", default=",".join(t.name for t in TYPES))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'type':8} {'n_tok':>5} {'ms':>9} {'GB/s':>7} {'GFLOP/s':>8}")
    for name in args.types.split(","):
        qtype = T[name]
        raw = weights(qtype, args.rows, args.cols, rng)
        for n_tok in map(int, args.tokens.split(",")):
            x = rng.standard_normal((n_tok, args.cols), dtype=np.float32)
            y = np.empty((n_tok, args.rows), dtype=np.float32)
            call = lambda: check(lib().luce_matmul(int(qtype), ffi.from_buffer(raw), raw.nbytes, args.rows,
                                                   args.cols, ffi.from_buffer("float[]", x), n_tok,
                                                   ffi.from_buffer("float[]", y)))
            s = time_call(call)
            print(f"{name:8} {n_tok:5d} {s * 1e3:9.3f} {raw.nbytes / s / 1e9:7.2f} "
                  f"{2 * args.rows * args.cols * n_tok / s / 1e9:8.1f}")


if __name__ == "__main__":
    main()
