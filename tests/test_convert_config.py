"""Config normalisation: rope_parameters vs legacy rope_scaling, YaRN rules, dflash_config vs
top level, SWA only for in-block causal drafters. Expected values are the fixtures' own numbers."""
from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from fixtures import drafter_checkpoints as ck
from fixtures.crafted_gguf import write_valid_qwen35
from luce.converters.convert import ConvertOptions, convert_checkpoint
from luce.errors import LuceError

A = "qwen35-dflash-draft."


def _keys(tmp_path, fixture, **opts):
    src = ck.FIXTURES[fixture](tmp_path / "src") if isinstance(fixture, str) else fixture
    out = tmp_path / "out.gguf"
    convert_checkpoint(src, out, ConvertOptions(**opts))
    return {f.name: f.contents() for f in GGUFReader(out).fields.values() if not f.name.startswith("GGUF.")}


def test_rope_parameters_carry_theta_and_yarn(tmp_path):
    k = _keys(tmp_path, "rope_parameters_yarn")
    assert k[A + "rope.freq_base"] == pytest.approx(5e6)
    assert k[A + "rope.scaling.type"] == "yarn" and k[A + "rope.scaling.factor"] == 4.0
    assert k[A + "rope.scaling.original_context_length"] == 2048
    assert k[A + "rope.scaling.beta_fast"] == 32.0 and k[A + "rope.scaling.beta_slow"] == 1.0


def test_legacy_type_spelling_and_top_level_original_context(tmp_path):
    k = _keys(tmp_path, "legacy_rope_scaling_type")
    assert k[A + "rope.scaling.type"] == "yarn" and k[A + "rope.scaling.factor"] == 8.0
    assert k[A + "rope.scaling.original_context_length"] == 1024
    assert k[A + "rope.freq_base"] == pytest.approx(1e7)


