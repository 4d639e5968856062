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

__all__ = ["LuceError", "__version__"]
