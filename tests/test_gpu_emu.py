"""The GPU backend run by the CPU (native/gpu/emu, docs/gpu.md "The emulated GPU"), in both of its
dialects: tools/gpu_check.py's correctness stages against libluce_gpu_emu.so, the HIP path
(`make gpu-emu`) and the CUDA path as built for sm_90 (`make gpu-emu-cuda`; `make test` builds
both first). The oracles are gpu_check's own: float64 numpy for the attention and
DeltaNet kernels, gguf's dequantization with the numpy int8 contract for every matmul type and
width, numpy for argmax / top-k, the CPU backend for whole models (logits within the stated
tolerance, greedy tokens on margin-checked prompts), eager launches for graph replay, the numpy
sampler for seeded sampling, and plain decoding for speculative decoding with all three drafter
kinds, chain and tree. On the CUDA path the matmul stage also holds the tensor-core kernels
(mma.sync fragments staged per warp or per block, fed by bulk and tensor-map copies, and the
prefill GEMM) to the dp4a kernel's bits at every width. The emulator runs every thread of every
block and stops a launch whose threads miss a barrier (or an mbarrier phase), so these also
check the kernels' synchronisation, at the HIP wave width (32, RDNA) and CUDA's.

What this cannot show: speed, and how the GPU compilers round (fp32 contraction): the
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

from fixtures.int8_acts import ACT_BLOCK

REPO = Path(__file__).resolve().parents[1]
EMU_LIBRARIES = {"hip": REPO / "build" / "gpu-emu" / "libluce_gpu_emu.so",
                 "cuda": REPO / "build" / "gpu-emu-cuda" / "libluce_gpu_emu.so"}
DIALECT_FLAGS = {"hip": ["-DLUCE_HIP=1"], "cuda": ["-D__CUDA_ARCH__=900"]}

# The model checks run here: the 27B's weight mix at the tiny synthetic shape, Q8_0 with an MTP
# block, and the transformers-built model in f16 (float weights: the fp32-activation kernels).
# The exact kernel family and the other types are covered per kernel by the matmul stage.
EMU_MODELS = ("synthetic tiny iq4_xs [fast]", "random q8_0 mtp [fast]", "transformers tiny base f16")
# The CUDA path's prefill GEMM and the float kernel of few-row matrices on the recipes' type mixes.
EMU_CUDA_MODELS = "synthetic tiny iq4_xs [fast],synthetic tiny lq-q4_k_m [fast],synthetic tiny lq-iq4_xs-small-f32 [fast]"


def _library(dialect: str) -> Path:
    library = EMU_LIBRARIES[dialect]
    if not library.exists():
        target = "gpu-emu" if dialect == "hip" else "gpu-emu-cuda"
        pytest.fail(f"{library} is missing: `make {target}` builds it (`make test` does)")
    return library


@pytest.fixture(scope="module")
def emu_library() -> Path:
    return _library("hip")


@pytest.fixture(scope="module")
def emu_cuda_library() -> Path:
    return _library("cuda")


def _build_faults(tmp_path_factory, dialect: str) -> Path:
    """tests/native/emu_faults.cu built against the emulator, as the emulated library is built."""
    exe = tmp_path_factory.mktemp(f"emu-{dialect}") / "emu_faults"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    include = [f"-I{REPO / d}" for d in ("native/include", "native/src", "native/gpu")]
    proc = subprocess.run([cxx, "-x", "c++", "-std=c++17", "-O1", "-fno-strict-aliasing", *DIALECT_FLAGS[dialect],
                           "-DLUCE_GPU_EMU=1", *include, str(REPO / "tests/native/emu_faults.cu"), "-x", "none",
                           str(REPO / "native/gpu/emu/gpu_emu.cpp"), str(REPO / "native/src/errors.cpp"), "-o",
                           str(exe), "-ldl"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


@pytest.fixture(scope="module", params=["hip", "cuda"])
def emu_faults(request, tmp_path_factory) -> Path:
    return _build_faults(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def emu_cuda_faults(tmp_path_factory) -> Path:
    return _build_faults(tmp_path_factory, "cuda")


def _emu_case(exe: Path, case: str) -> tuple[int, str]:
    proc = subprocess.run([str(exe), case], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout.strip()


def test_emulated_warp_operations_compute_what_the_dialect_defines(emu_faults):
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
    rc, out = _emu_case(emu_faults, "block_sums")  # two sums at once: block_sum's bits, every thread
    assert rc == 0 and out.split() == ["1"] * 160


def test_emulated_graph_replays_what_it_captured(emu_faults):
    """Nothing runs while a stream captures (the output still holds its NaN bytes); each replay
    runs the kernel on the input as it is then."""
    rc, out = _emu_case(emu_faults, "graph")
    assert rc == 0 and out.split() == ["-nan", "6", "20"]


@pytest.mark.parametrize("case, message", [
    ("stuck", "16 threads wait at __syncthreads and 16 at a warp operation that the others never reach"),
    ("returned", "a warp operation after another lane of the warp returned"),
])
def test_emulated_faults_stop_the_launch_with_one_error(emu_faults, case, message):
    rc, out = _emu_case(emu_faults, case)
    assert rc == 1 and out.startswith("error: ") and message in out and "a kernel (float*)" in out, out


def test_emulated_shared_memory_is_the_device_s(emu_faults):
    """65 KiB of dynamic shared memory: past an AMD workgroup's 64 KiB, and past an sm_90 block's
    48 KiB without the kernel's opt-in (cudaFuncSetAttribute)."""
    rc, out = _emu_case(emu_faults, "shared")
    want = ("66560 bytes of shared memory (an AMD workgroup has 65536)" if "emu-hip" in str(emu_faults)
            else "66560 bytes of dynamic shared memory, 49152 allowed")
    assert rc == 1 and want in out, out


