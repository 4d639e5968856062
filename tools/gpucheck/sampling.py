"""Stages "sampling" and "rejection": seeded sampling on the device against the numpy sampler of
tests/fixtures/sampler_oracle.py, and speculative rejection sampling's pair distribution against
the target's own (chi-square, tests/fixtures/rejection_check.py)."""
from __future__ import annotations

import json
from pathlib import Path

from .device import REPO
from .drafters import DRAFT_KINDS


SAMPLING_SETTINGS = ((0.8, 20, 0.8), (0.8, 40, 1.0), (0.8, 0, 0.9), (1.0, 0, 1.0))  # temperature, top-k, top-p
SAMPLING_TOKENS = 16


def check_sampling(path: Path, dut: str, threads: int) -> list[dict]:
    """Seeded sampled generation on the device under test against the numpy sampler of
    tests/fixtures/sampler_oracle.py, replayed with one RNG over the rows the generation drew from
    (the prompt's prefill row, then one-token steps): the same ids. With a top-k the device ranks
    each decode step's row (topk_rows) and only the candidates come back, so this also holds the
    device's ranking to the sampler's order, ties to the lower id."""
    import numpy as np

    from fixtures.native_eval import decode_step_logits
    from fixtures.sampler_oracle import Xoshiro256, oracle_draw
    from luce import Engine

    rows_out = []
    with Engine(path, device=dut, threads=threads) as eng:
        prompt = np.random.default_rng(23).integers(0, eng.info.n_vocab, 12).tolist()
        for seed, (temperature, top_k, top_p) in enumerate(SAMPLING_SETTINGS):
            got = eng.generate(prompt_ids=prompt, max_tokens=SAMPLING_TOKENS, temperature=temperature, top_k=top_k,
                               top_p=top_p, seed=seed, ignore_eos=True).tokens
            rows = decode_step_logits(eng, prompt + got, len(prompt), len(got) - 1)
            rng = Xoshiro256(seed)
            want = [oracle_draw(row, temperature, top_k, top_p, rng) for row in rows]
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
            rows_out.append({"case": f"{path.name}: temperature {temperature}, top-k {top_k}, top-p {top_p}",
                             "tokens": len(got), "first_diff": first, "ok": first is None and len(got) == len(want)})
    return rows_out


# Rejection sampling on the device (tests/fixtures/rejection_check.py): the reference pair's
# trained drafters propose close to the target, so drafts are both accepted and rejected, and the
# (t0, t1) pairs must follow the target's own distribution. Top-k 3: p and q are the device's top-k
# candidates (topk_rows on the verify and the proposal rows); a nucleus without top-k: whole rows
# come back to the host. The prompt, the first REJECTION_PROMPT_TOKENS tokens of the first held-out
# code prompt, was picked where the target hesitates (9 and ~40 likely pairs) and all three
# drafters get a third or more of their first drafts accepted (2026-12-05, CPU backend).
REJECTION_SETTINGS = {"top-k 3": (1.0, 3, 1.0), "top-p 0.9": (0.6, 0, 0.9)}
# Chain verification at both settings; DDTree (the target's draws walked down a tree) at top-k 3.
REJECTION_CASES = [(item, False) for item in REJECTION_SETTINGS.items()] + [(("top-k 3", (1.0, 3, 1.0)), True)]
REJECTION_PROMPT_TOKENS = 16
REJECTION_PVALUE = 1e-3


def check_rejection_sampling(dut: str, threads: int, draws: int) -> list[dict]:
    from fixtures.rejection_check import chi_square_pvalue, draw_pairs, expected_pairs
    from luce import Engine

    reference = REPO / "models" / "reference"
    text = json.loads((reference / "prompts" / "code.jsonl").read_text().splitlines()[0])["prompt"]
    rows = []
    for kind in DRAFT_KINDS:
        with Engine(reference / "target-q8_0.gguf", device=dut, threads=threads, ctx_size=256,
                    draft=reference / f"{kind}-q8_0.gguf") as eng:
            prompt = eng.encode_prompt(text)[:REJECTION_PROMPT_TOKENS]
            for (label, setting), tree in REJECTION_CASES:
                counts, accepted, rejected = draw_pairs(eng, prompt, setting, draws, ddtree=tree)
                expected = expected_pairs(eng, prompt, setting, draws)
                pvalue, cells = chi_square_pvalue(counts, expected)
                outside = len(set(counts) - set(expected))  # pairs the target could never draw
                rows.append({"case": f"{kind}, {label}{', tree' if tree else ''}", "draws": draws, "cells": cells,
                             "pvalue": pvalue, "accepted": accepted, "rejected": rejected, "outside": outside,
                             "ok": outside == 0 and pvalue > REJECTION_PVALUE})
    return rows
