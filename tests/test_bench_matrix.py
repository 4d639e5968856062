"""tools/bench_matrix.py's dry run (the CPU standing in for the GPU, tiny shape, no peer): every
mix gets a row with luce's tests, the DFlash 2 step columns and the markdown tables, and the files
are deleted after their rows. Speeds are never asserted (docs/benchmarks.md holds them)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIXES = ("lq-q4_k_m", "lq-iq4_xs-small-f32")


def test_dry_run_writes_a_row_per_mix(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(ROOT / "tools/bench_matrix.py"), "--dut", "cpu", "--shape", "tiny",
                           "--mixes", ",".join(MIXES), "--reps", "1", "--out", str(out), "--work", str(work)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "matrix.json").read_text())
    assert [row["mix"] for row in report["rows"]] == list(MIXES)
    for row in report["rows"]:
        assert set(row["luce"]) >= {"pp1", "pp2", "pp4", "pp8", "pp16", "pp32", "pp512", "pp2048", "tg128"}
        assert all(v > 0 for k, v in row["luce"].items())
        spec = row["luce_spec"]
        assert {"plain_ms", "block8", "block16", "verify16"} <= set(spec)
        assert spec["block16"]["step_ms"] > 0 and spec["verify16"]["x_plain"] > 0
        assert set(row["luce_parallel"]) == {"1", "8", "32", "64"} and min(row["luce_parallel"].values()) > 0
        assert "peer" not in row and "error" not in row
    assert not list(work.glob("synthetic-tiny-lq-*.gguf"))  # each mix's file went after its row
    markdown = (out / "matrix.md").read_text()
    # one row in each of the three tables, and one per number of sequences in the batched one
    assert all(markdown.count(f"| {mix} |") == 3 + 4 for mix in MIXES)


def test_bad_parallel_list_is_one_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools/bench_matrix.py"), "--dut", "cpu", "--parallel", "8,x",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--parallel '8,x'" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_mix_is_one_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "tools/bench_matrix.py"), "--dut", "cpu", "--mixes", "q9_9",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown mix q9_9" in proc.stderr and "Traceback" not in proc.stderr
