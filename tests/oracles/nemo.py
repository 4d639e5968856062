"""NVIDIA NeMo Automodel (PyPI 0.7.0, installed with --no-deps) as an oracle.

Used modules (their own code, unmodified):
  components/speculative/dflash/draft_qwen3_dflash2.py  Qwen3DFlash2DraftModel (convs around both
      sublayers, conv_block_size = the block) and CandidateSelector.walk (greedy selector walk)
  components/speculative/dspark/draft_qwen3.py          Qwen3DSparkModel: _forward_backbone (the
      DFlash trunk), lm_head, markov_head.sample_block_tokens (greedy Markov chain) and
      predict_confidence_step (the confidence logit; sigmoid applied here, as the spec defines c_k)

Why the import needs help (docs/oracles.md): `nemo_automodel.components.speculative.dflash/__init__`
imports the whole DFlash family, whose training code imports `datasets` (HF datasets, not installed
and not needed), and `components/datasets/llm/__init__` imports every dataset builder (again
`datasets`). The DFlash 2 model module itself only needs torch, transformers and two siblings, one of
which (`datasets/llm/packed_sequence.py`) does `from datasets import Dataset, DatasetDict` for type
use only. `import_dflash2()` therefore registers those two packages without running their
`__init__` and, for the duration of that import only, provides a `datasets` module with just those
two names, which raise if used.
The DSpark modules import cleanly as installed.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen3Config

_BARE_PACKAGES = ("nemo_automodel.components.speculative.dflash", "nemo_automodel.components.datasets.llm")


class _DatasetsNotInstalled:
    def __init__(self, *args, **kwargs):
        raise ImportError("HF `datasets` is not installed (a stand-in for NeMo's type-only import)")


def _register_bare_package(name: str, root: Path) -> None:
    if name in sys.modules:
        return
    package = types.ModuleType(name)
    package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
    sys.modules[name] = package


def import_dflash2():
    """The draft_qwen3_dflash2 module (see the module docstring for why this is not a plain import)."""
    root = Path(importlib.util.find_spec("nemo_automodel").origin).parent
    for name in _BARE_PACKAGES:
        _register_bare_package(name, root)
    stand_in = None
    if "datasets" not in sys.modules and importlib.util.find_spec("datasets") is None:
        stand_in = types.ModuleType("datasets")
        stand_in.Dataset = stand_in.DatasetDict = _DatasetsNotInstalled
        sys.modules["datasets"] = stand_in
    try:
        return importlib.import_module("nemo_automodel.components.speculative.dflash.draft_qwen3_dflash2")
    finally:
        # Only NeMo's import sees the stand-in: later availability checks (transformers probes
        # importlib.util.find_spec("datasets")) must still find no `datasets`.
        if stand_in is not None and sys.modules.get("datasets") is stand_in:
            del sys.modules["datasets"]


def _config(cfg: dict, **extra) -> Qwen3Config:
    config = Qwen3Config(**(cfg | extra))
    config._attn_implementation = "sdpa"
    return config


# ---- DFlash 2 ---------------------------------------------------------------------------------

def build_dflash2(cfg: dict, tensors: dict[str, torch.Tensor]):
    """Qwen3DFlash2DraftModel with exactly `tensors` (published names: bare codebook parameters)."""
    module = import_dflash2()
    model = module.Qwen3DFlash2DraftModel(_config(cfg)).float().eval()
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model


@torch.no_grad()
def dflash2_forward(model, embed: torch.Tensor, features: np.ndarray, block) -> np.ndarray:
    """One stateless forward: context positions 0..n_ctx-1, block right after; the convs see the
    block as one block of its own length ([n_block, H] out)."""
    n_ctx, n_block = len(features), len(block)
    hidden = model(position_ids=torch.arange(n_ctx + n_block)[None],
                   noise_embedding=F.embedding(torch.as_tensor(block, dtype=torch.long), embed)[None],
                   target_hidden=torch.from_numpy(np.asarray(features, np.float32))[None],
                   conv_block_size=n_block)
    return hidden[0].numpy()


@torch.no_grad()
def selector_walk(model, hidden: np.ndarray, lm_head: torch.Tensor, anchor: int) -> np.ndarray:
    """CandidateSelector.walk at temperature 0 over logits = lm_head(hidden) (compute_logits)."""
    h = torch.from_numpy(hidden)[None]
    logits = model.compute_logits(h, lambda x: x @ lm_head.T)
    path, _, _ = model.candidate_selector.walk(h, logits, torch.tensor([anchor]), 0.0)
    return path[0].numpy()


# ---- DSpark -----------------------------------------------------------------------------------

def build_dspark(cfg: dict, tensors: dict[str, torch.Tensor], embed: torch.Tensor, lm_head: torch.Tensor):
    """Qwen3DSparkModel with the drafter tensors plus the target's embedding and LM head (the class
    owns copies of both; published RadixArk drafters ship neither)."""
    from nemo_automodel.components.speculative.dspark.draft_qwen3 import Qwen3DSparkModel

    dc = cfg.get("dflash_config", {})
    config = _config(cfg, target_layer_ids=dc.get("target_layer_ids", cfg.get("target_layer_ids")),
                     mask_token_id=dc.get("mask_token_id", cfg.get("mask_token_id")), num_anchors=1)
    model = Qwen3DSparkModel(config).float().eval()
    state = {k: v.float() for k, v in tensors.items()} | {"embed_tokens.weight": embed, "lm_head.weight": lm_head}
    model.load_state_dict(state, strict=True)
    return model


@torch.no_grad()
def dspark_forward(model, features: np.ndarray, block) -> np.ndarray:
    """The DSpark backbone (same DFlash trunk; no mask = bidirectional block) -> [n_block, H]."""
    n_ctx, n_block = len(features), len(block)
    hidden = model._forward_backbone(position_ids=torch.arange(n_ctx + n_block)[None],
                                     noise_embedding=model.embed_tokens(torch.as_tensor(block, dtype=torch.long))[None],
                                     target_hidden_states=torch.from_numpy(np.asarray(features, np.float32))[None])
    return hidden[0].numpy()


@torch.no_grad()
def markov_chain(model, hidden: np.ndarray, anchor: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy Markov-corrected chain from `anchor` and each step's confidence sigmoid(w.[h_k; W1[prev_k]] + b),
    prev_0 = anchor, prev_k = token_{k-1}. Returns (tokens [n], confidence [n])."""
    h = torch.from_numpy(hidden)[None]
    tokens, _ = model.sample_draft_tokens(model.compute_logits(h), first_prev_token_ids=torch.tensor([anchor]),
                                          temperature=0.0, hidden_states=h)
    prev = torch.cat([torch.tensor([[anchor]]), tokens[:, :-1]], dim=1)
    confidence = torch.sigmoid(model.predict_confidence_step(h, prev))
    return tokens[0].numpy(), confidence[0].numpy()
