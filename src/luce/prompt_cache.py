"""A disk cache of prompt heads (`luce generate --prompt-cache DIR`, `Engine(prompt_cache=DIR)`).

After a prompt is prefilled, the session's state after its head (the prompt up to its last
whole BLOCK of tokens) is written to DIR; a later prompt that starts with a cached head loads
that state (luce_session_state_load: KV rows and DeltaNet state) and prefills only the rest. A
hybrid model's recurrent state cannot be cut back to a shorter prefix, so heads are kept at
block boundaries: a repeated document with a new question after it, or a conversation's next
turn, finds the head of what it shares.

Identity: entries live under DIR/<identity>/, the identity a hash of the format version, every
tensor's name, type and shape and the first bytes of its data (two fine-tunes of one shape
differ there), and the KV cache types and rotation (rows in another type or basis would be
read as garbage, silently). The same bytes tag each state file, and a load refuses a file whose
tag differs. A state that cannot be loaded (cut short, another luce version) is dropped and
the prompt prefilled in full.

Files: <key>.state (the session state, written atomically by the runtime) and <key>.tokens
(the head's token ids, int32, written to a temporary and renamed after the state): an entry
exists once its .tokens file does. A new entry replaces the entries whose heads it extends
(a conversation keeps one entry, not one per turn).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from luce.errors import LuceError

FORMAT = 1
BLOCK = 256           # heads end on multiples of this many tokens
TENSOR_SAMPLE = 4096  # bytes of each tensor's data hashed into the identity


def identity(model: Path, kv_settings: str) -> bytes:
    """The cache identity of a model file and KV cache settings: 32 bytes."""
    from luce.converters.gguf_reader import GGUFFile

    h = hashlib.sha256(f"luce prompt cache {FORMAT}\n{kv_settings}\n".encode())
    with GGUFFile.open(model) as f, open(model, "rb") as raw:
        for name in sorted(f.tensors):
            t = f.tensors[name]
            h.update(f"{name} {t.ggml_type} {list(t.shape)}\n".encode())
            raw.seek(t.offset)
            h.update(raw.read(min(TENSOR_SAMPLE, t.nbytes)))
    return h.digest()


class PromptCache:
    """The entries of one model and cache setting under a cache folder."""

    def __init__(self, folder: str | os.PathLike, tag: bytes):
        root = Path(folder)
        if root.exists() and not root.is_dir():
            raise LuceError(f"--prompt-cache {root}: not a folder")
        self.tag = tag
        self.dir = root / tag.hex()[:32]
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LuceError(f"--prompt-cache {root}: cannot create it ({e.strerror})") from None

    def _entries(self) -> list[tuple[Path, np.ndarray]]:
        out = []
        for tokens_file in self.dir.glob("*.tokens"):
            try:
                out.append((tokens_file.with_suffix(".state"), np.fromfile(tokens_file, dtype="<i4")))
            except OSError:
                continue  # removed by another process meanwhile
        return out

    def lookup(self, head: Sequence[int]) -> tuple[Path, int] | None:
        """The entry with the longest head that `head` starts with: (state file, its length)."""
        ids = np.asarray(head, dtype=np.int64)
        best = None
        for state, tokens in self._entries():
            n = len(tokens)
            if 0 < n <= len(ids) and (best is None or n > best[1]) and np.array_equal(tokens, ids[:n]):
                best = (state, n)
        return best

    def store(self, head: Sequence[int], save: Callable[[Path], None]) -> None:
        """A new entry for `head` (save(path) writes the session's state there), replacing the
        entries whose heads it extends."""
        ids = np.asarray(head, dtype="<i4")
        key = hashlib.sha256(ids.tobytes()).hexdigest()[:32]
        state, tokens = self.dir / f"{key}.state", self.dir / f"{key}.tokens"
        save(state)
        tmp = tokens.with_name(f"{tokens.name}.partial-{os.getpid()}")
        ids.tofile(tmp)
        os.replace(tmp, tokens)
        for old_state, old_tokens in self._entries():
            if old_state != state and len(old_tokens) < len(ids) and np.array_equal(old_tokens, ids[:len(old_tokens)]):
                self.drop(old_state)

    def drop(self, state: Path) -> None:
        """Removes an entry (its tokens file first: the entry is gone once that is)."""
        for path in (state.with_suffix(".tokens"), state):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
