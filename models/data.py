"""Token streams and batches shared by target and drafter training.

A split is tokenized once into one flat int32 stream: documents in corpus order, each followed by
<|endoftext|> (the document separator a base model learns to emit). Training windows are random
slices of S tokens; a window may cross a separator, as in every packed-LM recipe.

Shapes: S = sequence length, N = batch (windows per step).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from models.corpus import read_jsonl
from models.tokenizer import ENDOFTEXT, load


def tokenize_split(corpus: Path, split: str, tokenizer_dir: Path) -> np.ndarray:
    """(T,) int32 stream of one split: doc0 <eot> doc1 <eot> ..."""
    tok = load(tokenizer_dir)
    eot = tok.token_to_id(ENDOFTEXT)
    texts = [d["text"] for d in read_jsonl(corpus / f"{split}.jsonl")]
    parts = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        parts.append(np.asarray(enc.ids, dtype=np.int32))
        parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts)


class Windows:
    """Random (N, S) windows of a token stream, from a seeded generator (reproducible runs)."""

    def __init__(self, stream: np.ndarray, seq_len: int, seed: int):
        if len(stream) <= seq_len:
            raise SystemExit(f"error: token stream of {len(stream)} tokens is shorter than one "
                             f"window of {seq_len}")
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.seq_len = seq_len
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, n: int, device) -> torch.Tensor:
        starts = torch.randint(0, len(self.stream) - self.seq_len, (n,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.seq_len)[None, :]
        return self.stream[idx].to(device, non_blocking=True)

    def fixed(self, n: int, device) -> torch.Tensor:
        """n evenly spaced windows: the same validation batch on every call."""
        starts = torch.linspace(0, len(self.stream) - self.seq_len - 1, n).long()
        idx = starts[:, None] + torch.arange(self.seq_len)[None, :]
        return self.stream[idx].to(device)


def sync(device) -> float:
    """Wall clock after the device has finished queued work (honest step timings)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def autocast(device):
    """bf16 autocast on CUDA (the recipe's precision); fp32 on CPU, where bf16 is slow."""
    dev = torch.device(device)
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
