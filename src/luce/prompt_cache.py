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

Files: <key>.state (the session state) and <key>.tokens (the head's token ids, int32), each
written to a temporary beside it and renamed, the state first: an entry exists once its .tokens
file does. A new entry replaces the entries whose heads it extends (a conversation keeps one
entry, not one per turn).

Writes run on a background thread: the session's state is copied into host memory (a
luce_session_state_image, the bytes luce_session_state_save writes) and the prompt goes on to its
first token while the copy is written (4 s of a 2.1 GB 32K-token head, H100 host). One write is in
flight at a time (a store waits for the last one, so one image is held), a lookup whose prompt
starts with the head in flight's first block waits for it (it may use that head, or an entry the
write replaces), and wait() (Engine.close) waits for it; a write that fails is reported by the
next failures() or wait().
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Sequence

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
        self._writer: threading.Thread | None = None
        self._writing: np.ndarray | None = None  # the head in flight
        self._failures: list[str] = []  # appended by the writer, taken by failures()
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
        writing = self._writing
        if writing is not None and len(ids) >= BLOCK and np.array_equal(writing[:BLOCK], ids[:BLOCK]):
            self._join()  # this prompt may use the head in flight, or an entry its write replaces
        best = None
        for state, tokens in self._entries():
            n = len(tokens)
            if 0 < n <= len(ids) and (best is None or n > best[1]) and np.array_equal(tokens, ids[:n]):
                best = (state, n)
        return best

    def store(self, head: Sequence[int], image: np.ndarray) -> None:
        """A new entry for `head` whose state file holds `image` (luce_session_state_image's bytes),
        written on a background thread, replacing the entries whose heads it extends."""
        self._join()
        ids = np.asarray(head, dtype="<i4")
        self._writing = ids
        self._writer = threading.Thread(target=self._write, args=(ids, image), name="luce-prompt-cache")
        self._writer.start()

    def failures(self) -> list[str]:
        """Why the writes that failed since the last call failed (the write in flight not waited for)."""
        out = []
        while self._failures:
            out.append(self._failures.pop(0))
        return out

    def wait(self) -> list[str]:
        """Waits for the write in flight; then failures()."""
        self._join()
        return self.failures()

    def _join(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = self._writing = None

    def _write(self, ids: np.ndarray, image: np.ndarray) -> None:
        key = hashlib.sha256(ids.tobytes()).hexdigest()[:32]
        state, tokens = self.dir / f"{key}.state", self.dir / f"{key}.tokens"
        try:
            _write_atomically(state, image)
            _write_atomically(tokens, ids)
            for old_state, old_tokens in self._entries():
                if old_state != state and len(old_tokens) < len(ids) and np.array_equal(old_tokens, ids[:len(old_tokens)]):
                    self.drop(old_state)
        except OSError as e:  # a full disk costs the cache, not the answer
            self._failures.append(f"{e.strerror or type(e).__name__}: {e.filename or state}")

    def drop(self, state: Path) -> None:
        """Removes an entry (its tokens file first: the entry is gone once that is)."""
        for path in (state.with_suffix(".tokens"), state):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def _write_atomically(path: Path, data: np.ndarray) -> None:
    """data's bytes at path, whole or not at all: written to a temporary beside it, flushed to the
    disk and renamed over it (two writers of one path never interleave)."""
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
