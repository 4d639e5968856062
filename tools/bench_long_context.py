#!/usr/bin/env python3
"""Long-context timings on one GGUF file: decode tok/s after a long prompt per KV cache type, and
the prompt cache's time to first token (cold, cached, extended).

    python3 tools/bench_long_context.py MODEL.gguf --device gpu --depths 8192,32768 --kv f32,f16,q8_0
    python3 tools/bench_long_context.py MODEL.gguf --device gpu --ttft 32768 --cache-dir /tmp/pc

Prompts are seeded random token ids. Decode: best of --reps `generate(max_tokens=129)` calls per
(depth, cache type), tok/s from the result's decode_seconds. TTFT: the wall time of
`generate(max_tokens=1)` for the prompt without a cache, with an empty cache (prefill + store),
again (the head loaded), and with 256 new tokens after it (head loaded, longer head stored); and
how long each head's background write went on after its first token.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time

import numpy as np

from luce import Engine


def decode_at_depth(model: str, device: str, depth: int, kv: str, reps: int) -> tuple[float, float]:
    """Best decode tok/s of 128 tokens after a depth-token prompt, and that prompt's prefill seconds."""
    with Engine(model, device=device, ctx_size=depth + 256, cache_type_k=kv, cache_type_v=kv) as e:
        ids = np.random.default_rng(depth).integers(0, e.info.n_vocab, depth).tolist()
        best, prefill = 0.0, 0.0
        for _ in range(reps):
            st = e.generate(prompt_ids=ids, max_tokens=129, ignore_eos=True).stats
            best, prefill = max(best, st["decode_tok_s"]), st["prefill_seconds"]
        return best, prefill


def time_to_first_token(model: str, device: str, n: int, cache_dir: str) -> list[tuple[str, float, float, float]]:
    """(run, wall seconds, seconds the prompt cache took in them, seconds its background write
    went on after them) for the four TTFT runs."""
    ids = np.random.default_rng(0).integers(0, 2**31 - 1, n + 256)
    rows = []

    def run(e: Engine, prompt: list[int], label: str) -> None:
        t0 = time.perf_counter()
        st = e.generate(prompt_ids=prompt, max_tokens=1, ignore_eos=True).stats
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        e.flush_prompt_cache()  # the head's background write, timed apart from the first token
        rows.append((label, wall, st.get("prompt_cache_seconds", 0.0), time.perf_counter() - t0))

    with Engine(model, device=device, ctx_size=n + 1024) as e:
        ids = (ids % e.info.n_vocab).tolist()
        run(e, ids[:1024], "warm-up")
        run(e, ids[:n], "cold, no cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    with Engine(model, device=device, ctx_size=n + 1024, prompt_cache=cache_dir) as e:
        run(e, ids[:n], "cold, cache on")
        run(e, ids[:n], "the same prompt again")
        run(e, ids[:n + 256], "the prompt + 256 new tokens")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    ap.add_argument("--depths", default="", help="comma-separated prompt lengths to decode after")
    ap.add_argument("--kv", default="f32,f16,q8_0", help="KV cache types (both K and V)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ttft", type=int, default=0, help="prompt length of the time-to-first-token runs")
    ap.add_argument("--cache-dir", default="/tmp/luce-ttft-cache", help="prompt cache folder (emptied first)")
    args = ap.parse_args(argv)
    for depth in [int(d) for d in args.depths.split(",") if d]:
        for kv in args.kv.split(","):
            rate, prefill = decode_at_depth(args.model, args.device, depth, kv, args.reps)
            print(f"depth {depth} kv {kv}: tg128 {rate:.2f} tok/s, prefill {prefill:.2f} s", flush=True)
    if args.ttft:
        for label, wall, cache, write in time_to_first_token(args.model, args.device, args.ttft, args.cache_dir):
            print(f"{label}: {wall:.2f} s to the first token ({cache:.2f} s in the prompt cache; "
                  f"its write went on {write:.2f} s after)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
