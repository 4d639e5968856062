"""The per-tensor types of benchmark files (models/quant_recipes.py) against llama.cpp's own record
of what llama-quantize writes: the Qwen3.6-27B snapshot in its tests (tests/snapshots/
qwen3.6-27b.schema of llama.cpp 0c1e570, unpacked by `make peer-src`), for every ftype."""
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import quant_recipes as recipes  # noqa: E402
import synthetic_qwen35 as synth  # noqa: E402

SNAPSHOT = ROOT / "build/peer/llama.cpp/tests/snapshots/qwen3.6-27b.schema"
N_GQA_27B = 24 // 4
UPSTREAM_ONLY = {"TQ1_0", "TQ2_0", "MXFP4_MOE"}  # ternary / MoE ftypes: no qwen35 file uses them


def read_snapshot(path: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """{ftype: (default type, {tensor: type where it differs})}, as llama.cpp's test reads it."""
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make peer-src` (downloads llama-cpp-python's sdist)")
    sections, current = {}, None
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            ftype, default = line[1:].split("]")
            current = sections[ftype] = (default.strip(), {})
        else:
            name, qtype = line.rsplit(" ", 1)
            current[1][name] = qtype
    return sections


SECTIONS = read_snapshot(SNAPSHOT) if SNAPSHOT.exists() else {}
SHAPES_27B = synth.tensor_shapes(synth.SHAPES["27b"], mtp=False)  # the snapshot's file has no MTP block


def test_snapshot_covers_every_ftype_we_know():
    assert SECTIONS, f"{SNAPSHOT} is missing: run `make peer-src`"
    assert set(SECTIONS) - UPSTREAM_ONLY == set(recipes.FTYPE_DEFAULT)


@pytest.mark.parametrize("ftype", sorted(recipes.FTYPE_DEFAULT))
def test_every_tensor_type_equals_llama_quantize(ftype):
    default, overrides = read_snapshot(SNAPSHOT)[ftype]
    types = recipes.llama_quantize_types(ftype, SHAPES_27B, N_GQA_27B)
    quantized = [name for name, ne, _ in SHAPES_27B if recipes.quantizable(name, ne)]
    assert set(overrides) <= set(quantized)  # the snapshot names no tensor we leave alone
    assert recipes.FTYPE_DEFAULT[ftype].name.lower() == default.lower()
    want = {name: overrides.get(name, default).upper() for name in quantized}
    assert {name: types[name].name for name in quantized} == want
    # what llama-quantize leaves alone keeps the converter's type
    assert all(types[name] == src for name, ne, src in SHAPES_27B if not recipes.quantizable(name, ne))


def test_use_more_bits_by_hand():
    # 64 layers: the first and last 8, then 10, 13, ..., 55 (every third from layer 8 + 2)
    chosen = [i for i in range(64) if recipes.use_more_bits(i, 64)]
    assert chosen == list(range(8)) + list(range(10, 56, 3)) + list(range(56, 64))


def test_third_party_variants():
    base = recipes.llama_quantize_types("IQ4_XS", SHAPES_27B, N_GQA_27B)
    for qtype in (T.F32, T.BF16, T.Q8_0):
        small = recipes.with_small_projections(base, qtype)
        changed = {name for name in base if small[name] != base[name]}
        assert len(changed) == 2 * 48 and all(name.endswith(("ssm_alpha.weight", "ssm_beta.weight"))
                                              for name in changed)
    ud = recipes.unsloth_dynamic_types(SHAPES_27B, N_GQA_27B)
    assert {ud[f"blk.{i}.ssm_out.weight"] for i in range(64) if (i + 1) % 4} == {T.Q8_0}
    assert {ud[f"blk.{i}.ffn_up.weight"] for i in range(64)} == {T.Q4_K}
    assert {ud[f"blk.{i}.ffn_down.weight"] for i in range(64)} == {T.Q5_K, T.Q6_K}
    assert Counter(ud.values())[T.Q8_0] == 3 * 48


def test_unknown_ftype_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown llama-quantize ftype 'Q4_K_X'"):
        recipes.llama_quantize_types("Q4_K_X", SHAPES_27B, N_GQA_27B)


@pytest.mark.parametrize("mix", synth.RECIPE_MIXES)
def test_synthetic_file_has_the_recipe_types(tmp_path, mix):
    # The tiny shape through the writer: every tensor's type is the recipe's, and every value is finite.
    shape = synth.SHAPES["tiny"]
    path = synth.write(tmp_path / f"{mix}.gguf", shape, mix, seed=1, mtp=False, log=None)
    want = synth.mix_types(shape, mix, synth.tensor_shapes(shape, mtp=False))
    reader = GGUFReader(path)
    assert {t.name: t.tensor_type for t in reader.tensors} == want
    from gguf.quants import dequantize
    for t in reader.tensors:
        assert np.isfinite(dequantize(t.data, t.tensor_type)).all(), t.name
