"""The GPU backend's HIP path, run by the CPU (native/gpu/emu, docs/gpu.md "The emulated GPU"):
tools/gpu_check.py's correctness stages against libluce_gpu_emu.so (`make gpu-emu`, which
`make test` runs first). The oracles are gpu_check's own: float64 numpy for the attention and
DeltaNet kernels, gguf's dequantization with the numpy int8 contract for every matmul type and
width, numpy for argmax / top-k, the CPU backend for whole models (logits within the stated
tolerance, greedy tokens on margin-checked prompts), eager launches for graph replay, the numpy
sampler for seeded sampling, and plain decoding for speculative decoding with all three drafter
kinds, chain and tree. The emulator runs every thread of every block and stops a launch whose
threads miss a barrier, so these also check the kernels' synchronisation at the HIP wave width
(32, RDNA).

What this cannot show: speed, the CUDA-only kernels (tensor cores, bulk copies, the prefill
GEMM; those run on the H200 only), and how AMD's compiler rounds (fp32 contraction): the
emulator's arithmetic is the host's, without FMA contraction.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EMU_LIBRARY = REPO / "build" / "gpu-emu" / "libluce_gpu_emu.so"

# The model checks run here: the 27B's weight mix at the tiny synthetic shape, Q8_0 with an MTP
# block, and the transformers-built model in f16 (float weights: the fp32-activation kernels).
# The exact kernel family and the other types are covered per kernel by the matmul stage.
EMU_MODELS = ("synthetic tiny iq4_xs [fast]", "random q8_0 mtp [fast]", "transformers tiny base f16")


@pytest.fixture(scope="module")
def emu_library() -> Path:
    if not EMU_LIBRARY.exists():
        pytest.fail(f"{EMU_LIBRARY} is missing: `make gpu-emu` builds it (`make test` does)")
    return EMU_LIBRARY


@pytest.fixture(scope="module")
def emu_faults(tmp_path_factory) -> Path:
    """tests/native/emu_faults.cu built against the emulator, as the emulated library is built."""
    exe = tmp_path_factory.mktemp("emu") / "emu_faults"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    include = [f"-I{REPO / d}" for d in ("native/include", "native/src", "native/gpu")]
    subprocess.run([cxx, "-x", "c++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-DLUCE_HIP=1", "-DLUCE_GPU_EMU=1",
                    *include, str(REPO / "tests/native/emu_faults.cu"), "-x", "none",
                    str(REPO / "native/gpu/emu/hip_emu.cpp"), str(REPO / "native/src/errors.cpp"), "-o", str(exe),
                    "-ldl"], check=True, capture_output=True)
    return exe


def _emu_case(exe: Path, case: str) -> tuple[int, str]:
    proc = subprocess.run([str(exe), case], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout.strip()


def test_emulated_warp_operations_compute_what_hip_defines(emu_faults):
    """Hand-computed: lane l holds l^2 in a warp of 32."""
    rc, out = _emu_case(emu_faults, "shuffles")
    assert rc == 0
    values = [float(v) for v in out.split()]
    for lane in range(32):
        xor1, down1, from5, total = values[4 * lane:4 * lane + 4]
        assert xor1 == (lane ^ 1) ** 2
        assert down1 == (lane + 1 if lane < 31 else lane) ** 2  # past the warp's end: its own value
        assert from5 == 25 and total == sum(l * l for l in range(32))
    rc, out = _emu_case(emu_faults, "any")
    assert rc == 0 and out.split() == ["1", "0"] * 32
    rc, out = _emu_case(emu_faults, "block_sum")  # 96 threads, three warps, two barriers
    assert rc == 0 and out.split() == [str(96 * 97 // 2)] * 96


def test_emulated_graph_replays_what_it_captured(emu_faults):
    """Nothing runs while a stream captures (the output still holds its NaN bytes); each replay
    runs the kernel on the input as it is then."""
    rc, out = _emu_case(emu_faults, "graph")
    assert rc == 0 and out.split() == ["-nan", "6", "20"]


@pytest.mark.parametrize("case, message", [
    ("stuck", "16 threads wait at __syncthreads and 16 at a warp operation that the others never reach"),
    ("returned", "a warp operation after another lane of the warp returned"),
    ("shared", "66560 bytes of shared memory (an AMD workgroup has 65536)"),
])
def test_emulated_faults_stop_the_launch_with_one_error(emu_faults, case, message):
    rc, out = _emu_case(emu_faults, case)
    assert rc == 1 and out.startswith("error: ") and message in out and "a kernel (float*)" in out, out


def test_emulated_access_past_a_buffer_stops_the_process_naming_the_thread(emu_faults):
    """Device buffers end where an unreadable page begins: thread 64 of a 65-thread block writes
    the float after a 64-float buffer."""
    proc = subprocess.run([str(emu_faults), "overrun"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 70, (proc.returncode, proc.stderr)
    assert "invalid access" in proc.stderr and "block (0,0,0), thread (64,0,0)" in proc.stderr, proc.stderr


def _gpu_check(tmp_path: Path, library: Path, *args: str) -> dict:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--dut", "gpu", "--skip-build", "--bench-shape", "none",
         "--no-memcheck", "--out", str(out), *args],
        capture_output=True, text=True, timeout=1200,
        env={**os.environ, "LUCE_GPU_LIBRARY": str(library), "LUCE_CHECK_WORK": str(tmp_path / "work")})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu_report.json").read_text())


def _all_ok(report: dict, stage: str) -> None:
    rows = report[stage]
    assert rows and all(row["ok"] for row in rows), (stage, [row for row in rows if not row["ok"]][:3])


def test_emulated_kernels_match_their_oracles(tmp_path, emu_library):
    report = _gpu_check(tmp_path, emu_library, "--stages", "matmul,attention,select,deltanet")
    for stage in ("matmul", "attention", "select", "deltanet"):
        _all_ok(report, stage)
    # Every weight type the GPU serves, at every checked width, invariant over the widths.
    assert {row["type"] for row in report["matmul"]} >= {"Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
    # Both DeltaNet kernels of the HIP path, and the tree mode cases.
    assert any("tree" in row["case"] for row in report["deltanet"])


def test_emulated_models_match_the_cpu_backend(tmp_path, emu_library):
    report = _gpu_check(tmp_path, emu_library, "--stages", "models,graphs,sampling", "--models", ",".join(EMU_MODELS))
    checks = report["checks"]
    assert len(checks) == 3 and all(c["ok"] for c in checks), checks
    assert all(c["prompts_checked"] > 0 and c["checked_identical"] == c["prompts_checked"] for c in checks), checks
    assert report["graphs"]["ok"] and report["graphs"]["identical_tokens"]
    _all_ok(report, "sampling")


def test_emulated_speculative_decoding_is_plain_decoding(tmp_path, emu_library):
    """Each kind's drafter forward and greedy chain against the CPU backend, then generation from
    one real prompt: speculative == plain on the emulated GPU, chain and DDTree, and == the CPU's
    speculative output. (The rejection-sampling stage passes here too, 100 draws a case, but
    takes ~10 minutes: it stays a device check.)"""
    report = _gpu_check(tmp_path, emu_library, "--stages", "drafters", "--drafter-prompts", "1",
                        "--drafter-budget", "1200", "--ref-spec-budget", "0")
    _all_ok(report, "drafters")
    rows = report["drafters"]
    assert {row["kind"] for row in rows} == {"dflash", "dflash2", "dspark"} and not any("skipped" in r for r in rows)
    assert all(len(row["generate"]) == 1 for row in rows)
