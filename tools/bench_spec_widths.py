"""Speculative decode tok/s against plain decoding, per drafter, prompt set and block size (fixed
widths and auto), for docs/benchmarks.md.

On a machine shared with other work a run's speed moves with the load, so the configurations of
one drafter and prompt set run interleaved, round after round (plain, 4, 8, 16, auto, plain, ...),
and each reports its best round: the run least disturbed by others. One unmeasured round first
loads every code path and fills the cost cache (as a user's first run would), in a folder of its
own so earlier runs do not count.

    .venv/bin/python tools/bench_spec_widths.py [--rounds 7] [--prompts 4] [-n 128]

On a GPU machine, for any target and drafter (the 27B file with a random drafter, say):

    python3 tools/bench_spec_widths.py --device gpu --target T.gguf --drafter random=D.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent.parent / "models" / "reference"
DRAFTERS = ("dflash", "dflash2", "dspark")
SETS = {"code (HumanEval)": "code.jsonl", "prose (essays)": "prose.jsonl"}
WIDTHS = (4, 8, 16, "auto")


def load_prompts(name: str, n: int) -> list[str]:
    lines = (REFERENCE / "prompts" / name).read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()][:n]


def decode_tok_s(engine, prompts: list[str], n: int, **kw) -> tuple[float, dict]:
    """Tokens per second over the decode phases of every prompt (the first token comes out of
    prefill and is not counted, as in the stats), and the last run's stats."""
    tokens, seconds, stats = 0, 0.0, {}
    for prompt in prompts:
        stats = engine.generate(prompt, max_tokens=n, ignore_eos=True, **kw).stats
        tokens += stats["generated_tokens"] - 1
        seconds += stats["decode_seconds"]
    return tokens / seconds, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=4, help="prompts of each set")
    ap.add_argument("-n", type=int, default=128, help="tokens per prompt")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--target", type=Path, default=REFERENCE / "target-q8_0.gguf")
    ap.add_argument("--drafter", action="append", default=[], metavar="NAME=PATH",
                    help="a drafter to run (repeatable); default: the three reference drafters")
    ap.add_argument("--ctx-size", type=int, default=0, help="0: the engine's default")
    args = ap.parse_args()
    drafters = [d.partition("=")[::2] for d in args.drafter] or [
        (name, str(REFERENCE / f"{name}-q8_0.gguf")) for name in DRAFTERS]
    os.environ["LUCE_CACHE_DIR"] = tempfile.mkdtemp(prefix="luce-bench-cache-")
    os.environ["LUCE_COST_CACHE"] = "1"
    from luce import Engine

    print(f"| drafter | prompts | plain tok/s | " + " | ".join(f"block {w}" for w in WIDTHS)
          + " | auto chose | auto vs best fixed |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in WIDTHS) + " | --- | ---: |")
    extra = {"ctx_size": args.ctx_size} if args.ctx_size else {}
    for drafter, draft_path in drafters:
        with Engine(args.target, device=args.device, threads=args.threads, draft=draft_path, **extra) as eng:
            for label, file in SETS.items():
                prompts = load_prompts(file, args.prompts)
                # A fixed width past the drafter's limit (2x its checkpoint's: DSpark's 7 allows 14)
                # runs at that limit.
                limit = 2 * eng.draft_info.block_size
                configs = [("plain", {"speculative": False})] + [
                    (w, {"draft_block_size": w if w == "auto" else min(w, limit)}) for w in WIDTHS]
                best = {name: 0.0 for name, _ in configs}
                last = {}
                for r in range(args.rounds + 1):
                    for name, kw in configs:
                        speed, stats = decode_tok_s(eng, prompts, args.n, **kw)
                        if r > 0:  # round 0 warms up and fills the cost cache
                            best[name] = max(best[name], speed)
                            last[name] = stats
                plain = best["plain"]
                cells = [f"{best[w]:.0f} ({best[w] / plain:.2f}x)" + ("" if w == "auto" or w <= limit else f" [{limit}]")
                         for w in WIDTHS]
                fixed = max(best[w] for w in WIDTHS if w != "auto")
                auto = last["auto"]
                chose = (f"block {auto['block_size']}, {auto['spec_steps']} spec + {auto['plain_steps']} plain steps"
                         f" (last prompt)")
                print(f"| {drafter} | {label} | {plain:.0f} | " + " | ".join(cells)
                      + f" | {chose} | {best['auto'] / fixed:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
