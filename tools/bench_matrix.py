#!/usr/bin/env python3
"""The GPU benchmark matrix: luce beside llama.cpp on 27B files in the recipes users download.

    python3 tools/bench_matrix.py --peer-llama-cpp build/peer-cuda/bin      # or: make bench-gpu

For each mix (models/synthetic_qwen35.py; default: llama-quantize's IQ4_XS, Q4_K_M and Q8_0, IQ4_XS
with its small DeltaNet projections F32, Q8_0 and BF16, an unsloth-style UD-Q4_K_XL) it writes the
27B-shaped file (seeded, ~15-29 GB), then measures on the same file in the same run:
- luce (`luce bench` underneath): tg128, and pp1/2/4/8/16/32 (prompts of a verify's widths),
  pp512 and pp2048, from an empty context, as llama-bench counts them;
- the floor: the weight bytes one decode step reads / the device copy bandwidth measured once
  per run (bytes read + written);
- DFlash 2 (a random drafter of the published Qwen3.8 shape, models/synthetic_drafter.py): a
  whole speculative step at block 8 and 16 with every draft rejected (draft, verify, rollback)
  against a plain step, and a 16-row verify step as the loop runs it, against a plain step;
- many sequences at once (--parallel, default 1,8,32,64): aggregate decode tok/s of tg128, each
  sequence after its own 512-token prompt (`luce bench --parallel`: the batch runtime);
- llama.cpp, when given a CUDA build (--peer-llama-cpp DIR holding llama-bench,
  llama-speculative-simple and llama-batched-bench): `llama-bench -fa 1 -ngl 99` with the same
  tests, `llama-speculative-simple --spec-type draft-dflash --spec-draft-n-max 7 / 15` with the
  same drafter, and `llama-batched-bench -npp 512 -ntg 128 -npl ...` (its S_TG) for the batches.
Then deletes the file (--keep-files keeps it) and goes on. Writes matrix.json and matrix.md to
--out ($OUT by default). Performance numbers only: nothing here asserts a speed.
`--dut cpu --shape tiny` runs the same script on a CPU machine (its dry run; CI runs it).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tools"), str(REPO / "models")]

import gpu_check  # noqa: E402  (its build, bandwidth and speculative-step helpers)
import synthetic_drafter  # noqa: E402
import synthetic_qwen35 as synth  # noqa: E402

DEFAULT_MIXES = ("lq-iq4_xs", "lq-q4_k_m", "lq-q8_0", "lq-iq4_xs-small-f32", "ud-q4_k_xl",
                 "lq-iq4_xs-small-q8_0", "lq-iq4_xs-small-bf16")
PROMPT_WIDTHS = (1, 2, 4, 8, 16, 32, 512, 2048)
GEN_TOKENS = 128
SPEC_BLOCKS = (8, 16)
SPEC_TOKENS = 64
PARALLEL_DEPTH = 512  # each batched sequence's own prompt
DEFAULT_PARALLEL = "1,8,32,64"
PEER_TIMEOUT_S = 300
PEER_LABEL = "llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36; make peer-gpu)"


def log(msg: str) -> None:
    print(f"[bench-matrix {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- files ------------------------------------------------------------------------------------

def target_file(work: Path, shape: str, mix: str) -> tuple[Path, float]:
    """The mix's file (generated unless present) and the seconds generating it took."""
    path = work / f"synthetic-{shape}-{mix}.gguf"
    if path.exists():
        return path, 0.0
    t0 = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    synth.write(tmp, synth.SHAPES[shape], mix, mtp=False, log=None)
    tmp.rename(path)
    return path, time.perf_counter() - t0


def drafter_file(work: Path, shape: str) -> Path | None:
    if shape not in synthetic_drafter.SHAPES:
        return None
    path = work / f"synthetic-dflash2-{shape}.gguf"
    if not path.exists():
        synthetic_drafter.write(path.with_suffix(".tmp"), synthetic_drafter.SHAPES[shape])
        path.with_suffix(".tmp").rename(path)
    return path


# ---- luce -------------------------------------------------------------------------------------

