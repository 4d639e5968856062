"""What every stage shares: paths, the environment switches of the backends, the log line, the
build, the C test hooks of libluce / libluce_gpu, plain generation through the C ABI, and the device
measurements (copy bandwidth, memory, step timing) the benches report."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("LUCE_CHECK_WORK", "/tmp/luce-gpu-check"))
WHEELS = REPO / ".whl"
NEEDED_MODULES = {"gguf": ["gguf"], "cffi": ["cffi", "pycparser"]}  # module -> wheels to install


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


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


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


MAX_STEP = 64  # session.h: the widest verify step; wider steps are prefill chunks


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


def ab_label(setting: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())
