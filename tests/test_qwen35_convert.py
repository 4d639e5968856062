"""HF Qwen3.5 -> qwen35 GGUF converter, checked against oracles we did not write.

- transformers' own GGUF loader (`from_pretrained(gguf_file=...)`, integrations/gguf/) undoes every
  llama.cpp transform independently: the model it loads from our file must give the original
  model's logits, bit for bit in fp32, and each tensor it recovers must equal the original.
- gguf-py's GGUFReader reads keys/types back; gguf.quants encodes f16/bf16/q8_0 reference bytes.
- spec/qwen35.md §3.2-3.4 gives the key table, tensor names/shapes and the v-head index formula,
  transcribed here by hand.
"""
from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType
from gguf.quants import quantize

from fixtures.tiny_qwen35 import (CHAT_TEMPLATE, as_conditional_generation, build_checkpoint,
                                  tiny_qwen35)
from luce.converters.qwen35 import convert_qwen35
from luce.errors import LuceError

PROMPT = torch.randint(0, 512, (1, 70), generator=torch.Generator().manual_seed(7))  # > one 64-token chunk


def load_gguf_in_transformers(gguf_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()


def reader_value(reader: GGUFReader, key: str):
    field = reader.fields[key]
    return field.contents(), field.types


# --------------------------------------------------------------------------------------------
# transformers' independent loader


@pytest.mark.parametrize("preset", ["base", "tied", "mtp"])
def test_gguf_loaded_by_transformers_gives_identical_logits(tmp_path_factory, preset):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, preset)
    reloaded = load_gguf_in_transformers(gguf_path)
    with torch.no_grad():
        want, got = model(PROMPT).logits, reloaded(PROMPT).logits
    assert want.abs().max() > 1.0  # the random model is not degenerate
    diff = (want - got).abs().max().item()
    assert diff == 0.0, f"max |dlogit| = {diff}"


@pytest.mark.parametrize("preset", ["base", "tied"])
def test_every_tensor_round_trips_through_transformers_loader(tmp_path_factory, preset):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, preset)
    original = model.state_dict()
    recovered = load_gguf_in_transformers(gguf_path).state_dict()
    assert set(recovered) == set(original)
    for name, want in original.items():
        got = recovered[name]
        if name.endswith("norm.weight") and "linear_attn" not in name:
            # stored as fl(1 + w); the loader subtracts 1, so compare the multiplier HF applies
            assert torch.equal(1.0 + got, 1.0 + want), name
        elif name.endswith("A_log"):
            # stored as -exp(A_log); the loader takes log: compare the decay rate HF uses
            assert torch.allclose(got.exp(), want.exp(), rtol=2e-7, atol=0), name
        else:
            assert torch.equal(got, want), name


# --------------------------------------------------------------------------------------------
# metadata (spec §3.2, §3.6)

# key -> (expected value for the "base" preset, GGUF value type)
SPEC_KEYS = {
    "general.architecture": ("qwen35", GGUFValueType.STRING),
    "qwen35.block_count": (8, GGUFValueType.UINT32),
    "qwen35.context_length": (4096, GGUFValueType.UINT32),
    "qwen35.embedding_length": (64, GGUFValueType.UINT32),
    "qwen35.feed_forward_length": (96, GGUFValueType.UINT32),
    "qwen35.attention.head_count": (4, GGUFValueType.UINT32),
    "qwen35.attention.head_count_kv": (2, GGUFValueType.UINT32),
    "qwen35.attention.key_length": (32, GGUFValueType.UINT32),
    "qwen35.attention.value_length": (32, GGUFValueType.UINT32),
    "qwen35.rope.dimension_count": (8, GGUFValueType.UINT32),  # 32 * 0.25
    "qwen35.ssm.conv_kernel": (4, GGUFValueType.UINT32),
    "qwen35.ssm.state_size": (16, GGUFValueType.UINT32),
    "qwen35.ssm.group_count": (2, GGUFValueType.UINT32),
    "qwen35.ssm.time_step_rank": (6, GGUFValueType.UINT32),
    "qwen35.ssm.inner_size": (96, GGUFValueType.UINT32),  # HV * DV = 6 * 16
    "qwen35.full_attention_interval": (4, GGUFValueType.UINT32),
    "general.file_type": (0, GGUFValueType.UINT32),
    "general.quantization_version": (2, GGUFValueType.UINT32),
    "tokenizer.ggml.model": ("gpt2", GGUFValueType.STRING),
    "tokenizer.ggml.pre": ("qwen35", GGUFValueType.STRING),
    "tokenizer.ggml.eos_token_id": (2, GGUFValueType.UINT32),  # <|im_end|>
    "tokenizer.ggml.padding_token_id": (0, GGUFValueType.UINT32),  # <|endoftext|>
    "tokenizer.ggml.add_bos_token": (False, GGUFValueType.BOOL),
    "tokenizer.chat_template": (CHAT_TEMPLATE, GGUFValueType.STRING),
}


