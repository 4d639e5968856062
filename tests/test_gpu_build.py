"""The GPU backend's CPU-side contract (docs/gpu.md): what can be checked on a machine without a
GPU, which is every CI machine. The kernels themselves are checked on an H200 by
tools/gpu_check.py.

- libluce.so never links a GPU runtime; libluce_gpu.so is built whenever nvcc is present
  (`pip install .` with LUCE_GPU=auto) and exports exactly its one entry point.
- Asking for the GPU without one gives ONE DEVICE error line, for each reason (library absent,
  library unloadable, no device), before any weight is read onto a device; `auto` falls back to
  the CPU and computes exactly what the CPU computes.
- A bad LUCE_GPU value stops the CMake configure with a clear message.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine, LuceError
from luce.binding import _HERE as BINDING_DIR

DEVICE = 7  # LUCE_ERR_DEVICE
GPU_LIBRARY = BINDING_DIR / "libluce_gpu.so"
REPO = Path(__file__).resolve().parents[1]

# Loads a model on the GPU in a fresh process (the loader caches the library it opened) with the
# given environment; prints [status, message, seconds].
_CHILD = r"""
import json, sys, time
from luce.binding import ffi, lib
L = lib()
m = ffi.new("luce_model **")
params = ffi.new("luce_model_params *", {"device": 1, "n_threads": 1, "gpu_index": 0})
t0 = time.perf_counter()
status = L.luce_model_load(sys.argv[1].encode(), params, m)
print(json.dumps([status, ffi.string(L.luce_last_error()).decode(), time.perf_counter() - t0]))
"""


def _gpu_load_in_child(path, **env) -> tuple[int, str, float]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True,
                          timeout=120, cwd="/", env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return tuple(json.loads(proc.stdout))


def _needed(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_random_qwen35(tmp_path_factory.mktemp("gpu") / "tiny.gguf", SPEC_TINY)


def test_cpu_library_links_no_gpu_runtime():
    needed = _needed(BINDING_DIR / "libluce.so")
    assert needed and not [n for n in needed if "cuda" in n or "amdhip" in n or "hiprt" in n], needed


def test_gpu_library_is_built_where_nvcc_is_present():
    if shutil.which("nvcc") is None and shutil.which("hipcc") is None:
        assert not GPU_LIBRARY.exists()  # LUCE_GPU=auto found no compiler: nothing half-built
        return
    assert GPU_LIBRARY.exists(), "LUCE_GPU=auto with a GPU compiler present must build libluce_gpu.so"
    # Static cudart: only the driver is needed at run time, and it is dlopen'ed, not linked.
    assert not [n for n in _needed(GPU_LIBRARY) if "cudart" in n], _needed(GPU_LIBRARY)
    exported = subprocess.run(["nm", "-D", "--defined-only", str(GPU_LIBRARY)], capture_output=True,
                              text=True, check=True).stdout
    assert " T luce_gpu_open" in exported


def test_gpu_backend_installed_follows_the_library_file(tmp_path, monkeypatch):
    from luce.binding import lib

    monkeypatch.delenv("LUCE_GPU_LIBRARY", raising=False)
    assert lib().luce_gpu_backend_installed() == int(GPU_LIBRARY.exists())
    present = tmp_path / "libluce_gpu.so"
    present.write_bytes(b"")  # only its presence is asked: nothing is loaded
    monkeypatch.setenv("LUCE_GPU_LIBRARY", str(present))
    assert lib().luce_gpu_backend_installed() == 1
    monkeypatch.setenv("LUCE_GPU_LIBRARY", str(tmp_path / "absent.so"))
    assert lib().luce_gpu_backend_installed() == 0


def test_missing_gpu_library_is_one_device_error(tiny_path, tmp_path):
    missing = tmp_path / "nowhere" / "libluce_gpu.so"
    status, message, _ = _gpu_load_in_child(tiny_path, LUCE_GPU_LIBRARY=str(missing))
    assert status == DEVICE
    assert "GPU backend not built" in message and str(missing) in message and "\n" not in message


def test_unloadable_gpu_library_is_one_device_error(tiny_path, tmp_path):
    bogus = tmp_path / "libluce_gpu.so"
    bogus.write_bytes(b"not an ELF file")
    status, message, _ = _gpu_load_in_child(tiny_path, LUCE_GPU_LIBRARY=str(bogus))
    assert status == DEVICE and message.startswith("cannot load the GPU backend") and "\n" not in message


def test_plain_gpu_request_on_this_machine_is_one_device_error(tiny_path):
    # No GPU here: with the library built the runtime reports the missing device, without it
    # the missing library; either way one line and nothing uploaded.
    status, message, _ = _gpu_load_in_child(tiny_path)
    assert status == DEVICE and "\n" not in message
    expected = "no GPU device found" if GPU_LIBRARY.exists() else "GPU backend not built"
    assert message.startswith(expected), message


def test_engine_gpu_error_is_a_luce_error(tiny_path):
    with pytest.raises(LuceError) as info:
        Engine(tiny_path, device="gpu")
    assert info.value.status == DEVICE and "\n" not in str(info.value)


def test_auto_falls_back_to_the_cpu_with_identical_logits(tiny_path):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with Engine(tiny_path, device="auto", threads=1, ctx_size=64) as auto:
        assert auto.device == "cpu"
        got = auto.logits(ids)
    with Engine(tiny_path, device="cpu", threads=1, ctx_size=64) as cpu:
        want = cpu.logits(ids)
    np.testing.assert_array_equal(got, want)


def test_bad_gpu_index_is_an_argument_error(tiny_path):
    from luce.binding import ffi, lib

    L = lib()  # declares luce.h's types before ffi.new (as every caller must)
    m = ffi.new("luce_model **")
    params = ffi.new("luce_model_params *", {"device": 1, "n_threads": 1, "gpu_index": -1})
    assert L.luce_model_load(str(tiny_path).encode(), params, m) == 1  # INVALID_ARGUMENT
    assert "gpu_index" in ffi.string(L.luce_last_error()).decode()


def test_bad_luce_gpu_value_stops_configure(tmp_path):
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    proc = subprocess.run([cmake, "-S", str(REPO / "native"), "-B", str(tmp_path / "b"), "-DLUCE_GPU=metal"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "LUCE_GPU must be auto, cuda, hip or off (got 'metal')" in proc.stderr


KERNEL = r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\("
DEVICE_FUNCTION = r"__device__\s+(?:__forceinline__\s+)?void\s+(\w+)\s*\("


def _kernels(source: str, pattern: str = KERNEL):
    """(name, parameter names, body) of every __global__ function (or, with DEVICE_FUNCTION, every
    void __device__ function) in a CUDA/HIP source."""
    for m in re.finditer(pattern, source):
        i, depth = m.end(), 1
        while depth:  # past the parameter list
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        params = [re.findall(r"\w+", p)[-1] for p in source[m.end():i - 1].split(",") if p.strip()]
        start = source.index("{", i) + 1
        i, depth = start, 1
        while depth:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
        yield m.group(1), params, source[start:i - 1]


def test_every_kernel_waits_for_its_inputs_before_anything_else():
    """Programmatic dependent launch (gpu_compat.h) lets a kernel start while the one before it
    still runs: a kernel that returned or wrote through one of its parameters before
    wait_for_inputs() would race its predecessor on the GPU. Checked on the sources, since CI has
    no GPU to show the race (tools/gpu_check.py shows the results are right on an H200)."""
    kernels, device = {}, {}
    for path in sorted((REPO / "native" / "gpu").glob("*.cu")):
        for name, params, body in _kernels(path.read_text()):
            kernels[f"{path.name}:{name}"] = params, body
        for name, params, body in _kernels(path.read_text(), DEVICE_FUNCTION):
            device[name] = params, body
    assert len(kernels) >= 30, sorted(kernels)  # every op family's kernels were found

    def clean_before(where, params, head):
        code = re.sub(r"//[^\n]*", "", head)
        assert not re.search(r"\breturn\b", code), f"{where} may return before wait_for_inputs()"
        for name in params:  # p[i] = ..., p.y[i] = ..., *p = ..., p->f = ...
            store = rf"\b{name}(\.[\w.]+)?\s*\[[^;]*\]\s*=[^=]|(^|[;{{(\s])\*\s*{name}\s*=[^=]|\b{name}\s*->\s*\w+\s*=[^=]"
            assert not re.search(store, code), f"{where} writes through {name} before wait_for_inputs()"

    for where, (params, body) in kernels.items():
        head, sep, _ = body.partition("wait_for_inputs();")
        if not sep:
            # A kernel that hands its whole work to a __device__ function (several kernels sharing
            # one body): nothing before the call may return or write, and the function obeys the rule.
            calls = [c for c in re.findall(r"\b(\w+)\s*(?:<[^;()]*>)?\s*\(", re.sub(r"//[^\n]*", "", body))
                     if c in device]
            assert calls, f"{where} never calls wait_for_inputs()"
            clean_before(where, params, body.partition(calls[0])[0])
            where, (params, body) = f"{where} -> {calls[0]}", device[calls[0]]
            head, sep, _ = body.partition("wait_for_inputs();")
            assert sep, f"{where} never calls wait_for_inputs()"
        clean_before(where, params, head)


def test_hip_path_compiles_and_links_for_gfx1030(tmp_path):
    """The HIP path must not rot without an AMD GPU. Debian's hipcc (ROCm 5.2; `make
    test` installs it where it can: root on Debian, as on a CI machine) compiles every GPU source
    for gfx1030 (RDNA2, wave32 like the RDNA3/4 parts users run) and links libluce_gpu.so
    against the HIP runtime, exporting the backend's entry point."""
    if shutil.which("hipcc") is None:
        pytest.skip("no hipcc here: apt-get install hipcc (Debian; `make test` does it when run as root)")
    bin_dir = Path(sys.executable).parent  # the venv's cmake and ninja
    cmake = shutil.which("cmake", path=str(bin_dir)) or shutil.which("cmake")
    env = {**os.environ, "HIP_PLATFORM": "amd", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    build = tmp_path / "hip"
    for cmd in ([cmake, "-S", str(REPO / "native"), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 "-DLUCE_GPU=hip", "-DLUCE_GPU_ARCHS=gfx1030"],
                [cmake, "--build", str(build), "-j", "2", "--target", "luce_gpu"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    library = build / "libluce_gpu.so"
    assert [n for n in _needed(library) if "amdhip64" in n], _needed(library)
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                              check=True).stdout
    assert " T luce_gpu_open" in exported
