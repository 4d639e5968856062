"""The benches of the synthetic 27B target: plain decode against the bandwidth floor, sampled
decode, prefill, verify widths, step switches and --ab settings; the matmul kernel bench per 27B
shape; and the per-op device profile (LUCE_GPU_PROFILE) of decode, verify and prefill steps."""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

from .device import (
    REPO, WORK, _eval_timer, ab_label, copy_bandwidth, device_memory_used_mib, env, kernels, log, memory_mib,
    plain_generate)
from .matmul import PREFILL_WIDTH, _matmul_fn


VERIFY_WIDTHS = (1, 2, 4, 8, 16, 32)
PREFILL_LENGTHS = (512, 2048)
DECODE_TOKENS = 64


BENCH_CTX = 4096


@contextlib.contextmanager
def bench_engine(path: Path, dut: str, threads: int, setting: dict[str, str | None] | None = None):
    """The bench model on an engine started under `setting` (the backend reads its switches when it
    starts), closed on the way out."""
    from luce import Engine

    with env(**(setting or {})):
        eng = Engine(path, device=dut, threads=threads, ctx_size=BENCH_CTX)
    try:
        yield eng
    finally:
        eng.close()


def bench_decode_with(path: Path, dut: str, threads: int, deadline: float, **switches: str) -> dict | str:
    """Plain greedy decode of the bench model with these switches (docs/gpu.md), e.g. step graphs off
    (LUCE_GPU_GRAPHS=0) or programmatic dependent launch off (LUCE_GPU_PDL=0): what the main
    decode bench gains from each."""
    import numpy as np

    if time.perf_counter() > deadline:
        return "skipped: time budget"
    with bench_engine(path, dut, threads, switches) as eng:
        return _decode_ms(eng, np.random.default_rng(3).integers(0, eng.info.n_vocab, 16).astype(np.int32))


