"""Stage "models": the fixture models (synthetic mixes, random weights, transformers-built tiny
Qwen3.5) on the device against the CPU backend, per weight type and kernel family, within stated
tolerances; and compute-sanitizer's memcheck over one of them."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .device import REPO, kernels, plain_generate


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
# path are the per-type matmul oracle (matmul.py) and greedy identity on margin-checked prompts (a
# fast pass may have none: every prompt near a tie is reported, not asserted).
FLOAT_TOL = 1e-4
QUANT_TOL = 1e-4
FAST_TOL = 1e-1
SELF_TOL = 1e-4  # GPU prefill vs GPU decode steps (exact kernels): same kernels, different token tiling


MARGIN_FACTOR = 4.0


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
    except Exception as e:  # reported, and the check fails: the model checks need these models
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
from fixtures.native_eval import last_rows_logits
from gpucheck.device import plain_generate
from gpucheck.matmul import check_matmul_ops
from luce import Engine
with Engine(sys.argv[1], device="gpu", ctx_size=1024) as eng:
    eng.logits(list(range(70)))
    last_rows_logits(eng, list(range(600)), 1)  # a prefill chunk of 512
    plain_generate(eng, list(range(12)), 8)
check_matmul_ops("gpu", invariance=False, large=False)
"""


def memcheck(model: Path) -> dict:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        return {"status": "unavailable (no compute-sanitizer on PATH)", "ok": True}
    cmd = [tool, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode", "3", sys.executable, "-c",
           _MEMCHECK_CHILD, str(model), str(REPO / "tools"), str(REPO / "models"), str(REPO / "tests")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd="/")
    except subprocess.TimeoutExpired:
        return {"status": "timed out after 180 s (not counted as a failure)", "ok": True}
    errors = [line for line in proc.stdout.splitlines() if "ERROR SUMMARY" in line or "Invalid" in line]
    if proc.returncode == 0:
        return {"status": "clean: " + (errors[-1].strip() if errors else "no errors"), "ok": True}
    return {"status": f"exit {proc.returncode}: " + " | ".join(errors[:5] or [proc.stderr[-500:]]), "ok": False}
