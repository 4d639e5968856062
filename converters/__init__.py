"""Checkpoint readers and GGUF writers (pure Python: safetensors, gguf, numpy)."""
