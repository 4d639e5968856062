"""Runs the three fuzz targets for a fixed number of executions each and reports what they did.

    python tests/fuzz/run_fuzz.py [--runs-native N] [--runs-gguf N] [--runs-safetensors N] [--jobs 2]
                                  [--native build/fuzz/luce_fuzz_native] [--work build/fuzz-work]

`make fuzz` calls this. Each target starts from its committed seeds (tests/fuzz/corpus/<target>/,
copied into --work/<target>/, where the corpus grows; the committed seeds are never rewritten)
with a fixed libFuzzer seed, a 10 s per-input timeout (a hang is a finding) and a 2 GiB RSS cap.
A finding is written to --work/<target>/findings/ and the run of that target stops. Prints one
line per target (executions, seconds, corpus size, findings) and writes --work/summary.json;
exits 1 if any target found something. SIGINT to a fuzzer stops that target early, counted.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
INTERRUPTED = (72, -2, 130)   # exit after SIGINT: libFuzzer's own code; atheris (Python) dies of it
COMMON_FLAGS = ["-seed=1", "-timeout=10", "-rss_limit_mb=2048", "-max_len=65536", "-print_final_stats=1"]


def run_target(name: str, cmd: list[str], runs: int, work: Path, env: dict) -> dict:
    corpus = work / name
    findings = corpus / "findings"
    findings.mkdir(parents=True, exist_ok=True)
    for seed in (HERE / "corpus" / name).iterdir():
        shutil.copy(seed, corpus / seed.name)
    log = work / f"{name}.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run([*cmd, str(corpus), f"-runs={runs}", f"-artifact_prefix={findings}/",
                               *COMMON_FLAGS], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    seconds = time.monotonic() - t0
    text = log.read_text(errors="replace")
    # libFuzzer's final stats; after a SIGINT atheris prints none: then its last status line
    # ("#N ..."), a lower bound.
    executed = [int(x) for x in re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)] or \
        [int(x) for x in re.findall(r"^#(\d+)\s", text, flags=re.M)]
    found = sorted(p.name for p in findings.iterdir())
    return {"target": name, "executions": executed[-1] if executed else None, "seconds": round(seconds, 1),
            "corpus": sum(1 for p in corpus.iterdir() if p.is_file()), "findings": found,
            "exit_code": proc.returncode, "interrupted": proc.returncode in INTERRUPTED, "log": str(log)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-native", type=int, default=2_200_000)
    ap.add_argument("--runs-gguf", type=int, default=456_000)
    ap.add_argument("--runs-safetensors", type=int, default=7_500_000)
    ap.add_argument("--jobs", type=int, default=2, help="targets run at once (the first gets a lane to itself)")
    ap.add_argument("--native", type=Path, default=REPO / "build" / "fuzz" / "luce_fuzz_native")
    ap.add_argument("--work", type=Path, default=REPO / "build" / "fuzz-work")
    ap.add_argument("--only", choices=["native_loader", "gguf", "safetensors"], action="append")
    args = ap.parse_args()

    env = dict(os.environ, LUCE_FUZZ_TARGET=str(HERE / "corpus" / "native_loader" / "target-tiny.gguf"),
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    python = sys.executable
    targets = {"native_loader": ([str(args.native)], args.runs_native),
               "gguf": ([python, str(HERE / "fuzz_gguf.py")], args.runs_gguf),
               "safetensors": ([python, str(HERE / "fuzz_safetensors.py")], args.runs_safetensors)}
    chosen = [(name, cmd, runs) for name, (cmd, runs) in targets.items()
              if (not args.only or name in args.only) and runs > 0]

    def one(item):
        name, cmd, runs = item
        r = run_target(name, cmd, runs, args.work, env)
        print(f"{name:14s} {r['executions'] or 0:>11,d} executions in {r['seconds']:>7.1f} s, corpus {r['corpus']}, "
              f"findings: {', '.join(r['findings']) or 'none'}{' (interrupted)' if r['interrupted'] else ''}",
              flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one, chosen))
    total = sum(r["executions"] or 0 for r in results)
    print(f"{'total':14s} {total:>11,d} executions")
    (args.work / "summary.json").write_text(json.dumps({"results": results, "total_executions": total,
                                                       "argv": sys.argv[1:]}, indent=1))
    return 1 if any(r["findings"] or r["exit_code"] not in (0, *INTERRUPTED) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
