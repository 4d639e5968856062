"""Atomic output files: a converter writes a temp file beside the destination, the caller
validates it, and only then is it renamed over the destination.

A temp file in the *same folder* makes os.replace a single atomic rename on one filesystem, so
readers see either no file or the complete one; any failure (including Ctrl-C) removes the temp
file, so a failed run never leaves a partial output behind.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from luce.errors import LuceError


def check_destination(path, force: bool) -> Path:
    """Refuse an existing destination without --force, or a destination folder that is missing."""
    path = Path(path)
    if path.is_dir():
        raise LuceError(f"{path} is a directory; give an output file name")
    if path.exists() and not force:
        raise LuceError(f"{path} already exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise LuceError(f"output folder {path.parent} does not exist")
    return path


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_output(path, force: bool):
    """Yield a temp path in the destination folder; on a clean exit rename it to `path`.

    The caller writes the temp file and validates it inside the `with` block; raising there
    (or an interrupt) removes the temp file and leaves `path` untouched.
    """
    path = check_destination(path, force)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    os.chmod(tmp, 0o666 & ~_current_umask())   # mkstemp makes 0600; give it a normal file's mode
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
