"""A bounded GGUF parser for untrusted files.

gguf-py's GGUFReader trusts the file: an array whose declared count runs to the end of the
file makes it loop while memory grows, tensor offsets wrap silently, and neither array element
types nor overlapping / misaligned tensor data are checked. This reader validates every length
before reading it and every tensor extent with exact (Python int) arithmetic, so a crafted file
ends in one GGUFFormatError line instead of a hang, a crash or a wrong answer.

Container (little-endian, GGUF v2/v3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x      (string key, u32 value type, value)
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
    padding to general.alignment (default 32) | tensor data (offsets relative to here)
A string is a u64 byte length then UTF-8 bytes; an array is u32 element type, u64 count, items.
Shapes are kept in GGUF order: shape[0] = ne0, the contiguous dimension.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import (GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC,
                            GGMLQuantizationType, GGUFValueType)

from luce.errors import LuceError

SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4                      # GGML_MAX_DIMS
INT64_MAX = 2**63 - 1             # ggml keeps element counts and byte sizes in int64
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"

# Fixed-size value types: struct format (little-endian) and the numpy dtype for arrays of them.
_SCALAR = {
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.FLOAT64: ("<d", np.float64),
    GGUFValueType.BOOL: ("<B", np.uint8),
}
INTEGER_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})

# Smallest possible encodings, used to bound declared counts by the bytes that are left:
# a KV is at least an empty key (8) + type (4) + a 1-byte value; a tensor info at least an
# empty name (8) + n_dims (4) + one ne (8) + type (4) + offset (8).
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
_STRING_LEN_BYTES = 8

# ggml types whose elements numpy can view directly (BF16 is widened separately).
_NUMPY_TENSOR_DTYPE = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class GGUFFormatError(LuceError):
    """The file is not a readable GGUF: bad magic/version, truncated, or crafted. Exit code 2."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=2)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]   # GGUF order, shape[0] = ne0 (contiguous)
    ggml_type: int           # GGMLQuantizationType value
    offset: int              # absolute offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Sequential reads from the mapped file; every read is bounds-checked first."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining():
            raise GGUFFormatError(f"truncated file: {what} needs {n} bytes at offset {self.pos}, "
                                  f"only {self.remaining()} left")
        view = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str, strict: bool) -> str:
        n = self.u64(f"{what} length")
        raw = self.take(n, f"{what} ({n} bytes)")
        try:
            return bytes(raw).decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise GGUFFormatError(f"{what} at offset {self.pos - n} is not valid UTF-8") from None