def test_keys_types_and_values_match_the_spec_table(tmp_path_factory):
    _, gguf_path, hf_dir = tiny_qwen35(tmp_path_factory, "base")
    reader = GGUFReader(gguf_path)
    for key, (value, vtype) in SPEC_KEYS.items():
        got, types = reader_value(reader, key)
        assert types == [vtype], key
        assert got == value, key
    eps, types = reader_value(reader, "qwen35.attention.layer_norm_rms_epsilon")
    assert types == [GGUFValueType.FLOAT32] and eps == np.float32(1e-6)
    theta, types = reader_value(reader, "qwen35.rope.freq_base")
    assert types == [GGUFValueType.FLOAT32] and theta == np.float32(1e7)
    sections, types = reader_value(reader, "qwen35.rope.dimension_sections")
    assert types == [GGUFValueType.ARRAY, GGUFValueType.INT32] and list(sections) == [2, 1, 1, 0]
    assert "qwen35.nextn_predict_layers" not in reader.fields
    assert "tokenizer.ggml.bos_token_id" not in reader.fields  # the checkpoint has none

    # vocabulary: tokenizer.json's tokens by id, padded with [PAD{id}] up to vocab_size
    tokenizer = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens, _ = reader_value(reader, "tokenizer.ggml.tokens")
    types, _ = reader_value(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 512
    for text, i in tokenizer["model"]["vocab"].items():
        assert tokens[i] == text
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    n_used = max(max(tokenizer["model"]["vocab"].values()), max(added.values())) + 1
    assert tokens[n_used:] == [f"[PAD{i}]" for i in range(n_used, 512)]
    assert list(types[n_used:]) == [5] * (512 - n_used)  # UNUSED
    assert [types[added[t]] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [3, 3, 3]  # CONTROL
    assert [types[added[t]] for t in ("<think>", "</think>")] == [4, 4]  # USER_DEFINED
    merges, _ = reader_value(reader, "tokenizer.ggml.merges")
    assert merges == [" ".join(pair) for pair in tokenizer["model"]["merges"]]


def test_mtp_block_is_counted_and_named_nextn(tmp_path_factory):
    _, gguf_path, _ = tiny_qwen35(tmp_path_factory, "mtp")
    reader = GGUFReader(gguf_path)
    assert reader_value(reader, "qwen35.block_count")[0] == 9  # 8 main layers + 1 MTP block
    assert reader_value(reader, "qwen35.nextn_predict_layers")[0] == 1
    names = {t.name for t in reader.tensors if t.name.startswith("blk.8.")}
    assert names == {f"blk.8.{leaf}.weight" for leaf in (
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
        "post_attention_norm", "ffn_gate", "ffn_up", "ffn_down",
        "nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")}
    from safetensors.numpy import load_file

    hf = load_file(gguf_path.parent / "hf" / "model.safetensors")
    data = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert np.array_equal(data["blk.8.nextn.eh_proj.weight"], hf["mtp.fc.weight"])
    assert np.array_equal(data["blk.8.nextn.enorm.weight"], hf["mtp.pre_fc_norm_embedding.weight"] + 1)  # +1 too


# --------------------------------------------------------------------------------------------
# tensor names, shapes and transforms (spec §3.3, §3.4)

DELTANET = ["attn_norm.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
            "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_norm.weight", "ssm_out.weight",
            "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
ATTENTION = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
             "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
             "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]


@pytest.mark.parametrize("preset", ["base", "tied"])
def test_tensor_names_and_gguf_shapes(tmp_path_factory, preset):
    _, gguf_path, _ = tiny_qwen35(tmp_path_factory, preset)
    reader = GGUFReader(gguf_path)
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}  # GGUF ne order [in, out]
    want = {"token_embd.weight", "output_norm.weight"} | ({"output.weight"} if preset == "base" else set())
    for i in range(8):
        want |= {f"blk.{i}.{leaf}" for leaf in (ATTENTION if i % 4 == 3 else DELTANET)}
    assert set(shapes) == want
    hv = 6 if preset == "base" else 2
    assert shapes["token_embd.weight"] == [64, 512]
    assert shapes["blk.0.attn_qkv.weight"] == [64, 2 * 2 * 16 + hv * 16]
    assert shapes["blk.0.ssm_conv1d.weight"] == [4, 2 * 2 * 16 + hv * 16]
    assert shapes["blk.0.ssm_a"] == [hv] and shapes["blk.0.ssm_dt.bias"] == [hv]
    assert shapes["blk.0.ssm_out.weight"] == [hv * 16, 64]
    assert shapes["blk.0.ssm_norm.weight"] == [16]
    assert shapes["blk.3.attn_q.weight"] == [64, 2 * 4 * 32]  # q and gate interleaved per head
    assert all(t.tensor_type == QT.F32 for t in reader.tensors)


def test_value_heads_are_tiled_as_the_spec_says(tmp_path_factory):
    """GGUF position m*HK + kh holds HF value head kh*r + m (HK=2, HV=6, r=3), spec §3.4 item 5."""
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    hk, r, dv, qk = 2, 3, 16, 2 * 2 * 16
    tiled_of = [kh * r + m for m in range(r) for kh in range(hk)]  # GGUF head j <- HF head tiled_of[j]
    data = {t.name: np.asarray(t.data) for t in GGUFReader(gguf_path).tensors}
    attn = model.model.layers[0].linear_attn
    a_log, dt = attn.A_log.detach().numpy(), attn.dt_bias.detach().numpy()
    qkv, z = attn.in_proj_qkv.weight.detach().numpy(), attn.in_proj_z.weight.detach().numpy()
    conv, out = attn.conv1d.weight.detach().numpy()[:, 0, :], attn.out_proj.weight.detach().numpy()
    for j, h in enumerate(tiled_of):
        assert data["blk.0.ssm_a"][j] == np.float32(-np.exp(np.float64(a_log[h])))
        assert data["blk.0.ssm_dt.bias"][j] == dt[h]
        assert np.array_equal(data["blk.0.ssm_beta.weight"][j], attn.in_proj_b.weight[h].detach().numpy())
        assert np.array_equal(data["blk.0.ssm_alpha.weight"][j], attn.in_proj_a.weight[h].detach().numpy())
        rows, hf_rows = slice(j * dv, (j + 1) * dv), slice(h * dv, (h + 1) * dv)
        assert np.array_equal(data["blk.0.attn_gate.weight"][rows], z[hf_rows])
        assert np.array_equal(data["blk.0.attn_qkv.weight"][qk:][rows], qkv[qk:][hf_rows])
        assert np.array_equal(data["blk.0.ssm_conv1d.weight"][qk:][rows], conv[qk:][hf_rows])
        assert np.array_equal(data["blk.0.ssm_out.weight"][:, rows], out[:, hf_rows])
    assert np.array_equal(data["blk.0.attn_qkv.weight"][:qk], qkv[:qk])  # q and k rows untouched
    # the gated norm keeps its plain weight; the zero-centred norms carry the +1
    assert np.array_equal(data["blk.0.ssm_norm.weight"], attn.norm.weight.detach().numpy())
    norm = model.model.layers[0].input_layernorm.weight.detach().numpy()
    assert np.array_equal(data["blk.0.attn_norm.weight"], norm + np.float32(1))


# --------------------------------------------------------------------------------------------
# output types


@pytest.mark.parametrize("outtype,weight_type,file_type", [
    ("f16", QT.F16, 1), ("bf16", QT.BF16, 32), ("q8_0", QT.Q8_0, 7), ("q4_0", QT.Q4_0, 2), ("q4_1", QT.Q4_1, 3)])
def test_outtype_encodes_2d_weights_like_gguf_quants(tmp_path_factory, outtype, weight_type, file_type):
    _, f32_path, _ = tiny_qwen35(tmp_path_factory, "base", "f32")
    _, path, _ = tiny_qwen35(tmp_path_factory, "base", outtype)
    reference = {t.name: np.asarray(t.data) for t in GGUFReader(f32_path).tensors}
    reader = GGUFReader(path)
    assert reader_value(reader, "general.file_type")[0] == file_type
    for t in reader.tensors:
        want = reference[t.name]
        if want.ndim == 1 or t.name.endswith("_norm.weight") or "ssm_conv1d" in t.name:
            assert t.tensor_type == QT.F32, t.name  # llama.cpp keeps these in F32 for every outtype
            assert np.array_equal(np.asarray(t.data), want), t.name
        else:
            assert t.tensor_type == weight_type, t.name
            assert np.asarray(t.data).tobytes() == quantize(want, weight_type).tobytes(), t.name


# --------------------------------------------------------------------------------------------
# source layouts


def test_conditional_generation_layout_converts_to_the_same_tensors(tmp_path_factory, tmp_path):
    _, gguf_path, hf_dir = tiny_qwen35(tmp_path_factory, "base")
    wrapped = as_conditional_generation(hf_dir, tmp_path / "cg")
    # a vision tower tensor must be skipped (llama.cpp writes it to a separate mmproj file)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(wrapped / "model.safetensors")
    tensors["model.visual.patch_embed.proj.weight"] = np.ones((4, 3), np.float32)
    save_file(tensors, wrapped / "model.safetensors")
    out = tmp_path / "cg.gguf"
    convert_qwen35(wrapped, out)
    want = {t.name: np.asarray(t.data) for t in GGUFReader(gguf_path).tensors}
    got = {t.name: np.asarray(t.data) for t in GGUFReader(out).tensors}
    assert set(got) == set(want)
    assert all(np.array_equal(got[n], want[n]) for n in want)


def test_bf16_checkpoint_is_widened_exactly(tmp_path_factory, tmp_path):
    """A bf16 checkpoint (how Qwen ships them) converts to the f32 values of its bf16 weights."""
    model, _, hf_dir = tiny_qwen35(tmp_path_factory, "base")
    from transformers import Qwen3_5ForCausalLM

    bf16_dir = tmp_path / "bf16"
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir)  # the cached model stays fp32
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, bf16_dir / name)
    out = tmp_path / "bf16.gguf"
    convert_qwen35(bf16_dir, out)
    rounded = Qwen3_5ForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = rounded(PROMPT).logits, load_gguf_in_transformers(out)(PROMPT).logits
    assert (want - got).abs().max().item() == 0.0


