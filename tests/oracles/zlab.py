"""z-lab's `dflash` package (PyPI 0.1.0, installed with --no-deps beside transformers 5.24) as an oracle.

`dflash.model.DFlashDraftModel.forward(position_ids, noise_embedding, target_hidden, past_key_values)`
returns the drafter's final-normed hidden states of the block rows; it is target-agnostic, so given
the raw captured target features and the target's token embedding it is exactly what
luce_drafter_forward computes. `DFlash2DraftModel` adds the grouped dynamic causal convs around both
sublayers and `CandidateSelector.select` (the greedy selector walk at temperature 0).

Shapes: features [n_ctx, N*H] (raw target layer outputs, in tap order), block [n_block] token ids,
embed / lm_head [V, H]; returned hidden [n_block, H]. Positions: context 0..n_ctx-1, block
n_ctx..n_ctx+n_block-1 (the anchor sits right after the context, as in dflash_generate).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache, Qwen3Config

# Published checkpoints store the codebooks as bare parameters; dflash's CandidateSelector keeps them
# in nn.Embedding (its own from_pretrained adds `.weight` through this same key mapping).
_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


def qwen3_config(cfg: dict) -> Qwen3Config:
    """The drafter config.json as transformers reads it (rope_scaling / rope_parameters standardised
    by transformers itself, so YaRN comes out exactly as HF computes it)."""
    config = Qwen3Config(**cfg)
    config._attn_implementation = "sdpa"
    return config


def build(cfg: dict, tensors: dict[str, torch.Tensor], dflash2: bool = False):
    """A DFlashDraftModel / DFlash2DraftModel holding exactly `tensors` (checkpoint names), fp32, eval."""
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    model = (DFlash2DraftModel if dflash2 else DFlashDraftModel)(qwen3_config(cfg)).float().eval()
    state = {(k + ".weight" if k in _CODEBOOKS else k): v.float() for k, v in tensors.items()}
    model.load_state_dict(state, strict=True)
    return model


def _embed(block, embed: torch.Tensor) -> torch.Tensor:
    return F.embedding(torch.as_tensor(np.asarray(block), dtype=torch.long), embed)[None]


@torch.no_grad()
def forward(model, embed: torch.Tensor, features: np.ndarray, block) -> np.ndarray:
    """One stateless drafter forward over [context | block] (no cache)."""
    n_ctx, n_block = len(features), len(block)
    positions = torch.arange(n_ctx + n_block)[None]
    hidden = model(position_ids=positions, noise_embedding=_embed(block, embed),
                   target_hidden=torch.from_numpy(np.asarray(features, np.float32))[None])
    return hidden[0].numpy()


@torch.no_grad()
def forward_incremental(model, embed: torch.Tensor, features: np.ndarray, chunks: list[int], block) -> np.ndarray:
    """The same block, but with the context fed in `chunks` the way dflash_generate does it: each
    step passes only the newly committed rows with position_ids[start - new : start + B], keeps
    their K/V in a DynamicCache and crops the cache back to `start` (block K/V discarded). Each
    intermediate step drafts a throw-away mask block; the last step drafts `block`."""
    assert sum(chunks) == len(features)
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()    # as dflash's _make_cache: lets sliding layers crop back
    start, hidden = 0, None
    for i, n_new in enumerate(chunks):
        start += n_new
        rows = block if i == len(chunks) - 1 else [model.mask_token_id] * len(block)
        positions = torch.arange(start - n_new, start + len(rows))[None]
        new = torch.from_numpy(np.asarray(features[start - n_new:start], np.float32))[None]
        hidden = model(position_ids=positions, noise_embedding=_embed(rows, embed), target_hidden=new,
                       past_key_values=cache, use_cache=True)
        cache.crop(start - cache.get_seq_length())    # transformers 5: crop(-n) drops the last n rows
    return hidden[0].numpy()


def context_features(hidden_states, layer_ids) -> np.ndarray:
    """z-lab's own extract_context_feature (tap L = hidden_states[L + 1], concatenated in list order)
    for a batch of one -> [n_ctx, N*H]."""
    from dflash.model import extract_context_feature

    return extract_context_feature(list(hidden_states), layer_ids)[0].float().numpy()


@torch.no_grad()
def argmax_chain(model, hidden: np.ndarray, lm_head: torch.Tensor) -> np.ndarray:
    """DFlash proposals: argmax of the target LM head per row (compute_logits: multiplier 1, no cap)."""
    logits = model.compute_logits(torch.from_numpy(hidden)[None], lambda h: h @ lm_head.T)
    return logits[0].argmax(-1).numpy()


@torch.no_grad()
def selector_walk(model, hidden: np.ndarray, lm_head: torch.Tensor, anchor: int) -> np.ndarray:
    """DFlash 2 greedy walk (temperature 0): CandidateSelector.select over the rows' top-k."""
    h = torch.from_numpy(hidden)[None]
    tokens, _, _ = model.propose(h, torch.tensor([anchor]), lambda x: x @ lm_head.T, 0.0)
    return tokens[0].numpy()
