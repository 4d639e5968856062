"""Stage "drafters": each reference drafter on the device against the CPU (hidden rows, greedy
chain), and speculative generation's parity: speculative == plain on the device (chain and
DDTree), speculative device == CPU."""
from __future__ import annotations

import json
import time
from pathlib import Path

from .device import REPO, log


DRAFT_KINDS = ("dflash", "dflash2", "dspark")
DRAFT_PROMPTS = 3        # first prompts of models/reference/prompts/mixed.jsonl
DRAFT_PROMPT_TOKENS = 160
DRAFT_TOKENS = 40
DRAFT_TOL = 1e-4         # drafter hidden rows, max |gpu - cpu| / max |cpu| (fp32 sums, f16 weights)
NEAR_TIE = 1e-3          # a token mismatch is a near tie when the reference's top-2 margin there
                         # is below NEAR_TIE x max |logit| (reported, not failed)


def _reference_drafter(kind: str, root: Path) -> Path:
    """models/reference/<kind> converted by luce's converter (f16, the converter's default)."""
    from luce.converters.convert import convert_checkpoint

    out = root / f"reference-{kind}.gguf"
    if not out.exists():
        convert_checkpoint(REPO / "models" / "reference" / kind, out)
    return out


def _drafter_forward_chain(eng, features, block, hidden_rows, anchor):
    """The drafter's C test hooks on `eng`'s backend: hidden rows of one block over `features`,
    and the greedy chain (tokens, confidence) over the given hidden rows."""
    import numpy as np
    from luce.binding import check, ffi, lib

    out = np.zeros((len(block), eng.info.n_embd), dtype=np.float32)  # drafter hidden = target hidden
    check(lib().luce_drafter_forward(eng._drafter, ffi.from_buffer("float[]", features), len(features),
                                     ffi.from_buffer("int32_t[]", block), len(block), ffi.from_buffer("float[]", out)))
    tokens = np.zeros(len(hidden_rows), dtype=np.int32)
    conf = np.zeros(len(hidden_rows), dtype=np.float32)
    check(lib().luce_drafter_chain(eng._drafter, ffi.from_buffer("float[]", hidden_rows), len(hidden_rows),
                                   int(anchor), ffi.from_buffer("int32_t[]", tokens), ffi.from_buffer("float[]", conf)))
    return out, tokens, conf


def _compare_tokens(ref_eng, prompt, want, got) -> str:
    """'identical', 'near tie at i' (the reference's top-2 margin at the first difference is
    below NEAR_TIE x max |logit|: either token is a fair greedy choice) or 'DIFFER at i'."""
    import numpy as np

    if want == got:
        return "identical"
    i = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    row = ref_eng.logits(list(prompt) + list(want[:i]))[-1].astype(np.float64)
    top2 = np.sort(row)[-2:]
    return f"near tie at {i}" if top2[1] - top2[0] <= NEAR_TIE * np.abs(row).max() else f"DIFFER at {i}"


def check_drafter_kind(kind: str, dut: str, threads: int, root: Path, n_prompts: int = DRAFT_PROMPTS) -> dict:
    """One reference drafter: its forward and chain hooks GPU vs CPU, then greedy generation on
    real prompts: speculative on the GPU == plain on the GPU (lossless) in chain mode and with
    DDTree tree verification, and speculative GPU == CPU (chain)."""
    import numpy as np

    from luce import Engine
    from luce.errors import LuceError

    target = REPO / "models" / "reference" / "target-q8_0.gguf"
    path = _reference_drafter(kind, root)
    texts = [json.loads(line)["prompt"] for line in
             (REPO / "models" / "reference" / "prompts" / "mixed.jsonl").read_text().splitlines()[:n_prompts]]
    res: dict = {"kind": kind}
    with Engine(target, device="cpu", threads=threads, ctx_size=1024, draft=path) as cpu, \
            Engine(target, device=dut, threads=max(1, threads // 2), ctx_size=1024, draft=path) as dev:
        info, E, rng = cpu.draft_info, cpu.info.n_embd, np.random.default_rng(5)
        feats = rng.standard_normal((37, len(info.target_layer_ids) * E)).astype(np.float32)
        block = np.array([17] + [info.mask_token_id] * (info.block_size - 1), dtype=np.int32)
        h_cpu, _, _ = _drafter_forward_chain(cpu, feats, block, np.zeros((1, E), np.float32), 17)
        rows = np.ascontiguousarray(h_cpu[1:])
        _, t_cpu, c_cpu = _drafter_forward_chain(cpu, feats, block, rows, 17)
        h_dev, t_dev, c_dev = _drafter_forward_chain(dev, feats, block, rows, 17)
        res["hidden_rel_diff"] = float(np.abs(h_dev - h_cpu).max() / np.abs(h_cpu).max())
        res["chain_identical"] = bool((t_dev == t_cpu).all())
        res["confidence_diff"] = float(np.abs(c_dev - c_cpu).max())
        res["generate"] = []
        for text in texts:
            ids = cpu.encode_prompt(text)[-DRAFT_PROMPT_TOKENS:]
            kw = dict(prompt_ids=ids, max_tokens=DRAFT_TOKENS, ignore_eos=True)
            plain = dev.generate(**kw, speculative=False).tokens
            spec = dev.generate(**kw, adaptive=False)
            spec_cpu = cpu.generate(**kw, adaptive=False)
            # tau on both devices: with the same tokens out, drafts that differ (the target's
            # features, the drafter's context) show here and nowhere else, output staying lossless.
            row = {"lossless": _compare_tokens(dev, ids, plain, spec.tokens),
                   "gpu_vs_cpu": _compare_tokens(cpu, ids, spec_cpu.tokens, spec.tokens), "tau": spec.stats["tau"],
                   "tau_cpu": spec_cpu.stats["tau"]}
            try:
                tree = dev.generate(**kw, adaptive=False, ddtree=True).tokens
                row["ddtree"] = _compare_tokens(dev, ids, plain, tree)
            except LuceError as e:  # every backend has tree mode: a refusal fails the check
                row["ddtree"] = f"DIFFER: refused: {e}"
            res["generate"].append(row)
    gen = res["generate"]
    res["ok"] = (res["hidden_rel_diff"] <= DRAFT_TOL and res["chain_identical"] and res["confidence_diff"] <= DRAFT_TOL
                 and not any("DIFFER" in r[k] for r in gen for k in ("lossless", "gpu_vs_cpu", "ddtree")))
    return res


def check_drafters(dut: str, threads: int, root: Path, deadline: float, n_prompts: int = DRAFT_PROMPTS) -> list[dict]:
    rows = []
    for kind in DRAFT_KINDS:
        if time.perf_counter() > deadline:
            rows.append({"kind": kind, "skipped": "time budget (--drafter-budget)", "ok": True})
            continue
        log(f"drafter {kind}")
        try:
            rows.append(check_drafter_kind(kind, dut, threads, root, n_prompts))
        except Exception as e:
            rows.append({"kind": kind, "error": f"{type(e).__name__}: {e}", "ok": False})
    return rows
