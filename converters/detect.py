"""Which converter a checkpoint needs: a drafter (dflash / dflash2 / dspark) or a Qwen3.5
target (qwen35). Unknown layouts are refused with what was found, never guessed."""
from __future__ import annotations

from luce.converters import dflash, dflash2, dspark
from luce.errors import LuceError

DRAFTER_KINDS = ("dflash", "dflash2", "dspark")
TARGET_KIND = "qwen35"
TARGET_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
TARGET_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")


def is_target_config(config: dict) -> bool:
    archs = config.get("architectures") or []
    return any(a in TARGET_ARCHITECTURES for a in archs) or config.get("model_type") in TARGET_MODEL_TYPES


def detect_checkpoint(config: dict, tensor_names, sidecar_names=()) -> str:
    """dflash | dflash2 | dspark | qwen35 from config.json and the tensor names."""
    names = [dflash.strip_prefix(n) for n in tensor_names]
    archs = config.get("architectures") or []
    if is_target_config(config):
        return TARGET_KIND
    has_trunk = "fc.weight" in names and "hidden_norm.weight" in names
    if not has_trunk:
        sample = ", ".join(sorted(names)[:5]) or "no tensors"
        raise LuceError(f"unknown checkpoint layout: architectures={archs}, tensors: {sample}... "
                        f"(expected a DFlash/DFlash 2/DSpark drafter with fc.weight + hidden_norm.weight, "
                        f"or a Qwen3.5 target)")
    if "DFlash2DraftModel" in archs or dflash2.is_dflash2(names):
        return "dflash2"
    if any(a in dspark.ARCHITECTURES for a in archs) or dspark.is_dspark(names) or dspark.is_dspark(sidecar_names):
        return "dspark"
    return "dflash"