def gguf_tensors(path) -> dict:
    return {t.name: np.asarray(t.data) for t in GGUFReader(path).tensors}


def test_sharded_checkpoint_converts_to_the_same_tensors(tmp_path_factory, tmp_path):
    """model.safetensors.index.json + two shards, as large checkpoints ship."""
    from safetensors.numpy import load_file, save_file

    _, gguf_path, hf_dir = tiny_qwen35(tmp_path_factory, "base")
    shard_dir = tmp_path / "sharded"
    shard_dir.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, shard_dir / name)
    tensors = load_file(hf_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, members in shards.items():
        save_file({n: tensors[n] for n in members}, shard_dir / file)
    weight_map = {n: file for file, members in shards.items() for n in members}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    convert_qwen35(shard_dir, tmp_path / "sharded.gguf")
    want, got = gguf_tensors(gguf_path), gguf_tensors(tmp_path / "sharded.gguf")
    assert set(got) == set(want) and all(np.array_equal(got[n], want[n]) for n in want)


def test_legacy_rope_fields_give_the_same_keys(small_checkpoint, tmp_path):
    """Older configs keep rope_theta / partial_rotary_factor at the top level and the mRoPE
    sections in rope_scaling; the GGUF's rope keys must not depend on the spelling."""
    config = json.loads((small_checkpoint / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config |= {"rope_theta": rope["rope_theta"], "partial_rotary_factor": rope["partial_rotary_factor"],
               "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    (small_checkpoint / "config.json").write_text(json.dumps(config))
    convert_qwen35(small_checkpoint, tmp_path / "legacy.gguf")
    reader = GGUFReader(tmp_path / "legacy.gguf")
    assert reader_value(reader, "qwen35.rope.freq_base")[0] == np.float32(1e7)
    assert reader_value(reader, "qwen35.rope.dimension_count")[0] == 8
    assert list(reader_value(reader, "qwen35.rope.dimension_sections")[0]) == [2, 1, 1, 0]


# --------------------------------------------------------------------------------------------
# refusals: one LuceError, no output file


@pytest.fixture
def small_checkpoint(tmp_path_factory, tmp_path):
    """A fresh copy of the base checkpoint that a test may damage."""
    _, _, hf_dir = tiny_qwen35(tmp_path_factory, "base")
    copy = tmp_path / "hf"
    shutil.copytree(hf_dir, copy)
    return copy


def edit_config(hf_dir, **changes):
    path = hf_dir / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


def drop_tensor(hf_dir, name):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(hf_dir / "model.safetensors")
    del tensors[name]
    save_file(tensors, hf_dir / "model.safetensors")


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "config.json").unlink(), "no config.json"),
    (lambda d: edit_config(d, architectures=["LlamaForCausalLM"], model_type="llama"), "not a Qwen3.5 checkpoint"),
    (lambda d: edit_config(d, linear_num_key_heads=4), "not a multiple"),
    (lambda d: edit_config(d, hidden_size=None), "missing 'hidden_size'"),
    (lambda d: edit_config(d, hidden_size="64"), "hidden_size must be a positive integer"),
    (lambda d: edit_config(d, num_hidden_layers=-8), "num_hidden_layers must be a positive integer"),
    (lambda d: edit_config(d, rms_norm_eps="tiny"), "rms_norm_eps must be a positive number"),
    (lambda d: edit_config(d, text_config=[1]), "text_config is not an object"),
    (lambda d: edit_config(d, layer_types=["full_attention"] * 8), "full_attention_interval rule"),
    (lambda d: edit_config(d, intermediate_size=128), "does not match config.json"),
    (lambda d: drop_tensor(d, "model.layers.5.linear_attn.A_log"), "missing 1 tensor"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json: missing"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00"), "truncated safetensors file"),
    (lambda d: (d / "model.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}"), "corrupt safetensors header"),
])
def test_bad_checkpoint_is_one_error_and_no_file(small_checkpoint, tmp_path, damage, message):
    damage(small_checkpoint)
    out = tmp_path / "out.gguf"
    with pytest.raises(LuceError, match=message):
        convert_qwen35(small_checkpoint, out)
    assert list(tmp_path.glob("out.gguf*")) == [] and list(tmp_path.glob(".out.gguf*")) == []


