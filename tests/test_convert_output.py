"""atomic_output: the destination appears only complete, never partially, never by accident."""
from __future__ import annotations

import pytest

from luce.converters.output import atomic_output
from luce.errors import LuceError


def test_success_renames_temp_into_place(tmp_path):
    out = tmp_path / "d.gguf"
    with atomic_output(out, force=False) as tmp:
        assert tmp.parent == tmp_path and not out.exists()
        tmp.write_bytes(b"done")
    assert out.read_bytes() == b"done"
    assert list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failure_or_interrupt_leaves_nothing(tmp_path, exc):
    out = tmp_path / "d.gguf"
    with pytest.raises(type(exc)):
        with atomic_output(out, force=False) as tmp:
            tmp.write_bytes(b"partial")
            raise exc
    assert list(tmp_path.iterdir()) == []


def test_existing_file_needs_force(tmp_path):
    out = tmp_path / "d.gguf"
    out.write_bytes(b"old")
    with pytest.raises(LuceError, match="--force"):
        with atomic_output(out, force=False):
            pass
    assert out.read_bytes() == b"old"
    with atomic_output(out, force=True) as tmp:
        tmp.write_bytes(b"new")
    assert out.read_bytes() == b"new"


def test_failed_overwrite_keeps_the_old_file(tmp_path):
    out = tmp_path / "d.gguf"
    out.write_bytes(b"old")
    with pytest.raises(ValueError):
        with atomic_output(out, force=True) as tmp:
            tmp.write_bytes(b"half")
            raise ValueError("validation failed")
    assert out.read_bytes() == b"old" and list(tmp_path.iterdir()) == [out]


def test_missing_output_folder_is_one_clear_error(tmp_path):
    with pytest.raises(LuceError, match="does not exist"):
        with atomic_output(tmp_path / "no" / "d.gguf", force=False):
            pass
