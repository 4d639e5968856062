"""tools/ncu_matmul.py runs one matmul through a backend's test hook and holds it to the int8-
activation oracle (gguf.quants' dequantization times tests/fixtures/int8_acts.py's activations):
on the CPU backend the fast kernels pass, the exact (fp32-activation) kernels are told apart from
it, and bad sizes or types are one error line with exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "ncu_matmul.py"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args, "--dut", "cpu"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "LUCE_CPU_KERNELS": "", **env})


@pytest.mark.parametrize("qtype, rows, cols, tokens", [("IQ4_XS", 40, 512, 3), ("Q6_K", 24, 768, 5), ("Q8_0", 17, 96, 2)])
def test_the_fast_kernels_meet_the_int8_oracle(qtype, rows, cols, tokens):
    proc = run(qtype, str(rows), str(cols), str(tokens))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"{qtype} {rows}x{cols} T={tokens} on cpu:") and proc.stdout.rstrip().endswith(": ok")


def test_fp32_activations_are_not_the_int8_oracle():
    # The exact kernels skip the activations' int8 rounding (~1e-3 of the scale): the check sees it.
    proc = run("IQ4_XS", "40", "512", "3", LUCE_CPU_KERNELS="exact")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL (tolerance 1e-05)" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (("IQ4_XS", "40", "500", "3"), "whole IQ4_XS blocks of 256 columns"),
    (("IQ4_XS", "0", "512", "3"), "need positive sizes"),
    (("F32", "40", "512", "3"), "F32: not a type with int8-activation kernels"),
])
def test_bad_arguments_are_one_error_line(args, message):
    proc = run(*args)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith("ncu_matmul.py: error:") and message in proc.stderr
