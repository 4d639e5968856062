"""Round trip: every converted tensor equals its source after the documented conversion, and
every key has the documented type and value.

Oracles: the source is read with safetensors.torch and converted with torch casts; the output
is read with gguf-py's GGUFReader; q8_0 is compared byte for byte with gguf.quants.quantize.
Expected key values are the fixture constants, not anything the converter computed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType as Q, GGUFValueType as VT
from safetensors.torch import load_file

from fixtures import drafter_checkpoints as ck
from fixtures.crafted_gguf import write_valid_qwen35
from luce.converters.convert import ConvertOptions, convert_checkpoint

A = "qwen35-dflash-draft."
# HF name -> GGUF name, written out by hand from spec/engine.md §2.5 for layer 0 (layer 1 alike).
TRUNK_NAMES = {
    "fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
    "norm.weight": "output_norm.weight",
    "layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layers.0.self_attn.q_norm.weight": "blk.0.attn_q_norm.weight",
    "layers.0.self_attn.k_norm.weight": "blk.0.attn_k_norm.weight",
    "layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
DFLASH2_NAMES = {
    "layers.1.attention_conv.base_kernel": "blk.1.attn_conv.base",
    "layers.1.attention_conv.kernel_projection.weight": "blk.1.attn_conv.proj.weight",
    "layers.1.mlp_conv.base_kernel": "blk.1.ffn_conv.base",
    "layers.1.mlp_conv.kernel_projection.weight": "blk.1.ffn_conv.proj.weight",
    "candidate_selector.hidden_projection.weight": "dflash.selector.hproj.weight",
    "candidate_selector.predecessor_codebook": "dflash.selector.pred_cb",
    "candidate_selector.successor_codebook": "dflash.selector.succ_cb",
}
DSPARK_NAMES = {
    "markov_head.markov_w1.weight": "dflash.dspark.markov.w1",
    "markov_head.markov_w2.weight": "dflash.dspark.markov.w2",
    "confidence_head.proj.weight": "dflash.dspark.confidence.weight",
    "confidence_head.proj.bias": "dflash.dspark.confidence.bias",
}
F32_SUFFIXES = ("norm.weight", "conv.base", "confidence.bias")


def _convert(tmp_path, fixture, **opts):
    src = ck.FIXTURES[fixture](tmp_path / "src")
    out = tmp_path / "out.gguf"
    convert_checkpoint(src, out, ConvertOptions(**opts))
    return src, GGUFReader(out)


def _fields(reader):
    return {f.name: f for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def _value(field):
    return field.contents()


def _check_tensors(src, reader, names, outtype="f16", sidecar=False):
    source = load_file(src / "model.safetensors")
    if sidecar:
        source.update(load_file(src / "dflash_aux_heads.safetensors"))
    out = {t.name: t for t in reader.tensors}
    for hf, gg in names.items():
        t, ref = out[gg], source[hf].float()
        # GGUF dims are the HF dims reversed (ne0 = HF last dim).
        assert tuple(int(x) for x in t.shape) == tuple(reversed(ref.shape)), gg
        if gg.endswith(F32_SUFFIXES):
            assert t.tensor_type == Q.F32, gg
            np.testing.assert_array_equal(np.asarray(t.data).reshape(ref.shape), ref.numpy())
        elif outtype == "f16":
            assert t.tensor_type == Q.F16, gg
            np.testing.assert_array_equal(np.asarray(t.data).reshape(ref.shape), ref.half().numpy())
        elif outtype == "bf16":
            assert t.tensor_type == Q.BF16, gg
            expected_bits = source[hf].view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(np.asarray(t.data).view(np.uint16).reshape(ref.shape), expected_bits)
        elif outtype == "f32":
            assert t.tensor_type == Q.F32, gg
            np.testing.assert_array_equal(np.asarray(t.data).reshape(ref.shape), ref.numpy())
        elif outtype == "q8_0":
            rows_split = ref.dim() == 2 and ref.shape[-1] % 32 == 0
            assert t.tensor_type == (Q.Q8_0 if rows_split else Q.F16), gg
            if rows_split:
                expected = gguf_quants.quantize(ref.numpy(), Q.Q8_0)
                np.testing.assert_array_equal(np.asarray(t.data).ravel(), expected.ravel())


@pytest.mark.parametrize("outtype", ["f16", "bf16", "f32", "q8_0"])
def test_dflash_tensors_round_trip(tmp_path, outtype):
    src, reader = _convert(tmp_path, "zlab_dflash", outtype=outtype)
    _check_tensors(src, reader, TRUNK_NAMES, outtype)
    assert len(reader.tensors) == 11 * ck.L + 3     # spec/drafters.md §1.1: 11 per layer + 3


def test_dflash_keys_have_documented_types_and_values(tmp_path):
    _, reader = _convert(tmp_path, "zlab_dflash")
    f = _fields(reader)
    expected = {
        "general.architecture": (VT.STRING, "qwen35-dflash-draft"),
        A + "embedding_length": (VT.UINT32, ck.H), A + "block_count": (VT.UINT32, ck.L),
        A + "feed_forward_length": (VT.UINT32, ck.FF), A + "attention.head_count": (VT.UINT32, ck.NH),
        A + "attention.head_count_kv": (VT.UINT32, ck.NKV), A + "attention.key_length": (VT.UINT32, ck.D),
        A + "attention.value_length": (VT.UINT32, ck.D), A + "vocab_size": (VT.UINT32, ck.V),
        A + "context_length": (VT.UINT32, 4096), A + "dflash.n_target_layers": (VT.UINT32, 3),
        # dflash_config.block_size (8) wins over the top-level block_size (16)
        A + "dflash.block_size": (VT.UINT32, ck.BLOCK), A + "dflash.mask_token_id": (VT.UINT32, ck.MASK),
    }
    for key, (vtype, value) in expected.items():
        assert f[key].types[0] == vtype, key
        assert _value(f[key]) == value, key
    assert f[A + "attention.layer_norm_rms_epsilon"].types[0] == VT.FLOAT32
    assert _value(f[A + "attention.layer_norm_rms_epsilon"]) == pytest.approx(1e-6)
    assert _value(f[A + "rope.freq_base"]) == pytest.approx(1e7)
    assert f[A + "dflash.target_layer_ids"].types == [VT.ARRAY, VT.INT32]
    assert list(_value(f[A + "dflash.target_layer_ids"])) == ck.TAPS
    assert _value(f["general.name"]) == "DFlash-Draft-64h-2L"
    assert not any(k.startswith(A + "rope.scaling") or "sliding" in k or "dspark" in k or "dflash2" in k
                   for k in f)
    assert not any(t.name.startswith(("token_embd", "output.weight")) for t in reader.tensors)


def test_dflash2_tensors_and_keys(tmp_path):
    src, reader = _convert(tmp_path, "dflash2")
    _check_tensors(src, reader, {**TRUNK_NAMES, **DFLASH2_NAMES})
    f = _fields(reader)
    assert _value(f[A + "dflash.dflash2.conv_kernel_size"]) == ck.CONV_K
    assert _value(f[A + "dflash.dflash2.conv_group_size"]) == ck.CONV_GROUP
    assert _value(f[A + "dflash.dflash2.selector_rank"]) == ck.SEL_RANK
    assert _value(f[A + "dflash.dflash2.selector_top_k"]) == ck.SEL_TOP_K
    # is_causal false: all layers bidirectional, so no SWA keys although layer_types say sliding
    assert not any("sliding_window" in k for k in f)
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    groups = ck.H // ck.CONV_GROUP
    assert shapes["blk.0.attn_conv.base"] == (ck.H, ck.CONV_K, 2)
    assert shapes["blk.0.attn_conv.proj.weight"] == (ck.H, 2 * ck.CONV_K * groups)
    assert shapes["dflash.selector.pred_cb"] == (ck.SEL_RANK, ck.V)
    assert len(reader.tensors) == 11 * ck.L + 3 + 4 * ck.L + 3


@pytest.mark.parametrize("fixture,names,sidecar,conf_dim", [
    ("dspark_radixark", DSPARK_NAMES, False, ck.H + ck.MARKOV_RANK),
    ("dspark_deepspec", DSPARK_NAMES, False, ck.H + ck.MARKOV_RANK),
    ("dspark_specforge_sidecar", {
        "dspark_markov_head.markov_w1.weight": "dflash.dspark.markov.w1",
        "dspark_markov_head.markov_w2.weight": "dflash.dspark.markov.w2",
        "dspark_confidence_head.weight": "dflash.dspark.confidence.weight",
        "dspark_confidence_head.bias": "dflash.dspark.confidence.bias"}, True, ck.H),
])
def test_dspark_variants(tmp_path, fixture, names, sidecar, conf_dim):
    src, reader = _convert(tmp_path, fixture)
    _check_tensors(src, reader, {**TRUNK_NAMES, **names}, sidecar=sidecar)
    f = _fields(reader)
    assert _value(f[A + "dflash.dspark.enabled"]) == 1
    assert _value(f[A + "dflash.dspark.markov_rank"]) == ck.MARKOV_RANK
    assert _value(f[A + "dflash.dspark.vocab_size"]) == ck.V
    assert _value(f[A + "dflash.dspark.confidence_dim"]) == conf_dim
    assert _value(f[A + "dflash.dspark.confidence.enabled"]) == 1
    # DeepSpec/SpecForge/RadixArk DSpark use next-token slots
    assert f[A + "dflash.sample_from_anchor"].types == [VT.BOOL] and _value(f[A + "dflash.sample_from_anchor"]) is True
    assert _value(f[A + "dflash.block_size"]) == 7
    # YaRN 32 with original 8192 from rope_scaling
    assert _value(f[A + "rope.scaling.type"]) == "yarn"
    assert _value(f[A + "rope.scaling.factor"]) == 32.0
    assert f[A + "rope.scaling.original_context_length"].types == [VT.UINT32]
    assert _value(f[A + "rope.scaling.original_context_length"]) == 8192
    names_out = [t.name for t in reader.tensors]
    assert not any("embed" in n or "lm_head" in n for n in names_out)   # DeepSpec copies dropped
    assert names_out[-4:] == list(names.values())                          # heads appended last


def test_sharded_checkpoint_equals_single_file(tmp_path):
    src, sharded = _convert(tmp_path / "a", "dflash_sharded")
    source = {}
    for shard in sorted(src.glob("model-*.safetensors")):
        source.update(load_file(shard))
    out = {t.name: t for t in sharded.tensors}
    for hf, gg in TRUNK_NAMES.items():
        ref = source[hf].float()
        expected = ref.numpy() if gg.endswith(F32_SUFFIXES) else ref.half().numpy()
        np.testing.assert_array_equal(np.asarray(out[gg].data).reshape(ref.shape), expected)


def test_llama_cpp_layout_names_and_one_based_target_layers(tmp_path):
    target = write_valid_qwen35(tmp_path / "target.gguf")
    src, reader = _convert(tmp_path, "dflash2", layout="llama.cpp", target_model=target)
    f = _fields(reader)
    assert _value(f["general.architecture"]) == "dflash"
    assert list(_value(f["dflash.target_layers"])) == [i + 1 for i in ck.TAPS]
    assert _value(f["dflash.block_size"]) == ck.BLOCK and _value(f["tokenizer.ggml.mask_token_id"]) == ck.MASK
    assert _value(f["dflash.conv_kernel_size"]) == ck.CONV_K
    assert _value(f["dflash.selector_top_k"]) == ck.SEL_TOP_K
    # llama.cpp's converter writes no vocab_size and no dflash.mask_token_id, and copies the
    # target's tokenizer (here the crafted target's placeholder vocabulary).
    assert "dflash.vocab_size" not in f and "dflash.mask_token_id" not in f
    assert _value(f["tokenizer.ggml.model"]) == "gpt2" and len(f["tokenizer.ggml.tokens"].data) == 512
    assert _value(f["dflash.attention.causal"]) is False      # the checkpoint's is_causal
    assert list(_value(f["dflash.rope.dimension_sections"])) == [ck.D // 2, 0, 0, 0]
    names = {t.name for t in reader.tensors}
    assert {"fc.weight", "enc.output_norm.weight", "blk.0.attn_conv_base", "blk.0.ffn_conv_proj.weight",
            "selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight"} <= names
    _check_tensors(src, reader, {"fc.weight": "fc.weight",
                                 "candidate_selector.successor_codebook": "selector_successor.weight"})


def test_llama_cpp_layout_dspark_names(tmp_path):
    target = write_valid_qwen35(tmp_path / "target.gguf")
    _, reader = _convert(tmp_path, "dspark_radixark", layout="llama.cpp", target_model=target)
    f = _fields(reader)
    assert _value(f["dflash.sample_from_anchor"]) is True and _value(f["dflash.has_confidence_head"]) is True
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias"} <= {
        t.name for t in reader.tensors}
