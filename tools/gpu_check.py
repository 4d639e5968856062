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
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("LUCE_CHECK_WORK", "/tmp/luce-gpu-check"))
WHEELS = REPO / ".whl"
NEEDED_MODULES = {"gguf": ["gguf"], "cffi": ["cffi", "pycparser"]}  # module -> wheels to install

# Two kernel families run on both backends (docs/gpu.md): "fast", what users run, where
# quantized weights take int8 activations (d = amax / 127 per block, q = rint(x * 127 / amax),
# llama.cpp's scheme, the same contract on CPU and GPU); and "exact", fp32 activations for every
# type (LUCE_CPU_KERNELS=exact / LUCE_GPU_KERNELS=exact). Tolerances are on max |gpu - cpu| /
# max |cpu| over all logits.
# exact: every type differs only by fp32 summation order (measured <= 4.5e-5, 2026-12-02).
# fast: the integer dot products are identical, but a last-ulp difference in an activation
# (summation order upstream) can move one int8 activation by one step, which tiny random
# models amplify: measured up to 5.4e-2 (synthetic tiny q8_0, H200, 2026-12-03), while a wrong
# kernel moves logits by their whole scale. FAST_TOL bounds that; the sharp tests of the fast
# path are the per-type matmul oracle above and greedy identity on margin-checked prompts (a
# fast pass may have none: every prompt near a tie is reported, not asserted).
FLOAT_TOL = 1e-4
QUANT_TOL = 1e-4
FAST_TOL = 1e-1
SELF_TOL = 1e-4  # GPU prefill vs GPU decode steps (exact kernels): same kernels, different token tiling
KERNEL_ENV = ("LUCE_CPU_KERNELS", "LUCE_GPU_KERNELS")


@contextlib.contextmanager
def env(**variables: str | None):
    """Runs the block with these environment variables set (None: unset), restoring them after.
    The backends read their switches when an engine (GPU) or a matmul (CPU) starts."""
    saved = {k: os.environ.get(k) for k in variables}
    try:
        for k, v in variables.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kernels(mode: str):
    """Both backends' kernel family: "exact" (fp32 activations) or "fast" (the default)."""
    value = "exact" if mode == "exact" else None
    return env(**{k: value for k in KERNEL_ENV})


MARGIN_FACTOR = 4.0
VERIFY_WIDTHS = (1, 2, 4, 8, 16, 32)
PREFILL_LENGTHS = (512, 2048)
DECODE_TOKENS = 64


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# 1. build

def build(out: Path, archs: str) -> dict:
    """Installs luce (and any missing wheel) into WORK/site with pip --target, for this python:
    a venv would not see the packages of the machine's python when that python is itself a venv."""
    site = WORK / "site"
    site.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 4)}
    if not shutil.which("nvcc") and Path("/usr/local/cuda/bin/nvcc").exists():
        env.setdefault("CUDACXX", "/usr/local/cuda/bin/nvcc")  # CMake finds nvcc through this
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--upgrade", "--target", str(site)]
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None
               and not (site / m).is_dir()]
    if missing:
        if not WHEELS.is_dir():
            sys.exit(f"gpu-check: python modules {missing} are missing and there is no {WHEELS} to install "
                     "them from (see docs/gpu.md, 'Running the check')")
        wheels = [w for m in missing for w in NEEDED_MODULES[m]]
        subprocess.run([*pip, "--no-deps", "--find-links", str(WHEELS), *wheels], check=True, env=env)
    cmd = [*pip, "--no-deps", "--no-build-isolation", "-Ccmake.define.LUCE_GPU=cuda",
           f"-Ccmake.define.LUCE_GPU_ARCHS={archs}", f"-Cbuild-dir={WORK / 'build'}", str(REPO)]
    log(f"building: LUCE_GPU=cuda LUCE_GPU_ARCHS={archs}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    (out / "build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"gpu-check: build failed after {seconds:.0f} s; see {out / 'build.log'}:\n"
                 + (proc.stdout + proc.stderr)[-3000:])
    log(f"built in {seconds:.0f} s")
    return {"site": str(site), "archs": archs, "seconds": round(seconds, 1)}


# ---------------------------------------------------------------------------------------------
# 2. check: fixture models

class _TmpFactory:
    """What tests/fixtures/tiny_qwen35.py needs of pytest's tmp_path_factory."""

    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=name + "-", dir=self.root))


def fixture_models(root: Path) -> tuple[list[tuple[str, Path, bool]], list[str]]:
    """(label, path, has quantized weights) of every fixture model, and notes on the ones that
    could not be made."""
    from gguf.constants import GGMLQuantizationType as Q

    import synthetic_qwen35 as synth
    from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35

    models, notes = [], []
    # The pure mixes at the synthetic 'tiny' shape: every K type and IQ4_XS on real layouts; then
    # the recipes users download (quant_recipes.py): llama-quantize's Q4_K_M, the unsloth-style mix,
    # IQ4_XS with F32 / BF16 small DeltaNet projections (the float kernel of few-row matrices), and
    # the low-bit recipes (Q4_0, Q2_K, IQ3_XXS, IQ2_XXS, IQ1_M bodies with their bumped roles).
    for mix in ("iq4_xs", "q4_k", "q8_0", "f16", "lq-q4_k_m", "ud-q4_k_xl", "lq-iq4_xs-small-f32",
                "lq-iq4_xs-small-bf16", "lq-q4_0", "lq-q2_k", "lq-iq3_xxs", "lq-iq2_xxs", "lq-iq1_m"):
        path = synth.write(root / f"synthetic-tiny-{mix}.gguf", synth.SHAPES["tiny"], mix, seed=1, log=None)
        models.append((f"synthetic tiny {mix}", path, mix != "f16"))
    # Random-but-sane weights (spec §2.2 shape): float types, Q8_0, tied head, MTP block.
    for label, kw in (("random f32", {}), ("random f32 tied", {"tied": True}),
                      ("random f16", {"weight_type": Q.F16}), ("random bf16", {"weight_type": Q.BF16}),
                      ("random q8_0 mtp", {"weight_type": Q.Q8_0, "mtp": True})):
        path = write_random_qwen35(root / (label.replace(" ", "-") + ".gguf"), SPEC_TINY, seed=2, **kw)
        models.append((label, path, "q8_0" in label))
    # The transformers-built tiny Qwen3.5 converted by luce (needs torch + transformers).
    try:
        from fixtures.tiny_qwen35 import tiny_qwen35

        factory = _TmpFactory(root)
        for preset, outtype in (("base", "f32"), ("base", "f16"), ("base", "q8_0"), ("tied", "f32")):
            t = tiny_qwen35(factory, preset, outtype)
            models.append((f"transformers tiny {preset} {outtype}", t.gguf_path, outtype == "q8_0"))
    except Exception as e:  # reported, and the check fails: the brief wants these models
        notes.append(f"transformers tiny models could not be built: {type(e).__name__}: {e}")
    return models, notes


def model_checks(models, chosen: list[str] | None) -> list[tuple[str, Path, str, float]]:
    """(label, path, kernel mode, tolerance) of each model check: quantized models run both kernel
    families, float weights their one; `chosen` (--models) keeps the checks named by label or by
    "label [mode]"."""
    checks = [(label, path, mode, tol) for label, path, quantized in models
              for mode, tol in ((("exact", QUANT_TOL), ("fast", FAST_TOL)) if quantized else (("fast", FLOAT_TOL),))]
    if chosen is None:
        return checks
    names = {label for label, *_ in checks} | {f"{label} [{mode}]" for label, _, mode, _ in checks}
    if unknown := [c for c in chosen if c not in names]:
        raise SystemExit(f"gpu_check: unknown model check {unknown[0]!r} (have: {', '.join(sorted(names))})")
    return [c for c in checks if c[0] in chosen or f"{c[0]} [{c[2]}]" in chosen]


MATMUL_TOL = 1e-5  # max |y - ref| / max (|x| @ |W|^T): fp32 sums of exactly dequantized weights
MATMUL_WIDTHS = (1, 3, 8, 17, 64)
PREFILL_WIDTH = 512  # a prefill chunk (session.h PREFILL_STEP): GPU only (the dry run's CPU time)
MMA_FRAG_MAX_TOKENS = 32  # LUCE_GPU_MATMUL=frag serves up to this width, the staged kernel past it
MAX_STEP = 64  # session.h: the widest verify step; wider steps are prefill chunks


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


def _hook(library: str, name: str):
    """A C test hook of luce's library `library` (ctypes; returns its luce_status). The GPU
    library is the one libluce itself loads: LUCE_GPU_LIBRARY's when set (the emulator)."""
    import ctypes

    from luce.binding import _HERE

    path = os.environ.get("LUCE_GPU_LIBRARY") if library == "libluce_gpu.so" else None
    fn = getattr(ctypes.CDLL(path or str(_HERE / library)), name)
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def gpu_device_info() -> tuple[str, bool]:
    """(the GPU backend's name for the device, e.g. "cuda:NVIDIA H200", whether its int8 matmuls
    have tensor-core kernels), through libluce_gpu's luce_gpu_device_info."""
    import ctypes

    name, err = ctypes.create_string_buffer(256), ctypes.create_string_buffer(512)
    tensor_cores = ctypes.c_int32(0)
    st = _hook("libluce_gpu.so", "luce_gpu_device_info")(ctypes.c_int32(0), name, ctypes.c_size_t(len(name)),
                                                          ctypes.byref(tensor_cores), err, ctypes.c_size_t(len(err)))
    if st != 0:
        raise RuntimeError(f"luce_gpu_device_info failed with status {st}: {err.value.decode()}")
    return name.value.decode(), bool(tensor_cores.value)


def _ptr(a):
    """A numpy array's data as a C pointer (None: NULL)."""
    import ctypes

    return a.ctypes.data_as(ctypes.c_void_p) if a is not None else None


ATTN_TOL = 1e-4  # max |gpu - ref| / max |ref|, fp32 kernel vs float64 numpy
# (T, n_head, n_head_kv, head_dim, n_ctx, pos0, mask), pos[t] = pos0 + t: decode deep in a long cache (many
# splits), decode at position 0 (one key, all but one split empty), a verify block, a DFlash 2 verify
# (8 tokens over ~100 keys), head dim 48 (partial chunks), a random tree mask, and a drafter-like
# mask (each row a window ending past the context, most of the cache unseen); then prefill chunks
# longer than MAX_STEP (attention_prefill_kernel: tiles of 16 queries and 32 keys, partial ones at
# both ends, one from position 0), and head dim 48 past MAX_STEP (the one-query kernel's fallback).
ATTN_CASES = (
    (1, 24, 4, 256, 4096, 3000, None),
    (1, 24, 4, 256, 4096, 0, None),
    (1, 8, 2, 128, 700, 699, None),
    (16, 24, 4, 256, 4096, 1000, None),
    (8, 24, 4, 256, 4096, 100, None),
    (3, 4, 2, 48, 300, 100, None),
    (5, 8, 2, 64, 512, 300, "random"),
    (8, 32, 8, 128, 2048, 1500, "window"),
    (100, 24, 4, 256, 2048, 900, None),
    (130, 8, 2, 128, 512, 0, None),
    (75, 4, 2, 64, 256, 20, None),
    (66, 4, 4, 32, 128, 1, None),
    (70, 4, 2, 48, 300, 10, None),
)


