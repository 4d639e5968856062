"""The command: its arguments, the build-then-rerun step, and the order of the stages, each of
which is reported beside the others when it breaks."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench import bench, bench_matmul_kernels
from .device import REPO, WORK, ab_label, build, env, gpu_device_info, log
from .drafters import DRAFT_PROMPTS, check_drafters
from .graphs import check_graphs
from .kernel_checks import check_attention, check_deltanet, check_select
from .matmul import check_matmul_ops
from .models import check_model, fixture_models, memcheck, model_checks
from .report import write_report
from .sampling import check_rejection_sampling, check_sampling
from .spec_bench import bench_drafter, bench_reference_spec


# --help's first line, the first line of tools/gpu_check.py's docstring
DESCRIPTION = "Build, check and benchmark luce's GPU backend in one call (docs/gpu.md). Run on the GPU machine:"
STAGES = ("matmul", "attention", "select", "deltanet", "models", "graphs", "sampling", "rejection", "drafters")


def parse_stages(text: str) -> set[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names or names - set(STAGES):
        raise argparse.ArgumentTypeError(f"stages are {', '.join(STAGES)} (got {text!r})")
    return names


def parse_ab(text: str) -> dict[str, str]:
    """--ab's 'NAME=VALUE[,NAME=VALUE...]': environment settings of the GPU backend."""
    settings = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if not eq or not name.startswith("LUCE_"):
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: expected LUCE_NAME=VALUE")
        settings[name] = value
    return settings


def parse_kernel_shapes(text: str) -> list[tuple[str, int, int]]:
    """--kernel-shapes' 'TYPE:ROWSxCOLS[,...]', e.g. 'IQ2_XXS:17408x5120,Q2_K:5120x17408'."""
    shapes = []
    for item in text.split(","):
        type_name, _, dims = item.strip().partition(":")
        rows, _, cols = dims.partition("x")
        if not (type_name and rows.isdigit() and cols.isdigit()):
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: expected TYPE:ROWSxCOLS")
        shapes.append((type_name.upper(), int(rows), int(cols)))
    return shapes


def _stage(report: dict, key: str, what: str, measure, on_error) -> None:
    """report[key] = measure(), or on_error(message) if it raises: a stage that breaks is reported
    beside the others, and the run goes on."""
    log(what)
    try:
        report[key] = measure()
    except Exception as e:
        report[key] = on_error(f"{type(e).__name__}: {e}")


def _under(setting: dict[str, str], measure):
    with env(**setting):
        return measure()


def _failed_cases(field: str):
    return lambda message: [{field: "all", "error": message, "ok": False}]


