#!/usr/bin/env python3
"""One quantized matmul through luce's test hook, for Nsight Compute: a kernel's stall reasons
and pipe loads on one 27B shape, without a model.

    PYTHONPATH=/tmp/luce-gpu-check/site ncu --set full -k regex:matmul_gemm --launch-count 1 \\
        python3 tools/ncu_matmul.py IQ4_XS 17408 5120 64 --kernel gemm

The weights and activations are seeded random ones, made as gpu_check's matmul checks make them. --kernel forces LUCE_GPU_MATMUL (default: the backend's choice by width).
The result is held to the int8-activation oracle gpu_check uses (gguf.quants' dequantization
times the activations quantized by tests/fixtures/int8_acts.py), so a profiled kernel is also a
correct one: exit status 1 past gpu_check's MATMUL_TOL, 2 for bad arguments. --dut cpu runs the
same call through the CPU backend's hook (a dry run on a machine without a GPU). The GPU run
needs the GPU backend built (tools/gpu_check.py builds it into /tmp/luce-gpu-check/site).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KERNELS = ("dp4a", "mma", "frag", "staged", "gemm")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("type", help="a quantized ggml type with int8-activation kernels: IQ4_XS, Q6_K, Q5_K, Q8_0, ...")
    ap.add_argument("rows", type=int)
    ap.add_argument("cols", type=int)
    ap.add_argument("tokens", type=int)
    ap.add_argument("--kernel", choices=KERNELS, help="LUCE_GPU_MATMUL for the call")
    ap.add_argument("--dut", choices=("gpu", "cpu"), default="gpu", help="device under test (cpu: dry run)")
    args = ap.parse_args(argv)

    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q

    sys.path[:0] = [str(REPO / "tools"), str(REPO / "models"), str(REPO / "tests")]
    from fixtures.int8_acts import ACT_BLOCK, quantized_activations
    from gpu_check import MATMUL_TOL, _matmul_case, _matmul_fn, _worst

    if args.type not in ACT_BLOCK:
        ap.error(f"{args.type}: not a type with int8-activation kernels ({', '.join(sorted(ACT_BLOCK))})")
    qtype = Q[args.type]
    block_elems, _ = GGML_QUANT_SIZES[qtype]
    if min(args.rows, args.cols, args.tokens) < 1 or args.cols % block_elems:
        ap.error(f"{args.rows}x{args.cols} at {args.tokens} tokens: need positive sizes and whole "
                 f"{args.type} blocks of {block_elems} columns")
    if args.kernel:
        os.environ["LUCE_GPU_MATMUL"] = args.kernel
    rng = np.random.default_rng(5)
    raw, _, _, w = _matmul_case(qtype, rng, args.dut, args.rows, args.cols)  # w: gguf.quants' dequantization
    x = rng.standard_normal((args.tokens, args.cols)).astype(np.float32)
    run = _matmul_fn(args.dut)
    if args.dut == "gpu":
        y, us = run(int(qtype), raw, args.rows, args.cols, x, timing_reps=3)
        timing = f"{us:.1f} us per call (3 calls), "
    else:
        y, timing = run(int(qtype), raw, args.rows, args.cols, x), ""
    scale = float((np.abs(x).astype(np.float64) @ np.abs(w).T).max())
    err, _ = _worst(y, quantized_activations(x, ACT_BLOCK[args.type]) @ w.T, scale, args.tokens)
    verdict = "ok" if err <= MATMUL_TOL else f"FAIL (tolerance {MATMUL_TOL:g})"
    print(f"{args.type} {args.rows}x{args.cols} T={args.tokens} on {args.dut}: {timing}"
          f"rel err vs the int8-activation oracle {err:.2e}: {verdict}")
    return 0 if err <= MATMUL_TOL else 1


if __name__ == "__main__":
    raise SystemExit(main())