def _attention_mask(rng, kind: str | None, T: int, n_ctx: int, pos0: int):
    """None (causal), random ancestor sets whose last row sees nothing (zeros expected), or windows:
    row t sees keys [t * 37, pos0 + 8) (a shared context, then the whole block of 8)."""
    import numpy as np

    if kind is None:
        return None
    if kind == "random":
        mask = (rng.random((T, n_ctx)) < 0.3).astype(np.uint8)
        mask[-1] = 0
        return mask
    mask = np.zeros((T, n_ctx), dtype=np.uint8)
    for t in range(T):
        mask[t, t * 37:pos0 + 8] = 1
    return mask


def _attention_ref(q, k, v, pos, mask):
    """float64 softmax attention over the visible keys (causal j <= pos[t], or mask[t][j] != 0)."""
    import numpy as np

    T, H, D = q.shape
    Hkv, n_ctx, _ = k.shape
    group = H // Hkv
    out = np.zeros((T, H, D))
    for t in range(T):
        vis = mask[t].astype(bool) if mask is not None else np.arange(n_ctx) <= pos[t]
        if not vis.any():
            continue
        for h in range(H):
            kk, vv = k[h // group][vis].astype(np.float64), v[h // group][vis].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) / np.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vv
    return out


def check_attention(dut: str) -> list[dict]:
    """Split-KV and one-pass GPU attention vs float64 numpy on random inputs (libluce_gpu's
    luce_gpu_attention hook; GPU only)."""
    import ctypes

    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_attention is a GPU test hook", "ok": True}]
    fn, ptr = _hook("libluce_gpu.so", "luce_gpu_attention"), _ptr
    rng = np.random.default_rng(11)
    rows = []
    for T, H, Hkv, D, n_ctx, pos0, kind in ATTN_CASES:
        pos = np.arange(pos0, pos0 + T, dtype=np.int32)
        q = rng.standard_normal((T, H, D), dtype=np.float32)
        k = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        v = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        mask = _attention_mask(rng, kind, T, n_ctx, pos0)
        # Keys no query sees stand for cache rows never written: NaN, so touching one shows.
        unseen = ~mask.any(axis=0).astype(bool) if mask is not None else np.arange(n_ctx) > pos[-1]
        k[:, unseen] = np.nan
        v[:, unseen] = np.nan
        ref = _attention_ref(q, k, v, pos, mask)

        def run(split: int, rows_at: slice = slice(None)):
            qq, pp = np.ascontiguousarray(q[rows_at]), np.ascontiguousarray(pos[rows_at])
            mm = np.ascontiguousarray(mask[rows_at]) if mask is not None else None
            out = np.zeros(qq.shape, dtype=np.float32)
            err = ctypes.create_string_buffer(512)
            st = fn(ctypes.c_int32(0), ptr(qq), ptr(k), ptr(v), ptr(pp), ptr(mm), len(pp), H, Hkv, D, n_ctx,
                    ctypes.c_int32(split), ptr(out), err, ctypes.c_size_t(len(err)))
            if st != 0:
                raise RuntimeError(err.value.decode())
            return out

        for split in (1, 0):
            case = f"T={T} H={H}/{Hkv} D={D} ctx={n_ctx} pos0={pos0}{f' {kind} mask' if kind else ''} " \
                   f"{'split' if split else 'one-pass'}"
            try:
                out = run(split)
                # Verify rows must be the bits of one-token decode rows (speculative == plain);
                # prefill chunks (wider than any verify step) have their own kernel and order.
                verify = split and 1 < T <= MAX_STEP
                alone = np.concatenate([run(1, slice(t, t + 1)) for t in range(T)]) if verify else out
            except RuntimeError as e:
                rows.append({"case": case, "error": str(e), "ok": False})
                continue
            diff = np.abs(out - ref)
            rel = float(diff.max() / max(np.abs(ref).max(), 1e-30))
            bad = np.argwhere(diff > ATTN_TOL * max(np.abs(ref).max(), 1e-30))
            same = bool(np.array_equal(out, alone, equal_nan=True))
            rows.append({"case": case + ("" if same else ", rows != one-token rows"), "max_abs": float(diff.max()),
                         "rel_err": rel, "first_bad": bad[0].tolist() if len(bad) else None,
                         "ok": rel <= ATTN_TOL and same})
    return rows


# (rows, n, k): k 0 is argmax_rows. A vocabulary row of the 27B (248320: 61 chunks of 4096 with a
# ragged last one), one row as a DSpark chain step asks, a short row, and DDTree's widths.
# The last five also time the call (the hook's wall clock, the rows' copies included, the same for
# every k of one shape): the top-k costs a selection round per candidate, and sampled speculative
# decoding ranks proposal rows with k up to 32 (speculative.cpp PROPOSAL_TOP_K), verify rows with
# the user's top-k up to 256.
SELECT_CASES = ((8, 248320, 0), (1, 248320, 0), (3, 5000, 0), (8, 248320, 1), (7, 248320, 8), (2, 9000, 40),
                (1, 248320, 32), (1, 248320, 256), (15, 248320, 20), (15, 248320, 32), (15, 248320, 256))
SELECT_TIMED = 5  # the last cases of SELECT_CASES
SELECT_TIMING_REPS = 5


def _select_rows(rng, n_rows: int, n: int):
    """Random rows whose best values tie across chunks (the lower index must win), plus an
    all -inf row (argmax: index 0, as the CPU backend)."""
    import numpy as np

    x = rng.standard_normal((n_rows, n), dtype=np.float32)
    for r in range(n_rows):
        hi = x[r].max() + 1.0
        x[r, rng.choice(n, size=3, replace=False)] = hi  # a three-way tie for the top
    if n_rows > 2:
        x[-1] = -np.inf
    return x


def check_select(dut: str) -> list[dict]:
    """argmax_rows and topk_rows on the device vs numpy's stable orderings (value descending, then
    index ascending; libluce_gpu's luce_gpu_select hook; GPU only)."""
    import ctypes

    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_select is a GPU test hook", "ok": True}]
    fn, ptr = _hook("libluce_gpu.so", "luce_gpu_select"), _ptr
    rng = np.random.default_rng(17)
    rows = []
    for i, (n_rows, n, k) in enumerate(SELECT_CASES):
        x = _select_rows(rng, n_rows, n)
        want = np.argsort(-x, axis=1, kind="stable")[:, :max(k, 1)].astype(np.int32)
        ids = np.full((n_rows, max(k, 1)), -7, dtype=np.int32)
        vals = np.zeros((n_rows, max(k, 1)), dtype=np.float32)
        err = ctypes.create_string_buffer(512)
        call = lambda: fn(ctypes.c_int32(0), ptr(x), ctypes.c_int32(n_rows), ctypes.c_int64(n),  # noqa: E731
                          ctypes.c_int32(k), ptr(ids), ptr(vals), err, ctypes.c_size_t(len(err)))
        st = call()
        case = f"{'argmax' if k == 0 else f'top {k}'} of {n_rows} x {n}"
        if st != 0:
            rows.append({"case": case, "error": err.value.decode(), "ok": False})
            continue
        bad = [r for r in range(n_rows) if not np.array_equal(ids[r], want[r])
               or (k > 0 and not np.array_equal(vals[r], x[r, want[r]]))]
        row = {"case": case, "rows_wrong": len(bad),
               "first_wrong": [bad[0], ids[bad[0]][:4].tolist(), want[bad[0]][:4].tolist()] if bad else None,
               "ok": not bad}
        if i >= len(SELECT_CASES) - SELECT_TIMED:
            times = []
            for _ in range(SELECT_TIMING_REPS):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            row["ms"] = 1e3 * sorted(times)[len(times) // 2]
        rows.append(row)
    return rows


DELTA_TOL = 1e-4  # max |gpu - ref| / max |ref| over outputs, final state and history
DELTA_EPS = 1e-6  # the L2 norm clamp of the random cases
# (HK, HV, DK, DV, T): the 27B's layer (DK 128: two threads per state column), DK 64, the tiny
# fixtures' DK 32, DK 48 (no register kernel: the device-memory kernel either way), and 21 tokens
# of DK 128 (a state carried through a longer step).
# Steps wider than MAX_STEP without history take the prefill kernel (deltanet.cu), in chunks of 8
# tokens: 77 (a short last chunk) at DK = 128, 72 at 64, 65 at 32 with DV = 40 (a block's columns
# past DV), 66 at 16 (4 lanes a column).
DELTA_CASES = ((16, 48, 128, 128, 1), (16, 48, 128, 128, 16), (4, 8, 64, 64, 5), (4, 8, 32, 32, 3),
               (2, 4, 48, 48, 4), (4, 8, 128, 128, 21), (4, 8, 128, 128, 77), (4, 8, 64, 64, 72),
               (2, 4, 32, 40, 65), (2, 4, 16, 16, 66))
# Tree mode (DDTree verify): each token starts from its parent's state (-1: the step's initial
# state, t = 7 back at the root level); t = 3, 6, 8 and 10 branch off earlier tokens.
DELTA_TREE_PARENTS = (-1, 0, 1, 0, 3, 4, 1, -1, 2, 8, 5, 10)
DELTA_TREE_CASES = ((4, 8, 128, 128), (2, 4, 64, 64), (2, 4, 48, 48))


def _deltanet_ref(conv, b, a, ssm_a, dt_bias, hk, hv, dk, dv, eps, state, parent=None) -> dict:
    """float64 Gated DeltaNet over T tokens (spec/qwen35.md §1.4 steps 3-7; v head j reads k head
    j % HK): {"out": [T][HV][DV], "state": the final state, "history": the per-token states}.
    parent: tree mode, token t starts from token parent[t]'s state (< 0: `state`), and the state
    returned is `state`."""
    import numpy as np

    T = conv.shape[0]
    S = state.astype(np.float64).copy()
    out = np.zeros((T, hv, dv))
    hist = np.zeros((T, hv, dk, dv))
    sp = lambda x: x if x > 20 else np.log1p(np.exp(x))  # noqa: E731
    for t in range(T):
        if parent is not None:
            S = (state.astype(np.float64) if parent[t] < 0 else hist[parent[t]]).copy()
        row = conv[t].astype(np.float64)
        for j in range(hv):
            kh = j % hk
            q = row[kh * dk:(kh + 1) * dk]
            k = row[hk * dk + kh * dk:hk * dk + (kh + 1) * dk]
            v = row[2 * hk * dk + j * dv:2 * hk * dk + (j + 1) * dv]
            q = q / max(np.linalg.norm(q), eps) / np.sqrt(dk)
            k = k / max(np.linalg.norm(k), eps)
            beta = 1 / (1 + np.exp(-float(b[t, j])))
            decay = np.exp(float(ssm_a[j]) * sp(float(a[t, j]) + float(dt_bias[j])))
            S[j] *= decay
            delta = beta * (v - k @ S[j])
            S[j] += np.outer(k, delta)
            out[t, j] = q @ S[j]
            hist[t, j] = S[j]
    return {"out": out, "state": state.astype(np.float64) if parent is not None else S, "history": hist}


def _deltanet_inputs(rng, hk, hv, dk, dv, T):
    """Random inputs of one DeltaNet case: conv rows, b, a, ssm_a, dt_bias, initial state."""
    import numpy as np

    conv = rng.standard_normal((T, 2 * hk * dk + hv * dv), dtype=np.float32)
    b = rng.standard_normal((T, hv), dtype=np.float32)
    a = rng.standard_normal((T, hv), dtype=np.float32)
    ssm_a = -np.exp(rng.standard_normal(hv).astype(np.float32))
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state0 = (0.1 * rng.standard_normal((hv, dk, dv))).astype(np.float32)
    return conv, b, a, ssm_a, dt_bias, state0


# luce_gpu_deltanet's kernel argument (gpu::DeltaKernel)
DELTA_KERNELS = {0: "device memory", 1: "registers", 2: "registers, state loaded early"}


def _deltanet_case(label: str, inputs, dims, ref, registers: int, history: bool,
                   parent=None) -> tuple[dict, dict]:
    """One luce_gpu_deltanet call against the float64 reference: (report row, the outputs)."""
    import ctypes

    import numpy as np

    fn, ptr = _hook("libluce_gpu.so", "luce_gpu_deltanet"), _ptr
    conv, b, a, ssm_a, dt_bias, state0 = inputs
    hk, hv, dk, dv, T = dims
    state = state0.copy()
    out = np.zeros((T, hv, dv), dtype=np.float32)
    hist = np.zeros((T, hv, dk, dv), dtype=np.float32) if history else None
    par = None if parent is None else np.ascontiguousarray(parent, dtype=np.int32)
    err = ctypes.create_string_buffer(512)
    st = fn(ctypes.c_int32(0), ptr(conv), ptr(b), ptr(a), ptr(ssm_a), ptr(dt_bias), hk, hv, dk, dv,
            ctypes.c_float(DELTA_EPS), T, ptr(state), ptr(out), ptr(hist), ctypes.c_int32(registers),
            None if par is None else par.ctypes.data_as(ctypes.c_void_p), err, ctypes.c_size_t(len(err)))
    kernel = DELTA_KERNELS[registers]
    case = "HK={} HV={} DK={} DV={} T={} ".format(*dims) + kernel + label
    if st != 0:
        return {"case": case, "error": err.value.decode(), "ok": False}, {}
    got = {"out": out, "state": state, **({"history": hist} if history else {})}
    worst = {"max_abs": 0.0, "rel_err": 0.0, "first_bad": None}
    for name, y in got.items():
        diff = np.abs(y - ref[name])
        scale = max(float(np.abs(ref[name]).max()), 1e-30)
        rel = float(diff.max()) / scale
        if rel > worst["rel_err"]:
            worst.update(max_abs=float(diff.max()), rel_err=rel)
        bad = np.argwhere(diff > DELTA_TOL * scale)
        if len(bad) and worst["first_bad"] is None:
            worst["first_bad"] = f"{name}{bad[0].tolist()}"
    return {"case": case, **worst, "ok": worst["rel_err"] <= DELTA_TOL}, got


def check_deltanet(dut: str) -> list[dict]:
    """Register-resident and device-memory GPU DeltaNet vs float64 numpy on random inputs
    (libluce_gpu's luce_gpu_deltanet hook; GPU only), with and without the history and in tree
    mode. Up to MAX_STEP tokens the register kernel orders its sums the same way with history as
    without, so those runs must also agree bit for bit: decode / verify exactness at kernel level
    (wider steps without history take the prefill kernel and its own order); with its state
    loaded early (LUCE_GPU_DELTANET_EARLY) it must give the same bits as without."""
    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_deltanet is a GPU test hook", "ok": True}]
    rng = np.random.default_rng(13)
    rows = []
    for dims in DELTA_CASES:
        inputs = _deltanet_inputs(rng, *dims)
        ref = _deltanet_ref(*inputs[:5], *dims[:4], DELTA_EPS, inputs[5])
        runs = {}
        for registers, history in ((1, True), (0, True), (1, False), (2, True)):
            row, runs[registers, history] = _deltanet_case("" if history else ", no history", inputs, dims, ref,
                                                           registers, history)
            rows.append(row)
        same_bits = [("history on / off", runs[1, True], runs[1, False], ("out", "state"), dims[4] <= MAX_STEP),
                     ("state loaded early / not", runs[2, True], runs[1, True], ("out", "state", "history"), True)]
        for what, x, y, keys, applies in same_bits:
            if applies and x and y and not all(np.array_equal(x[k], y[k]) for k in keys):
                rows.append({"case": "HK={} HV={} DK={} DV={} T={} registers: ".format(*dims) + what,
                             "error": "outputs differ in bits", "ok": False})
    for hk, hv, dk, dv in DELTA_TREE_CASES:
        dims = (hk, hv, dk, dv, len(DELTA_TREE_PARENTS))
        inputs = _deltanet_inputs(rng, *dims)
        ref = _deltanet_ref(*inputs[:5], hk, hv, dk, dv, DELTA_EPS, inputs[5], DELTA_TREE_PARENTS)
        for registers in (1, 0, 2):  # 2: state loaded early, the default kernel of verify steps
            rows.append(_deltanet_case(f", tree {list(DELTA_TREE_PARENTS)}", inputs, dims, ref, registers, True,
                                       DELTA_TREE_PARENTS)[0])
    return rows


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
    # HIP path): only "fast" runs there. "frag" forced past 32 tokens is the staged kernel.
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
        # kernel forced (per-warp fragments up to 32 tokens and the staged one past that / the
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


def plain_generate(engine, ids, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0):
    """Plain (not speculative) generation through the C ABI, end-of-generation ids ignored:
    greedy, or sampled with seed 0 when a temperature is given."""
    import numpy as np
    from luce.binding import check, ffi, lib

    ids = np.ascontiguousarray(ids, dtype=np.int32)
    check(lib().luce_session_reset(engine._session))
    params = ffi.new("luce_generate_params *", {"max_tokens": n, "temperature": temperature, "top_k": top_k,
                                                "top_p": top_p, "seed": 0, "ignore_eos": 1,
                                                "stop_ids": ffi.NULL, "n_stop_ids": 0})
    out = ffi.new("int32_t[]", n)
    stats = ffi.new("luce_generate_stats *")
    check(lib().luce_generate(engine._session, ffi.NULL, ffi.from_buffer("int32_t[]", ids), len(ids), params,
                              ffi.NULL, ffi.NULL, out, n, stats))
    return [out[i] for i in range(stats.n_generated)], stats


GRAPH_STEPS = 24  # one-token steps compared between graph replay and eager launches


def check_graphs(path: Path, dut: str, threads: int) -> dict:
    """Step graphs (the default) against eager launches (LUCE_GPU_GRAPHS=0), each with programmatic
    dependent launch (the default on sm_90+), against eager launches without it (LUCE_GPU_PDL=0,
    every kernel waiting for the whole previous one), against the attention prologue as five
    launches instead of one (LUCE_GPU_FUSED_ATTN=0, eager) and against the DeltaNet state loaded
    after the previous kernel ends instead of before (LUCE_GPU_DELTANET_EARLY=0, graphs) on one
    fixture model: the logits of a prefill and GRAPH_STEPS one-token greedy steps must be bitwise
    identical, and so must the tokens of a greedy generation (the device-argmax path)."""
    import numpy as np

    from luce import Engine
    from luce.binding import check, ffi, lib

    def run(graphs: str, pdl: str = "1", fused: str = "1", early: str = "1"):
        with env(LUCE_GPU_GRAPHS=graphs, LUCE_GPU_PDL=pdl, LUCE_GPU_FUSED_ATTN=fused, LUCE_GPU_DELTANET_EARLY=early):
            eng = Engine(path, device=dut, threads=threads)
        try:
            L, session, V = lib(), eng._session, eng.info.n_vocab
            ids = np.random.default_rng(17).integers(0, V, 12).astype(np.int32)
            rows = np.zeros((GRAPH_STEPS + 1, V), dtype=np.float32)
            check(L.luce_session_reset(session))
            check(L.luce_session_eval(session, ffi.from_buffer("int32_t[]", ids), len(ids),
                                      ffi.from_buffer("float[]", rows[0]), 1))
            for i in range(GRAPH_STEPS):
                tok = np.array([int(np.argmax(rows[i]))], dtype=np.int32)
                check(L.luce_session_eval(session, ffi.from_buffer("int32_t[]", tok), 1,
                                          ffi.from_buffer("float[]", rows[i + 1]), 1))
            tokens, _ = plain_generate(eng, ids, GRAPH_STEPS)
            return rows, tokens
        finally:
            eng.close()

    graph_rows, graph_tokens = run("1")
    others = {"serial": run("0", pdl="0"), "eager": run("0"), "unfused": run("0", fused="0"),
              "late state": run("1", early="0")}
    diff = np.argwhere(np.any([rows != graph_rows for rows, _ in others.values()], axis=0))
    res = {"model": path.name, "steps": GRAPH_STEPS, "identical_logits": not len(diff),
           "max_abs": max(float(np.abs(rows - graph_rows).max()) for rows, _ in others.values()),
           "first_diff": diff[0].tolist() if len(diff) else None,
           "identical_tokens": all(tokens == graph_tokens for _, tokens in others.values()),
           "differing": [name for name, (rows, tokens) in others.items()
                         if not np.array_equal(rows, graph_rows) or tokens != graph_tokens]}
    res["ok"] = res["identical_logits"] and res["identical_tokens"]
    return res


SAMPLING_SETTINGS = ((0.8, 20, 0.8), (0.8, 40, 1.0), (0.8, 0, 0.9), (1.0, 0, 1.0))  # temperature, top-k, top-p
SAMPLING_TOKENS = 16


def check_sampling(path: Path, dut: str, threads: int) -> list[dict]:
    """Seeded sampled generation on the device under test against the numpy sampler of
    tests/fixtures/sampler_oracle.py, replayed with one RNG over the rows the generation drew from
    (the prompt's prefill row, then one-token steps): the same ids. With a top-k the device ranks
    each decode step's row (topk_rows) and only the candidates come back, so this also holds the
    device's ranking to the sampler's order, ties to the lower id."""
    import numpy as np

    from fixtures.native_eval import decode_step_logits
    from fixtures.sampler_oracle import Xoshiro256, oracle_draw
    from luce import Engine

    rows_out = []
    with Engine(path, device=dut, threads=threads) as eng:
        prompt = np.random.default_rng(23).integers(0, eng.info.n_vocab, 12).tolist()
        for seed, (temperature, top_k, top_p) in enumerate(SAMPLING_SETTINGS):
            got = eng.generate(prompt_ids=prompt, max_tokens=SAMPLING_TOKENS, temperature=temperature, top_k=top_k,
                               top_p=top_p, seed=seed, ignore_eos=True).tokens
            rows = decode_step_logits(eng, prompt + got, len(prompt), len(got) - 1)
            rng = Xoshiro256(seed)
            want = [oracle_draw(row, temperature, top_k, top_p, rng) for row in rows]
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            rows_out.append({"case": f"{path.name}: temperature {temperature}, top-k {top_k}, top-p {top_p}",
                             "tokens": len(got), "first_diff": first, "ok": first is None and len(got) == len(want)})
    return rows_out


# Rejection sampling on the device (tests/fixtures/rejection_check.py): the reference pair's
# trained drafters propose close to the target, so drafts are both accepted and rejected, and the
# (t0, t1) pairs must follow the target's own distribution. Top-k 3: p and q are the device's top-k
# candidates (topk_rows on the verify and the proposal rows); a nucleus without top-k: whole rows
# come back to the host. The prompt, the first REJECTION_PROMPT_TOKENS tokens of the first held-out
# code prompt, was picked where the target hesitates (9 and ~40 likely pairs) and all three
# drafters get a third or more of their first drafts accepted (2026-12-05, CPU backend).
REJECTION_SETTINGS = {"top-k 3": (1.0, 3, 1.0), "top-p 0.9": (0.6, 0, 0.9)}
# Chain verification at both settings; DDTree (the target's draws walked down a tree) at top-k 3.
REJECTION_CASES = [(item, False) for item in REJECTION_SETTINGS.items()] + [(("top-k 3", (1.0, 3, 1.0)), True)]
REJECTION_PROMPT_TOKENS = 16
REJECTION_PVALUE = 1e-3


def check_rejection_sampling(dut: str, threads: int, draws: int) -> list[dict]:
    from fixtures.rejection_check import chi_square_pvalue, draw_pairs, expected_pairs
    from luce import Engine

    reference = REPO / "models" / "reference"
    text = json.loads((reference / "prompts" / "code.jsonl").read_text().splitlines()[0])["prompt"]
    rows = []
    for kind in DRAFT_KINDS:
        with Engine(reference / "target-q8_0.gguf", device=dut, threads=threads, ctx_size=256,
                    draft=reference / f"{kind}-q8_0.gguf") as eng:
            prompt = eng.encode_prompt(text)[:REJECTION_PROMPT_TOKENS]
            for (label, setting), tree in REJECTION_CASES:
                counts, accepted, rejected = draw_pairs(eng, prompt, setting, draws, ddtree=tree)
                expected = expected_pairs(eng, prompt, setting, draws)
                pvalue, cells = chi_square_pvalue(counts, expected)
                outside = len(set(counts) - set(expected))  # pairs the target could never draw
                rows.append({"case": f"{kind}, {label}{', tree' if tree else ''}", "draws": draws, "cells": cells,
                             "pvalue": pvalue, "accepted": accepted, "rejected": rejected, "outside": outside,
                             "ok": outside == 0 and pvalue > REJECTION_PVALUE})
    return rows


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


def check_model(label: str, path: Path, tol: float, dut: str, threads: int, mode: str = "fast") -> dict:
    with kernels(mode):
        res = _check_model(path, tol, SELF_TOL if mode == "exact" else tol, dut, threads,
                           need_checked=mode == "exact")
    return {"model": f"{label} [{mode}]", **res}


def _check_model(path: Path, tol: float, self_tol: float, dut: str, threads: int, need_checked: bool) -> dict:
    import numpy as np

    from fixtures.native_eval import decode_step_logits, last_rows_logits
    from luce import Engine

    rng = np.random.default_rng(7)
    uploads = []  # the load progress reports: per tensor on the GPU, done == total last
    with Engine(path, device="cpu", threads=threads, ctx_size=1024) as cpu, \
            Engine(path, device=dut, threads=max(1, threads // 2), ctx_size=1024,
                   progress=lambda done, total: uploads.append((done, total))) as gpu:
        V = cpu.info.n_vocab
        ids = rng.integers(0, V, 70).tolist()  # 70 tokens: a 64-token chunk plus 6
        want, got = cpu.logits(ids), gpu.logits(ids)
        scale = float(np.abs(want).max())
        diff = float(np.abs(got.astype(np.float64) - want).max())
        # A 600-token prompt's last 64 rows: prefill chunks of 512 (session.h PREFILL_STEP) and
        # 88. Held to the CPU only where rounding is fp32's (exact kernels, float weights): on
        # the int8 paths one activation rounding the other way somewhere in 600 positions moves
        # the logits by several percent (tiny q8_0, fast: 0.25 of the scale, 2026-12-04).
        long_diff = None
        if tol < FAST_TOL:
            long_ids = np.random.default_rng(8).integers(0, V, 600).tolist()
            want_long = last_rows_logits(cpu, long_ids, 64)
            long_diff = float(np.abs(last_rows_logits(gpu, long_ids, 64).astype(np.float64) - want_long).max())
            long_diff /= max(float(np.abs(want_long).max()), 1e-30)
        # Batch invariance on the device: prefill rows vs the same rows from one-token steps.
        steps = decode_step_logits(gpu, ids, 40, 29)
        self_diff = float(np.abs(steps - got[39:69]).max())
        # Greedy generation on margin-checked prompts.
        # A dozen short prompts: enough that some clear the margin even for quantized types,
        # whose GPU/CPU difference (activation rounding on the CPU) is the largest.
        prompts = [rng.integers(0, V, 12).tolist() for _ in range(12)]
        n_gen = 16
        greedy_rows = []
        for p in prompts:
            cpu_tokens, _ = plain_generate(cpu, p, n_gen)
            gpu_tokens, _ = plain_generate(gpu, p, n_gen)
            seq = p + cpu_tokens[:-1]
            # The GPU's rows as its greedy run makes them: the prompt's prefill, then one-token
            # steps (its prefill rows, another kernel family, can round an int8 activation the
            # other way where the steps do not, and the margin must cover what generation saw).
            # The CPU's prefill rows are its decode rows, bit for bit.
            lc = cpu.logits(seq)[len(p) - 1:]
            lg = decode_step_logits(gpu, seq, len(p), len(seq) - len(p))
            top2 = np.sort(lc, axis=1)[:, -2:]
            margin = float((top2[:, 1] - top2[:, 0]).min())
            seq_diff = float(np.abs(lg.astype(np.float64) - lc).max())
            greedy_rows.append({"margin": margin, "diff": seq_diff,
                                "checked": margin > MARGIN_FACTOR * seq_diff,
                                "identical": cpu_tokens == gpu_tokens})
    n_checked = sum(r["checked"] for r in greedy_rows)
    progress_ok = (bool(uploads) and uploads[-1][0] == uploads[-1][1] > 0
                   and all(a[0] <= b[0] for a, b in zip(uploads, uploads[1:]))
                   and (dut != "gpu" or len(uploads) > 1))
    ok = (progress_ok and diff <= tol * scale and self_diff <= self_tol * max(scale, 1e-30)
          and (long_diff is None or long_diff <= tol)
          and all(r["identical"] for r in greedy_rows if r["checked"]) and (n_checked > 0 or not need_checked))
    return {"upload_progress_ok": progress_ok, "tolerance": tol, "self_tolerance": self_tol, "rel_diff": diff / scale, "long_rel_diff": long_diff, "self_rel_diff": self_diff / scale,
            "prompts_checked": n_checked, "prompts": len(greedy_rows),
            "checked_identical": sum(r["identical"] for r in greedy_rows if r["checked"]),
            "near_tie_identical": sum(r["identical"] for r in greedy_rows if not r["checked"]),
            "ok": bool(ok)}


# compute-sanitizer's memcheck over one small model (logits of a 70- and a 600-token prefill, greedy
# decode) and the matmul hook of every type: out-of-bounds or misaligned device accesses that
# the numbers alone might not show.
_MEMCHECK_CHILD = r"""
import sys
sys.path[:0] = sys.argv[2:]
import numpy as np
import gpu_check
from fixtures.native_eval import last_rows_logits
from luce import Engine
with Engine(sys.argv[1], device="gpu", ctx_size=1024) as eng:
    eng.logits(list(range(70)))
    last_rows_logits(eng, list(range(600)), 1)  # a prefill chunk of 512
    gpu_check.plain_generate(eng, list(range(12)), 8)
gpu_check.check_matmul_ops("gpu", invariance=False, large=False)
"""


def memcheck(model: Path) -> dict:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return {"status": "unavailable (no compute-sanitizer on PATH)", "ok": True}
    cmd = [tool, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode", "3", sys.executable, "-c",
           _MEMCHECK_CHILD, str(model), str(Path(__file__).resolve().parent), str(REPO / "models"), str(REPO / "tests")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd="/")
    except subprocess.TimeoutExpired:
        return {"status": "timed out after 180 s (not counted as a failure)", "ok": True}
    errors = [line for line in proc.stdout.splitlines() if "ERROR SUMMARY" in line or "Invalid" in line]
    if proc.returncode == 0:
        return {"status": "clean: " + (errors[-1].strip() if errors else "no errors"), "ok": True}
    return {"status": f"exit {proc.returncode}: " + " | ".join(errors[:5] or [proc.stderr[-500:]]), "ok": False}


# ---------------------------------------------------------------------------------------------
# 3. bench: synthetic 27B

def copy_bandwidth() -> float | None:
    """Device-to-device copy bandwidth in bytes/s counting bytes read + written (torch, in a child
    process so that its CUDA context does not share the measured process)."""
    code = ("import torch, time\n"
            "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x)\n"
            "for _ in range(3): y.copy_(x)\n"
            "torch.cuda.synchronize(); t = time.perf_counter()\n"
            "for _ in range(20): y.copy_(x)\n"
            "torch.cuda.synchronize(); print(2 * 20 * x.numel() / (time.perf_counter() - t))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(proc.stdout.strip()) if proc.returncode == 0 else None


def memory_mib(eng) -> dict:
    """The engine's own account (luce_model_memory): what it holds now and at its peak, with the
    weights, in MiB."""
    m = eng.memory()
    return {"in_use": round(m.in_use_bytes / 2**20, 1), "peak": round(m.peak_bytes / 2**20, 1),
            "weights": round(eng.info.weight_bytes / 2**20, 1)}


def device_memory_used_mib() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True)
    return float(proc.stdout.split()[0]) if proc.returncode == 0 and proc.stdout.strip() else None


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


def _eval_timer(eng, logits):
    """t(tokens, n_rows): seconds of one luce_session_eval of `tokens` on eng's session, with
    n_rows logits rows downloaded into `logits`."""
    import numpy as np
    from luce.binding import check, ffi, lib

    def eval_(tokens, n_rows: int) -> float:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        t = time.perf_counter()
        check(lib().luce_session_eval(eng._session, ffi.from_buffer("int32_t[]", tokens), len(tokens),
                                      ffi.from_buffer("float[]", logits), n_rows))
        return time.perf_counter() - t

    return eval_


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


STAGES = ("matmul", "attention", "select", "deltanet", "models", "graphs", "sampling", "rejection", "drafters")


def parse_stages(text: str) -> set[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names or names - set(STAGES):
        raise argparse.ArgumentTypeError(f"stages are {', '.join(STAGES)} (got {text!r})")
    return names


def parse_ab(text: str) -> dict[str, str]:
    """--ab's 'NAME=VALUE[,NAME=VALUE...]': environment settings of the GPU backend."""
    settings = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or not name.startswith("LUCE_"):
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: expected LUCE_NAME=VALUE")
        settings[name] = value
    return settings


def ab_label(setting: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


def bench_matmul_kernels(dut: str, deadline: float, ab: list[dict[str, str]] = ()) -> list[dict]:
    """Device time of one quantized matmul kernel (activations already quantized) per 27B shape and
    width: the default choice by width, and the dp4a, the two tensor-core kernels and the prefill GEMM
    forced. GB/s counts the weight bytes once per call. Each timed call reads its own copy of the
    weights (the hook's copies add up to 4x the L2), so they come from DRAM as in a model step.

    Each setting in `ab` (--ab) times the default choice again under those environment
    variables: the hook builds a backend per call, which reads them, so one run holds an A/B of
    any switch the backend reads at start (LUCE_GPU_BULK=0, say) on the same weights."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType as Q

    sys.path.insert(0, str(REPO / "models"))
    import synthetic_qwen35 as synth

    if dut != "gpu":
        return []
    run = _matmul_fn(dut)
    rng = np.random.default_rng(5)
    rows = []
    for type_name, n_rows, n_cols in KERNEL_SHAPES:
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


# ---------------------------------------------------------------------------------------------
# 4. drafters: GPU vs CPU on the reference pair, and a DFlash 2 step on the synthetic 27B pair

DRAFT_KINDS = ("dflash", "dflash2", "dspark")
DRAFT_PROMPTS = 3        # first prompts of models/reference/prompts/mixed.jsonl
DRAFT_PROMPT_TOKENS = 160
DRAFT_TOKENS = 40
DRAFT_TOL = 1e-4         # drafter hidden rows, max |gpu - cpu| / max |cpu| (fp32 sums, f16 weights)
NEAR_TIE = 1e-3          # a token mismatch is a near tie when the reference's top-2 margin there
                         # is below NEAR_TIE x max |logit| (reported, not failed)
# Zero-acceptance run: one spec step per token; the last DRAFT_BENCH_BLOCK - 2 steps draft fewer
# rows (max_tokens caps them), so the run is long enough for those to weigh little (at 16 tokens
# they were 6 of 14 steps; the step's own cost is what the bar is about).
DRAFT_BENCH_TOKENS = 64
DRAFT_BENCH_BLOCK = 8
DRAFT_BENCH_ORACLE_STEPS = 16  # full-acceptance and DDTree runs: steps of a whole block each (was 4)
DRAFT_BENCH_SETUP_S = 45  # generating the 2 GB drafter and loading the 27B pair, roughly
# Verify steps timed inside the speculative loop (loop_verify): widths 8 and 16, as issue 6's bar
# names width 16 and a DFlash 2 step verifies 8.
LOOP_VERIFY_WIDTHS = (8, 16)


def _reference_drafter(kind: str, root: Path) -> Path:
    """models/reference/<kind> converted by luce's converter (f16, the converter's default)."""
    from luce.converters.convert import convert_checkpoint

    out = root / f"reference-{kind}.gguf"
    if not out.exists():
        convert_checkpoint(REPO / "models" / "reference" / kind, out)
    return out


def _drafter_forward_chain(eng, features, block, hidden_rows, anchor):
    """The drafter's C test hooks on `eng`'s backend: hidden rows of one block over `features`,
    and the greedy chain (tokens, confidence) over the given hidden rows."""
    import numpy as np
    from luce.binding import check, ffi, lib

    out = np.zeros((len(block), eng.info.n_embd), dtype=np.float32)  # drafter hidden = target hidden
    check(lib().luce_drafter_forward(eng._drafter, ffi.from_buffer("float[]", features), len(features),
                                     ffi.from_buffer("int32_t[]", block), len(block), ffi.from_buffer("float[]", out)))
    tokens = np.zeros(len(hidden_rows), dtype=np.int32)
    conf = np.zeros(len(hidden_rows), dtype=np.float32)
    check(lib().luce_drafter_chain(eng._drafter, ffi.from_buffer("float[]", hidden_rows), len(hidden_rows),
                                   int(anchor), ffi.from_buffer("int32_t[]", tokens), ffi.from_buffer("float[]", conf)))
    return out, tokens, conf


def _compare_tokens(ref_eng, prompt, want, got) -> str:
    """'identical', 'near tie at i' (the reference's top-2 margin at the first difference is
    below NEAR_TIE x max |logit|: either token is a fair greedy choice) or 'DIFFER at i'."""
    import numpy as np

    if want == got:
        return "identical"
    i = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    row = ref_eng.logits(list(prompt) + list(want[:i]))[-1].astype(np.float64)
    top2 = np.sort(row)[-2:]
    return f"near tie at {i}" if top2[1] - top2[0] <= NEAR_TIE * np.abs(row).max() else f"DIFFER at {i}"


def check_drafter_kind(kind: str, dut: str, threads: int, root: Path, n_prompts: int = DRAFT_PROMPTS) -> dict:
    """One reference drafter: its forward and chain hooks GPU vs CPU, then greedy generation on
    real prompts: speculative on the GPU == plain on the GPU (lossless) in chain mode and with
    DDTree tree verification, and speculative GPU == CPU (chain)."""
    import numpy as np

    from luce import Engine
    from luce.errors import LuceError

    target = REPO / "models" / "reference" / "target-q8_0.gguf"
    path = _reference_drafter(kind, root)
    texts = [json.loads(line)["prompt"] for line in
             (REPO / "models" / "reference" / "prompts" / "mixed.jsonl").read_text().splitlines()[:n_prompts]]
    res: dict = {"kind": kind}
    with Engine(target, device="cpu", threads=threads, ctx_size=1024, draft=path) as cpu, \
            Engine(target, device=dut, threads=max(1, threads // 2), ctx_size=1024, draft=path) as dev:
        info, E, rng = cpu.draft_info, cpu.info.n_embd, np.random.default_rng(5)
        feats = rng.standard_normal((37, len(info.target_layer_ids) * E)).astype(np.float32)
        block = np.array([17] + [info.mask_token_id] * (info.block_size - 1), dtype=np.int32)
        h_cpu, _, _ = _drafter_forward_chain(cpu, feats, block, np.zeros((1, E), np.float32), 17)
        rows = np.ascontiguousarray(h_cpu[1:])
        _, t_cpu, c_cpu = _drafter_forward_chain(cpu, feats, block, rows, 17)
        h_dev, t_dev, c_dev = _drafter_forward_chain(dev, feats, block, rows, 17)
        res["hidden_rel_diff"] = float(np.abs(h_dev - h_cpu).max() / np.abs(h_cpu).max())
        res["chain_identical"] = bool((t_dev == t_cpu).all())
        res["confidence_diff"] = float(np.abs(c_dev - c_cpu).max())
        res["generate"] = []
        for text in texts:
            ids = cpu.encode_prompt(text)[-DRAFT_PROMPT_TOKENS:]
            kw = dict(prompt_ids=ids, max_tokens=DRAFT_TOKENS, ignore_eos=True)
            plain = dev.generate(**kw, speculative=False).tokens
            spec = dev.generate(**kw, adaptive=False)
            spec_cpu = cpu.generate(**kw, adaptive=False)
            # tau on both devices: with the same tokens out, drafts that differ (the target's
            # features, the drafter's context) show here and nowhere else, output staying lossless.
            row = {"lossless": _compare_tokens(dev, ids, plain, spec.tokens),
                   "gpu_vs_cpu": _compare_tokens(cpu, ids, spec_cpu.tokens, spec.tokens), "tau": spec.stats["tau"],
                   "tau_cpu": spec_cpu.stats["tau"]}
            try:
                tree = dev.generate(**kw, adaptive=False, ddtree=True).tokens
                row["ddtree"] = _compare_tokens(dev, ids, plain, tree)
            except LuceError as e:  # every backend has tree mode now: a refusal fails the check
                row["ddtree"] = f"DIFFER: refused: {e}"
            res["generate"].append(row)
    gen = res["generate"]
    res["ok"] = (res["hidden_rel_diff"] <= DRAFT_TOL and res["chain_identical"] and res["confidence_diff"] <= DRAFT_TOL
                 and not any("DIFFER" in r[k] for r in gen for k in ("lossless", "gpu_vs_cpu", "ddtree")))
    return res


def check_drafters(dut: str, threads: int, root: Path, deadline: float, n_prompts: int = DRAFT_PROMPTS) -> list[dict]:
    rows = []
    for kind in DRAFT_KINDS:
        if time.perf_counter() > deadline:
            rows.append({"kind": kind, "skipped": "time budget (--drafter-budget)", "ok": True})
            continue
        log(f"drafter {kind}")
        try:
            rows.append(check_drafter_kind(kind, dut, threads, root, n_prompts))
        except Exception as e:
            rows.append({"kind": kind, "error": f"{type(e).__name__}: {e}", "ok": False})
    return rows


# The reference pair's speculative decoding, GPU against CPU (issue 6's "spec decode on the
# reference models"): the committed Q8_0 drafters on held-out code, as the CPU table of
# docs/benchmarks.md measured them, at each checkpoint's block and at DFlash 2's block 8.
REF_SPEC_PROMPTS = 12  # first prompts of models/reference/prompts/code.jsonl
REF_SPEC_TOKENS = 64
REF_SPEC_BLOCKS = {"dflash": (0,), "dflash2": (0, 8), "dspark": (0,)}  # 0: the checkpoint's block


def bench_reference_spec(dut: str, threads: int, deadline: float) -> list[dict]:
    """tok/s of plain and speculative greedy decoding (chain and DDTree, adaptive off) with each
    reference drafter, on the device under test and on the CPU of the same host: one row per
    (device, drafter, block, verify) with its tau, acceptance and speedup over plain."""
    from luce import bench as luce_bench

    ref = REPO / "models" / "reference"
    prompts = [json.loads(line)["prompt"] for line in
               (ref / "prompts" / "code.jsonl").read_text().splitlines()[:REF_SPEC_PROMPTS]]
    tests = [luce_bench.Test("tg", REF_SPEC_TOKENS)]
    rows = []
    for kind, blocks in REF_SPEC_BLOCKS.items():  # a drafter's devices together: the budget cuts whole drafters
        for device in dict.fromkeys((dut, "cpu")):
            if time.perf_counter() > deadline:
                rows.append({"device": device, "draft": kind, "skipped": "time budget (--ref-spec-budget)"})
                continue
            log(f"reference speculative bench: {kind} on {device}")
            plain, *spec = luce_bench.bench_speculative(
                ref / "target-q8_0.gguf", ref / f"{kind}-q8_0.gguf", tests, 0, [threads], list(blocks),
                list(luce_bench.VERIFY_MODES), False, device, 1, True, prompt_set=prompts)
            rows += [{"device": device, "draft": kind, "block": r.block, "verify": r.verify, "tok_s": r.tok_s,
                      "plain_tok_s": plain.tok_s, "tau": r.tau, "acceptance": r.acceptance, "speedup": r.speedup}
                     for r in spec]
    return rows


def bench_drafter(shape: str, dut: str, threads: int, deadline: float, profile_path: Path | None = None) -> dict:
    """A whole DFlash 2 speculative step (draft, verify, rollback, bookkeeping) at block 8 on the
    synthetic pair (target from bench(), drafter from models/synthetic_drafter.py) against a plain
    step. The random drafter's proposals are all rejected (worst case: rollback every step); a
    second run forces full acceptance through the oracle hook (no rollback, 7 drafts kept); a
    third puts the oracle continuation on a DDTree tree's first-child chain (accepted as deep as
    that chain goes; the step verifies the whole tree)."""
    import numpy as np

    from luce import Engine

    sys.path.insert(0, str(REPO / "models"))
    import synthetic_drafter

    target = WORK / f"synthetic-{shape}-iq4_xs.gguf"
    if shape not in synthetic_drafter.SHAPES or not target.exists():
        return {"skipped": f"no synthetic {shape} target or drafter shape"}
    if time.perf_counter() > deadline - DRAFT_BENCH_SETUP_S:
        return {"skipped": "time budget (--drafter-budget): no room to generate and load the pair"}
    path = WORK / f"synthetic-dflash2-{shape}.gguf"
    res: dict = {"shape": shape, "block": DRAFT_BENCH_BLOCK, "drafter": str(path)}
    if not path.exists():
        log(f"generating {path.name}")
        t0 = time.perf_counter()
        synthetic_drafter.write(path.with_suffix(".tmp"), synthetic_drafter.SHAPES[shape])
        path.with_suffix(".tmp").rename(path)
        res["generate_seconds"] = round(time.perf_counter() - t0, 1)
    res["drafter_mib"] = round(path.stat().st_size / 2**20, 1)
    log("drafter bench: loading")
    with Engine(target, device=dut, threads=threads, ctx_size=1024, draft=path) as eng:
        ids = np.random.default_rng(4).integers(0, eng.info.n_vocab, 64).tolist()
        kw = dict(prompt_ids=ids, ignore_eos=True, draft_block_size=DRAFT_BENCH_BLOCK, adaptive=False)
        eng.generate(**kw, max_tokens=4)  # warm-up
        plain = eng.generate(**{**kw, "max_tokens": DRAFT_BENCH_TOKENS}, speculative=False)
        st = plain.stats
        res["plain_ms"] = 1e3 * st["decode_seconds"] / max(1, st["generated_tokens"] - 1)
        runs = {"zero_accept": dict(max_tokens=DRAFT_BENCH_TOKENS),
                "full_accept": dict(max_tokens=DRAFT_BENCH_ORACLE_STEPS * DRAFT_BENCH_BLOCK + 1, oracle_tokens=None),
                "ddtree_oracle": dict(max_tokens=DRAFT_BENCH_ORACLE_STEPS * DRAFT_BENCH_BLOCK + 1, oracle_tokens=None,
                                      ddtree=True)}
        for name, extra in runs.items():
            if time.perf_counter() > deadline:
                res[name] = "skipped: time budget"
                continue
            if "oracle_tokens" in extra:  # the plain continuation: every draft is accepted
                extra["oracle_tokens"] = eng.generate(**{**kw, "max_tokens": extra["max_tokens"]},
                                                      speculative=False).tokens
            log(f"drafter bench: {name}")
            st = eng.generate(**kw, **extra).stats
            n = max(1, st["spec_steps"])
            step = (st["decode_seconds"] - st["plain_steps"] * res["plain_ms"] / 1e3) / n
            res[name] = {"spec_steps": st["spec_steps"], "tau": st["tau"], "step_ms": 1e3 * step,
                         "draft_ms": 1e3 * st["draft_seconds"] / n, "verify_ms": 1e3 * st["verify_seconds"] / n,
                         "rollback_ms": 1e3 * st["rollback_seconds"] / n,
                         "x_plain": 1e3 * step / res["plain_ms"]}
        res["loop_verify"] = {}
        for width in LOOP_VERIFY_WIDTHS:
            if time.perf_counter() > deadline:
                res["loop_verify"][str(width)] = "skipped: time budget"
                continue
            log(f"drafter bench: verify steps of {width} rows")
            res["loop_verify"][str(width)] = _loop_verify(eng, kw, width, res["plain_ms"])
        res["memory"] = memory_mib(eng)
    if profile_path is not None and time.perf_counter() < deadline:  # on the CPU: the script's dry run
        res["profile"] = profile_drafter_steps(target, path, dut, threads, kw, profile_path)
    return res


def _loop_verify(eng, kw: dict, width: int, plain_ms: float) -> dict:
    """A verify step of `width` rows as the speculative loop runs it: the rollback history written,
    the argmax taken on the device, only the ids downloaded (bench()'s verify widths time
    session_eval, which writes no history and downloads every row's logits). Every draft is
    rejected, so each step verifies block = width rows and commits one token. Two runs, of
    DRAFT_BENCH_TOKENS and twice as many tokens, end alike (their last width - 2 steps verify
    fewer rows, max_tokens capping the drafts); their difference holds only full-width steps."""
    runs = [eng.generate(**{**kw, "draft_block_size": width, "max_tokens": n}).stats
            for n in (DRAFT_BENCH_TOKENS, 2 * DRAFT_BENCH_TOKENS)]
    steps = runs[1]["spec_steps"] - runs[0]["spec_steps"]
    verify_ms = 1e3 * (runs[1]["verify_seconds"] - runs[0]["verify_seconds"]) / max(1, steps)
    return {"steps": steps, "tau": runs[1]["tau"], "verify_ms": verify_ms, "x_plain": verify_ms / plain_ms}


def profile_drafter_steps(target: Path, drafter: Path, dut: str, threads: int, kw: dict, profile_path: Path) -> str:
    """Per-op device time (LUCE_GPU_PROFILE) of the zero-acceptance DFlash 2 run, in an engine of
    its own (the table is written when it closes): where a speculative step's time goes, by op."""
    from luce import Engine

    log("drafter bench: profile")
    with open(profile_path, "a") as f:
        f.write(f"\n## DFlash 2: {len(kw['prompt_ids'])}-token prompt, then {DRAFT_BENCH_TOKENS} tokens with every draft rejected (a "
                f"block-{DRAFT_BENCH_BLOCK} step per token, the last {DRAFT_BENCH_BLOCK - 2} with fewer drafts; "
                f"prefill included)\n")
    with env(LUCE_GPU_PROFILE=str(profile_path)), \
            Engine(target, device=dut, threads=threads, ctx_size=1024, draft=drafter) as eng:
        eng.generate(**kw, max_tokens=DRAFT_BENCH_TOKENS)
    return str(profile_path)


# ---------------------------------------------------------------------------------------------
# report

def _mma_cell(m: dict) -> str:
    """The tensor-core kernels' errors, or n/a where they were not run (float types, the CPU dry run)."""
    if not m.get("worst_frag"):
        return "n/a"
    return (f"{m['rel_err_frag']:.2e} {m['worst_frag']}; staged {m.get('rel_err_staged', 0):.2e}; "
            f"prefill gemm {m.get('rel_err_gemm', 0):.2e} {m.get('worst_gemm')}")


def _case_table(header: str, cases: list[dict]) -> list[str]:
    """A kernel-vs-float64 table (attention, DeltaNet), or nothing when that stage did not run."""
    if not cases:
        return []
    rows = [(f"| {a['case']} | {a.get('error') or a.get('skipped')} | | | {'FAIL' if 'error' in a else '-'} |")
            if ("error" in a or "skipped" in a) else
            (f"| {a['case']} | {a['max_abs']:.2e} | {a['rel_err']:.2e} | {a['first_bad']} | "
             f"{'ok' if a['ok'] else 'FAIL'} |") for a in cases]
    return [header, "| --- | --- | --- | --- | --- |", *rows, ""]


def _select_table(cases: list[dict]) -> list[str]:
    """The argmax / top-k table, or nothing when that stage did not run."""
    if not cases:
        return []
    rows = [(f"| {a['case']} | {a.get('error') or a.get('skipped')} | | {'FAIL' if 'error' in a else '-'} | |")
            if ("error" in a or "skipped" in a) else
            f"| {a['case']} | {a['rows_wrong']} | {a['first_wrong']} | {'ok' if a['ok'] else 'FAIL'} |"
            + (f" {a['ms']:.3f} |" if "ms" in a else " |") for a in cases]
    return ["| selection case (ties across chunks, an all -inf row) | rows wrong | first wrong [row, got, want] | ok "
            "| hook ms (median of 5, copies included) |", "| --- | --- | --- | --- | ---: |", *rows, ""]


def _step_ab_table(b: dict) -> list[str]:
    """--ab at step level: decode, verify-width step times and prefill tok/s under each setting,
    beside the default."""
    if not b.get("ab"):
        return []
    ms = lambda row: f"{row['ms']:.2f}" if isinstance(row, dict) else "-"  # noqa: E731
    tok_s = lambda row: f"{row['tok_s']:.0f}" if isinstance(row, dict) else "-"  # noqa: E731
    lines = ["", "| setting | decode ms/token | " + " | ".join(f"verify {w} ms" for w in VERIFY_WIDTHS) + " | "
             + " | ".join(f"prefill {n} tok/s" for n in PREFILL_LENGTHS) + " |",
             "| --- | ---: |" + " ---: |" * (len(VERIFY_WIDTHS) + len(PREFILL_LENGTHS))]
    runs = {"default": {"decode": b.get("decode"), "verify": b.get("verify") or {}, "prefill": b.get("prefill") or {}},
            **b["ab"]}
    for label, r in runs.items():
        if not isinstance(r, dict):
            lines.append(f"| {label} | {r} |" + " |" * (len(VERIFY_WIDTHS) + len(PREFILL_LENGTHS)))
            continue
        decode = f"{r['decode']['ms_per_token']:.2f}" if r.get("decode") else "-"
        prefill = r.get("prefill") or {}
        lines.append(f"| {label} | {decode} | " + " | ".join(ms(r["verify"].get(str(w))) for w in VERIFY_WIDTHS)
                     + " | " + " | ".join(tok_s(prefill.get(str(n))) for n in PREFILL_LENGTHS) + " |")
    return lines


def _reference_spec_table(rows: list[dict]) -> list[str]:
    """One line per (drafter, block, verify), each device's speculative and plain tok/s side by side."""
    if not rows:
        return []
    lines = ["", f"## Bench: reference pair, speculative vs plain, {REF_SPEC_TOKENS} tokens after each of "
                 f"{REF_SPEC_PROMPTS} held-out code prompts", ""]
    lines += [f"- {r.get('device', '')} {r.get('draft', '')}: {r.get('error') or r.get('skipped')}"
              for r in rows if "error" in r or "skipped" in r]
    measured = [r for r in rows if "tok_s" in r]
    devices = list(dict.fromkeys(r["device"] for r in measured))
    if not measured:
        return lines
    lines += ["| drafter | block | verify | tau | " + " | ".join(f"{d} spec tok/s | {d} plain tok/s | {d} speedup"
                                                           for d in devices) + " |",
              "| --- | ---: | --- | ---: |" + " ---: | ---: | ---: |" * len(devices)]
    by_key: dict = {}
    for r in measured:
        by_key.setdefault((r["draft"], r["block"], r["verify"]), {})[r["device"]] = r
    for (draft, block, verify), per in by_key.items():
        taus = " / ".join(dict.fromkeys(f"{r['tau']:.2f}" for r in per.values()))
        cells = [f"{per[d]['tok_s']:.0f} | {per[d]['plain_tok_s']:.0f} | {per[d]['speedup']:.2f}x" if d in per
                 else "- | - | -" for d in devices]
        lines.append(f"| {draft} | {block} | {verify} | {taus} | " + " | ".join(cells) + " |")
    return lines


def write_report(out: Path, report: dict) -> None:
    """gpu_report.json (everything measured) and gpu_report.md (its tables), one section per stage."""
    (out / "gpu_report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = (_check_lines(report) + _drafter_check_lines(report.get("drafters")) + _kernel_bench_lines(report.get("kernels"))
             + _bench_lines(report.get("bench")) + _drafter_bench_lines(report.get("drafter_bench"))
             + _reference_spec_table(report.get("reference_spec", [])))
    lines.append(f"\nRESULT: {'PASS' if report['ok'] else 'FAIL'} ({report['seconds']:.0f} s)")
    text = "\n".join(lines) + "\n"
    (out / "gpu_report.md").write_text(text)
    print(text)


def _check_lines(report: dict) -> list[str]:
    """The header, then the checks: kernels against their oracles, models against the CPU, graphs."""
    lines = [f"# luce GPU check — {report['date']}", "",
             f"- device: {report.get('device', '?')}; host {report['host']}",
             f"- build: {json.dumps(report.get('build'))}",
             f"- tolerances: float {FLOAT_TOL:g}, quantized {QUANT_TOL:g} with exact kernels, {FAST_TOL:g} with "
             f"fast (int8-activation) kernels (max |gpu-cpu| / max |cpu|); GPU prefill vs GPU decode "
             f"{SELF_TOL:g} (exact) / the model's tolerance (fast); margin factor {MARGIN_FACTOR:g}", "",
             "| weight type | rows x cols | exact: rel err vs gguf.quants x fp32 | fast: rel err vs int8-activation "
             "oracle [width, token, row of worst] | tensor-core (LUCE_GPU_MATMUL=frag; staged): same | widths where row != 1-token row | "
             "widths where dp4a != tensor-core bits | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |",
             *[(f"| {m['type']} | error: {m['error']} | | | | | | FAIL |" if "error" in m else
                f"| {m['type']} | {m['rows']} x {m['cols']} | {m['rel_err']:.2e} | {m['rel_err_fast']:.2e} "
                f"{m['worst_fast']} | {_mma_cell(m)} | "
                f"{m['invariance_broken_at'] or 'none'} | {m.get('kernels_differ_at') or 'none'} | "
                f"{'ok' if m['ok'] else 'FAIL'} |")
               for m in report.get("matmul", [])],
             f"(matmul tolerance {MATMUL_TOL:g} of max |x| @ |W|^T; widths {', '.join(map(str, MATMUL_WIDTHS))}; "
             f"invariance over {INVARIANCE_TOKENS} tokens)",
             *[f"- the same checks under {label}: " + ("ok, all {} cases".format(len(rows)) if all(m["ok"] for m in rows)
               else "FAIL: " + ", ".join(f"{m['type']} {m.get('rows', '')}x{m.get('cols', '')}" for m in rows if not m["ok"]))
               for label, rows in report.get("matmul_ab", {}).items()],
             "",
             *_case_table(f"| attention case | max abs | rel err vs float64 (tol {ATTN_TOL:g}) | "
                          "first bad [t, h, d] | ok |", report.get("attention", [])),
             *_select_table(report.get("select", [])),
             *_case_table(f"| DeltaNet case | max abs | rel err vs float64 (tol {DELTA_TOL:g}) | first bad | ok |",
                          report.get("deltanet", [])),
             "| model | rel diff vs CPU | 512-token chunk vs CPU | tol | prefill vs decode (GPU) | greedy: margin-checked identical | near-tie identical | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in report["checks"]:
        if "error" in c:
            lines.append(f"| {c['model']} | error: {c['error']} | | | | | | FAIL |")
            continue
        long_diff = "—" if c["long_rel_diff"] is None else f"{c['long_rel_diff']:.2e}"
        lines.append(f"| {c['model']} | {c['rel_diff']:.2e} | {long_diff} | {c['tolerance']:g} | {c['self_rel_diff']:.2e} | "
                     f"{c['checked_identical']}/{c['prompts_checked']} | "
                     f"{c['near_tie_identical']}/{c['prompts'] - c['prompts_checked']} | "
                     f"{'ok' if c['ok'] else 'FAIL'} |")
    g = report.get("graphs")
    if g:
        lines.append(f"\n- step graphs (default) vs eager (LUCE_GPU_GRAPHS=0) vs eager without programmatic "
                     f"dependent launch (LUCE_GPU_PDL=0) vs eager with the attention prologue unfused "
                     f"(LUCE_GPU_FUSED_ATTN=0) vs graphs with the DeltaNet state loaded late "
                     f"(LUCE_GPU_DELTANET_EARLY=0), {g.get('model')}: " + (
            f"error: {g['error']}" if "error" in g else
            f"logits of prefill + {g['steps']} one-token steps bitwise identical: {g['identical_logits']} "
            f"(max abs diff {g['max_abs']:.2e}, first diff {g['first_diff']}"
            f"{', differing: ' + ', '.join(g['differing']) if g.get('differing') else ''}); greedy tokens identical: "
            f"{g['identical_tokens']} -> {'ok' if g['ok'] else 'FAIL'}"))
    lines += [""] if report.get("sampling") else []
    for r in report.get("sampling", []):
        lines.append(f"- seeded sampling vs the numpy sampler, {r['case']}: " + (
            f"error: {r['error']}" if "error" in r else
            f"{r['tokens']} tokens, first difference {r['first_diff']} -> {'ok' if r['ok'] else 'FAIL'}"))
    lines += [""] if report.get("rejection") else []
    for r in report.get("rejection", []):
        lines.append(f"- rejection sampling, reference pair, {r['case']}: " + (
            f"error: {r['error']}" if "error" in r else
            f"{r['draws']} draws of (t0, t1) over {r['cells']} cells, chi-square p = {r['pvalue']:.3g}, "
            f"{r['accepted']} drafts accepted / {r['rejected']} rejected, {r['outside']} pairs outside p's "
            f"support -> {'ok' if r['ok'] else 'FAIL'}"))
    if "memcheck" in report:
        lines.append(f"\n- compute-sanitizer memcheck (synthetic tiny iq4_xs + matmul hook): {report['memcheck']['status']}")
    for n in report.get("notes", []):
        lines.append(f"\nNOTE: {n}")
    return lines


def _drafter_check_lines(drafters: list[dict] | None) -> list[str]:
    """The reference drafters on the GPU against the CPU and against plain decoding."""
    if not drafters:
        return []
    lines = ["", "| drafter | hidden rel diff (tol {:g}) | chain GPU == CPU | conf diff | spec == plain (GPU) "
              "| spec GPU == CPU | DDTree | tau GPU / CPU | ok |".format(DRAFT_TOL),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in drafters:
        if "error" in r or "skipped" in r:
            lines.append(f"| {r['kind']} | " + (f"error: {r['error']} | | | | | | | FAIL |" if "error" in r
                                               else f"skipped: {r['skipped']} | | | | | | | - |"))
            continue
        g = r["generate"]
        col = lambda k: ", ".join(x[k] if len(x[k]) < 60 else x[k][:57] + "..." for x in g)  # noqa: E731
        taus = ", ".join(f"{x['tau']:.2f} / {x['tau_cpu']:.2f}" for x in g)
        lines.append(f"| {r['kind']} | {r['hidden_rel_diff']:.2e} | {r['chain_identical']} | "
                     f"{r['confidence_diff']:.1e} | {col('lossless')} | {col('gpu_vs_cpu')} | {col('ddtree')} | "
                     f"{taus} | "
                     f"{'ok' if r['ok'] else 'FAIL'} |")
    return lines


def _kernel_bench_lines(ks: list[dict] | None) -> list[str]:
    """The matmul kernel bench: each shape and width under each kernel."""
    if not ks:
        return []
    ab = list(next((k["ab"] for k in ks if "ab" in k), {}))
    lines = ["", f"## Matmul kernels: device time per call, {KERNEL_REPS} calls (activations quantized once)", "",
             "| type | rows x cols | T | default: us (GB/s of weights) | x T=1 | dp4a forced | fragment tensor-core "
             "forced | staged tensor-core forced | prefill GEMM forced |" + "".join(f" default, {a} |" for a in ab),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(ab)]
    for k in ks:
        if "error" in k:
            lines.append(f"| error: {k['error']} | | | | | | | | |")
            continue
        cell = lambda r: f"{r['us']:.1f} ({r['GBps']:.0f})"  # noqa: E731
        lines.append(f"| {k['type']} | {k['rows']} x {k['cols']} | {k['T']} | {cell(k['auto'])} | "
                     f"{k['x_width1']:.2f} | {cell(k['dp4a'])} | {cell(k['frag'])} | {cell(k['staged'])} | "
                     f"{cell(k['gemm'])} |" + "".join(f" {cell(k['ab'][a])} |" for a in ab))
    return lines


def _bench_lines(b: dict | None) -> list[str]:
    """The synthetic target: decode against the floor, prefill, verify widths, the A/B settings."""
    if not b:
        return []
    lines = ["", f"## Bench: synthetic {b['shape']} {b['mix']} ({b.get('file_gib')} GiB)", ""]
    if "error" in b:
        lines.append(f"error: {b['error']}")
    bw = b.get("copy_bandwidth_Bps")
    lines.append(f"- load {b.get('load_seconds')} s; weights read per decode token "
                 f"{b['bytes_per_token'] / 2**30:.2f} GiB; copy bandwidth "
                 f"{(bw or 0) / 1e12:.2f} TB/s (read+write); floor {b.get('floor_ms', float('nan')):.2f} ms/token")
    d = b.get("decode")
    if d:
        lines.append(f"- decode (step graphs): {d['tok_s']:.1f} tok/s, {d['ms_per_token']:.2f} ms/token"
                     + (f", {100 * d['fraction_of_floor']:.0f}% of the floor" if "fraction_of_floor" in d else ""))
    for label, ds in (b.get("decode_sampled") or {}).items():
        lines.append(f"- decode sampled ({label}): {ds['tok_s']:.1f} tok/s, {ds['ms_per_token']:.2f} ms/token")
    for key, what in (("decode_eager", "without step graphs (LUCE_GPU_GRAPHS=0)"),
                      ("decode_no_pdl", "without programmatic dependent launch (LUCE_GPU_PDL=0)")):
        dg = b.get(key)
        if dg:
            lines.append(f"- decode {what}: " + (
                f"{dg['tok_s']:.1f} tok/s, {dg['ms_per_token']:.2f} ms/token" if isinstance(dg, dict) else dg))
    for n, p in (b.get("prefill") or {}).items():
        lines.append(f"- prefill {n}: " + (f"{p['tok_s']:.0f} tok/s ({p['seconds']:.3f} s, the fastest of "
                                           f"{', '.join(f'{r:.3f}' for r in p['runs_seconds'])} s)"
                                           if isinstance(p, dict) else p))
    if b.get("verify"):
        lines += ["", "| verify width | ms/step (incl. w logits rows downloaded) | x width 1 | "
                  "ms/step (last row's logits only) |", "| --- | --- | --- | --- |"]
        for w, row in b["verify"].items():
            lines.append(f"| {w} | " + (f"{row['ms']:.2f} | {row.get('x_width1', float('nan')):.2f} | "
                                        f"{row.get('ms_last_row_logits', float('nan')):.2f} |"
                                        if isinstance(row, dict) else f"{row} | | |"))
    lines += _step_ab_table(b)
    if b.get("profile"):
        lines.append(f"\n- per-op profile of decode, verify-16 and prefill-512 steps: {Path(b['profile']).name}")
    if b.get("memory"):
        m = b["memory"]
        lines.append(f"\n- luce's peak memory (decode, then prefill up to 2048 tokens; ctx {BENCH_CTX}): "
                     f"{m['peak']} MiB, of which weights {m['weights']} MiB")
    lines.append(f"- device memory in use after the bench (nvidia-smi, context included): "
                 f"{b.get('device_memory_used_mib')} MiB")
    return lines


def _drafter_bench_lines(db: dict | None) -> list[str]:
    """The synthetic DFlash 2 pair: whole speculative steps against a plain step, verify inside the loop."""
    if not db:
        return []
    lines = ["", f"## Bench: DFlash 2 step, synthetic {db.get('shape')} pair, block {db.get('block')}", ""]
    if "error" in db or "skipped" in db:
        lines.append(f"- {db.get('error') or db.get('skipped')}")
    else:
        lines.append(f"- drafter {db['drafter_mib']} MiB; plain step {db['plain_ms']:.2f} ms")
        if db.get("memory"):
            lines.append(f"- luce's peak memory, target and drafter (ctx 1024): {db['memory']['peak']} MiB")
        for name in ("zero_accept", "full_accept", "ddtree_oracle"):
            r = db.get(name)
            if r is None:
                continue
            lines.append(f"- {name}: " + (r if isinstance(r, str) else
                         f"step {r['step_ms']:.2f} ms = {r['x_plain']:.2f}x plain (draft {r['draft_ms']:.2f}, "
                         f"verify {r['verify_ms']:.2f}, rollback {r['rollback_ms']:.2f} ms; "
                         f"{r['spec_steps']} steps, tau {r['tau']:.2f})"))
        for width, r in (db.get("loop_verify") or {}).items():
            lines.append(f"- verify step of {width} rows inside the speculative loop (history written, argmax "
                         "on the device; full-width steps of two zero-acceptance runs): " +
                         (r if isinstance(r, str) else
                          f"{r['verify_ms']:.2f} ms = {r['x_plain']:.2f}x the plain step ({r['steps']} steps)"))
        if db.get("profile"):
            lines.append(f"- per-op profile of the zero-acceptance run: {Path(db['profile']).name}")
    return lines


def _stage(report: dict, key: str, what: str, measure, on_error) -> None:
    """report[key] = measure(), or on_error(message) if it raises: a stage that breaks is reported
    beside the others, and the run goes on."""
    log(what)
    try:
        report[key] = measure()
    except Exception as e:
        report[key] = on_error(f"{type(e).__name__}: {e}")


def _under(setting: dict[str, str], measure):
    with env(**setting):
        return measure()


def _failed_cases(field: str):
    return lambda message: [{field: "all", "error": message, "ok": False}]


def run(args, out: Path, build_info: dict | None) -> int:
    t_start = time.perf_counter()
    deadline = t_start + args.budget
    threads = os.cpu_count() or 4
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "host": f"{platform.node()} ({threads} cores)", "dut": args.dut, "build": build_info,
              "checks": [], "notes": []}
    if args.dut == "gpu":
        name, tensor_cores = gpu_device_info()
        report["device"] = f"{name} (tensor-core int8 matmuls: {'yes' if tensor_cores else 'no'})"
        if shutil.which("nvidia-smi"):
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
            report["device"] += f"; {q.stdout.strip()}"
    WORK.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "models")]  # the fixtures and generators every stage uses
    wanted = args.stages
    report["stages"] = sorted(wanted)
    models, notes = [], []
    if wanted & {"models", "graphs", "sampling"} or (args.dut == "gpu" and not args.no_memcheck):
        models, notes = fixture_models(Path(tempfile.mkdtemp(prefix="fixtures-", dir=WORK)))
    report["notes"] += notes
    report["matmul"] = []
    if "matmul" in wanted:
        _stage(report, "matmul", "matmul per weight type", lambda: check_matmul_ops(args.dut), _failed_cases("type"))
    report["matmul_ab"] = {}  # an A/B's settings must keep every bit too
    for setting in args.ab if "matmul" in wanted else ():
        _stage(report["matmul_ab"], ab_label(setting), f"matmul per weight type under {ab_label(setting)}",
               lambda: _under(setting, lambda: check_matmul_ops(args.dut)), _failed_cases("type"))
    if args.bench_shape != "none" and args.dut == "gpu":
        _stage(report, "kernels", "matmul kernel bench", lambda: bench_matmul_kernels(args.dut, deadline, args.ab),
               lambda message: [{"error": message}])
    matmul_rows = report["matmul"] + [m for rows in report["matmul_ab"].values() for m in rows]
    if args.only == "kernels":
        report["ok"] = all(m["ok"] for m in matmul_rows) and not any("error" in k for k in report.get("kernels", []))
        report["seconds"] = time.perf_counter() - t_start
        write_report(out, report)
        return 0 if report["ok"] else 1
    if "attention" in wanted:
        _stage(report, "attention", "attention kernels vs float64", lambda: check_attention(args.dut),
               _failed_cases("case"))
    if "select" in wanted:
        _stage(report, "select", "argmax / top-k selection vs numpy", lambda: check_select(args.dut),
               _failed_cases("case"))
    if "deltanet" in wanted:
        _stage(report, "deltanet", "DeltaNet kernels vs float64", lambda: check_deltanet(args.dut),
               _failed_cases("case"))
    for label, path, mode, mode_tol in model_checks(models, args.models) if "models" in wanted else ():
        log(f"check {label} [{mode}]")
        try:
            report["checks"].append(check_model(label, path, mode_tol, args.dut, threads, mode))
        except Exception as e:
            report["checks"].append({"model": f"{label} [{mode}]", "error": f"{type(e).__name__}: {e}",
                                     "ok": False})
    if "graphs" in wanted:
        _stage(report, "graphs", "step graphs vs eager", lambda: check_graphs(models[0][1], args.dut, threads),
               lambda message: {"error": message, "ok": False})
    if "sampling" in wanted:
        _stage(report, "sampling", "seeded sampling vs the numpy sampler",
               lambda: check_sampling(models[0][1], args.dut, threads), _failed_cases("case"))
    if args.rejection_draws > 0 and "rejection" in wanted:
        _stage(report, "rejection", "rejection sampling's distribution (chi-square)",
               lambda: check_rejection_sampling(args.dut, threads, args.rejection_draws), _failed_cases("case"))
    if args.dut == "gpu" and not args.no_memcheck:
        log("memcheck")
        report["memcheck"] = memcheck(models[0][1])
    if args.bench_shape != "none":
        _stage(report, "bench", f"bench: synthetic {args.bench_shape}",
               lambda: bench(args.bench_shape, args.dut, threads, deadline, out / "gpu_profile.txt", args.ab),
               lambda message: {"shape": args.bench_shape, "mix": "iq4_xs", "bytes_per_token": 0, "error": message})
    if not args.no_drafters and "drafters" in wanted:  # after the target bench, with budgets of their own
        drafter_deadline = time.perf_counter() + args.drafter_budget
        report["drafters"] = check_drafters(args.dut, threads, WORK, drafter_deadline, args.drafter_prompts)
        if args.bench_shape != "none":
            _stage(report, "drafter_bench", "drafter bench",
                   lambda: bench_drafter(args.bench_shape, args.dut, threads, drafter_deadline, out / "gpu_profile.txt"),
                   lambda message: {"error": message})
        if args.ref_spec_budget > 0:
            _stage(report, "reference_spec", "reference speculative bench",
                   lambda: bench_reference_spec(args.dut, threads, time.perf_counter() + args.ref_spec_budget),
                   lambda message: [{"error": message}])
    report["ok"] = (all(c["ok"] for c in report["checks"] + matmul_rows + report.get("attention", [])
                        + report.get("select", []) + report.get("deltanet", []) + report.get("sampling", [])
                        + report.get("rejection", [])
                        + [report.get("graphs", {"ok": True})]
                        + report.get("drafters", []))
                    and not notes
                    and report.get("memcheck", {"ok": True})["ok"]) and "error" not in report.get("bench", {})
    report["seconds"] = time.perf_counter() - t_start
    write_report(out, report)
    return 0 if report["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    ap.add_argument("--dut", choices=("gpu", "cpu"), default="gpu",
                    help="device under test (cpu: dry run of this script without a GPU)")
    ap.add_argument("--skip-build", action="store_true", help="use the luce installed for this python")
    ap.add_argument("--archs", default=os.environ.get("LUCE_GPU_ARCHS", "90"))
    ap.add_argument("--bench-shape", default="27b", choices=("27b", "0.8b", "tiny", "none"))
    ap.add_argument("--budget", type=float, default=330.0, help="seconds after which bench items are skipped")
    ap.add_argument("--no-memcheck", action="store_true", help="skip the compute-sanitizer pass")
    ap.add_argument("--no-drafters", action="store_true", help="skip the drafter checks and the drafter benches")
    ap.add_argument("--drafter-budget", type=float, default=90.0,
                    help="seconds for the drafter checks and bench, after the target bench")
    ap.add_argument("--drafter-prompts", type=int, default=DRAFT_PROMPTS,
                    help=f"prompts each drafter kind generates from in the drafter checks (default {DRAFT_PROMPTS})")
    ap.add_argument("--ref-spec-budget", type=float, default=90.0,
                    help="seconds for the reference pair's speculative bench, GPU against CPU (0: skip it)")
    ap.add_argument("--rejection-draws", type=int, default=1000,
                    help="seeded 3-token runs per drafter kind and setting in the rejection sampling check (0: skip)")
    ap.add_argument("--ab", type=parse_ab, action="append", default=[], metavar="LUCE_X=V[,...]",
                    help="also time the kernel bench's default choice, decode and the verify widths under these "
                         "backend settings (repeatable)")
    ap.add_argument("--only", choices=("all", "kernels"), default="all",
                    help="kernels: build, the per-type matmul checks and the matmul kernel bench only")
    ap.add_argument("--models", type=lambda text: [m.strip() for m in text.split(",") if m.strip()], default=None,
                    metavar="LABEL[,...]",
                    help="the fixture model checks to run, by label or 'label [fast|exact]' (default: all)")
    ap.add_argument("--stages", type=parse_stages, default=set(STAGES), metavar="NAME[,...]",
                    help=f"the check stages to run, of {', '.join(STAGES)} (default: all; the benches follow "
                         "--bench-shape)")
    ap.add_argument("--build-info", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_build:
        info = build(args.out, args.archs)
        # Continue in a fresh process that imports the luce just built (not the source tree).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([info["site"], os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--skip-build", "--out", str(args.out.resolve()),
               "--dut", args.dut, "--bench-shape", args.bench_shape, "--budget", str(args.budget),
               "--build-info", json.dumps(info), "--drafter-budget", str(args.drafter_budget), "--only", args.only,
               "--ref-spec-budget", str(args.ref_spec_budget), "--rejection-draws", str(args.rejection_draws),
               "--stages", ",".join(sorted(args.stages)), "--drafter-prompts", str(args.drafter_prompts)] \
            + (["--models", ",".join(args.models)] if args.models is not None else []) \
            + [a for setting in args.ab for a in ("--ab", ab_label(setting))] \
            + (["--no-memcheck"] if args.no_memcheck else []) + (["--no-drafters"] if args.no_drafters else [])
        return subprocess.run(cmd, cwd="/", env=env).returncode
    return run(args, args.out, json.loads(args.build_info) if args.build_info else None)


if __name__ == "__main__":
    sys.exit(main())