def luce_tests(path: Path, dut: str, reps: int) -> dict:
    """{test: tok/s} for pp at every PROMPT_WIDTHS and tg128, as `luce bench` measures them."""
    from luce import bench

    tests = bench.tests_from(PROMPT_WIDTHS, (GEN_TOKENS,))
    rows = bench.bench_luce(path, tests, [0], dut, reps, warmup=True)
    return {r.test: round(r.tok_s, 2) for r in rows} | {"peak_mib": round(max(r.peak_mib for r in rows), 1)}


def luce_parallel(path: Path, dut: str, reps: int, parallel: list[int]) -> dict:
    """{sequences: aggregate tok/s} of tg128 after a PARALLEL_DEPTH-token prompt per sequence."""
    from luce import bench

    rows = bench.bench_parallel(path, [GEN_TOKENS], PARALLEL_DEPTH, parallel, [0], dut, reps, warmup=True)
    return {str(r.parallel): round(r.tok_s, 2) for r in rows}


def luce_speculative(target: Path, drafter: Path, dut: str) -> dict:
    """A DFlash 2 step at each SPEC_BLOCKS block with every draft rejected, and a verify of 16 rows
    as the loop runs it, each against a plain step (gpucheck.spec_bench.bench_drafter's method)."""
    import numpy as np

    from luce import Engine

    res: dict = {}
    with Engine(target, device=dut, threads=os.cpu_count() or 4, ctx_size=1024, draft=drafter) as eng:
        ids = np.random.default_rng(4).integers(0, eng.info.n_vocab, 64).tolist()
        kw = dict(prompt_ids=ids, ignore_eos=True, adaptive=False)
        eng.generate(**kw, max_tokens=4, draft_block_size=SPEC_BLOCKS[0])  # warm-up
        st = eng.generate(**kw, max_tokens=SPEC_TOKENS, speculative=False).stats
        plain_ms = 1e3 * st["decode_seconds"] / max(1, st["generated_tokens"] - 1)
        res["plain_ms"] = round(plain_ms, 3)
        for block in SPEC_BLOCKS:
            st = eng.generate(**kw, max_tokens=SPEC_TOKENS, draft_block_size=block).stats
            n = max(1, st["spec_steps"])
            step_ms = 1e3 * (st["decode_seconds"] - st["plain_steps"] * plain_ms / 1e3) / n
            res[f"block{block}"] = {"step_ms": round(step_ms, 3), "x_plain": round(step_ms / plain_ms, 3),
                                    "tau": st["tau"]}
        verify = gpu_check._loop_verify(eng, {**kw, "draft_block_size": 16}, 16, plain_ms)
        res["verify16"] = {"ms": round(verify["verify_ms"], 3), "x_plain": round(verify["x_plain"], 3)}
    return res


# ---- llama.cpp --------------------------------------------------------------------------------