def decode_bytes_per_token(path: Path) -> int:
    """Bytes of weights one decode step reads: every tensor of the main layers, the head and the
    norms; not the token embedding (one row is gathered) nor the MTP block (never run)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    n_layer = int(r.fields["qwen35.block_count"].parts[-1][0])
    nextn = r.fields.get("qwen35.nextn_predict_layers")
    n_main = n_layer - (int(nextn.parts[-1][0]) if nextn else 0)
    mtp = tuple(f"blk.{i}." for i in range(n_main, n_layer))
    return sum(int(t.n_bytes) for t in r.tensors
               if t.name != "token_embd.weight" and not t.name.startswith(mtp))


def _verify_widths(eng, ids, deadline: float) -> dict:
    """Step time per verify width after a 512-token prompt (median of 5, with all w logits rows
    downloaded and with the last row's only), and each width's ratio to width 1. The engine runs
    without the prefill GEMM: session_eval is prompt prefill, while speculative decoding verifies
    with the kernels that keep decode's bits."""
    import numpy as np
    from luce.binding import check, lib

    eval_ = _eval_timer(eng, np.empty((max(VERIFY_WIDTHS), eng.info.n_vocab), dtype=np.float32))
    check(lib().luce_session_reset(eng._session))
    eval_(ids[:512], 1)
    res, pos = {}, 512
    for w in VERIFY_WIDTHS:
        if time.perf_counter() > deadline:
            res[str(w)] = "skipped: time budget"
            continue
        times, last_row = [], []
        for _ in range(5):
            times.append(eval_(ids[pos:pos + w], w))
            pos += w
            last_row.append(eval_(ids[pos:pos + w], 1))  # without the w x vocab logits download
            pos += w
        res[str(w)] = {"ms": 1e3 * statistics.median(times), "ms_last_row_logits": 1e3 * statistics.median(last_row)}
    base = res["1"]["ms"] if isinstance(res.get("1"), dict) else None
    for row in res.values():
        if isinstance(row, dict) and base:
            row["x_width1"] = row["ms"] / base
    return res


def _decode_ms(eng, ids, **sampling) -> dict:
    """Plain decode of DECODE_TOKENS after a 16-token prompt, after a short warm-up: greedy, or
    sampled under `sampling` (temperature, top_k, top_p)."""
    plain_generate(eng, ids[:16], 4, **sampling)  # warm-up: first launches, page faults
    _, st = plain_generate(eng, ids[:16], DECODE_TOKENS, **sampling)
    ms = 1e3 * st.decode_seconds / max(1, st.n_generated - 1)
    return {"ms_per_token": ms, "tok_s": 1e3 / ms, "tokens": st.n_generated}


# Sampled decode: the device ranks the row (top-k) / the whole row comes back to the host sampler.
SAMPLED_DECODE = {"temperature 0.7, top-k 20, top-p 0.8": dict(temperature=0.7, top_k=20, top_p=0.8),
                  "temperature 0.7": dict(temperature=0.7)}


PREFILL_RUNS = 3  # a prefill is one run of 0.2-0.8 s: single runs moved by ~5% between engines


def _prefill_tok_s(eng, ids, deadline: float) -> dict:
    """Prompt prefill of PREFILL_LENGTHS tokens of ids from an empty context (the last row's
    logits downloaded): tok/s per length, from the fastest of PREFILL_RUNS runs."""
    import numpy as np

    from luce.binding import check, lib

    eval_ = _eval_timer(eng, np.empty((1, eng.info.n_vocab), dtype=np.float32))
    res = {}
    for n in PREFILL_LENGTHS:
        if time.perf_counter() > deadline:
            res[str(n)] = "skipped: time budget"
            continue
        log(f"prefill {n}")
        runs = []
        for _ in range(PREFILL_RUNS):
            check(lib().luce_session_reset(eng._session))
            runs.append(eval_(ids[:n], 1))
        dt = min(runs)
        res[str(n)] = {"seconds": dt, "tok_s": n / dt, "runs_seconds": [round(r, 4) for r in runs]}
    return res


def bench_steps_with(path: Path, dut: str, threads: int, deadline: float, setting: dict[str, str]) -> dict | str:
    """Decode, the verify widths and prompt prefill of the bench model on engines started under
    `setting` (--ab): the step-level side of an A/B whose kernel side is the kernel bench's extra
    column."""
    import numpy as np

    if time.perf_counter() > deadline:
        return "skipped: time budget"
    log(f"steps under {ab_label(setting)}")
    with bench_engine(path, dut, threads, {"LUCE_GPU_PREFILL_GEMM": "0", **setting}) as eng:
        ids = np.random.default_rng(3).integers(0, eng.info.n_vocab, 2048 + 64).astype(np.int32)
        res = {"decode": _decode_ms(eng, ids), "verify": _verify_widths(eng, ids, deadline)}
    with bench_engine(path, dut, threads, setting) as eng:  # prompt prefill as it runs: the GEMM on
        res["prefill"] = _prefill_tok_s(eng, ids, deadline)
    return res


def bench(shape: str, dut: str, threads: int, deadline: float, profile_path: Path | None = None,
          ab: list[dict[str, str]] = ()) -> dict:
    import numpy as np

    sys.path.insert(0, str(REPO / "models"))
    import synthetic_qwen35 as synth

    path = WORK / f"synthetic-{shape}-iq4_xs.gguf"
    res: dict = {"shape": shape, "mix": "iq4_xs", "file": str(path)}
    if not path.exists():
        log(f"generating {path.name}")
        t0 = time.perf_counter()
        synth.write(path.with_suffix(".tmp"), synth.SHAPES[shape], "iq4_xs", log=None)
        path.with_suffix(".tmp").rename(path)
        res["generate_seconds"] = round(time.perf_counter() - t0, 1)
    res["file_gib"] = round(path.stat().st_size / 2**30, 2)
    res["bytes_per_token"] = decode_bytes_per_token(path)
    res["copy_bandwidth_Bps"] = copy_bandwidth() if dut == "gpu" else None
    if res["copy_bandwidth_Bps"]:
        res["floor_ms"] = 1e3 * res["bytes_per_token"] / res["copy_bandwidth_Bps"]

    log("loading")
    t0 = time.perf_counter()
    with bench_engine(path, dut, threads) as eng:
        res["load_seconds"] = round(time.perf_counter() - t0, 1)
        ids = np.random.default_rng(3).integers(0, eng.info.n_vocab, 2048 + 64).astype(np.int32)
        log("decode")
        res["decode"] = _decode_ms(eng, ids)
        if res.get("floor_ms"):
            res["decode"]["fraction_of_floor"] = res["floor_ms"] / res["decode"]["ms_per_token"]
        res["decode_sampled"] = {label: _decode_ms(eng, ids, **kw) for label, kw in SAMPLED_DECODE.items()}
        res["prefill"] = _prefill_tok_s(eng, ids, deadline)
        res["memory"] = memory_mib(eng)
    log("verify widths")  # as speculative decoding verifies: without the prefill GEMM
    with bench_engine(path, dut, threads, {"LUCE_GPU_PREFILL_GEMM": "0"}) as eng:
        res["verify"] = _verify_widths(eng, ids, deadline)
        res["device_memory_used_mib"] = device_memory_used_mib()
    for key, switches in (("decode_eager", {"LUCE_GPU_GRAPHS": "0"}), ("decode_no_pdl", {"LUCE_GPU_PDL": "0"})):
        try:
            res[key] = bench_decode_with(path, dut, threads, deadline, **switches)
        except Exception as e:
            res[key] = f"error: {type(e).__name__}: {e}"
    res["ab"] = {}
    for setting in ab:
        try:
            res["ab"][ab_label(setting)] = bench_steps_with(path, dut, threads, deadline, setting)
        except Exception as e:
            res["ab"][ab_label(setting)] = f"error: {type(e).__name__}: {e}"
    if profile_path is not None and time.perf_counter() < deadline:  # on the CPU: the script's dry run
        res["profile"] = profile_steps(path, dut, threads, ids, profile_path)
    return res


# The 27B's matmul shapes (rows x cols, type of the iq4_xs mix): FFN gate/up and down, the
# DeltaNet qkv projection, ssm_out, the attention v projection, one DeltaNet gate (alpha/beta),
# a slice of the Q5_K head, the Q8_0 drafter's FFN gate/up; and (34816, 16480 rows) the launches
# that fuse matrices in a step (RowSegments): FFN gate + up, DeltaNet qkv + gate + beta + alpha.
KERNEL_SHAPES = (("IQ4_XS", 17408, 5120), ("IQ4_XS", 34816, 5120), ("IQ4_XS", 5120, 17408), ("IQ4_XS", 10240, 5120),
                 ("IQ4_XS", 16480, 5120), ("Q6_K", 5120, 6144), ("Q6_K", 1024, 5120), ("IQ4_XS", 48, 5120),
                 ("Q5_K", 32768, 5120), ("Q8_0", 17408, 5120), ("Q8_0", 5120, 17408))
KERNEL_REPS = 20
# 64: the widest verify step (MAX_STEP); PREFILL_WIDTH: a prefill chunk, where the prefill GEMM runs
KERNEL_WIDTHS = VERIFY_WIDTHS + (64, PREFILL_WIDTH)


def bench_matmul_kernels(dut: str, deadline: float, ab: list[dict[str, str]] = (),
                         shapes: list[tuple[str, int, int]] | None = None) -> list[dict]:
    """Device time of one quantized matmul kernel (activations already quantized) per 27B shape and
    width: the default choice by width, and the dp4a, the two tensor-core kernels and the prefill GEMM
    forced. GB/s counts the weight bytes once per call. Each timed call reads its own copy of the
    weights (the hook's copies add up to 4x the L2), so they come from DRAM as in a model step.

    Each setting in `ab` (--ab) times the default choice again under those environment
    variables: the hook builds a backend per call, which reads them, so one run holds an A/B of
    any switch the backend reads at start (LUCE_GPU_BULK=0, say) on the same weights. `shapes`
    (--kernel-shapes) replaces KERNEL_SHAPES."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType as Q

    sys.path.insert(0, str(REPO / "models"))
    import synthetic_qwen35 as synth

    if dut != "gpu":
        return []
    run = _matmul_fn(dut)
    rng = np.random.default_rng(5)
    rows = []
    for type_name, n_rows, n_cols in shapes or KERNEL_SHAPES:
        qtype = Q[type_name]
        block_elems, _ = synth.GGML_QUANT_SIZES[qtype]
        raw = synth.random_blocks(qtype, n_rows * n_cols // block_elems, rng, 0.05).reshape(n_rows, -1)
        for T in KERNEL_WIDTHS:
            if time.perf_counter() > deadline:
                break
            x = rng.standard_normal((T, n_cols)).astype(np.float32)
            row = {"type": type_name, "rows": n_rows, "cols": n_cols, "T": T}
            for kind in ("auto", "dp4a", "frag", "staged", "gemm"):
                with kernels("fast"), env(LUCE_GPU_MATMUL=None if kind == "auto" else kind):
                    _, us = run(int(qtype), raw, n_rows, n_cols, x, timing_reps=KERNEL_REPS)
                row[kind] = {"us": us, "GBps": raw.nbytes / us / 1e3}
            row["ab"] = {}
            for setting in ab:
                with kernels("fast"), env(**setting):
                    _, us = run(int(qtype), raw, n_rows, n_cols, x, timing_reps=KERNEL_REPS)
                row["ab"][ab_label(setting)] = {"us": us, "GBps": raw.nbytes / us / 1e3}
            rows.append(row)
    for row in rows:
        one = next(r for r in rows if (r["type"], r["rows"], r["cols"], r["T"]) ==
                   (row["type"], row["rows"], row["cols"], 1))
        row["x_width1"] = row["auto"]["us"] / one["auto"]["us"]
    return rows


def profile_steps(path: Path, dut: str, threads: int, ids, profile_path: Path) -> str:
    """Per-op device time (LUCE_GPU_PROFILE) of 8 decode steps, of 3 verify steps of 16 tokens,
    and of a 512-token prompt's prefill (the prefill bar's gap), each in its own engine so the
    tables stay apart. Profiled runs carry per-op event overhead: the tables say where time
    goes, the bench above says how much there is."""
    import numpy as np

    from luce import Engine
    from luce.binding import check, ffi, lib

    log("profile")
    with env(LUCE_GPU_PROFILE=str(profile_path)):
        with open(profile_path, "a") as f:
            f.write("## decode: 16-token prompt, 8 greedy steps (prefill included)\n")
        with Engine(path, device=dut, threads=threads, ctx_size=1024) as eng:
            plain_generate(eng, ids[:16], 8)
        with open(profile_path, "a") as f:
            f.write("\n## verify: 64-token prompt, then 3 steps of 16 tokens with 16 logits rows (prefill included; "
                    "LUCE_GPU_PREFILL_GEMM=0, as speculative verify steps)\n")
        with env(LUCE_GPU_PREFILL_GEMM="0"), Engine(path, device=dut, threads=threads, ctx_size=1024) as eng:
            L, V = lib(), eng.info.n_vocab
            logits = np.empty((16, V), dtype=np.float32)
            toks = np.ascontiguousarray(ids[:64 + 48], dtype=np.int32)
            check(L.luce_session_eval(eng._session, ffi.from_buffer("int32_t[]", toks[:64]), 64,
                                      ffi.from_buffer("float[]", logits), 1))
            for k in range(3):
                chunk = np.ascontiguousarray(toks[64 + 16 * k:80 + 16 * k])
                check(L.luce_session_eval(eng._session, ffi.from_buffer("int32_t[]", chunk), 16,
                                          ffi.from_buffer("float[]", logits), 16))
        with open(profile_path, "a") as f:
            f.write("\n## prefill: one 512-token prompt (the prefill GEMM on, as prompt prefill runs)\n")
        with Engine(path, device=dut, threads=threads, ctx_size=1024) as eng:
            prompt = np.ascontiguousarray(ids[:512], dtype=np.int32)
            check(lib().luce_session_eval(eng._session, ffi.from_buffer("int32_t[]", prompt), 512,
                                          ffi.from_buffer("float[]", np.empty((1, eng.info.n_vocab), np.float32)), 1))
    return str(profile_path)