def test_emulated_mma_is_the_integer_product(emu_cuda_faults):
    """m16n8k32 and m16n8k16 int8 mma from fragments filled per the PTX ISA's layouts, against
    numpy's product of the same matrices."""
    import numpy as np

    rc, out = _emu_case(emu_cuda_faults, "mma")
    assert rc == 0
    got = np.array([int(v) for v in out.split()]).reshape(2, 16, 8)
    r, k, n = np.arange(16)[:, None], np.arange(32)[None, :], np.arange(8)[None, :]
    a = (7 * r + 3 * k) % 17 - 8
    b = (5 * np.arange(32)[:, None] + 11 * n) % 13 - 6
    assert (got[0] == a @ b).all() and (got[1] == a[:, :16] @ b[:16]).all()


def test_emulated_ldmatrix_gives_each_lane_its_row_words(emu_cuda_faults):
    """PTX ldmatrix .x4: register i of lane l is word l % 4 of row l // 4 of matrix i, rows at the
    addresses lanes 8 i .. 8 i + 7 gave (row r of matrix m stored at words 32 m + 4 ((3 r) % 8))."""
    rc, out = _emu_case(emu_cuda_faults, "ldmatrix")
    assert rc == 0
    got = [int(v) for v in out.split()]
    want = [32 * i + 4 * ((3 * (lane // 4)) % 8) + lane % 4 for lane in range(32) for i in range(4)]
    assert got == want


def test_emulated_bulk_and_tensor_copies_land_before_the_wait_returns(emu_cuda_faults):
    """A warp waits on each mbarrier before another warp issues the copy: the bulk copy's 64
    floats, then a tensor-map box of 8 words x 4 rows at row 8 of a 10-row array, whose last two
    rows lie past the array and land as zeros."""
    rc, out = _emu_case(emu_cuda_faults, "copies")
    assert rc == 0
    got = [float(v) for v in out.split()]
    assert got == [float(i) for i in range(80)] + [0.0] * 16


@pytest.mark.parametrize("case, message", [
    ("phase", "on an mbarrier phase that never completes"),
    ("uninit", "an mbarrier used before its mbarrier.init"),
    ("box", "a box that starts off a 16-byte boundary"),
    ("partial", "a warp operation on part of the warp"),
])
def test_emulated_ptx_faults_stop_the_launch(emu_cuda_faults, case, message):
    rc, out = _emu_case(emu_cuda_faults, case)
    assert rc == 1 and out.startswith("error: ") and message in out, out


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
    assert report["device"] == "hip:luce emulator (host CPU, wave32) (tensor-core int8 matmuls: no)"
    for stage in ("matmul", "attention", "select", "deltanet"):
        _all_ok(report, stage)
    # Every weight type the GPU serves, at every checked width, invariant over the widths.
    assert {row["type"] for row in report["matmul"]} >= {
        "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
        "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"}
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


# ---- the CUDA path (sm_90) ----------------------------------------------------------------------

_PTX_PROBE = r"""
import ctypes, json, os, sys
sys.path[:0] = [os.path.join(sys.argv[1], d) for d in ("tools", "tests", "models")]
import numpy as np
import gpu_check as gc
from gguf.constants import GGMLQuantizationType as Q

run = gc._matmul_fn("gpu")
lib = ctypes.CDLL(os.environ["LUCE_GPU_LIBRARY"])  # the hook's library: dlopen gives the same one


def counts():
    out = (ctypes.c_uint64 * 5)()
    lib.luce_emu_ptx_counts(out)
    return list(out)


rng = np.random.default_rng(3)
raw, n_rows, n_cols, w = gc._matmul_case(Q.IQ4_XS, rng, "gpu", 64, 5120)
result = {}
for name, T, env in (("frag", 8, {"LUCE_GPU_MATMUL": "frag"}),
                     ("rows", 8, {"LUCE_GPU_MATMUL": "frag", "LUCE_GPU_BULK": "rows"}),
                     ("staged", 8, {"LUCE_GPU_MATMUL": "staged"}), ("gemm", 64, {"LUCE_GPU_MATMUL": "gemm"}),
                     ("dp4a", 8, {"LUCE_GPU_MATMUL": "dp4a"})):
    before = counts()
    with gc.kernels("fast"), gc.env(**env):
        run(int(Q.IQ4_XS), raw, n_rows, n_cols, rng.standard_normal((T, n_cols)).astype(np.float32))
    result[name] = [a - b for a, b in zip(counts(), before)]
for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0):  # the prefill GEMM of every type it serves
    raw, n_rows, n_cols, w = gc._matmul_case(qtype, rng, "gpu", 64, 5120)
    before = counts()
    with gc.kernels("fast"), gc.env(LUCE_GPU_MATMUL="gemm"):
        run(int(qtype), raw, n_rows, n_cols, rng.standard_normal((64, n_cols)).astype(np.float32))
    result["gemm " + qtype.name] = [a - b for a, b in zip(counts(), before)]
print(json.dumps(result))
"""


def test_emulated_cuda_path_runs_its_tensor_core_kernels(emu_cuda_library):
    """The emulated device is an sm_90 part to the backend: forcing each kernel family on the 27B's
    IQ4_XS rows runs its PTX (the emulator counts it: mma, ldmatrix, bulk copies, tensor-map
    copies, mbarrier waits), and the dp4a kernel none. Without this the bitwise comparisons of the
    matmul stage below could pass with every kernel silently falling back to dp4a."""
    proc = subprocess.run([sys.executable, "-c", _PTX_PROBE, str(REPO)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "LUCE_GPU_LIBRARY": str(emu_cuda_library)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    mma, ldmatrix, bulk, tensor, waits = range(5)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["frag"][mma] > 0 and got["frag"][ldmatrix] > 0 and got["frag"][tensor] > 0 and got["frag"][bulk] == 0
    assert got["rows"][bulk] > 0 and got["rows"][tensor] == 0 and got["rows"][waits] > 0
    assert got["staged"][mma] > 0 and got["staged"][bulk] == got["staged"][tensor] == 0
    # The GEMM's own count: one 128-row x 64-token tile, 20 groups of 5120 values, each warp 8
    # units x 2 m-tiles x 4 n-tiles of m16n8k32 per group (Q6_K: two m16n8k16 for each), 8 warps.
    gemm_mma = 8 * 20 * 8 * 2 * 4
    assert got["gemm"][mma] == gemm_mma
    assert [got["gemm " + t][mma] for t in ("Q4_K", "Q5_K", "Q6_K", "Q8_0")] == [gemm_mma, gemm_mma, 2 * gemm_mma, gemm_mma]
    assert got["dp4a"] == [0, 0, 0, 0, 0]


def test_emulated_cuda_kernels_match_their_oracles(tmp_path, emu_cuda_library):
    """As the HIP path's test above, on the CUDA path: every matmul type and width against the
    oracles, the tensor-core kernels' bits == dp4a's at every width (the prefill GEMM to the
    oracle), prefill attention's tiles among the attention cases. (Argmax / top-k and DeltaNet are
    the same code on both paths, at the same warp width: the HIP test covers them.)"""
    report = _gpu_check(tmp_path, emu_cuda_library, "--stages", "matmul,attention")
    assert report["device"] == "cuda:luce emulator (host CPU, sm_90) (tensor-core int8 matmuls: yes)"
    for stage in ("matmul", "attention"):
        _all_ok(report, stage)
    assert all(not row["kernels_differ_at"] for row in report["matmul"])
    int8_types = set(ACT_BLOCK)  # the types with int8 kernels; the others take the exact kernel
    assert all(row["worst_frag"] is not None for row in report["matmul"] if row["type"] in int8_types)


def test_emulated_cuda_model_matches_the_cpu_backend(tmp_path, emu_cuda_library):
    """The 27B's weight mixes at the tiny synthetic shape on the CUDA path (the pure IQ4_XS one,
    llama-quantize's Q4_K_M, IQ4_XS with F32 small projections): prompt chunks through the prefill
    GEMM and prefill attention, decode and verify widths through dp4a and the fragment kernels;
    logits within tolerance of the CPU backend, greedy tokens identical. (Graphs against eager
    launches: the HIP test; step capture is the same code.)"""
    report = _gpu_check(tmp_path, emu_cuda_library, "--stages", "models", "--models", EMU_CUDA_MODELS)
    checks = report["checks"]
    assert len(checks) == 3, checks
    assert all(c["ok"] and c["checked_identical"] == c["prompts_checked"] > 0 for c in checks), checks