def test_yarn_factor_without_original_context_is_refused(tmp_path):
    src = ck.yarn_without_original(tmp_path / "src")
    with pytest.raises(LuceError, match="original_max_position_embeddings"):
        convert_checkpoint(src, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_no_yarn_drops_scaling_keys_but_keeps_theta(tmp_path):
    k = _keys(tmp_path, ck.yarn_without_original(tmp_path / "src"), no_yarn=True)
    assert not any(key.startswith(A + "rope.scaling") for key in k)
    assert k[A + "rope.freq_base"] == pytest.approx(1e7)


def test_factor_of_one_writes_no_yarn(tmp_path):
    src = ck.zlab_dflash(tmp_path / "src", rope_scaling={"rope_type": "yarn", "factor": 1.0})
    assert not any("rope.scaling" in key for key in _keys(tmp_path, src))


def test_top_level_fields_when_there_is_no_dflash_config(tmp_path):
    k = _keys(tmp_path, "top_level_fields")
    assert k[A + "dflash.block_size"] == ck.BLOCK and k[A + "dflash.mask_token_id"] == ck.MASK
    assert list(k[A + "dflash.target_layer_ids"]) == ck.TAPS


def test_dflash_config_wins_over_top_level(tmp_path):
    src = ck.zlab_dflash(tmp_path / "src", mask_token_id=7, target_layer_ids=[3, 4, 5])
    k = _keys(tmp_path, src)
    assert k[A + "dflash.mask_token_id"] == ck.MASK and list(k[A + "dflash.target_layer_ids"]) == ck.TAPS
    assert k[A + "dflash.block_size"] == ck.BLOCK          # not the top-level 16


def test_aux_hidden_state_layer_ids_are_layer_inputs(tmp_path):
    cfg = ck.base_config(aux_hidden_state_layer_ids=[1, 2, 3])
    del cfg["dflash_config"]["target_layer_ids"]
    src = ck.write_checkpoint(tmp_path / "src", cfg, ck.trunk_tensors(ck._gen(1)))
    assert list(_keys(tmp_path, src)[A + "dflash.target_layer_ids"]) == [0, 1, 2]


def test_swa_pattern_for_in_block_causal_drafters(tmp_path):
    k = _keys(tmp_path, "swa_causal")
    assert k[A + "attention.sliding_window"] == 1024
    assert list(k[A + "attention.sliding_window_pattern"]) == [True, False]


@pytest.mark.parametrize("where", ["top", "dflash_config.is_causal", "dflash_config.causal"])
def test_bidirectional_sliding_layers_keep_their_window(tmp_path, where):
    """is_causal false changes the in-block direction, not the window (spec/drafters.md §1.5): the
    pattern and window are written as for a causal drafter, plus attention.causal = false."""
    cfg = ck.base_config(sliding_window=1024, layer_types=["sliding_attention", "full_attention"],
                         use_sliding_window=True)
    if where == "top":
        cfg["is_causal"] = False
    else:
        cfg["dflash_config"][where.split(".")[1]] = False
    src = ck.write_checkpoint(tmp_path / "src", cfg, ck.trunk_tensors(ck._gen(1)))
    k = _keys(tmp_path, src)
    assert k[A + "attention.sliding_window"] == 1024
    assert list(k[A + "attention.sliding_window_pattern"]) == [True, False]
    assert k[A + "attention.causal"] is False


def test_bidirectional_window_needs_use_sliding_window(tmp_path):
    """Without use_sliding_window, transformers' Qwen3Config drops sliding_window (so z-lab's
    reference runs no window) and llama.cpp's converter writes none: neither does luce."""
    assert not any("sliding_window" in key or "causal" in key for key in _keys(tmp_path, "swa_not_causal"))


def test_causal_sliding_drafters_write_no_causal_key(tmp_path):
    """In-block causal sliding layers keep the lucebox bytes they always had: no attention.causal."""
    assert A + "attention.causal" not in _keys(tmp_path, "swa_causal")


def test_speculators_sample_from_anchor_false_is_kept(tmp_path):
    src = ck.dspark_radixark(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["sample_from_anchor"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    assert _keys(tmp_path, src)[A + "dflash.sample_from_anchor"] is False


def test_head_dim_derived_from_k_proj_when_config_has_none(tmp_path):
    cfg = ck.base_config()
    del cfg["head_dim"]
    src = ck.write_checkpoint(tmp_path / "src", cfg, ck.trunk_tensors(ck._gen(1)))
    assert _keys(tmp_path, src)[A + "attention.key_length"] == ck.D


@pytest.mark.parametrize("override,both", [
    ({"hidden_size": 96}, ("96", "64")),
    ({"num_hidden_layers": 3}, ("3", "2")),
    ({"intermediate_size": 100}, ("100", "128")),
    ({"num_key_value_heads": 4}, ("64", "32")),        # 4*16 vs k_proj rows 32
])
def test_config_disagreeing_with_weights_names_both_values(tmp_path, override, both):
    src = ck.zlab_dflash(tmp_path / "src", **override)
    with pytest.raises(LuceError) as err:
        convert_checkpoint(src, tmp_path / "out.gguf")
    assert all(v in str(err.value) for v in both)


def test_target_layer_ids_length_must_match_fc(tmp_path):
    cfg = ck.base_config()
    cfg["dflash_config"]["target_layer_ids"] = [0, 1]
    src = ck.write_checkpoint(tmp_path / "src", cfg, ck.trunk_tensors(ck._gen(1)))
    with pytest.raises(LuceError, match=r"len\(target_layer_ids\)=2 but the weights say 3"):
        convert_checkpoint(src, tmp_path / "out.gguf")


def test_deepseek_v4_mtp_head_names(tmp_path):
    gen = ck._gen(13)
    heads = ck.dspark_heads(gen, prefix_w="mtp.2.markov_head.", prefix_c="mtp.2.confidence_head.proj.")
    src = ck.write_checkpoint(tmp_path / "src", ck._dspark_config("DSparkDraftModel"),
                              {**ck.trunk_tensors(gen), **heads})
    k = _keys(tmp_path, src)
    assert k[A + "dflash.dspark.markov_rank"] == ck.MARKOV_RANK
    assert k[A + "dflash.dspark.confidence_dim"] == ck.H + ck.MARKOV_RANK


def test_unconverted_sidecar_tensors_and_pickles_are_warned_about(tmp_path):
    gen = ck._gen(14)
    src = ck.write_checkpoint(tmp_path / "src", ck.base_config(), ck.trunk_tensors(gen),
                              sidecar={"domino_start": ck._rand(gen, 4)})
    result = convert_checkpoint(src, tmp_path / "a.gguf")
    assert any("sidecar tensors not converted" in w for w in result.warnings)
    (src / "dflash_aux_heads.safetensors").rename(src / "dflash_aux_heads.pt")
    result = convert_checkpoint(src, tmp_path / "b.gguf")
    assert any("skipping dflash_aux_heads.pt" in w for w in result.warnings)
    with pytest.raises(LuceError, match="only .safetensors"):
        convert_checkpoint(src, tmp_path / "c.gguf", ConvertOptions(aux_heads=src / "dflash_aux_heads.pt"))


def test_config_markov_rank_must_match_the_weights(tmp_path):
    src = ck.dspark_radixark(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["markov_rank"] = 8
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LuceError, match="markov_rank=8 but the weights say 16"):
        convert_checkpoint(src, tmp_path / "out.gguf")


# ---- DFlash 2 unary-logit scalars (spec/drafters.md §2.2-§2.3) -----------------------------------

MULTIPLIER_KEY, SOFTCAP_KEY = A + "dflash.dflash2.output_multiplier", A + "dflash.dflash2.final_logit_softcapping"


def _dflash2_with(folder, dflash_config: dict, **top_level):
    src = ck.dflash2(folder, **top_level)
    cfg = json.loads((src / "config.json").read_text())
    cfg["dflash_config"].update(dflash_config)
    (src / "config.json").write_text(json.dumps(cfg))
    return src


def test_logit_scalars_are_written_as_f32_keys(tmp_path):
    out = tmp_path / "out.gguf"
    convert_checkpoint(ck.dflash2_logit_scalars(tmp_path / "src"), out)
    fields = GGUFReader(out).fields
    for key, value in ((MULTIPLIER_KEY, ck.MUSE_MULTIPLIER), (SOFTCAP_KEY, ck.MUSE_SOFTCAP)):
        assert fields[key].types == [GGUFValueType.FLOAT32]
        assert fields[key].contents() == np.float32(value)


def test_logit_scalars_dflash_config_wins_and_top_level_is_read(tmp_path):
    src = _dflash2_with(tmp_path / "a", {"output_multiplier": 0.5}, output_multiplier=3.0, final_logit_softcapping=30.0)
    k = _keys(tmp_path / "a", src)
    assert k[MULTIPLIER_KEY] == 0.5 and k[SOFTCAP_KEY] == 30.0


def test_default_logit_scalars_write_nothing(tmp_path):
    """Explicit defaults (multiplier 1, cap null) give the same bytes as a config without them."""
    plain, explicit = tmp_path / "plain.gguf", tmp_path / "explicit.gguf"
    convert_checkpoint(ck.dflash2(tmp_path / "a"), plain)
    convert_checkpoint(_dflash2_with(tmp_path / "b", {"output_multiplier": 1.0, "final_logit_softcapping": None}),
                       explicit)
    assert plain.read_bytes() == explicit.read_bytes()
    assert not any("output_multiplier" in f or "softcapping" in f for f in GGUFReader(plain).fields)


@pytest.mark.parametrize("field, value", [
    ("output_multiplier", 0), ("output_multiplier", -0.5), ("output_multiplier", float("inf")),
    ("final_logit_softcapping", 0.0), ("final_logit_softcapping", float("nan")), ("final_logit_softcapping", "20"),
    ("final_logit_softcapping", True),
])
def test_bad_logit_scalars_are_refused(tmp_path, field, value):
    src = _dflash2_with(tmp_path / "src", {field: value})
    with pytest.raises(LuceError, match=f"{field} must be a finite number > 0"):
        convert_checkpoint(src, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_llama_cpp_layout_writes_logit_scalars_under_upstream_keys(tmp_path):
    """llama.cpp's converter stores output_multiplier as {arch}.logit_scale and the cap as
    {arch}.final_logit_softcapping (its DFlash graph scales, then soft-caps, as luce does)."""
    target = write_valid_qwen35(tmp_path / "target.gguf")
    out = tmp_path / "out.gguf"
    convert_checkpoint(ck.dflash2_logit_scalars(tmp_path / "src"), out,
                       ConvertOptions(layout="llama.cpp", target_model=target))
    f = {x.name: x for x in GGUFReader(out).fields.values()}
    assert f["dflash.logit_scale"].contents() == pytest.approx(ck.MUSE_MULTIPLIER, rel=1e-7)
    assert f["dflash.final_logit_softcapping"].contents() == ck.MUSE_SOFTCAP
    assert not any("dflash2" in name for name in f)


def test_llama_cpp_layout_without_target_model_is_one_line(tmp_path, luce_cmd):
    out = tmp_path / "out.gguf"
    result = luce_cmd("convert", ck.dflash2(tmp_path / "src"), "-o", out, "--layout", "llama.cpp")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "--target-model" in lines[0] and "tokenizer" in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize("make_target, message", [
    (lambda d: (d / "t.gguf").write_bytes(b"GGUF") and d / "t.gguf", "t.gguf"),
    (lambda d: (d / "hf").mkdir() or d / "hf", "tokenizer.json and config.json"),
])
def test_bad_target_model_is_refused_before_writing(tmp_path, luce_cmd, make_target, message):
    out = tmp_path / "out.gguf"
    result = luce_cmd("convert", ck.dflash2(tmp_path / "src"), "-o", out, "--layout", "llama.cpp",
                      "--target-model", make_target(tmp_path))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not out.exists()


def test_lucebox_layout_ignores_target_model_and_says_so(tmp_path):
    target = write_valid_qwen35(tmp_path / "target.gguf")
    out = tmp_path / "out.gguf"
    result = convert_checkpoint(ck.dflash2(tmp_path / "src"), out, ConvertOptions(target_model=target))
    assert any("--target-model is used only by --layout llama.cpp" in w for w in result.warnings)
    names = {f.name for f in GGUFReader(out).fields.values()}
    assert not any(n.startswith("tokenizer.") for n in names) and "qwen35-dflash-draft.vocab_size" in names


def test_mask_outside_the_target_vocabulary_is_refused(tmp_path):
    from fixtures.crafted_gguf import TinyQwen35
    target = write_valid_qwen35(tmp_path / "target.gguf", TinyQwen35(vocab=256))
    with pytest.raises(LuceError, match="mask_token_id=500 is outside the target's vocabulary of 256"):
        convert_checkpoint(ck.dflash2(tmp_path / "src"), tmp_path / "out.gguf",
                           ConvertOptions(layout="llama.cpp", target_model=target))
    assert not (tmp_path / "out.gguf").exists()
