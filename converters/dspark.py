"""DSpark heads (spec/engine.md §2.5, spec/drafters.md §3): a Markov bigram head and an
optional confidence head on top of the DFlash trunk, found in one of three places:

    SpecForge sidecar       dspark_markov_head.markov_w{1,2}.weight, dspark_confidence_head.{weight,bias}
    DeepSeek-V4 MTP shard   mtp.2.markov_head.markov_w{1,2}.weight, mtp.2.confidence_head.proj.{weight,bias}
    inline (RadixArk, DeepSpec native)  markov_head.markov_w{1,2}.weight, confidence_head.proj.{weight,bias}

Aliases are tried in that order. Shapes (HF): w1 [V, R] (an embedding indexed by the previous
target token), w2 [V, R] (Linear R -> V), confidence weight [1, C] with C = H or H + R, bias [1].
"""
from __future__ import annotations

ALIASES = {
    "markov_w1": ("dspark_markov_head.markov_w1.weight", "mtp.2.markov_head.markov_w1.weight",
                  "markov_head.markov_w1.weight"),
    "markov_w2": ("dspark_markov_head.markov_w2.weight", "mtp.2.markov_head.markov_w2.weight",
                  "markov_head.markov_w2.weight"),
    "confidence_weight": ("dspark_confidence_head.weight", "mtp.2.confidence_head.proj.weight",
                          "confidence_head.proj.weight"),
    "confidence_bias": ("dspark_confidence_head.bias", "mtp.2.confidence_head.proj.bias",
                        "confidence_head.proj.bias"),
}
HEAD_NAMES = frozenset(n for names in ALIASES.values() for n in names)
ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel")
MARKERS = ("markov_head.", "confidence_head", "dspark_")


def is_dspark(names) -> bool:
    return any(m in n for n in names for m in MARKERS)


def find_heads(main: dict, sidecar: dict) -> dict:
    """role -> (SourceTensor, where) for the heads present; the sidecar wins over the main file."""
    found = {}
    for role, aliases in ALIASES.items():
        for alias in aliases:
            for table, where in ((sidecar, "sidecar"), (main, "main")):
                if alias in table and role not in found:
                    found[role] = (table[alias], where)
    return found
