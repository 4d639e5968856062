"""The reference pair over all held-out code prompts: tau, acceptance and tok/s of plain decoding,
DFlash 2 (block 16, chain) and the target's own MTP block at k = 1..4 drafts, greedy.

    make reference-mtp && python3 tools/reference_pair.py [--threads 2] [-n 96]

Every speculative run must commit the plain run's tokens (asserted). tau = committed tokens per
verify step including the bonus token; acceptance = accepted / drafted. tok/s is generated tokens
over generate() wall time, prefill included, so it is the user's view, not a step cost.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from luce import Engine

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "models" / "reference"
WORK = ROOT / "models" / "work"


def run(path, prompts, n, threads, draft=None, **kw):
    accepted = drafted = steps = tokens = 0
    seconds, outs = 0.0, []
    with Engine(path, threads=threads, draft=draft) as eng:
        for p in prompts:
            t0 = time.perf_counter()
            g = eng.generate(p, max_tokens=n, ignore_eos=True, **kw)
            seconds += time.perf_counter() - t0
            outs.append(g.tokens)
            tokens += len(g.tokens)
            if draft:
                accepted += g.stats["n_accepted"]
                drafted += g.stats["n_drafted"]
                steps += g.stats["spec_steps"]
    res = {"tok_s": round(tokens / seconds, 1)}
    if draft:
        res |= {"tau": round((accepted + steps) / steps, 3), "acceptance": round(accepted / drafted, 3)}
    return res, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=96)
    args = ap.parse_args()
    prompts = [json.loads(line)["prompt"] for line in (REF / "prompts" / "code.jsonl").read_text().splitlines()]
    target, pair = REF / "target-q8_0.gguf", WORK / "reference-target-mtp-q8_0.gguf"
    dflash2 = WORK / "reference-dflash2-q8_0.gguf"
    for need, make in ((pair, "make reference-mtp"), (dflash2, "make demo")):
        if not need.is_file():
            raise SystemExit(f"error: {need} not found ({make})")
    out = {}
    out["plain"], ref = run(target, prompts, args.n, args.threads)
    runs = [("dflash2 b16", target, str(dflash2), {})] + \
           [(f"mtp k={k}", pair, "mtp", {"draft_block_size": k}) for k in (1, 2, 3, 4)]
    for name, path, draft, kw in runs:
        out[name], tokens = run(path, prompts, args.n, args.threads, draft, adaptive=False, **kw)
        assert tokens == ref, f"{name}: not the plain greedy tokens"
    print(json.dumps({"prompts": len(prompts), "tokens_each": args.n, "threads": args.threads, **out}, indent=1))


if __name__ == "__main__":
    main()
