"""Each inspect rule: a file that violates only that rule, reported with its code and the right
exit code (0 valid / 1 invalid / 2 unreadable). Broken files are made from valid converted ones
by changing exactly one thing (tests/fixtures/gguf_edit.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType, GGUFValueType

from fixtures import drafter_checkpoints as ck
from fixtures.crafted_gguf import CRAFTED, CRAFTED_QWEN35, TinyQwen35, qwen35_gguf_parts, write_gguf, write_valid_qwen35
from fixtures.gguf_edit import ARR, BOOL, F32, STR, U32, rewrite
from luce.cli.main import cli
from luce.converters.convert import ConvertOptions, convert_checkpoint
from luce.converters.validate import inspect_gguf

A = "qwen35-dflash-draft."
I32 = GGUFValueType.INT32


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    out = {}
    for name in ("zlab_dflash", "dflash2", "dspark_radixark", "dflash2_logit_scalars"):
        out[name] = root / f"{name}.gguf"
        convert_checkpoint(ck.FIXTURES[name](root / name), out[name])
    return out


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_valid_qwen35(tmp_path_factory.mktemp("target") / "target.gguf")


def _codes(report, severity="error"):
    return {f.code for f in report.findings if f.severity == severity}


def _z(*shape):
    return np.zeros(shape, dtype=np.float32)


# (name, source drafter, rewrite kwargs, expected error code or None, expected warning code or None)
RULES = [
    ("arch", "zlab_dflash", dict(set_kv={"general.architecture": ("llama", STR)}), "arch", None),
    ("hparam-missing", "zlab_dflash", dict(drop_kv=[A + "embedding_length"]), "hparam-missing", None),
    ("hparam-range", "zlab_dflash", dict(set_kv={A + "feed_forward_length": (600000, U32)}), "hparam-range", None),
    ("eps-range", "zlab_dflash", dict(set_kv={A + "attention.layer_norm_rms_epsilon": (0.0, F32)}),
     "hparam-range", None),
    # 4 heads over 3 KV heads; k/v replaced with 3*16 rows so shapes stay consistent
    ("head-ratio", "zlab_dflash", dict(set_kv={A + "attention.head_count_kv": (3, U32)},
                                       tensors={f"blk.{i}.attn_{x}.weight": _z(48, 64) for i in range(2) for x in "kv"}),
     "head-ratio", None),
    ("key-type", "zlab_dflash", dict(set_kv={A + "dflash.block_size": (8.0, F32)}), "key-type", None),
    ("block-size-missing", "zlab_dflash", dict(drop_kv=[A + "dflash.block_size"]), "block-size-missing", None),
    ("block-size-range", "zlab_dflash", dict(set_kv={A + "dflash.block_size": (1, U32)}), "block-size-range", None),
    ("mask-missing", "zlab_dflash", dict(drop_kv=[A + "dflash.mask_token_id"]), "mask-missing", None),
    ("mask-range", "zlab_dflash", dict(set_kv={A + "dflash.mask_token_id": (512, U32)}), "mask-range", None),
    ("target-ids-length", "zlab_dflash", dict(set_kv={A + "dflash.target_layer_ids": ([0, 1], ARR, I32)}),
     "target-ids-length", None),
    ("target-ids-range", "zlab_dflash", dict(set_kv={A + "dflash.target_layer_ids": ([-1, 0, 1], ARR, I32)}),
     "target-ids-range", None),
    ("target-ids-missing", "zlab_dflash", dict(drop_kv=[A + "dflash.target_layer_ids"]), None, "target-ids-missing"),
    ("tensor-missing", "zlab_dflash", dict(drop_tensors=["blk.1.ffn_up.weight"]), "tensor-missing", None),
    ("tensor-shape", "zlab_dflash", dict(tensors={"blk.0.attn_q_norm.weight": _z(8)}), "tensor-shape", None),
    ("tensor-unknown", "zlab_dflash", dict(tensors={"extra.weight": _z(4)}), None, "tensor-unknown"),
    ("fc-width-error", "zlab_dflash", dict(tensors={"dflash.fc.weight": _z(64, 96)}), "fc-width", None),
    # N=4 declared (ids agree) but fc holds 3*H: an error even though it divides evenly (luce's
    # runtime sizes the fused features by the taps and refuses the file; Lucebox warned)
    ("fc-width-divisible", "zlab_dflash", dict(set_kv={A + "dflash.n_target_layers": (4, U32),
                                                       A + "dflash.target_layer_ids": ([0, 1, 2, 3], ARR, I32)}),
     "fc-width", None),
    ("rope-theta-missing", "zlab_dflash", dict(drop_kv=[A + "rope.freq_base"]), None, "rope-theta-missing"),
    ("yarn-no-original", "zlab_dflash", dict(set_kv={A + "rope.scaling.type": ("yarn", STR),
                                                     A + "rope.scaling.factor": (4.0, F32)}), "yarn-no-original", None),
    ("swa-pattern-length", "zlab_dflash", dict(set_kv={A + "attention.sliding_window": (64, U32),
                                                       A + "attention.sliding_window_pattern": ([True] * 3, ARR, BOOL)}),
     "swa-pattern-length", None),
    ("swa-window-missing", "zlab_dflash", dict(set_kv={A + "attention.sliding_window_pattern": ([True, False], ARR, BOOL)}),
     "swa-window-missing", None),
    ("conv-incomplete", "dflash2", dict(drop_tensors=["blk.1.ffn_conv.base"]), "conv-incomplete", None),
    ("conv-kernel-unset", "dflash2", dict(drop_kv=[A + "dflash.dflash2.conv_kernel_size"]), "conv-incomplete", None),
    ("conv-group", "dflash2", dict(set_kv={A + "dflash.dflash2.conv_group_size": (24, U32)}), "conv-group", None),
    ("selector-incomplete", "dflash2", dict(drop_tensors=["dflash.selector.succ_cb"]), "selector-incomplete", None),
    ("selector-rank", "dflash2", dict(set_kv={A + "dflash.dflash2.selector_rank": (16, U32)}), "selector-rank", None),
    ("selector-vocab", "dflash2", dict(tensors={"dflash.selector.succ_cb": _z(256, 32)}), "selector-vocab", None),
    ("selector-top-k-zero", "dflash2", dict(set_kv={A + "dflash.dflash2.selector_top_k": (0, U32)}), "selector-top-k", None),
    ("selector-top-k-257", "dflash2", dict(set_kv={A + "dflash.dflash2.selector_top_k": (257, U32)}), "selector-top-k", None),
    ("logit-softcap-zero", "dflash2", dict(set_kv={A + "dflash.dflash2.final_logit_softcapping": (0.0, F32)}),
     "logit-scalar-range", None),
    ("logit-multiplier-negative", "dflash2", dict(set_kv={A + "dflash.dflash2.output_multiplier": (-1.0, F32)}),
     "logit-scalar-range", None),
    ("logit-multiplier-nan", "dflash2", dict(set_kv={A + "dflash.dflash2.output_multiplier": (float("nan"), F32)}),
     "logit-scalar-range", None),
    ("logit-softcap-type", "dflash2", dict(set_kv={A + "dflash.dflash2.final_logit_softcapping": ("20", STR)}),
     "key-type", None),
    ("dspark-markov-incomplete", "dspark_radixark", dict(drop_tensors=["dflash.dspark.markov.w2"]),
     "dspark-markov-incomplete", None),
    ("dspark-markov-shape", "dspark_radixark", dict(tensors={"dflash.dspark.markov.w2": _z(256, 16)}),
     "dspark-markov-shape", None),
    ("dspark-confidence-incomplete", "dspark_radixark", dict(drop_tensors=["dflash.dspark.confidence.bias"]),
     "dspark-confidence-incomplete", None),
    ("dspark-confidence-dim", "dspark_radixark", dict(tensors={"dflash.dspark.confidence.weight": _z(1, 70)},
                                                      set_kv={A + "dflash.dspark.confidence_dim": (70, U32)}),
     "dspark-confidence-dim", None),
    ("dspark-metadata", "dspark_radixark", dict(set_kv={A + "dflash.dspark.markov_rank": (8, U32)}),
     "dspark-metadata", None),
    ("dspark-anchor", "dspark_radixark", dict(drop_kv=[A + "dflash.sample_from_anchor"]), None, "dspark-anchor"),
    # what llama.cpp's converter writes for other families' drafters and luce does not compute
    ("unsupported-value-scale", "zlab_dflash", dict(set_kv={A + "attention.value_scale": (0.5, F32)}),
     "unsupported", None),
    ("unsupported-embedding-scale", "zlab_dflash", dict(set_kv={A + "embedding_scale": (8.0, F32)}), "unsupported", None),
    ("unsupported-activation", "zlab_dflash", dict(set_kv={A + "hidden_activation": ("gelu", STR)}), "unsupported", None),
    ("unsupported-partial-rotary", "zlab_dflash", dict(set_kv={A + "rope.dimension_count": (8, U32)}),
     "unsupported", None),
    ("unsupported-d2t", "zlab_dflash", dict(tensors={"d2t": _z(256)}), "unsupported", None),
]


def test_rule_names_are_unique():
    assert len({r[0] for r in RULES}) == len(RULES)


@pytest.mark.parametrize("name,source,edit,error,warning", RULES, ids=[r[0] for r in RULES])
def test_rule_violation_is_reported_alone(tmp_path, drafters, name, source, edit, error, warning):
    path = rewrite(drafters[source], tmp_path / f"{name}.gguf", **edit)
    report = inspect_gguf(path)
    assert _codes(report) == ({error} if error else set()), report.findings
    if warning:
        assert warning in _codes(report, "warning")
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == (1 if error else 0), result.output
    payload = json.loads(result.output)
    assert payload["valid"] is (error is None)
    assert (error or warning) in {f["code"] for f in payload["findings"]}


@pytest.mark.parametrize("name", ["zlab_dflash", "dflash2", "dspark_radixark", "dflash2_logit_scalars"])
def test_converted_files_are_valid_and_pair_with_the_tiny_target(drafters, target, name):
    report = inspect_gguf(drafters[name], target)
    assert report.valid and report.exit_code == 0, report.findings
    assert report.target.kind == "target" and report.target.valid


def test_summary_reports_the_logit_scalars(drafters):
    with_scalars, without = inspect_gguf(drafters["dflash2_logit_scalars"]), inspect_gguf(drafters["dflash2"])
    assert with_scalars.summary["output_multiplier"] == np.float32(ck.MUSE_MULTIPLIER)
    assert with_scalars.summary["final_logit_softcapping"] == ck.MUSE_SOFTCAP
    assert without.summary["output_multiplier"] is None and without.summary["final_logit_softcapping"] is None


def test_upstream_layout_reads_back_the_same_summary(tmp_path):
    src = ck.dflash2(tmp_path / "src")
    convert_checkpoint(src, tmp_path / "a.gguf")
    target = write_valid_qwen35(tmp_path / "target.gguf")
    convert_checkpoint(src, tmp_path / "b.gguf", ConvertOptions(layout="llama.cpp", target_model=target))
    a, b = inspect_gguf(tmp_path / "a.gguf"), inspect_gguf(tmp_path / "b.gguf", target)
    assert a.valid and b.valid and not b.findings, b.findings
    # no vocab_size in the upstream file: its vocabulary is the target tokenizer's token list
    for key in ("format", "layers", "hidden", "vocab", "block_size", "mask_token_id", "target_layer_ids",
                "heads_present"):
        assert a.summary[key] == b.summary[key], key
    assert b.summary["layout"] == "llama.cpp" and b.summary["target_layer_ids"] == ck.TAPS


# ---- pair rules -----------------------------------------------------------------------------

PAIRS = [
    ("pair-hidden", "zlab_dflash", TinyQwen35(hidden=128), None),
    ("pair-mask", "zlab_dflash", TinyQwen35(vocab=256), None),
    ("pair-codebook", "dflash2", TinyQwen35(vocab=1024), None),
    ("pair-markov-vocab", "dspark_radixark", TinyQwen35(vocab=1024), None),
    ("pair-target-layers", "zlab_dflash", TinyQwen35(),
     dict(set_kv={A + "dflash.target_layer_ids": ([0, 1, 3], ARR, I32)})),   # 3 = the target's last layer
]


@pytest.mark.parametrize("code,source,target_cfg,edit", PAIRS, ids=[p[0] for p in PAIRS])
def test_pair_rule(tmp_path, drafters, code, source, target_cfg, edit):
    drafter = rewrite(drafters[source], tmp_path / "d.gguf", **edit) if edit else drafters[source]
    target_path = write_valid_qwen35(tmp_path / "t.gguf", target_cfg)
    assert inspect_gguf(drafter).valid           # fine on its own
    report = inspect_gguf(drafter, target_path)
    assert _codes(report) == {code}, report.findings
    result = CliRunner().invoke(cli, ["inspect", str(drafter), "--target", str(target_path)])
    assert result.exit_code == 1 and code in result.output


def test_target_must_be_qwen35(tmp_path, drafters):
    report = inspect_gguf(drafters["zlab_dflash"], drafters["dflash2"])
    assert "pair-target" in _codes(report)


# ---- target files ---------------------------------------------------------------------------

def test_target_summary(target):
    report = inspect_gguf(target)
    assert report.valid and report.kind == "target", report.findings
    s, c = report.summary, TinyQwen35()
    assert (s["layers"], s["main_layers"], s["hidden"], s["vocab"]) == (c.n_layer, c.n_layer, c.hidden, c.vocab)
    assert s["tensor_types"] == {"F32": len(qwen35_gguf_parts().tensors)}
    assert s["tokenizer"]["model"] == "gpt2" and s["tokenizer"]["pre"] == "qwen35"
    assert s["tokenizer"]["tokens"] == c.vocab and s["tokenizer"]["merges"] == 2
    assert s["tokenizer"]["eos_token_id"] == c.vocab - 1


TARGET_CODES = {"block_count_2_31": "hparam-range", "block_count_beyond_tensors": "tensor-missing",
                "head_count_zero": "hparam-range", "head_count_kv_zero": "hparam-range",
                "head_count_kv_array_wrong_length": "layer-array-length"}


@pytest.mark.parametrize("name", sorted(CRAFTED_QWEN35))
def test_impossible_target_hparams_are_invalid(tmp_path, name):
    path = CRAFTED_QWEN35[name](tmp_path / "t.gguf")
    report = inspect_gguf(path)
    assert TARGET_CODES[name] in _codes(report), report.findings
    assert CliRunner().invoke(cli, ["inspect", str(path)]).exit_code == 1


def test_unsupported_target_weight_type(tmp_path):
    parts = qwen35_gguf_parts()
    t = parts.tensors[-1]                      # an F32 FFN matrix, ne0 a multiple of 32
    t.ggml_type = GGMLQuantizationType.MXFP4         # a type luce has no kernel for
    t.data = t.data[: len(t.data) // 32 * 17 // 4]   # MXFP4: 17 bytes per 32 values
    report = inspect_gguf(write_gguf(tmp_path / "t.gguf", parts))
    assert _codes(report) == {"tensor-type"}


# ---- unreadable files -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_unreadable_files_exit_2_with_one_line(tmp_path, name):
    path = CRAFTED[name](tmp_path / "bad.gguf")
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("Error: ")
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 2
    payload = json.loads(result.output)
    assert payload["valid"] is False and payload["findings"][0]["code"] == "unreadable"


def test_unreadable_target_exits_2(tmp_path, drafters):
    bad = CRAFTED["truncated_data"](tmp_path / "t.gguf")
    assert CliRunner().invoke(cli, ["inspect", str(drafters["zlab_dflash"]), "--target", str(bad)]).exit_code == 2
