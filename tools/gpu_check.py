#!/usr/bin/env python3
"""Build, check and benchmark luce's GPU backend in one call (docs/gpu.md). Run on the GPU machine:

    python3 tools/gpu_check.py            # or: make gpu-check        (report -> $OUT or ./gpu-check-out)

1. build   `pip install --target $LUCE_CHECK_WORK/site .` (no network: --no-index), LUCE_GPU=cuda for
           sm_90 (--archs / LUCE_GPU_ARCHS override). Python packages missing there (gguf, cffi)
           are installed from wheels in ./.whl (docs/gpu.md says how to fetch them).
2. check   attention (split-KV, one-pass) and DeltaNet (register, device-memory) kernels vs float64
           numpy on random inputs through libluce_gpu's test hooks; GPU vs CPU logits on small fixture models, per weight type, within a stated tolerance
           (relative to the largest |logit|); GPU prefill vs GPU one-token decode (the batch
           invariance speculative decoding relies on); greedy generation token-identical to the
           CPU on margin-checked prompts (prompts whose top-1/top-2 margin along the whole
           generation exceeds MARGIN_FACTOR x the GPU/CPU logit difference, the GPU's logits
           taken from one-token steps as its generation takes them; near-ties are reported, not
           asserted).
3. bench   a synthetic 27B qwen35 file in the upstream mix (models/synthetic_qwen35.py, generated
           here, ~15 GB): plain decode tok/s against the floor (bytes read per token / measured
           device copy bandwidth), prefill tok/s at 512 and 2048, verify-width step times, decode
           with step graphs; then, reloaded with LUCE_GPU_PROFILE=FILE, device time per Backend op
           for decode and verify-16 (gpu_profile.txt; GPU only).
4. drafters each reference drafter (models/reference, converted here) GPU vs CPU: hidden rows of one
           block, the greedy chain, and greedy generation on real prompts: speculative == plain on
           the GPU, speculative GPU == CPU, DDTree (or the backend's refusal); then a whole DFlash 2
           step at block 8 on the synthetic 27B pair (models/synthetic_drafter.py) vs a plain step,
           and its per-op device time (appended to gpu_profile.txt; GPU only).
5. spec     the reference pair's speculative decoding on held-out code, GPU against the host's CPU:
           plain and speculative tok/s, tau and speedup per drafter, block and verify mode
           (--ref-spec-budget).

Writes gpu_report.md and gpu_report.json. Exit status 0 iff every check passed. `--dut cpu` runs
the same script with the CPU standing in for the GPU (a dry run of the script itself).

The code lives in the package tools/gpucheck/ (one module per stage family; its __init__ lists
them). This file is the command, and keeps the names other tools import from it
(tools/bench_matrix.py, tools/ncu_matmul.py, tests/test_gpu_emu.py).
"""
from __future__ import annotations

import sys

from gpucheck.bench import decode_bytes_per_token
from gpucheck.cli import main
from gpucheck.device import build, copy_bandwidth, env, gpu_device_info, kernels, plain_generate
from gpucheck.matmul import MATMUL_TOL, _matmul_case, _matmul_fn, _worst, check_matmul_ops
from gpucheck.spec_bench import _loop_verify

__all__ = ["MATMUL_TOL", "_loop_verify", "_matmul_case", "_matmul_fn", "_worst", "build", "check_matmul_ops",
           "copy_bandwidth", "decode_bytes_per_token", "env", "gpu_device_info", "kernels", "main", "plain_generate"]

if __name__ == "__main__":
    sys.exit(main())
