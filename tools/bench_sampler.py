"""Host sampler cost per row (luce_sample: what plain sampled decoding runs per token;
luce_sample_probs: what speculative decoding's rejection sampling runs per verified row) on rows
of Qwen3.5's vocabulary (248320): a peaked row (a trained model's: a few ids far above a normal
tail) and a broad one, whose top-p set holds thousands of ids.

    .venv/bin/python tools/bench_sampler.py [--vocab 248320] [--reps 50]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from luce.binding import check, ffi, lib

SETTINGS = [(0.7, 0, 1.0), (0.7, 40, 1.0), (0.7, 0, 0.9), (0.7, 40, 0.9), (1.0, 0, 0.8), (1.0, 0, 0.95)]


def rows(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    peaked = rng.normal(0, 1, vocab).astype(np.float32)
    peaked[rng.choice(vocab, 30, replace=False)] += np.float32(12.0)
    return {"peaked": peaked, "broad": (rng.normal(0, 1, vocab) * 2.5).astype(np.float32)}


def per_call_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    L, out = lib(), ffi.new("int32_t *")
    probs = np.empty(args.vocab, np.float32)
    print("| row | temperature, top-k, top-p | luce_sample ms | luce_sample_probs ms |")
    print("| --- | --- | ---: | ---: |")
    for name, row in rows(args.vocab).items():
        buf = ffi.from_buffer("float[]", row)
        for t, k, p in SETTINGS:
            sample = per_call_ms(lambda: check(L.luce_sample(buf, len(row), t, k, p, 1, out)), args.reps)
            dist = per_call_ms(lambda: check(L.luce_sample_probs(buf, len(row), t, k, p,
                                                                 ffi.from_buffer("float[]", probs))), args.reps)
            print(f"| {name} | {t}, {k}, {p} | {sample:.2f} | {dist:.2f} |")


if __name__ == "__main__":
    main()
