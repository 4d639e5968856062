"""Step cost of MTP drafting (`draft="mtp"`, k = 1..4 drafts per step) against a plain decode step,
on a random qwen35 file with an MTP block written by the test fixture (seeded), or any target.

A plain step is decode seconds per token of a plain run; an MTP step is (draft + verify + rollback)
seconds per spec step of a run that always drafts (adaptive off). Best of --rounds interleaved
rounds, since a shared machine's load moves between runs.

    .venv/bin/python tools/bench_mtp_steps.py [--threads 2] [-n 64] [--rounds 3] [--target T.gguf]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def random_target(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf.constants import GGMLQuantizationType as Q

    from fixtures.crafted_gguf import TinyQwen35
    from fixtures.random_qwen35_gguf import write_random_qwen35

    shape = TinyQwen35(hidden=1024, n_layer=8, interval=4, n_head=8, n_kv=2, head_dim=128, ff=3072, vocab=16384,
                       conv_kernel=4, state_size=128, group_count=4, time_step_rank=8)
    return write_random_qwen35(folder / "mtp-bench.gguf", shape, seed=3, weight_type=Q.Q8_0, mtp=True,
                               mtp_values="random")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from luce import Engine

    with tempfile.TemporaryDirectory() as tmp:
        target = args.target or random_target(Path(tmp))
        best: dict[str, float] = {}
        with Engine(target, threads=args.threads) as plain, Engine(target, threads=args.threads, draft="mtp") as mtp:
            for _ in range(args.rounds):
                s = plain.generate(prompt_ids=PROMPT, max_tokens=args.n, ignore_eos=True).stats
                best["plain"] = min(best.get("plain", 1e9), s["decode_seconds"] / (s["generated_tokens"] - 1))
                for k in (1, 2, 3, 4):
                    s = mtp.generate(prompt_ids=PROMPT, max_tokens=args.n, ignore_eos=True, draft_block_size=k,
                                     adaptive=False).stats
                    step = (s["draft_seconds"] + s["verify_seconds"] + s["rollback_seconds"]) / s["spec_steps"]
                    best[f"k={k}"] = min(best.get(f"k={k}", 1e9), step)
                    best[f"draft k={k}"] = min(best.get(f"draft k={k}", 1e9), s["draft_seconds"] / s["spec_steps"])
    plain_ms = best["plain"] * 1e3
    print(f"plain step {plain_ms:.2f} ms ({args.threads} threads, {target if args.target else 'random file'})")
    for k in (1, 2, 3, 4):
        ms, draft_ms = best[f"k={k}"] * 1e3, best[f"draft k={k}"] * 1e3
        print(f"MTP k={k}: step {ms:.2f} ms = {ms / plain_ms:.2f}x plain (drafting {draft_ms:.2f} ms)")


if __name__ == "__main__":
    main()
