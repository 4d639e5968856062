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
                                                                                      ("IQ4_XS", 40, 8448)]:
        m = rows[key]
        assert m["ok"] and m["rel_err_fast"] <= 1e-5 and m["rel_err"] <= 1e-5, m
    assert "RESULT: PASS" in (out / "gpu_report.md").read_text()