def run(args, out: Path, build_info: dict | None) -> int:
    t_start = time.perf_counter()
    deadline = t_start + args.budget
    threads = os.cpu_count() or 4
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "host": f"{platform.node()} ({threads} cores)", "dut": args.dut, "build": build_info,
              "checks": [], "notes": []}
    if args.dut == "gpu":
        name, tensor_cores = gpu_device_info()
        report["device"] = f"{name} (tensor-core int8 matmuls: {'yes' if tensor_cores else 'no'})"
        if shutil.which("nvidia-smi"):
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True)
            report["device"] += f"; {q.stdout.strip()}"
    WORK.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "models")]  # the fixtures and generators every stage uses
    wanted = args.stages
    report["stages"] = sorted(wanted)
    models, notes = [], []
    if wanted & {"models", "graphs", "sampling"} or (args.dut == "gpu" and not args.no_memcheck):
        models, notes = fixture_models(Path(tempfile.mkdtemp(prefix="fixtures-", dir=WORK)))
    report["notes"] += notes
    report["matmul"] = []
    if "matmul" in wanted:
        _stage(report, "matmul", "matmul per weight type", lambda: check_matmul_ops(args.dut), _failed_cases("type"))
    report["matmul_ab"] = {}  # an A/B's settings must keep every bit too
    for setting in args.ab if "matmul" in wanted else ():
        _stage(report["matmul_ab"], ab_label(setting), f"matmul per weight type under {ab_label(setting)}",
               lambda: _under(setting, lambda: check_matmul_ops(args.dut)), _failed_cases("type"))
    if args.bench_shape != "none" and args.dut == "gpu":
        _stage(report, "kernels", "matmul kernel bench",
               lambda: bench_matmul_kernels(args.dut, deadline, args.ab, args.kernel_shapes),
               lambda message: [{"error": message}])
    matmul_rows = report["matmul"] + [m for rows in report["matmul_ab"].values() for m in rows]
    if args.only == "kernels":
        report["ok"] = all(m["ok"] for m in matmul_rows) and not any("error" in k for k in report.get("kernels", []))
        report["seconds"] = time.perf_counter() - t_start
        write_report(out, report)
        return 0 if report["ok"] else 1
    if "attention" in wanted:
        _stage(report, "attention", "attention kernels vs float64", lambda: check_attention(args.dut, timed=args.bench_shape != "none"),
               _failed_cases("case"))
    if "select" in wanted:
        _stage(report, "select", "argmax / top-k selection vs numpy", lambda: check_select(args.dut),
               _failed_cases("case"))
    if "deltanet" in wanted:
        _stage(report, "deltanet", "DeltaNet kernels vs float64", lambda: check_deltanet(args.dut),
               _failed_cases("case"))
    for label, path, mode, mode_tol in model_checks(models, args.models) if "models" in wanted else ():
        log(f"check {label} [{mode}]")
        try:
            report["checks"].append(check_model(label, path, mode_tol, args.dut, threads, mode))
        except Exception as e:
            report["checks"].append({"model": f"{label} [{mode}]", "error": f"{type(e).__name__}: {e}",
                                     "ok": False})
    if "graphs" in wanted:
        _stage(report, "graphs", "step graphs vs eager", lambda: check_graphs(models[0][1], args.dut, threads),
               lambda message: {"error": message, "ok": False})
    if "sampling" in wanted:
        _stage(report, "sampling", "seeded sampling vs the numpy sampler",
               lambda: check_sampling(models[0][1], args.dut, threads), _failed_cases("case"))
    if args.rejection_draws > 0 and "rejection" in wanted:
        _stage(report, "rejection", "rejection sampling's distribution (chi-square)",
               lambda: check_rejection_sampling(args.dut, threads, args.rejection_draws), _failed_cases("case"))
    if args.dut == "gpu" and not args.no_memcheck:
        log("memcheck")
        report["memcheck"] = memcheck(models[0][1])
    if args.bench_shape != "none":
        _stage(report, "bench", f"bench: synthetic {args.bench_shape}",
               lambda: bench(args.bench_shape, args.dut, threads, deadline, out / "gpu_profile.txt", args.ab),
               lambda message: {"shape": args.bench_shape, "mix": "iq4_xs", "bytes_per_token": 0, "error": message})
    if not args.no_drafters and "drafters" in wanted:  # after the target bench, with budgets of their own
        drafter_deadline = time.perf_counter() + args.drafter_budget
        report["drafters"] = check_drafters(args.dut, threads, WORK, drafter_deadline, args.drafter_prompts)
        if args.bench_shape != "none":
            _stage(report, "drafter_bench", "drafter bench",
                   lambda: bench_drafter(args.bench_shape, args.dut, threads, drafter_deadline, out / "gpu_profile.txt"),
                   lambda message: {"error": message})
        if args.ref_spec_budget > 0:
            _stage(report, "reference_spec", "reference speculative bench",
                   lambda: bench_reference_spec(args.dut, threads, time.perf_counter() + args.ref_spec_budget),
                   lambda message: [{"error": message}])
    report["ok"] = (all(c["ok"] for c in report["checks"] + matmul_rows + report.get("attention", [])
                        + report.get("select", []) + report.get("deltanet", []) + report.get("sampling", [])
                        + report.get("rejection", [])
                        + [report.get("graphs", {"ok": True})]
                        + report.get("drafters", []))
                    and not notes
                    and report.get("memcheck", {"ok": True})["ok"]) and "error" not in report.get("bench", {})
    report["seconds"] = time.perf_counter() - t_start
    write_report(out, report)
    return 0 if report["ok"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    ap.add_argument("--dut", choices=("gpu", "cpu"), default="gpu",
                    help="device under test (cpu: dry run of this script without a GPU)")
    ap.add_argument("--skip-build", action="store_true", help="use the luce installed for this python")
    ap.add_argument("--archs", default=os.environ.get("LUCE_GPU_ARCHS", "90"))
    ap.add_argument("--bench-shape", default="27b", choices=("27b", "0.8b", "tiny", "none"))
    ap.add_argument("--budget", type=float, default=330.0, help="seconds after which bench items are skipped")
    ap.add_argument("--no-memcheck", action="store_true", help="skip the compute-sanitizer pass")
    ap.add_argument("--no-drafters", action="store_true", help="skip the drafter checks and the drafter benches")
    ap.add_argument("--drafter-budget", type=float, default=90.0,
                    help="seconds for the drafter checks and bench, after the target bench")
    ap.add_argument("--drafter-prompts", type=int, default=DRAFT_PROMPTS,
                    help=f"prompts each drafter kind generates from in the drafter checks (default {DRAFT_PROMPTS})")
    ap.add_argument("--ref-spec-budget", type=float, default=90.0,
                    help="seconds for the reference pair's speculative bench, GPU against CPU (0: skip it)")
    ap.add_argument("--rejection-draws", type=int, default=1000,
                    help="seeded 3-token runs per drafter kind and setting in the rejection sampling check (0: skip)")
    ap.add_argument("--ab", type=parse_ab, action="append", default=[], metavar="LUCE_X=V[,...]",
                    help="also time the kernel bench's default choice, decode and the verify widths under these "
                         "backend settings (repeatable)")
    ap.add_argument("--only", choices=("all", "kernels"), default="all",
                    help="kernels: build, the per-type matmul checks and the matmul kernel bench only")
    ap.add_argument("--models", type=lambda text: [m.strip() for m in text.split(",") if m.strip()], default=None,
                    metavar="LABEL[,...]",
                    help="the fixture model checks to run, by label or 'label [fast|exact]' (default: all)")
    ap.add_argument("--stages", type=parse_stages, default=set(STAGES), metavar="NAME[,...]",
                    help=f"the check stages to run, of {', '.join(STAGES)} (default: all; the benches follow "
                         "--bench-shape)")
    ap.add_argument("--kernel-shapes", type=parse_kernel_shapes, default=None, metavar="TYPE:ROWSxCOLS[,...]",
                    help="the weight types and shapes the matmul kernel bench times (default: the 27B's)")
    ap.add_argument("--build-info", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_build:
        info = build(args.out, args.archs)
        # Continue in a fresh process that imports the luce just built (not the source tree).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([info["site"], os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--skip-build", "--out", str(args.out.resolve()),
               "--dut", args.dut, "--bench-shape", args.bench_shape, "--budget", str(args.budget),
               "--build-info", json.dumps(info), "--drafter-budget", str(args.drafter_budget), "--only", args.only,
               "--ref-spec-budget", str(args.ref_spec_budget), "--rejection-draws", str(args.rejection_draws),
               "--stages", ",".join(sorted(args.stages)), "--drafter-prompts", str(args.drafter_prompts)] \
            + (["--models", ",".join(args.models)] if args.models is not None else []) \
            + (["--kernel-shapes", ",".join(f"{t}:{r}x{c}" for t, r, c in args.kernel_shapes)]
               if args.kernel_shapes else []) \
            + [a for setting in args.ab for a in ("--ab", ab_label(setting))] \
            + (["--no-memcheck"] if args.no_memcheck else []) + (["--no-drafters"] if args.no_drafters else [])
        return subprocess.run(cmd, cwd="/", env=env).returncode
    return run(args, args.out, json.loads(args.build_info) if args.build_info else None)
