"""`luce convert` through click's CliRunner and as a real subprocess: malformed inputs give one
clear line, a non-zero exit and no output file; interrupts leave nothing behind."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from fixtures import drafter_checkpoints as ck
from luce.cli.main import cli


def _run(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


def _assert_one_line_failure(result, out, code=1, fragment=""):
    assert result.exit_code == code, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output
    assert fragment in result.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_convert_then_json_summary(tmp_path):
    src = ck.dflash2(tmp_path / "src")
    out = tmp_path / "d.gguf"
    result = _run(src, "-o", out, "--outtype", "q8_0", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["format"] == "DFlash 2" and summary["layers"] == ck.L and summary["hidden"] == ck.H
    assert summary["block_size"] == ck.BLOCK and summary["target_layer_ids"] == ck.TAPS
    assert summary["heads"] == ["conv", "selector"] and summary["output_bytes"] == out.stat().st_size
    assert "Q8_0" in summary["tensor_types"]


def test_rich_summary_table(tmp_path):
    result = _run(ck.zlab_dflash(tmp_path / "src"), "-o", tmp_path / "d.gguf")
    assert result.exit_code == 0
    for label in ("Format", "Layers", "Block size", "Target layers", "Mask token", "Tensor types", "Output size"):
        assert label in result.output


def test_dry_run_writes_nothing_and_prints_the_plan(tmp_path):
    out = tmp_path / "d.gguf"
    result = _run(ck.zlab_dflash(tmp_path / "src"), "-o", out, "--dry-run")
    assert result.exit_code == 0 and not out.exists()
    assert "dflash.fc.weight" in result.output and "blk.1.ffn_down.weight" in result.output
    assert "qwen35-dflash-draft.dflash.mask_token_id" in result.output


def test_single_safetensors_with_config(tmp_path):
    src = ck.zlab_dflash(tmp_path / "src")
    (src / "config.json").rename(tmp_path / "cfg.json")
    out = tmp_path / "d.gguf"
    _assert_one_line_failure(_run(src / "model.safetensors", "-o", out), out, fragment="--config")
    assert _run(src / "model.safetensors", "--config", tmp_path / "cfg.json", "-o", out).exit_code == 0


def test_refuses_to_overwrite_without_force(tmp_path):
    src = ck.zlab_dflash(tmp_path / "src")
    out = tmp_path / "d.gguf"
    out.write_bytes(b"keep me")
    result = _run(src, "-o", out)
    assert result.exit_code == 1 and "--force" in result.output and out.read_bytes() == b"keep me"
    assert _run(src, "-o", out, "--force").exit_code == 0 and out.read_bytes()[:4] == b"GGUF"


@pytest.mark.parametrize("outtype", ["q4_0", "q4_1"])
def test_target_only_outtypes_are_refused_for_drafters(tmp_path, outtype):
    out = tmp_path / "d.gguf"
    _assert_one_line_failure(_run(ck.dflash2(tmp_path / "src"), "-o", out, "--outtype", outtype), out,
                             fragment=f"--outtype {outtype} is for Qwen3.5 targets")


def _bad_json(src):
    (src / "config.json").write_text("{ not json")


def _missing_tensor(src):
    tensors = ck.trunk_tensors(ck._gen(1))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, src / "model.safetensors")


def _wrong_shape(src):
    tensors = ck.trunk_tensors(ck._gen(1))
    tensors["layers.0.self_attn.q_norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
    save_file(tensors, src / "model.safetensors")


def _truncated(src):
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 100])


def _truncated_header(src):
    (src / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")


def _unknown_dtype(src):
    tensors = ck.trunk_tensors(ck._gen(1))
    tensors["norm.weight"] = torch.ones(ck.H, dtype=torch.int32)
    save_file(tensors, src / "model.safetensors")


def _unknown_layout(src):
    save_file({"model.embed_tokens.weight": torch.ones(4, 4)}, src / "model.safetensors")


def _unmapped_tensor(src):
    tensors = ck.trunk_tensors(ck._gen(1))
    tensors["layers.0.mystery.weight"] = torch.ones(4)
    save_file(tensors, src / "model.safetensors")


def _no_weights(src):
    (src / "model.safetensors").unlink()


def _missing_shard(src):
    (src / "model.safetensors").unlink()
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "gone.safetensors"}}))


def _config_not_object(src):
    (src / "config.json").write_text("[1, 2]")


def _missing_config_field(src):
    cfg = json.loads((src / "config.json").read_text())
    del cfg["vocab_size"]
    (src / "config.json").write_text(json.dumps(cfg))


MALFORMED = {
    "bad_json": (_bad_json, "not valid JSON"),
    "config_not_object": (_config_not_object, "not a JSON object"),
    "missing_config_field": (_missing_config_field, "vocab_size"),
    "missing_tensor": (_missing_tensor, "ffn_up"),
    "wrong_shape": (_wrong_shape, "q_norm"),
    "truncated_safetensors": (_truncated, "truncated"),
    "truncated_header": (_truncated_header, "header"),
    "unknown_dtype": (_unknown_dtype, "I32"),
    "unknown_layout": (_unknown_layout, "unknown checkpoint layout"),
    "unmapped_tensor": (_unmapped_tensor, "layers.0.mystery.weight"),
    "no_weights": (_no_weights, "model.safetensors"),
    "missing_shard": (_missing_shard, "gone.safetensors"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_checkpoint_is_one_line_and_no_file(tmp_path, name):
    src = ck.zlab_dflash(tmp_path / "src")
    breaker, fragment = MALFORMED[name]
    breaker(src)
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir()
    _assert_one_line_failure(_run(src, "-o", out), out, fragment=fragment)


def test_dspark_markov_head_without_w2_is_refused(tmp_path):
    gen = ck._gen(4)
    heads = ck.dspark_heads(gen)
    del heads["markov_head.markov_w2.weight"]
    src = ck.write_checkpoint(tmp_path / "src", ck._dspark_config("DSparkDraftModel"),
                              {**ck.trunk_tensors(gen), **heads})
    out = tmp_path / "d.gguf"
    _assert_one_line_failure(_run(src, "-o", out), out, fragment="markov_w2")


def test_missing_confidence_bias_becomes_zero_with_a_warning(tmp_path):
    gen = ck._gen(4)
    heads = ck.dspark_heads(gen)
    del heads["confidence_head.proj.bias"]
    src = ck.write_checkpoint(tmp_path / "src", ck._dspark_config("DSparkDraftModel"),
                              {**ck.trunk_tensors(gen), **heads})
    result = _run(src, "-o", tmp_path / "d.gguf", "--json")
    assert result.exit_code == 0
    assert any("zero bias" in w for w in json.loads(result.stdout)["warnings"])


def test_target_checkpoint_without_target_converter_is_one_line(tmp_path, monkeypatch):
    src = tmp_path / "target"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    import importlib
    real = importlib.import_module

    def no_qwen35(name, *a, **kw):
        if name == "luce.converters.qwen35":
            raise ModuleNotFoundError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(importlib, "import_module", no_qwen35)
    out = tmp_path / "t.gguf"
    _assert_one_line_failure(_run(src, "-o", out), out, fragment="target converter")


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_mid_write_leaves_no_file(tmp_path, monkeypatch, exc):
    from luce.converters import drafter_gguf
    calls = {"n": 0}
    real = drafter_gguf.encode

    def failing(data, stored):
        calls["n"] += 1
        if calls["n"] == 5:
            raise exc()
        return real(data, stored)
    monkeypatch.setattr(drafter_gguf, "encode", failing)
    out = tmp_path / "d.gguf"
    src = ck.zlab_dflash(tmp_path / "src")
    result = _run(src, "-o", out)
    assert result.exit_code != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_real_subprocess_convert_and_inspect(tmp_path, luce_cmd):
    src = ck.dspark_specforge_sidecar(tmp_path / "src")
    out = tmp_path / "d.gguf"
    done = luce_cmd("convert", src, "-o", out)
    assert done.returncode == 0, done.stderr
    inspected = luce_cmd("inspect", out, "--json")
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["valid"] and report["format"] == "DSpark" and report["heads_present"] == ["markov", "confidence"]
    failed = luce_cmd("convert", src, "-o", out)        # exists, no --force
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    unreadable = luce_cmd("inspect", src / "config.json")
    assert unreadable.returncode == 2 and unreadable.stderr.startswith("Error: ")
