"""Tokenizer metadata of a qwen35 GGUF, from the checkpoint's tokenizer.json (spec §3.6).

What llama.cpp's converter writes for a byte-level BPE vocabulary (`_set_vocab_gpt2`):
  - tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "qwen35" (the split regex a runtime must use);
  - tokenizer.ggml.tokens: one string per id up to the model's vocab_size. Regular tokens are spelled
    in GPT-2's byte->unicode alphabet exactly as in tokenizer.json; added tokens keep their text;
    ids the tokenizer does not use (the embedding is padded past them) become `[PAD{id}]`, UNUSED;
  - tokenizer.ggml.token_type: NORMAL, CONTROL for special added tokens (and ones that look like
    `<|...|>`), USER_DEFINED for other added tokens (`<think>` in Qwen3.5), UNUSED for padding;
  - merges, special token ids (bos/eos/pad ... from tokenizer_config.json, falling back to
    config.json), add_*_token flags and the chat template: gguf-py's SpecialVocab, which is the
    code llama.cpp's converter runs for exactly this.
Qwen3.5 never prepends BOS, so add_bos_token is written as false whatever the checkpoint says.
"""
from __future__ import annotations

import json
from pathlib import Path

from gguf import GGUFWriter, SpecialVocab, TokenType

from luce.errors import LuceError

TOKENIZER_MODEL = "gpt2"
TOKENIZER_PRE = "qwen35"


def _looks_special(text: str) -> bool:
    # llama.cpp marks `<|...|>` added tokens CONTROL even when tokenizer.json does not say special
    return text.startswith("<|") and text.endswith("|>")


def vocab_from_tokenizer_json(path: Path, n_vocab: int) -> tuple[list[str], list[int]]:
    """(tokens, token types) for ids 0..n_vocab-1 from a Hugging Face BPE tokenizer.json."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise LuceError(f"{path}: missing (a qwen35 GGUF carries its tokenizer)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LuceError(f"{path}: not readable JSON ({e})") from None
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise LuceError(f"{path}: expected a byte-level BPE tokenizer (model.type BPE)")

    by_id: dict[int, tuple[str, TokenType]] = {}
    for text, token_id in model["vocab"].items():
        by_id[token_id] = (text, TokenType.NORMAL)
    for added in data.get("added_tokens") or []:
        text, token_id = added["content"], added["id"]
        special = added.get("special") or _looks_special(text)
        by_id[token_id] = (text, TokenType.CONTROL if special else TokenType.USER_DEFINED)

    too_big = [i for i in by_id if not 0 <= i < n_vocab]
    if too_big:
        raise LuceError(f"{path}: token id {max(too_big)} is outside the model's vocab_size {n_vocab}")
    tokens, types = [], []
    for token_id in range(n_vocab):
        text, kind = by_id.get(token_id, (f"[PAD{token_id}]", TokenType.UNUSED))
        tokens.append(text)
        types.append(int(kind))
    return tokens, types


def add_tokenizer_metadata(w: GGUFWriter, checkpoint_dir: Path, n_vocab: int) -> None:
    """Write the tokenizer.* keys of a qwen35 GGUF for the checkpoint in `checkpoint_dir`."""
    tokens, types = vocab_from_tokenizer_json(checkpoint_dir / "tokenizer.json", n_vocab)
    w.add_tokenizer_model(TOKENIZER_MODEL)
    w.add_tokenizer_pre(TOKENIZER_PRE)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = SpecialVocab(checkpoint_dir, load_merges=True, n_vocab=n_vocab)
    if not special.merges:
        raise LuceError(f"{checkpoint_dir / 'tokenizer.json'}: no BPE merges")
    special.add_special_token["bos"] = False
    special.add_to_gguf(w, quiet=True)