def _value_type(raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFFormatError(f"{what}: unknown value type {raw}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str):
    """One KV value -> (python value, element type for arrays or None)."""
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}", strict=False), None
    if vtype == GGUFValueType.ARRAY:
        etype = _value_type(cur.u32(f"array type of {key!r}"), f"array {key!r}")
        if etype == GGUFValueType.ARRAY:
            raise GGUFFormatError(f"array {key!r}: nested arrays are not allowed")
        count = cur.u64(f"array count of {key!r}")
        # Bound the count by the bytes left before reading a single element.
        min_item = _STRING_LEN_BYTES if etype == GGUFValueType.STRING else struct.calcsize(_SCALAR[etype][0])
        if count * min_item > cur.remaining():
            raise GGUFFormatError(f"array {key!r} declares {count} {etype.name} items but only "
                                  f"{cur.remaining()} bytes are left")
        if etype == GGUFValueType.STRING:
            return [cur.string(f"item of {key!r}", strict=False) for _ in range(count)], etype
        dtype = np.dtype(_SCALAR[etype][1]).newbyteorder("<")
        items = np.frombuffer(cur.take(count * dtype.itemsize, f"array {key!r}"), dtype=dtype).copy()
        return (items.astype(bool) if etype == GGUFValueType.BOOL else items), etype
    value = cur.scalar(_SCALAR[vtype][0], f"value of {key!r}")
    return (bool(value) if vtype == GGUFValueType.BOOL else value), None


def _read_tensor_info(cur: _Cursor, index: int):
    name = cur.string(f"tensor #{index} name", strict=True)
    n_dims = cur.u32(f"tensor {name!r} n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r}: n_dims {n_dims} is outside 1..{MAX_DIMS}")
    shape = tuple(cur.u64(f"tensor {name!r} ne[{d}]") for d in range(n_dims))
    raw_type = cur.u32(f"tensor {name!r} type")
    rel_offset = cur.u64(f"tensor {name!r} offset")
    if any(ne == 0 for ne in shape):
        raise GGUFFormatError(f"tensor {name!r}: shape {list(shape)} has a zero dimension")
    n_elements = 1
    for ne in shape:
        n_elements *= ne
        if n_elements > INT64_MAX:
            raise GGUFFormatError(f"tensor {name!r}: shape {list(shape)} overflows the element count")
    try:
        gtype = GGMLQuantizationType(raw_type)
        block, type_size = GGML_QUANT_SIZES[gtype]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor {name!r}: unknown ggml type {raw_type}") from None
    if shape[0] % block:
        raise GGUFFormatError(f"tensor {name!r}: ne0={shape[0]} is not a multiple of the "
                              f"{gtype.name} block size {block}")
    nbytes = n_elements // block * type_size
    if nbytes > INT64_MAX:
        raise GGUFFormatError(f"tensor {name!r}: byte size {nbytes} overflows")
    return name, shape, int(gtype), rel_offset, nbytes


class GGUFFile:
    """A validated, memory-mapped GGUF. Build with GGUFFile.open(path); close() or use `with`."""

    def __init__(self, path: Path, mm, file_size: int):
        self.path, self._mm, self.file_size = path, mm, file_size
        self.version = 0
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.kv: dict[str, object] = {}
        self.kv_type: dict[str, tuple] = {}
        self.tensors: dict[str, TensorInfo] = {}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def open(cls, path) -> "GGUFFile":
        path = Path(path)
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if size == 0:
                    raise GGUFFormatError(f"{path}: empty file, not a GGUF")
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFFormatError(f"{path}: cannot read: {e.strerror or e}") from None
        gf = cls(path, mm, size)
        try:
            gf._parse()
        except GGUFFormatError as e:
            gf.close()
            raise GGUFFormatError(f"{path}: {e}") from None
        except BaseException:
            gf.close()
            raise
        return gf

    def _parse(self) -> None:
        cur = _Cursor(self._mm, self.file_size)
        magic = cur.u32("magic")
        if magic != GGUF_MAGIC:
            raise GGUFFormatError(f"bad magic {bytes(self._mm[:4])!r}: not a GGUF file")
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            raise GGUFFormatError(f"unsupported GGUF version {self.version} (expected 2 or 3)")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("KV count")
        if n_kv * _MIN_KV_BYTES > cur.remaining():
            raise GGUFFormatError(f"KV count {n_kv} cannot fit in the {cur.remaining()} bytes left")
        if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining():
            raise GGUFFormatError(f"tensor count {n_tensors} cannot fit in the {cur.remaining()} bytes left")
        self._read_kv(cur, n_kv)
        self._read_alignment()
        infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._place_tensors(infos)

    def _read_kv(self, cur: _Cursor, n_kv: int) -> None:
        for i in range(n_kv):
            key = cur.string(f"key #{i}", strict=True)
            if key in self.kv:
                raise GGUFFormatError(f"duplicate key {key!r}")
            vtype = _value_type(cur.u32(f"type of {key!r}"), f"key {key!r}")
            value, etype = _read_value(cur, vtype, key)
            self.kv[key], self.kv_type[key] = value, (vtype, etype)

    def _read_alignment(self) -> None:
        if ALIGNMENT_KEY not in self.kv:
            return
        if self.kv_type[ALIGNMENT_KEY][0] != GGUFValueType.UINT32:
            raise GGUFFormatError(f"{ALIGNMENT_KEY} must be UINT32")
        align = self.kv[ALIGNMENT_KEY]
        if align == 0 or align & (align - 1):
            raise GGUFFormatError(f"{ALIGNMENT_KEY}={align} is not a power of two")
        self.alignment = align

    def _place_tensors(self, infos) -> None:
        if infos and self.data_offset > self.file_size:
            raise GGUFFormatError(f"truncated file: tensor data would start at {self.data_offset}, "
                                  f"file has {self.file_size} bytes")
        for name, shape, gtype, rel, nbytes in infos:
            if name in self.tensors:
                raise GGUFFormatError(f"duplicate tensor {name!r}")
            if rel % self.alignment:
                raise GGUFFormatError(f"tensor {name!r}: offset {rel} is not aligned to {self.alignment}")
            start = self.data_offset + rel       # Python ints: no wrap-around possible
            if start + nbytes > self.file_size:
                raise GGUFFormatError(f"tensor {name!r}: data [{start}, {start + nbytes}) runs past the "
                                      f"end of the file ({self.file_size} bytes)")
            self.tensors[name] = TensorInfo(name, shape, gtype, start, nbytes)
        by_offset = sorted(self.tensors.values(), key=lambda t: t.offset)
        for prev, nxt in zip(by_offset, by_offset[1:]):
            if nxt.offset < prev.offset + prev.nbytes:
                raise GGUFFormatError(f"tensors {prev.name!r} and {nxt.name!r} overlap")

    # -- access ------------------------------------------------------------------------------
    @property
    def arch(self) -> str | None:
        value = self.kv.get(ARCHITECTURE_KEY)
        return value if isinstance(value, str) else None

    def type_name(self, key: str) -> str:
        vtype, etype = self.kv_type[key]
        return f"{vtype.name}[{etype.name}]" if etype is not None else vtype.name

    def get_int(self, key: str, default=None):
        """An integer-typed key of any width; LuceError (exit 1) if it holds another type."""
        if key not in self.kv:
            return default
        if self.kv_type[key][0] not in INTEGER_TYPES:
            raise LuceError(f"{self.path}: key {key!r} has type {self.type_name(key)}, expected an integer")
        return int(self.kv[key])

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor, zero-copy from the mapping (uint8)."""
        t = self.tensors[name]
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def tensor_array(self, name: str) -> np.ndarray:
        """Tensor values in numpy (row-major) order, shape reversed from GGUF: F32/F16 and the
        integer types as views, BF16 widened to float32, quantized types as raw uint8 bytes."""
        t = self.tensors[name]
        raw = self.tensor_bytes(name)
        np_shape = tuple(reversed(t.shape))
        if t.ggml_type == GGMLQuantizationType.BF16:
            # bf16 is the top half of an f32: widen by shifting into the high 16 bits.
            return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(np_shape)
        dtype = _NUMPY_TENSOR_DTYPE.get(GGMLQuantizationType(t.ggml_type))
        if dtype is None:
            return raw
        return raw.view(np.dtype(dtype).newbyteorder("<")).reshape(np_shape)

    def close(self) -> None:
        if self._mm is None:
            return
        try:
            self._mm.close()
        except BufferError:
            # Tensor views handed out earlier still point into the map; it is released
            # when the last of them is garbage-collected.
            pass
        self._mm = None

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
