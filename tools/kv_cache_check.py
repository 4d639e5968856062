#!/usr/bin/env python3
"""Every KV cache type on the GPU against the CPU on the same cache (docs/formats.md, "KV cache").

    python3 tools/kv_cache_check.py [--model models/reference/target-q8_0.gguf]

For f32, f16, q8_0, q4_0 rotated and q8_0 K / f16 V rotated: the logits of a seeded 700-token
prompt on both backends (max |gpu - cpu| / max |cpu|), whether 64 greedy tokens after 600 of its
tokens are equal, and the GPU's decode tok/s. Prints one line per type and the JSON of all.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from luce import Engine

REPO = Path(__file__).resolve().parents[1]
CACHES = {"f32": {}, "f16": dict(kv_cache="f16"), "q8_0": dict(kv_cache="q8_0"),
          "q4_0 rotated": dict(kv_cache="q4_0", kv_rotate=True),
          "q8_0 K / f16 V rotated": dict(cache_type_k="q8_0", cache_type_v="f16", kv_rotate=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "models/reference/target-q8_0.gguf")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 8000, 700)]
    report = {}
    for name, cache in CACHES.items():
        res = {}
        for device in ("cpu", "gpu"):
            with Engine(args.model, device=device, threads=args.threads, ctx_size=1024, **cache) as eng:
                res[device] = eng.logits(ids)
                gen = eng.generate(prompt_ids=ids[:600], max_tokens=64, ignore_eos=True)
                res[device + " tokens"], res[device + " tok/s"] = gen.tokens, gen.stats["decode_tok_s"]
        report[name] = {"rel_err": float(np.abs(res["gpu"] - res["cpu"]).max() / np.abs(res["cpu"]).max()),
                        "tokens_equal": res["gpu tokens"] == res["cpu tokens"], "gpu_decode_tok_s": res["gpu tok/s"]}
        print(name, report[name], flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
