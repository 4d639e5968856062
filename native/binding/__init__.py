"""cffi binding of the native runtime (ABI mode: the header is parsed, the library dlopen'ed).

`lib()` loads libluce on first use, so importing luce never touches the native library;
`check(status)` turns a failing luce_status into a LuceError carrying luce_last_error().
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import cffi

_HERE = Path(__file__).resolve().parent
_HEADER = _HERE / "luce.h"
_LIBRARY = _HERE / "libluce.so"

ffi = cffi.FFI()
_lock = threading.Lock()
_lib = None


def _cdef_text(header: str) -> str:
    """The declarations between the CDEF markers of luce.h (cffi does not run the preprocessor)."""
    begin = header.index("/* LUCE_CDEF_BEGIN */") + len("/* LUCE_CDEF_BEGIN */")
    end = header.index("/* LUCE_CDEF_END */")
    return header[begin:end]


def lib():
    """The loaded native library (loaded once per process)."""
    global _lib
    with _lock:
        if _lib is None:
            from luce.errors import LuceError

            if not _LIBRARY.exists() or not _HEADER.exists():
                raise LuceError(
                    f"native runtime not found at {_HERE} (reinstall luce: pip install .)"
                )
            ffi.cdef(_cdef_text(_HEADER.read_text()))
            _lib = ffi.dlopen(os.fspath(_LIBRARY))
        return _lib


def last_error() -> str:
    return ffi.string(lib().luce_last_error()).decode("utf-8", "replace")


def check(status: int, what: str = "") -> None:
    """Raise LuceError (with the native one-line reason) unless status is LUCE_OK."""
    if status != 0:
        from luce.errors import LuceError

        reason = last_error() or f"native call failed with status {status}"
        # Native messages often name the file already; never say it twice.
        message = f"{what}: {reason}" if what and what not in reason else reason
        raise LuceError(message, status=int(status))
