"""The target's tokenizer, for drafters written in the llama.cpp layout.

llama.cpp loads a drafter as a model of its own, vocabulary included: its loader stops at "key not
found: tokenizer.ggml.model" and sizes the Markov and selector tables by that vocabulary. So its
converter copies the target's tokenizer into the drafter (`--target-model-dir`); `luce convert
--layout llama.cpp --target-model PATH` does the same from
  - a target GGUF: its tokenizer.* keys are copied as they are (values and types), or
  - the target's Hugging Face folder: tokenizer.json + config.json, turned into tokenizer.* keys by
    the code luce's qwen35 converter uses (qwen35_vocab.py, which follows llama.cpp's converter).
The drafter's mask token goes in tokenizer.ggml.mask_token_id, where llama.cpp's converter puts it.

    open_target_vocab(path) -> TargetVocab (checked up front, before any output is written)
    TargetVocab.add_to(writer)   writes the tokenizer.* keys
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFWriter
from gguf.constants import Keys

from luce.converters import schema
from luce.converters.gguf_reader import GGUFFile
from luce.converters.qwen35_vocab import add_tokenizer_metadata, vocab_from_tokenizer_json
from luce.converters.safetensors_source import CONFIG_FILE, load_json
from luce.errors import LuceError

TOKENIZER_JSON = "tokenizer.json"


@dataclass
class TargetVocab:
    path: Path
    n_vocab: int
    mrope: bool                      # the target ropes by sections (qwen35 does): the drafter says so too
    gguf_keys: list | None = None    # [(name, value, vtype, etype)] copied from a target GGUF
    hf_dir: Path | None = None

    def add_to(self, w: GGUFWriter) -> None:
        if self.hf_dir is not None:
            add_tokenizer_metadata(w, self.hf_dir, self.n_vocab)
            return
        for name, value, vtype, etype in self.gguf_keys:
            w.add_key_value(name, value, vtype, etype)


def open_target_vocab(path) -> TargetVocab:
    path = Path(path)
    if path.is_dir():
        return _from_hf_folder(path)
    if not path.is_file():
        raise LuceError(f"--target-model {path}: no such file or directory")
    return _from_gguf(path)


def _from_gguf(path: Path) -> TargetVocab:
    with GGUFFile.open(path) as gf:
        if schema.TOKENIZER_MODEL.template not in gf.kv or schema.TOKENIZER_TOKENS.template not in gf.kv:
            raise LuceError(f"--target-model {path}: the GGUF has no tokenizer ({schema.TOKENIZER_MODEL.template} "
                            f"and {schema.TOKENIZER_TOKENS.template} are needed)")
        keys = []
        for name, value in gf.kv.items():
            # The drafter's own mask id is written after these; a target's would be a duplicate.
            if name.startswith(schema.TOKENIZER_PREFIX) and name != schema.TOKENIZER_MASK_TOKEN_ID.template:
                vtype, etype = gf.kv_type[name]
                if hasattr(value, "tolist"):
                    value = value.tolist()
                keys.append((name, value, vtype, etype))
        n_vocab = len(gf.kv[schema.TOKENIZER_TOKENS.template])
        sections = Keys.Rope.DIMENSION_SECTIONS.format(arch=gf.arch)
        return TargetVocab(path, n_vocab, mrope=sections in gf.kv, gguf_keys=keys)


def _from_hf_folder(path: Path) -> TargetVocab:
    if not (path / TOKENIZER_JSON).is_file() or not (path / CONFIG_FILE).is_file():
        raise LuceError(f"--target-model {path}: a Hugging Face target folder needs {TOKENIZER_JSON} and "
                        f"{CONFIG_FILE}")
    config = load_json(path / CONFIG_FILE, "config")
    text = config.get("text_config") or config
    n_vocab = text.get("vocab_size")
    if not isinstance(n_vocab, int) or n_vocab <= 0:
        raise LuceError(f"--target-model {path}: {CONFIG_FILE} has no positive vocab_size")
    vocab_from_tokenizer_json(path / TOKENIZER_JSON, n_vocab)       # fail now, not mid-write
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return TargetVocab(path, n_vocab, mrope="mrope_section" in rope, hf_dir=path)


def check_mask(vocab: TargetVocab, mask_token_id: int) -> None:
    if not 0 <= mask_token_id < vocab.n_vocab:
        raise LuceError(f"mask_token_id={mask_token_id} is outside the target's vocabulary of {vocab.n_vocab} "
                        f"tokens ({vocab.path})")
