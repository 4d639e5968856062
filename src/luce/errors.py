"""The one exception type the luce library raises for anything a user can get wrong.

The CLI catches LuceError once, at the top, and prints its message as a single line
(`Error: ...`) with the exit code it carries; the library never prints.
"""
from __future__ import annotations


class LuceError(Exception):
    """A user-facing failure: bad input file, bad option, unsupported model.

    `exit_code` is what the CLI exits with (1 unless a command documents otherwise);
    `status` is the native luce_status when the failure came from the runtime.
    """

    def __init__(self, message: str, *, exit_code: int = 1, status: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status
