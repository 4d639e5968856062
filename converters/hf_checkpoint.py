"""A Hugging Face checkpoint directory read lazily: config.json plus single or sharded safetensors.

Only the headers are parsed up front; `load(name)` memory-maps one tensor and returns it as
float32, so converting a 27B checkpoint holds one tensor in memory at a time. numpy has no
bfloat16, which is why this reads the safetensors layout itself (8-byte little-endian header
length, a JSON header of {name: {dtype, shape, data_offsets}}, then the data) instead of going
through `safetensors.safe_open(framework="np")`, which refuses BF16.

Every file is untrusted: the header length, offsets and byte counts are checked against the file
size before anything is mapped.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from luce.errors import LuceError

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element)
_DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # upper 16 bits of an f32; widened in `_to_float32`
    "F64": (np.dtype("<f8"), 8),
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # real headers are a few MB even for 27B shards


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live: file, dtype, shape, absolute byte range."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class Checkpoint:
    """config.json (as a dict) and a name -> TensorRef table over every safetensors file."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise LuceError(f"{self.directory}: not a checkpoint directory")
        self.config = _read_json(self.directory / "config.json")
        self.tensors: dict[str, TensorRef] = {}
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise LuceError(f"{self.directory}: no *.safetensors files")
        for path in files:
            for name, ref in _read_header(path).items():
                if name in self.tensors:
                    raise LuceError(f"{path.name}: tensor {name!r} also appears in {self.tensors[name].path.name}")
                self.tensors[name] = ref

    def load(self, name: str) -> np.ndarray:
        """The tensor as a float32 array of its stored shape."""
        ref = self.tensors[name]
        stored, _ = _DTYPES[ref.dtype]
        count = math.prod(ref.shape)
        raw = np.memmap(ref.path, dtype=stored, mode="r", offset=ref.begin, shape=(count,))
        return _to_float32(raw, ref.dtype).reshape(ref.shape)


def _to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        # bf16 is the top half of an IEEE f32: shifting the bits up is exact.
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise LuceError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LuceError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise LuceError(f"{path}: expected a JSON object")
    return data


def _read_header(path: Path) -> dict[str, TensorRef]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise LuceError(f"{path.name}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise LuceError(f"{path.name}: safetensors header length {header_len} exceeds the file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LuceError(f"{path.name}: bad safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise LuceError(f"{path.name}: bad safetensors header")
    data_start = 8 + header_len
    refs = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        refs[name] = _tensor_ref(path, name, entry, data_start, size)
    return refs


def _tensor_ref(path: Path, name: str, entry, data_start: int, size: int) -> TensorRef:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise LuceError(f"{path.name}: malformed header entry for {name!r}") from None
    if dtype not in _DTYPES:
        raise LuceError(f"{path.name}: {name}: unsupported dtype {dtype} (expected one of {', '.join(_DTYPES)})")
    if not all(isinstance(d, int) and d >= 0 for d in shape) or not all(isinstance(o, int) for o in (begin, end)):
        raise LuceError(f"{path.name}: {name}: bad shape or offsets")
    nbytes = math.prod(shape) * _DTYPES[dtype][1]
    if not 0 <= begin <= end or end - begin != nbytes or data_start + end > size:
        raise LuceError(f"{path.name}: {name}: byte range [{begin}, {end}) does not fit {shape} {dtype} in the file")
    return TensorRef(path, dtype, shape, data_start + begin, data_start + end)