def peer_tests(peer: Path, path: Path, reps: int) -> dict:
    """{test: tok/s} from llama-bench on the same file and tests (flash attention, all layers on the GPU)."""
    cmd = [str(peer / "llama-bench"), "-m", str(path), "-p", ",".join(map(str, PROMPT_WIDTHS)),
           "-n", str(GEN_TOKENS), "-fa", "1", "-ngl", "99", "-r", str(reps), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    if proc.returncode != 0:
        return {"error": _last_line(proc.stderr or proc.stdout)}
    res = {}
    for run in json.loads(proc.stdout):
        test = f"pp{run['n_prompt']}" if run["n_gen"] == 0 else f"tg{run['n_gen']}"
        res[test] = round(run["avg_ts"], 2)
        res["device"] = run.get("gpu_info") or run.get("cpu_info") or "?"
    return res


def peer_parallel(peer: Path, path: Path, parallel: list[int]) -> dict:
    """{sequences: S_TG} from llama-batched-bench on the same file: every sequence its own
    PARALLEL_DEPTH-token prompt (not shared), then GEN_TOKENS decoded by all at once."""
    cmd = [str(peer / "llama-batched-bench"), "-m", str(path), "-c", str(max(parallel) * (PARALLEL_DEPTH + GEN_TOKENS)),
           "-b", "2048", "-ub", "512", "-npp", str(PARALLEL_DEPTH), "-ntg", str(GEN_TOKENS),
           "-npl", ",".join(map(str, parallel)), "-ngl", "99", "-fa", "on", "--output-format", "jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    out = proc.stdout + "\n" + proc.stderr
    res = {str(run["pl"]): round(run["speed_tg"], 2)
           for run in (json.loads(line) for line in out.splitlines() if line.startswith('{"n_kv_max"'))}
    if proc.returncode != 0 or not res:
        res["error"] = _first_error(out)
    return res


def peer_speculative(peer: Path, target: Path, drafter: Path, plain_tok_s: float | None) -> dict:
    """llama-speculative-simple with the same drafter: ms per decoded token over its steps, and a
    step against llama-bench's plain tg step. Every draft of a random drafter is rejected, so
    each step commits one token, as in luce_speculative."""
    res = {}
    for block in SPEC_BLOCKS:
        cmd = [str(peer / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter),
               "--spec-type", "draft-dflash", "--spec-draft-n-max", str(block - 1), "-ngl", "99", "-ngld", "99",
               "-fa", "on", "--temp", "0", "-n", str(SPEC_TOKENS), "-p", "def fibonacci(n):"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
        out = proc.stdout + proc.stderr
        decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
        if proc.returncode != 0 or not decoded:
            res[f"block{block}"] = {"error": _first_error(out)}
            continue
        accepted = re.search(r"n_accept\s*=\s*(\d+)", out)
        n, seconds = int(decoded.group(1)), float(decoded.group(2))
        steps = max(1, n - (int(accepted.group(1)) if accepted else 0))
        step_ms = 1e3 * seconds / steps
        res[f"block{block}"] = {"step_ms": round(step_ms, 3),
                                "x_plain": round(step_ms * plain_tok_s / 1e3, 3) if plain_tok_s else None}
    return res


def _first_error(text: str) -> str:
    """llama.cpp's first error line without its timestamp ('0.02.368.499 E ...'), else the last line."""
    for line in text.splitlines():
        m = re.match(r"^[\d.]+ E (.*)", line.strip())
        if m:
            return m.group(1)[:300]
    return _last_line(text)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


# ---- the run ----------------------------------------------------------------------------------

def measure_mix(mix: str, args, bandwidth: float | None, drafter: Path | None) -> dict:
    log(f"{mix}: generating")
    path, gen_s = target_file(args.work, args.shape, mix)
    row: dict = {"mix": mix, "file_gib": round(path.stat().st_size / 2**30, 2), "generate_seconds": round(gen_s, 1),
                 "bytes_per_token": gpu_check.decode_bytes_per_token(path)}
    if bandwidth:
        row["floor_ms"] = round(1e3 * row["bytes_per_token"] / bandwidth, 3)
    try:
        log(f"{mix}: luce")
        row["luce"] = luce_tests(path, args.dut, args.reps)
        if args.parallel:
            log(f"{mix}: luce, {args.parallel} sequences at once")
            row["luce_parallel"] = luce_parallel(path, args.dut, args.reps, args.parallel)
        if drafter:
            log(f"{mix}: luce DFlash 2")
            row["luce_spec"] = luce_speculative(path, drafter, args.dut)
        if args.peer_llama_cpp:
            log(f"{mix}: llama.cpp")
            row["peer"] = peer_tests(args.peer_llama_cpp, path, args.reps)
            if args.parallel and (args.peer_llama_cpp / "llama-batched-bench").exists():
                row["peer_parallel"] = peer_parallel(args.peer_llama_cpp, path, args.parallel)
            if drafter:
                row["peer_spec"] = peer_speculative(args.peer_llama_cpp, path, drafter,
                                                    row["peer"].get(f"tg{GEN_TOKENS}"))
    except Exception as e:  # one mix failing must not lose the others' rows
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if not args.keep_files:
            path.unlink()
    return row


def ratios(row: dict) -> dict:
    """luce / llama.cpp per test, and decode against the floor."""
    luce, peer = row.get("luce", {}), row.get("peer", {})
    out = {t: round(luce[t] / peer[t], 2) for t in luce if isinstance(peer.get(t), float) and peer[t] > 0}
    tg = luce.get(f"tg{GEN_TOKENS}")
    if tg and row.get("floor_ms"):
        out["floor_fraction"] = round(row["floor_ms"] * tg / 1e3, 3)
    return out


def write_markdown(report: dict, path: Path) -> None:
    tg = f"tg{GEN_TOKENS}"
    lines = [f"# luce GPU benchmark matrix ({report['date']})", "",
             f"Device: {report['device']}. Copy bandwidth {report['bandwidth_tb_s']} TB/s. luce {report['commit']}; "
             f"peer: {report.get('peer_build') or 'not run'}.", f"Command: `{report['command']}`", "",
             "## Decode and prefill (tok/s; ratio = luce / llama.cpp)", "",
             f"| mix | GiB | floor ms | luce {tg} | % of floor | llama.cpp {tg} | ratio | luce pp512 | llama.cpp | ratio "
             "| luce pp2048 | llama.cpp | ratio |", "|---|" + "---:|" * 12]
    for row in report["rows"]:
        luce, peer, r = row.get("luce", {}), row.get("peer", {}), row.get("ratios", {})
        if "error" in row and not luce:
            lines.append(f"| {row['mix']} | {row['file_gib']} | error: {row['error']} |" + " |" * 10)
            continue
        cells = [row["mix"], row["file_gib"], row.get("floor_ms", ""), luce.get(tg, ""),
                 f"{100 * r['floor_fraction']:.0f} %" if "floor_fraction" in r else ""]
        for test in (tg, "pp512", "pp2048"):
            if test != tg:
                cells.append(luce.get(test, ""))
            cells += [peer.get(test, ""), f"{r[test]:.2f}" if test in r else ""]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    small = [f"pp{w}" for w in PROMPT_WIDTHS if w <= 32]
    lines += ["", "## Small prompts, the widths a verify step has (luce tok/s / llama.cpp tok/s)", "",
              "| mix | " + " | ".join(small) + " |", "|---|" + "---:|" * len(small)]
    for row in report["rows"]:
        luce, peer = row.get("luce", {}), row.get("peer", {})
        lines.append(f"| {row['mix']} | " + " | ".join(f"{luce.get(t, '')} / {peer.get(t, '')}" for t in small) + " |")
    lines += ["", "## DFlash 2 steps (random drafter, every draft rejected; x = one plain step)", "",
              "| mix | luce plain ms | luce block 8 | luce block 16 | luce verify 16 | llama.cpp block 8 "
              "| llama.cpp block 16 |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        spec, peer = row.get("luce_spec", {}), row.get("peer_spec", {})

        def cell(d: dict, key: str) -> str:
            v = d.get(key, {})
            return v.get("error", "")[:60] if "error" in v else (f"{v['step_ms']} ms, {v['x_plain']}x" if v else "")
        verify = spec.get("verify16", {})
        lines.append(f"| {row['mix']} | {spec.get('plain_ms', '')} | {cell(spec, 'block8')} | {cell(spec, 'block16')} | "
                     + (f"{verify['ms']} ms, {verify['x_plain']}x" if verify else "")
                     + f" | {cell(peer, 'block8')} | {cell(peer, 'block16')} |")
    lines += parallel_table(report)
    path.write_text("\n".join(lines) + "\n")


def parallel_table(report: dict) -> list[str]:
    """Aggregate decode tok/s by number of sequences; x np1 = over luce's own single sequence."""
    if not any("luce_parallel" in row for row in report["rows"]):
        return []
    lines = ["", f"## Many sequences at once (aggregate tg{GEN_TOKENS} tok/s, a {PARALLEL_DEPTH}-token prompt each; "
             "llama.cpp: llama-batched-bench S_TG)", "",
             "| mix | sequences | luce | x luce np1 | llama.cpp | ratio |", "|---|---:|---:|---:|---:|---:|"]
    for row in report["rows"]:
        luce, peer = row.get("luce_parallel", {}), row.get("peer_parallel", {})
        for n, tok_s in luce.items():
            one, theirs = luce.get("1"), peer.get(n)
            lines.append(f"| {row['mix']} | {n} | {tok_s} | " + (f"{tok_s / one:.2f}" if one else "")
                         + f" | {theirs if theirs is not None else peer.get('error', '')[:60]} | "
                         + (f"{tok_s / theirs:.2f}" if isinstance(theirs, float) and theirs > 0 else "") + " |")
    return lines


def git_commit() -> str:
    """The commit measured; '-dirty' when the tree differs from it (a tree copied to a GPU machine
    may carry an older .git than its files: then say which commit the files are in the notes)."""
    proc = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixes", default=",".join(DEFAULT_MIXES), help="comma-separated synthetic_qwen35 mixes")
    ap.add_argument("--peer-llama-cpp", type=Path, default=None, metavar="DIR",
                    help="a llama.cpp build's bin/ (llama-bench, llama-speculative-simple) to run on the same files")
    ap.add_argument("--peer-label", default=PEER_LABEL, help="how the report names the peer build")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench-matrix-out"))
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("LUCE_CHECK_WORK", "/tmp/luce-gpu-check")),
                    help="where the model files are written (each is deleted after its row)")
    ap.add_argument("--shape", default="27b", choices=sorted(synth.SHAPES))
    ap.add_argument("--dut", default="gpu", choices=("gpu", "cpu"), help="cpu: the script's dry run")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per test, both tools")
    ap.add_argument("--no-drafter", dest="drafter", action="store_false", help="skip the DFlash 2 columns")
    ap.add_argument("--parallel", default=DEFAULT_PARALLEL, metavar="LIST",
                    help="numbers of sequences decoding at once for the batched columns ('' skips them)")
    ap.add_argument("--keep-files", action="store_true", help="keep each mix's file after its row")
    ap.add_argument("--skip-build", action="store_true", help="use the luce installed for this python")
    ap.add_argument("--archs", default=os.environ.get("LUCE_GPU_ARCHS", "90"), help="CUDA architectures to build")
    args = ap.parse_args(argv)
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    try:
        args.parallel = [int(x) for x in args.parallel.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--parallel {args.parallel!r}: a comma-separated list of numbers of sequences")
    if any(not 1 <= n <= 64 for n in args.parallel):
        ap.error("--parallel: each number of sequences must be in 1..64")
    unknown = sorted(set(mixes) - set(synth.MIXES))
    if unknown:
        ap.error(f"unknown mix {', '.join(unknown)} (known: {', '.join(synth.MIXES)})")
    if args.peer_llama_cpp and not (args.peer_llama_cpp / "llama-bench").exists():
        ap.error(f"--peer-llama-cpp: no llama-bench in {args.peer_llama_cpp}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.dut == "gpu" and not args.skip_build:  # gpu_check's build, then this script again on it
        info = gpu_check.build(args.out, args.archs)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([info["site"], os.environ.get("PYTHONPATH", "")])}
        rest = argv if argv is not None else sys.argv[1:]
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--skip-build", *rest], env=env).returncode
    device = gpu_check.gpu_device_info()[0] if args.dut == "gpu" else f"CPU ({platform.processor() or 'host'})"
    bandwidth = gpu_check.copy_bandwidth() if args.dut == "gpu" else None
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "device": device, "bandwidth_tb_s": round(bandwidth / 1e12, 2) if bandwidth else "not measured",
              "commit": git_commit(), "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
              "shape": args.shape, "rows": []}
    drafter = drafter_file(args.work, args.shape) if args.drafter else None
    for mix in mixes:
        row = measure_mix(mix, args, bandwidth, drafter)
        row["ratios"] = ratios(row)
        report["rows"].append(row)
        if "peer" in row:
            report["peer_build"] = args.peer_label
        (args.out / "matrix.json").write_text(json.dumps(report, indent=1))  # after every row: nothing lost
        write_markdown(report, args.out / "matrix.md")
    print((args.out / "matrix.md").read_text())
    return 0 if not any("error" in row for row in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
