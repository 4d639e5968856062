"""Byte-level BPE for the reference models, built the way Qwen3.5's tokenizer is built.

Same pipeline as a real Qwen3.5 tokenizer.json (spec/qwen35.md §3.6): NFC normaliser, the qwen35
split regex (Qwen2's pattern with \\p{M} joined to letters) in "isolated" mode, GPT-2 byte-level
mapping without its own regex, a BPE model without unk/byte-fallback, ByteLevel decoder. Merges
are learned on the training split only. As in Qwen, the special tokens come AFTER the learned
vocabulary (ids VOCAB-len(SPECIALS)..VOCAB-1), so the file has the real layout and a converter
sees control tokens at the end of the table.

    python -m models.tokenizer --corpus models/work/corpus --out DIR [--vocab 8192]

Writes DIR/tokenizer.json and DIR/tokenizer_config.json (ChatML chat_template, eos <|im_end|>).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from models.corpus import read_jsonl

# spec/qwen35.md §3.6; identical to transformers' tokenization_qwen3_5.PRETOKENIZE_REGEX.
QWEN35_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
                      r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"
# The drafters' mask token (dflash_config.mask_token_id). Real Qwen3.5 drafters borrow an unused
# reserved token of the target vocabulary; ours is reserved for exactly that and never appears
# in the text.
MASK = "<|mask|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END, THINK, END_THINK, MASK]

# ChatML, as Qwen's templates render it without tools: every message framed by
# <|im_start|>role\n ... <|im_end|>\n, then the assistant header when a reply is wanted.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MODEL_MAX_LENGTH = 4096


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(texts: list[str], vocab_size: int) -> Tokenizer:
    """BPE over texts with vocab_size - len(SPECIALS) learned entries (256 byte symbols + merges),
    then the specials appended. Deterministic for a given corpus."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), min_frequency=2,
                                  show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_special_tokens(SPECIALS)
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"error: BPE stopped at {tok.get_vocab_size()} tokens, wanted "
                         f"{vocab_size}: the corpus is too small for this vocabulary")
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {s: tok.token_to_id(s) for s in SPECIALS}


def tokenizer_config(tok: Tokenizer) -> dict:
    """tokenizer_config.json in the transformers-5 form Qwen3.5 checkpoints use."""
    ids = special_ids(tok)
    return {
        "tokenizer_class": "Qwen3_5Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for s, i in ids.items()},
    }


def save(tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")


def load(folder: Path) -> Tokenizer:
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=Path("models/work/corpus"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args(argv)
    tok = train([d["text"] for d in read_jsonl(args.corpus / "train.jsonl")], args.vocab)
    save(tok, args.out)
    print(json.dumps(special_ids(tok)))


if __name__ == "__main__":
    main()
