"""tools/kernel_stats.py reads ptxas's own report of each kernel instance (nvcc is on every CI
machine): names instances by their template arguments, a matmul's first as a ggml type, and
reports static shared memory a hand count gives; a source that does not compile, or a filter that
matches nothing, is one error line and exit status 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "kernel_stats.py"

SOURCE = r"""
template <int TYPE, int N>
__global__ void matmul_probe_kernel(float *y) {
    __shared__ float tile[N][32];  // N * 32 * 4 bytes
    tile[threadIdx.y % N][threadIdx.x % 32] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = tile[(threadIdx.y + 1) % N][threadIdx.x % 32];
}
template __global__ void matmul_probe_kernel<23, 4>(float *);  // IQ4_XS
template __global__ void matmul_probe_kernel<8, 2>(float *);   // Q8_0
"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def test_instances_are_named_by_type_and_arguments_with_their_shared_memory(tmp_path):
    src = tmp_path / "probe.cu"
    src.write_text(SOURCE)
    proc = run(str(src))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"matmul_probe_kernel IQ4_XS<4>", "matmul_probe_kernel Q8_0<2>"}
    assert rows["matmul_probe_kernel IQ4_XS<4>"][-1] == str(4 * 32 * 4)  # static shared bytes
    assert rows["matmul_probe_kernel Q8_0<2>"][-1] == str(2 * 32 * 4)
    assert all(int(r[-3]) > 0 and r[-2] == "0" for r in rows.values())  # registers used, nothing spilled
    only = run(str(src), "--grep", "Q8_0")
    assert only.returncode == 0 and "IQ4_XS" not in only.stdout and "Q8_0<2>" in only.stdout


def test_bad_source_and_empty_filter_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k( {\n")
    for proc in (run(str(bad)), run(str(REPO / "native" / "gpu" / "copy.cu"), "--grep", "no such kernel")):
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("kernel_stats: ")