def test_truncated_tensor_data_is_refused(small_checkpoint, tmp_path):
    weights = small_checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(LuceError, match="outside the file"):
        convert_qwen35(small_checkpoint, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_unknown_tensor_is_refused_not_dropped(small_checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(small_checkpoint / "model.safetensors")
    tensors["model.layers.0.linear_attn.surprise.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, small_checkpoint / "model.safetensors")
    with pytest.raises(LuceError, match="does not know.*surprise"):
        convert_qwen35(small_checkpoint, tmp_path / "out.gguf")


def test_existing_output_needs_force(small_checkpoint, tmp_path):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(LuceError, match="already exists"):
        convert_qwen35(small_checkpoint, out)
    assert out.read_bytes() == b"keep me"
    convert_qwen35(small_checkpoint, out, force=True)
    assert out.read_bytes()[:4] == b"GGUF"


def test_unknown_outtype_is_refused(small_checkpoint, tmp_path):
    with pytest.raises(LuceError, match="unknown outtype"):
        convert_qwen35(small_checkpoint, tmp_path / "out.gguf", outtype="q4_k")


def test_progress_and_summary_cover_every_tensor(small_checkpoint, tmp_path):
    class Recorder:
        def __init__(self):
            self.calls = []

        def start(self, n_tensors, n_bytes):
            self.calls.append(("start", n_tensors, n_bytes))

        def advance(self, name, n_bytes):
            self.calls.append((name, n_bytes))

    progress, out = Recorder(), tmp_path / "out.gguf"
    summary = convert_qwen35(small_checkpoint, out, progress=progress)
    tensors = GGUFReader(out).tensors
    assert progress.calls[0] == ("start", len(tensors), sum(int(t.n_bytes) for t in tensors))
    assert progress.calls[1:] == [(t.name, int(t.n_bytes)) for t in tensors]
    assert summary["n_tensors"] == len(tensors) and summary["tensor_types"] == {"F32": len(tensors)}
    assert summary["output_bytes"] == out.stat().st_size and summary["layers"] == 8


def test_fixture_is_deterministic(tmp_path):
    """Same seed -> same weights and tokenizer, so test failures reproduce."""
    a, dir_a = build_checkpoint(tmp_path / "a", "tied")
    b, dir_b = build_checkpoint(tmp_path / "b", "tied")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert (dir_a / "tokenizer.json").read_text() == (dir_b / "tokenizer.json").read_text()


def test_peak_memory_is_about_one_tensor(tmp_path):
    """Streaming: the converter holds about one tensor (plus its encoded copy), never the model.
    tracemalloc sees numpy's buffers; the checkpoint is many times its largest tensor."""
    import tracemalloc

    from luce.converters.safetensors_source import read_header

    _, hf_dir = build_checkpoint(tmp_path / "hf", "base", hidden_size=256, intermediate_size=512)
    sizes = [4 * int(np.prod(t.shape)) for t in read_header(hf_dir / "model.safetensors").values()]
    total, largest = sum(sizes), max(sizes)
    assert total > 10 * largest
    tracemalloc.start()
    try:
        convert_qwen35(hf_dir, tmp_path / "m.gguf", outtype="q8_0")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * largest, (peak, largest, total)


def test_luce_convert_cli_dispatches_qwen35_checkpoints(tmp_path_factory, tmp_path):
    """`luce convert` detects a Qwen3.5 checkpoint and writes the same file as the API."""
    from click.testing import CliRunner

    from luce.cli.main import cli

    _, api_path, hf_dir = tiny_qwen35(tmp_path_factory, "base", "q8_0")
    out = tmp_path / "cli.gguf"
    result = CliRunner().invoke(cli, ["convert", str(hf_dir), "-o", str(out), "--outtype", "q8_0"])
    assert result.exit_code == 0, result.output
    assert "qwen35" in result.stdout
    want, got = gguf_tensors(api_path), gguf_tensors(out)
    assert set(got) == set(want) and all(np.array_equal(got[n], want[n]) for n in want)

    # An existing output is refused without --force and replaced with it.
    again = CliRunner().invoke(cli, ["convert", str(hf_dir), "-o", str(out), "--outtype", "q8_0"])
    assert again.exit_code != 0 and "--force" in again.output
    forced = CliRunner().invoke(cli, ["convert", str(hf_dir), "-o", str(out), "--outtype", "q8_0", "--force"])
    assert forced.exit_code == 0, forced.output
