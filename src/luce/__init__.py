"""luce: fast, lossless local inference of Qwen3.5-family hybrid models with
block-diffusion speculative decoding (DFlash, DFlash 2, DSpark).

The Python API mirrors the CLI:

    from luce import Engine
    eng = Engine("target.gguf")
    print(eng.generate("Hello", max_tokens=32).text)
"""
from __future__ import annotations

from luce.errors import LuceError

__version__ = "0.1.0"


def reference_target():
    """Path of the bundled reference target: a 12.6 M-parameter Qwen3.5-architecture model trained
    on Python source and essays (docs/models.md), what `luce generate` runs without -m."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "data" / "reference-target-q8_0.gguf"

__all__ = ["Engine", "Generation", "LuceError", "MemoryUse", "ModelInfo", "__version__"]


def __getattr__(name):
    # Lazy: `import luce` (and so `luce --help`) never imports numpy or the native binding.
    if name in ("Engine", "Generation", "MemoryUse", "ModelInfo"):
        from luce import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'luce' has no attribute {name!r}")
