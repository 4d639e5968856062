"""tools/gpu_check.py keeps working between device runs: its CPU dry run (`--dut cpu`) of the
kernel stage checks libluce's fast matmul path against the numpy int8-activation oracle
(tests/fixtures/int8_acts.py, with gguf.quants' dequantization of the weights) for every weight
type and shape the device check uses, the odd ones included (a partial group of eight Q8_0
units, a long IQ4_XS row), and writes a report that says so. The device itself is only reached
by the real run on a GPU machine (docs/gpu.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_kernel_stage_dry_run_passes_the_int8_oracle(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--dut", "cpu", "--skip-build", "--only", "kernels",
         "--bench-shape", "none", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LUCE_CHECK_WORK": str(tmp_path / "work")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((out / "gpu_report.json").read_text())
    rows = {(m["type"], m["rows"], m["cols"]): m for m in report["matmul"]}
    for key in [(t, 99, 512) for t in ("Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")] + [("Q8_0", 99, 480),
                                                                                      ("IQ4_XS", 40, 8448),
                                                                                      ("IQ4_XS", 64, 5120),
                                                                                      ("IQ4_XS", 48, 17408),
                                                                                      ("Q8_0", 48, 17408)]:
        m = rows[key]
        assert m["ok"] and m["rel_err_fast"] <= 1e-5 and m["rel_err"] <= 1e-5, m
    assert "RESULT: PASS" in (out / "gpu_report.md").read_text()


def test_whole_script_dry_run_passes_and_reports_every_stage(tmp_path):
    """Every stage of the device run, with the CPU standing in for the GPU and the tiny synthetic
    shapes: a stage that breaks between device runs fails here, not in the next GPU session.
    The synthetic drafter bench carries two invariants of its own: the random drafter's drafts are
    all rejected (tau 1), the oracle's all accepted (tau = the block)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--dut", "cpu", "--skip-build", "--bench-shape", "tiny",
         "--ref-spec-budget", "1", "--rejection-draws", "300", "--ab", "LUCE_GPU_BULK=0", "--out", str(out),
         "--budget", "86400"],  # every bench item runs, however slow this CPU: the test checks stages, not speed
        capture_output=True, text=True, timeout=1800, env={**os.environ, "LUCE_CHECK_WORK": str(tmp_path / "work")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((out / "gpu_report.json").read_text())
    for stage in ("matmul", "attention", "select", "deltanet", "checks", "drafters", "sampling", "rejection"):
        assert report[stage] and all(row["ok"] for row in report[stage]), stage
    assert report["graphs"]["ok"] and report["graphs"]["identical_tokens"]
    under = report["matmul_ab"]["LUCE_GPU_BULK=0"]  # --ab's settings pass the matmul checks too
    assert len(under) == len(report["matmul"]) and all(row["ok"] for row in under)
    assert {row["kind"] for row in report["drafters"]} == {"dflash", "dflash2", "dspark"}
    # The trained reference drafters exercise both branches of the rejection sampler.
    assert all(row["accepted"] > 0 and row["rejected"] > 0 for row in report["rejection"])
    # Both engines on the CPU here: the same drafts, so the same tau on every prompt.
    assert all(g["tau"] == g["tau_cpu"] for row in report["drafters"] for g in row["generate"])

    bench = report["bench"]
    assert bench["decode"]["tok_s"] > 0 and set(bench["prefill"]) == {"512", "2048"}
    assert len(bench["decode_sampled"]) == 2 and all(d["tok_s"] > 0 for d in bench["decode_sampled"].values())
    assert set(bench["verify"]) == {"1", "2", "4", "8", "16", "32"}
    # The engine's own memory account reaches the report (tests/test_memory.py checks its values).
    assert bench["memory"]["peak"] >= bench["memory"]["in_use"] > 0
    under = bench["ab"]["LUCE_GPU_BULK=0"]  # --ab's step side: an engine of its own under the setting
    assert under["decode"]["tok_s"] > 0 and set(under["verify"]) == set(bench["verify"])
    assert all(under["prefill"][n]["tok_s"] > 0 for n in ("512", "2048"))  # prefill under the setting too
    steps = report["drafter_bench"]
    assert steps["zero_accept"]["tau"] == 1.0 and steps["full_accept"]["tau"] == steps["block"] == 8
    assert steps["ddtree_oracle"]["tau"] > 1.0
    # The verify steps inside the loop: the two runs' difference is one full-width step per token.
    for width in ("8", "16"):
        loop = steps["loop_verify"][width]
        assert loop["tau"] == 1.0 and loop["steps"] == 64 and loop["verify_ms"] > 0, (width, loop)

    # One second of budget: the first drafter is measured (chain and tree), the others are skipped.
    spec = report["reference_spec"]
    measured = [r for r in spec if "tok_s" in r]
    assert {(r["draft"], r["verify"]) for r in measured} == {("dflash", "chain"), ("dflash", "tree")}
    assert all(r["tau"] >= 1.0 and r["tok_s"] > 0 and r["plain_tok_s"] > 0 for r in measured)
    assert {r["draft"] for r in spec if "skipped" in r} == {"dflash2", "dspark"}
    text = (out / "gpu_report.md").read_text()
    assert "reference pair, speculative vs plain" in text and "RESULT: PASS" in text
    assert "luce's peak memory (decode" in text and "luce's peak memory, target and drafter" in text
    profile = (out / "gpu_profile.txt").read_text()  # the sections' headers (per-op tables come from a GPU)
    assert all(f"## {step}:" in profile for step in ("decode", "verify", "prefill", "DFlash 2"))
