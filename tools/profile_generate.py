#!/usr/bin/env python3
"""One `generate` call between cuProfilerStart and cuProfilerStop, for Nsight Compute: the kernels
of one prefill and its decode (or speculative) steps, on a model already on this machine.

    ncu --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum --csv \\
        --clock-control none --cache-control none \\
        python3 tools/profile_generate.py MODEL.gguf --tokens 2 > kernels.csv

A first, identical call before the window records the step graphs and grows the scratch, so the
window holds the steady state. With --draft the steps are speculative (block --block). Needs the
GPU backend (`pip install .` with nvcc present; tools/gpu_check.py builds it into its own site
directory: put that first on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import ctypes

import numpy as np

from luce import Engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--draft", help="drafter GGUF: speculative steps")
    ap.add_argument("--block", type=int, default=8, help="draft block size (with --draft)")
    ap.add_argument("--prompt-tokens", type=int, default=64, help="random prompt length (seeded)")
    ap.add_argument("--tokens", type=int, default=2, help="tokens to generate in the profiled call")
    ap.add_argument("--ctx", type=int, default=1024)
    args = ap.parse_args(argv)
    cuda = ctypes.CDLL("libcuda.so.1")
    with Engine(args.model, device="gpu", ctx_size=args.ctx, draft=args.draft) as eng:
        prompt = np.random.default_rng(4).integers(0, eng.info.n_vocab, args.prompt_tokens).tolist()
        kw = dict(prompt_ids=prompt, max_tokens=args.tokens, ignore_eos=True, speculative=bool(args.draft))
        if args.draft:
            kw.update(draft_block_size=args.block, adaptive=False)
        eng.generate(**kw)  # graphs recorded, scratch grown: the profiled call is the steady state
        cuda.cuProfilerStart()
        stats = eng.generate(**kw).stats
        cuda.cuProfilerStop()
    print({k: stats.get(k) for k in ("spec_steps", "plain_steps", "decode_seconds")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
