"""The committed reference target joined with its trained MTP block, as a transformers checkpoint.

    python3 -m models.target_mtp -o models/work/target-mtp/target
    luce convert models/work/target-mtp/target -o models/work/reference-target-mtp-q8_0.gguf --outtype q8_0

(`make reference-mtp` runs both.) The target's weights come from target-q8_0.gguf through
models/gguf_to_hf.py (the exact inverse of the converter: reconverting them writes the committed
tensors byte for byte), the `mtp.*` tensors from models/reference/mtp (models/train_mtp.py), and
config.json gains `mtp_num_hidden_layers: 1` as Qwen3.5's own configs say it. The converter then
does what it does for a downloaded Qwen3.5 with its MTP head: `mtp.*` becomes block
blk.{num_hidden_layers}.nextn.*, block_count counts it and nextn_predict_layers = 1.

Why a second GGUF made on demand and not a new target-q8_0.gguf: the committed target is what the
drafters were trained against, what gguf_to_hf exports and the tests pin; its main tensors do not
change here (the MTP file's main tensors are the same bytes, tests/test_mtp.py checks), and a
second 14 MB file would push the tracked models plus the drafter carry past the GPU tool's 64 MiB.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REF = Path(__file__).parent / "reference"


def _names(path: Path) -> list[str]:
    """Tensor names from a safetensors header (no tensor read: numpy has no bfloat16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def join(out: Path, mtp_dir: Path = REF / "mtp", gguf: Path = REF / "target-q8_0.gguf") -> dict:
    """Two shards and an index, as Qwen3.5 checkpoints ship their MTP head: the exported target
    (float32) and the MTP file as trained (bf16), copied byte for byte."""
    import shutil

    from models.gguf_to_hf import export

    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    for stale in ("model.safetensors", "model.safetensors.index.json", *shards):  # a rerun's
        (out / stale).unlink(missing_ok=True)
    export(gguf, out)
    main_names, mtp_names = _names(out / "model.safetensors"), _names(mtp_dir / "model.safetensors")
    if not mtp_names or not all(k.startswith("mtp.") for k in mtp_names):
        raise SystemExit(f"error: {mtp_dir / 'model.safetensors'} must hold mtp.* tensors only")
    (out / "model.safetensors").rename(out / shards[0])
    shutil.copyfile(mtp_dir / "model.safetensors", out / shards[1])
    weight_map = {k: shards[0] for k in main_names} | {k: shards[1] for k in mtp_names}
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n")
    config = json.loads((out / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"tensors": len(weight_map), "mtp_tensors": len(mtp_names)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--mtp", type=Path, default=REF / "mtp", help="models/train_mtp.py output")
    ap.add_argument("--gguf", type=Path, default=REF / "target-q8_0.gguf", help="the target")
    args = ap.parse_args(argv)
    for need in (args.gguf, args.mtp / "model.safetensors"):
        if not need.is_file():
            sys.exit(f"error: {need} not found")
    info = join(args.out, args.mtp, args.gguf)
    print(f"wrote {args.out}: {info['tensors']} tensors ({info['mtp_tensors']} mtp.*)")


if __name__ == "__main__":
    main()
