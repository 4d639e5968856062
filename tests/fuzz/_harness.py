"""What the Python fuzz targets share: the property every input must satisfy, and the driver.

The property (issue 33): bad input ends in a LuceError whose message is one line, never another
exception, a crash or a hang. `refusal(check, data)` returns that message (None when the input is
accepted) and lets any other exception escape, which is what the fuzzer reports as a crash.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def scratch_file(suffix: str) -> Path:
    """A file in memory-backed /dev/shm when there is one: the input is written there each run."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, name = tempfile.mkstemp(suffix=suffix, prefix="luce-fuzz-", dir=folder)
    os.close(fd)
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    return Path(name)


def scratch_dir() -> Path:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    name = Path(tempfile.mkdtemp(prefix="luce-fuzz-", dir=folder))
    atexit.register(shutil.rmtree, name, True)
    return name


def refusal(check, data: bytes) -> str | None:
    from luce.errors import LuceError

    try:
        check(data)
    except LuceError as e:
        message = str(e)
        if "\n" in message or not message.strip():
            raise AssertionError(f"refusal is not one line: {message!r}") from None
        return message
    return None


def run_fuzzer(make_check, argv: list[str]) -> None:
    """atheris over make_check() (built inside the instrumentation context, so luce is covered)."""
    import atheris

    with atheris.instrument_imports(include=["luce"]):
        check = make_check()
    atheris.Setup(argv, lambda data: refusal(check, data))
    atheris.Fuzz()


if __name__ == "__main__":
    sys.exit("run fuzz_gguf.py or fuzz_safetensors.py")
