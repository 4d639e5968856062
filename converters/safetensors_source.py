"""Lazy, validated access to a checkpoint's safetensors: one file, a sharded set
(model.safetensors.index.json), and an optional sidecar head file.

Only the JSON headers are read up front; tensor data is memory-mapped and read one tensor at a
time while the GGUF is written, so a 4 GB checkpoint is never held in RAM. The header is parsed
here (not by the safetensors package) because numpy has no bfloat16: BF16 is widened to float32
by a bit shift, which is exact.

safetensors file: u64 LE header length n | n bytes of JSON {name: {dtype, shape, data_offsets}}
| data; data_offsets are [begin, end) relative to the end of the header.
"""
from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from luce.errors import LuceError

MODEL_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
SIDECAR_FILES = ("dflash_aux_heads.safetensors", "dflash_aux_heads.pt")
MAX_HEADER_BYTES = 100 * 1024 * 1024    # the safetensors package's own limit

# dtype string -> (bytes per element, numpy dtype of the stored bits)
DTYPES = {"F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2")}


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str            # F32 | F16 | BF16
    shape: tuple[int, ...]   # HF (row-major) order
    file: Path
    start: int            # absolute byte offset in file
    nbytes: int


def _fail(path: Path, why: str) -> LuceError:
    return LuceError(f"{path}: {why}")


def read_header(path: Path) -> dict[str, SourceTensor]:
    """Parse and bounds-check one safetensors header."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            if size < 8:
                raise _fail(path, "truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise _fail(path, f"truncated or corrupt safetensors header (declares {n} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise _fail(path, f"cannot read: {e.strerror or e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _fail(path, "safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_start, data_size = 8 + n, size - 8 - n
    tensors = {}
    for name, entry in header.items():
        tensors[name] = _tensor_entry(path, name, entry, data_start, data_size)
    return tensors


def _tensor_entry(path, name, entry, data_start, data_size) -> SourceTensor:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise _fail(path, f"tensor {name!r}: malformed header entry") from None
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _fail(path, f"tensor {name!r} has dtype {dtype!r}; only BF16, F16 and F32 are supported")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _fail(path, f"tensor {name!r}: bad shape {list(shape)}")
    count = int(np.prod(shape, dtype=object)) if shape else 1
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_size):
        raise _fail(path, f"tensor {name!r}: data offsets [{begin!r}, {end!r}) outside the file (truncated?)")
    if end - begin != count * DTYPES[dtype][0]:
        raise _fail(path, f"tensor {name!r}: {end - begin} bytes do not match {dtype} shape {list(shape)}")
    return SourceTensor(name, dtype, shape, path, data_start + begin, end - begin)


def load_json(path: Path, what: str) -> dict:
    try:
        value = json.loads(Path(path).read_text())
    except OSError as e:
        raise _fail(Path(path), f"cannot read {what}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(Path(path), f"{what} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise _fail(Path(path), f"{what} is not a JSON object")
    return value


class Checkpoint:
    """config.json + the main tensors (+ sidecar tensors), read lazily.

    `tensors` maps the main checkpoint's names to SourceTensor; `sidecar` the sidecar's.
    """

    def __init__(self, config: dict, config_path: Path | None, tensors: dict, sidecar: dict,
                 sidecar_path: Path | None, files: list[Path], warnings: list[str] | None = None):
        self.config, self.config_path = config, config_path
        self.tensors, self.sidecar, self.sidecar_path = tensors, sidecar, sidecar_path
        self.files = files
        self.warnings = warnings or []
        self._maps: dict[Path, mmap.mmap] = {}

    @property
    def source_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values()) + sum(t.nbytes for t in self.sidecar.values())

    def read(self, t: SourceTensor) -> np.ndarray:
        """One tensor as float32 (BF16 widened exactly) or float16, HF shape."""
        mm = self._maps.get(t.file)
        if mm is None:
            with open(t.file, "rb") as f:
                mm = self._maps[t.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        raw = np.frombuffer(mm, dtype=DTYPES[t.dtype][1], count=t.nbytes // DTYPES[t.dtype][0],
                            offset=t.start)
        if t.dtype == "BF16":
            # bf16 bits are the high half of an f32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            raw = raw.copy()
        return raw.reshape(t.shape)

    def close(self) -> None:
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()


def open_checkpoint(src, config_path=None, aux_heads=None, use_sidecar=True) -> Checkpoint:
    """A checkpoint directory, or a single .safetensors file with --config."""
    src = Path(src)
    if not src.exists():
        raise LuceError(f"{src}: no such file or directory")
    if src.is_dir():
        files, tensors = _read_dir(src)
        config_path = Path(config_path) if config_path else src / CONFIG_FILE
        folder = src
    else:
        if config_path is None:
            guess = src.parent / CONFIG_FILE
            if not guess.exists():
                raise LuceError(f"{src}: a single .safetensors file needs --config (no {CONFIG_FILE} beside it)")
            config_path = guess
        files, tensors = [src], read_header(src)
        folder = src.parent
    if not Path(config_path).exists():
        raise LuceError(f"{config_path}: no config.json (pass --config FILE)")
    config = load_json(config_path, "config")
    warnings: list[str] = []
    sidecar_path = _sidecar_path(folder, aux_heads, warnings) if use_sidecar else None
    sidecar = read_header(sidecar_path) if sidecar_path else {}
    return Checkpoint(config, Path(config_path), tensors, sidecar, sidecar_path, files, warnings)


def _read_dir(src: Path):
    index = src / INDEX_FILE
    if index.exists():
        weight_map = load_json(index, "shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise _fail(index, "shard index has no weight_map")
        for name, shard in weight_map.items():
            # A shard is a file beside the index: a name, not a number, a list or a path elsewhere.
            if (not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", "..")
                    or "\0" in shard):
                raise _fail(index, f"weight_map maps {name!r} to {shard!r}, not a shard file name")
        files = sorted({src / f for f in weight_map.values()})
        tensors = {}
        for f in files:
            try:
                present = f.is_file()
            except OSError:          # e.g. a name longer than the file system allows
                present = False
            if not present:
                raise _fail(index, f"names a missing shard {f.name!r}")
            tensors.update(read_header(f))
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise _fail(index, f"tensor {missing[0]!r} is listed but not found in its shard")
        return files, tensors
    single = src / MODEL_FILE
    if single.exists():
        return [single], read_header(single)
    raise LuceError(f"{src}: no {MODEL_FILE} or {INDEX_FILE} found")


def _sidecar_path(folder: Path, aux_heads, warnings: list[str]) -> Path | None:
    if aux_heads is not None:
        path = Path(aux_heads)
        if not path.exists():
            raise LuceError(f"{path}: aux-heads file not found")
    else:
        path = next((folder / n for n in SIDECAR_FILES if (folder / n).exists()), None)
        if path is None:
            return None
        if path.suffix != ".safetensors":
            # Found by default, not asked for: reading a pickle needs torch, so skip it loudly.
            warnings.append(f"skipping {path.name}: only .safetensors sidecars are read "
                            f"(re-save it with safetensors.torch.save_file, then pass --aux-heads)")
            return None
    if path.suffix != ".safetensors":
        raise LuceError(f"{path}: only .safetensors sidecar heads are supported; "
                        f"re-save the .pt with safetensors.torch.save_file")
    return path
