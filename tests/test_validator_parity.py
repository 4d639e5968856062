"""One set of rules for a qwen35 target: `luce inspect` says "invalid" for exactly the files the
runtime refuses, with the same one-line reason (converters/target_rules.py, native/src/model.cpp).

1. The bounds and key names in converters/target_rules.py are model.cpp's, read out of the C++
   source (so a bound changed on one side only fails here).
2. Many crafted targets, each one change away from a loadable file: every hyperparameter zero,
   negative, absurd, of the wrong type or missing; per-layer arrays of the wrong length or
   element type; rope sections out of range; tensors of the wrong shape or missing; tokenizer
   arrays of the wrong element type or length. Controls that must stay valid sit among them. For
   every file: inspect's verdict equals the runtime's (the native loader in a child process with a
   capped address space, then luce.Engine, which adds the tokenizer rules only Python reads);
   when the native loader refuses, its message is inspect's error, word for word.
3. Through the CLI: `luce inspect` exits 1 with the reason on one line; `luce generate` exits 1
   with one `Error:` line naming the same reason; neither prints a traceback.
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType, Keys

from conftest import run_luce
from fixtures.crafted_gguf import KV, VT, Tensor, qwen35_gguf_parts, write_gguf
from fixtures.native_child import load_models_in_child
from luce import Engine, LuceError
from luce.cli.main import cli
from luce.converters import target_rules as R
from luce.converters.validate import ERROR, inspect_gguf

MODEL_CPP = Path(__file__).resolve().parents[1] / "native" / "src" / "model.cpp"
FORMAT = 3


# ---- 1. the same bounds and keys on both sides ------------------------------------------------

def _cpp_constants() -> dict[str, int | float]:
    out = {}
    for name, expr in re.findall(r"constexpr (?:int64_t|double) (\w+) = ([^;]+);", MODEL_CPP.read_text()):
        if re.fullmatch(r"[\d.\s<*]+", expr):      # literals and shifts only (no names)
            out[name] = eval(expr)                 # noqa: S307 - digits, '.', '<<' and '*' only
    return out


def test_bounds_are_model_cpps():
    cpp = _cpp_constants()
    assert {n for n in cpp if n.startswith("MAX_")} >= {"MAX_LAYERS", "MAX_EMBD", "MAX_HEADS", "MAX_ROPE_SECTIONS"}
    for name, value in cpp.items():
        assert getattr(R, name) == value, name


def test_keys_are_model_cpps():
    cpp = dict(re.findall(r'const char \*(KEY_\w+) = "([^"]+)";', MODEL_CPP.read_text()))
    python = {name: getattr(R, "K_" + name[4:]) for name in cpp if hasattr(R, "K_" + name[4:])}
    assert set(cpp) - set(python) == {"KEY_ARCH", "KEY_EOS"}     # read for naming / stopping only
    assert python == {k: cpp[k] for k in python}


def test_supported_types_are_the_loaders(tmp_path):
    """Every type the Python rules accept is in the loader's list (its refusal message names them)."""
    parts = qwen35_gguf_parts()
    t = next(t for t in parts.tensors if t.name == "blk.0.ffn_up.weight")
    n_blocks = int(np.prod(t.shape)) // 32
    bad = replace(t, ggml_type=GGMLQuantizationType.Q8_1, data=bytes(n_blocks * 40))
    path = write_gguf(tmp_path / "q8_1.gguf", replace(parts, tensors=[bad if x is t else x for x in parts.tensors]))
    native = _native_results({"q8_1": path})["q8_1"]
    assert native[0] != 0
    assert native[1].endswith(f"(supported: {' '.join(R.ggml_type_name(x) for x in sorted(R.SUPPORTED_TYPES))})")


# ---- 2. crafted targets: same verdict, same reason ---------------------------------------------

def _key(template: str) -> str:
    return template.format(arch=R.ARCH)


def _set(key: str, vtype, value, etype=None):
    def edit(parts):
        kvs = [kv for kv in parts.kvs if kv.key != key] + [KV(key, vtype, value, etype)]
        return replace(parts, kvs=kvs)
    return edit


def _drop_kv(key: str):
    return lambda parts: replace(parts, kvs=[kv for kv in parts.kvs if kv.key != key])


def _drop_tensor(name: str):
    return lambda parts: replace(parts, tensors=[t for t in parts.tensors if t.name != name])


def _reshape(name: str, shape: tuple):
    def edit(parts):
        out = []
        for t in parts.tensors:
            if t.name == name:
                t = Tensor(name, shape, GGMLQuantizationType.F32, np.zeros(int(np.prod(shape)), "<f4").tobytes())
            out.append(t)
        return replace(parts, tensors=out)
    return edit


def _mtp(edit=lambda parts: parts):
    """The crafted target with an MTP block blk.4 (nextn_predict_layers = 1), then `edit`."""
    from fixtures.crafted_gguf import TinyQwen35
    from fixtures.random_qwen35_gguf import _mtp_block

    def add(parts):
        blocks = _key(Keys.LLM.BLOCK_COUNT)
        kvs = [replace(kv, value=5) if kv.key == blocks else kv for kv in parts.kvs]
        kvs.append(KV(_key(Keys.LLM.NEXTN_PREDICT_LAYERS), VT.UINT32, 1))
        mtp = _mtp_block(TinyQwen35(), np.random.default_rng(0), "random")
        return edit(replace(parts, kvs=kvs, tensors=list(parts.tensors) + mtp))
    return add


L, A, Rp, S, T = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM, Keys.Tokenizer
U32, I32, U64, F32, STR, ARR, BOOL = VT.UINT32, VT.INT32, VT.UINT64, VT.FLOAT32, VT.STRING, VT.ARRAY, VT.BOOL
INT_KEYS = [L.BLOCK_COUNT, L.CONTEXT_LENGTH, L.EMBEDDING_LENGTH, L.FEED_FORWARD_LENGTH, A.HEAD_COUNT,
            A.HEAD_COUNT_KV, A.KEY_LENGTH, A.VALUE_LENGTH, Rp.DIMENSION_COUNT, S.CONV_KERNEL, S.STATE_SIZE,
            S.GROUP_COUNT, S.TIME_STEP_RANK, S.INNER_SIZE, L.FULL_ATTENTION_INTERVAL]


def _cases() -> dict[str, object]:
    cases = {"valid": lambda p: p}
    for template in INT_KEYS:
        key, short = _key(template), template.split("}.")[1]
        for label, vtype, value in [("zero", U32, 0), ("negative", I32, -1), ("2^31", U32, 2**31),
                                    ("2^40", U64, 2**40), ("2^63+1", U64, 2**63 + 1), ("string", STR, "4"),
                                    ("float", F32, 4.0)]:
            cases[f"{short}={label}"] = _set(key, vtype, value)
        defaulted = template in (A.VALUE_LENGTH, L.FULL_ATTENTION_INTERVAL)
        cases[f"{short}:missing" + (" (valid: default)" if defaulted else "")] = _drop_kv(key)
    for template in (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.HEAD_COUNT_KV):
        key, short = _key(template), template.split("}.")[1]
        cases[f"{short}:array-short"] = _set(key, ARR, [4, 4, 4], I32)
        cases[f"{short}:array-float"] = _set(key, ARR, [4.0] * 4, F32)
        cases[f"{short}:array-string"] = _set(key, ARR, ["4"] * 4, STR)
        cases[f"{short}:array-bool"] = _set(key, ARR, [True] * 4, BOOL)
    # per-layer head arrays may hold 0 for DeltaNet layers (layer 3 is the attention layer)
    cases["head_count:array-zeros-on-deltanet (valid)"] = _set(_key(A.HEAD_COUNT), ARR, [0, 0, 0, 4], U32)
    cases["head_count:array-zero-on-attention"] = _set(_key(A.HEAD_COUNT), ARR, [4, 4, 4, 0], U32)
    cases["head_count=3 (not a multiple of kv)"] = _set(_key(A.HEAD_COUNT), U32, 3)
    eps = _key(A.LAYERNORM_RMS_EPS)
    for label, value in [("0", 0.0), ("-1", -1.0), ("1", 1.0), ("nan", float("nan")), ("inf", float("inf"))]:
        cases[f"eps={label}"] = _set(eps, F32, value)
    cases["eps=string"] = _set(eps, STR, "1e-6")
    cases["eps:missing"] = _drop_kv(eps)
    base = _key(Rp.FREQ_BASE)
    for label, value in [("1", 1.0), ("0", 0.0), ("nan", float("nan"))]:
        cases[f"rope_base={label}"] = _set(base, F32, value)
    cases["rope_base:missing (valid: default)"] = _drop_kv(base)
    cases["rope_dim=odd"] = _set(_key(Rp.DIMENSION_COUNT), U32, 7)
    sections = _key(Rp.DIMENSION_SECTIONS)
    cases["sections=[4,0,0,0] (valid)"] = _set(sections, ARR, [4, 0, 0, 0], I32)
    cases["sections=[2,1] (valid)"] = _set(sections, ARR, [2, 1], I32)
    cases["sections:missing (valid)"] = _drop_kv(sections)
    cases["sections=[2,2,1,0] (sum > n_rot/2)"] = _set(sections, ARR, [2, 2, 1, 0], I32)
    cases["sections=[5,-1,0,0]"] = _set(sections, ARR, [5, -1, 0, 0], I32)
    cases["sections=[64,64,64,64]"] = _set(sections, ARR, [64] * 4, U32)
    cases["sections=5 entries"] = _set(sections, ARR, [1, 1, 1, 1, 0], I32)
    cases["sections=float"] = _set(sections, ARR, [2.0, 1.0, 1.0, 0.0], F32)
    cases["sections=string"] = _set(sections, ARR, ["2", "1", "1", "0"], STR)
    cases["sections=scalar"] = _set(sections, I32, 4)
    recurrent = R.K_RECURRENT
    cases["recurrent_layers (valid)"] = _set(recurrent, ARR, [True, True, True, False], BOOL)
    cases["recurrent_layers=int"] = _set(recurrent, ARR, [1, 1, 1, 0], I32)
    cases["recurrent_layers=short"] = _set(recurrent, ARR, [True, True, False], BOOL)
    nextn = _key(L.NEXTN_PREDICT_LAYERS)
    cases["nextn=4 (all layers)"] = _set(nextn, U32, 4)
    cases["nextn=-1"] = _set(nextn, I32, -1)
    cases["split.count=2"] = _set("split.count", VT.UINT16, 2)
    # the MTP block, bound when its nextn.eh_proj is there
    cases["mtp (valid)"] = _mtp()
    cases["mtp:no-eh_proj (valid: no MTP block)"] = _mtp(_drop_tensor("blk.4.nextn.eh_proj.weight"))
    cases["mtp:enorm-missing"] = _mtp(_drop_tensor("blk.4.nextn.enorm.weight"))
    cases["mtp:eh_proj-wrong"] = _mtp(_reshape("blk.4.nextn.eh_proj.weight", (64, 64)))
    cases["mtp:attn_q-wrong"] = _mtp(_reshape("blk.4.attn_q.weight", (64, 64)))
    # tensors
    cases["token_embd:missing"] = _drop_tensor("token_embd.weight")
    cases["token_embd:wrong-width"] = _reshape("token_embd.weight", (32, 512))
    cases["token_embd:3-d"] = _reshape("token_embd.weight", (64, 512, 1))
    cases["output:missing (valid: tied)"] = _drop_tensor("output.weight")
    cases["output:wrong-vocab"] = _reshape("output.weight", (64, 500))
    cases["output_norm:wrong"] = _reshape("output_norm.weight", (63,))
    cases["attn_q:transposed"] = _reshape("blk.3.attn_q.weight", (128, 64))
    cases["attn_k_norm:missing"] = _drop_tensor("blk.3.attn_k_norm.weight")
    cases["ffn_down:wrong"] = _reshape("blk.1.ffn_down.weight", (128, 32))
    cases["ssm_conv1d:wrong"] = _reshape("blk.0.ssm_conv1d.weight", (3, 128))
    cases["ssm_a:wrong"] = _reshape("blk.2.ssm_a", (5,))
    cases["attn_qkv:missing"] = _drop_tensor("blk.0.attn_qkv.weight")
    # tokenizer arrays (Python-side rules)
    cases["tokens=ints"] = _set(T.LIST, ARR, list(range(512)), I32)
    cases["tokens=short"] = _set(T.LIST, ARR, [f"<{i}>" for i in range(500)], STR)
    cases["token_type=strings"] = _set(T.TOKEN_TYPE, ARR, ["1"] * 512, STR)
    cases["token_type=short"] = _set(T.TOKEN_TYPE, ARR, [1] * 511, I32)
    cases["scores=ints"] = _set(T.SCORES, ARR, [0] * 512, I32)
    cases["scores (valid)"] = _set(T.SCORES, ARR, [0.0] * 512, F32)
    cases["merges=ints"] = _set(T.MERGES, ARR, [1, 2], I32)
    return cases


CASES = _cases()
VALID = {name for name in CASES if name == "valid" or "(valid" in name}

def _native_results(paths: dict) -> dict:
    return load_models_in_child(paths)


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    root = tmp_path_factory.mktemp("crafted_targets")
    paths = {name: write_gguf(root / f"case{i}.gguf", edit(qwen35_gguf_parts())) for i, (name, edit) in
             enumerate(CASES.items())}
    return paths, _native_results(paths)


def _engine_error(path) -> str | None:
    try:
        Engine(path, threads=1, ctx_size=64).close()
        return None
    except LuceError as e:
        assert "\n" not in str(e)
        return str(e)


@pytest.mark.parametrize("name", list(CASES))
def test_inspect_says_invalid_iff_the_runtime_refuses(crafted, name):
    paths, native = crafted
    report = inspect_gguf(paths[name])
    errors = [f.message for f in report.findings if f.severity == ERROR]
    status, message = native[name]
    engine_error = _engine_error(paths[name])
    assert report.valid == (engine_error is None), (name, errors, engine_error)
    assert report.valid == (name in VALID), (name, errors, engine_error)
    if status != 0:
        # The native loader's reason is inspect's first error, word for word.
        assert status in (FORMAT, 4) and errors and errors[0] == message, (name, errors, message)
        assert engine_error is not None and message in engine_error
    elif not report.valid:
        # Passed the native loader: refused by the Python-only rules, with inspect's reason.
        assert errors[0] in engine_error, (name, errors, engine_error)


def test_every_rule_family_is_exercised(crafted):
    """Fixture strength: the refusals come from many different rules, not one early check."""
    _, native = crafted
    reasons = {re.sub(r"\d+", "N", m) for s, m in native.values() if s != 0}
    assert len(reasons) >= 30, sorted(reasons)


# ---- 3. the commands: one line, documented exit codes, no traceback ---------------------------

@pytest.mark.parametrize("name", ["sections=[2,2,1,0] (sum > n_rot/2)", "recurrent_layers=int", "eps=nan",
                                  "attn_q:transposed", "token_type=strings"])
def test_inspect_and_generate_agree_on_the_command_line(crafted, name):
    paths, _ = crafted
    path = paths[name]
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 1
    reason = next(f["message"] for f in json.loads(result.output)["findings"] if f["severity"] == ERROR)
    done = run_luce("generate", "-m", path, "--prompt-ids", "1,2", "-n", "1", "-t", "1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and reason in lines[0], (reason, lines)


def test_tokenizer_refuses_mistyped_token_types_on_its_own(crafted):
    """The tokenizer, used without Engine, refuses token types that are not integers with a
    LuceError (it used to read "1" as 1 and raise a bare ValueError on other strings)."""
    from luce.tokenizer import Tokenizer
    paths, _ = crafted
    with pytest.raises(LuceError, match="token_type is not a list of integers"):
        Tokenizer.from_gguf(paths["token_type=strings"])
    assert Tokenizer.from_gguf(paths["valid"]).n_vocab == 512


def test_truncated_targets_are_refused_by_both(tmp_path, crafted):
    """A target cut anywhere (header, metadata, tensor table, data) is unreadable to inspect (exit 2,
    one line) and refused by the native loader; neither crashes."""
    from luce.converters.gguf_reader import GGUFFormatError
    data = crafted[0]["valid"].read_bytes()
    cuts = sorted({0, 3, 4, 8, 16, 24, len(data) - 1} | set(np.linspace(25, len(data) - 2, 40).astype(int).tolist()))
    paths = {}
    for cut in cuts:
        paths[str(cut)] = tmp_path / f"cut{cut}.gguf"
        paths[str(cut)].write_bytes(data[:cut])
    native = _native_results(paths)
    for cut, path in paths.items():
        assert native[cut][0] in (FORMAT, 2), (cut, native[cut])
        with pytest.raises(GGUFFormatError):
            inspect_gguf(path)
    for cut in (str(cuts[1]), str(cuts[len(cuts) // 2]), str(cuts[-1])):
        result = CliRunner().invoke(cli, ["inspect", str(paths[cut])])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def test_a_key_or_tensor_name_that_is_not_utf8_is_refused_by_both(tmp_path, crafted):
    """GGUF keys and tensor names are text: a byte sequence that is not UTF-8 makes the file
    unreadable to inspect and to the native loader alike, with the same reason."""
    from luce.converters.gguf_reader import GGUFFile, GGUFFormatError
    valid = crafted[0]["valid"]
    data = bytearray(valid.read_bytes())
    with GGUFFile.open(valid) as gf:
        first_tensor = next(iter(gf.tensors))
    name_at = bytes(data).index(first_tensor.encode())
    key_bytes = bytearray(data)
    key_bytes[32] = 0xFF                     # first byte of key #0 (after the 24-byte header and its length)
    name_bytes = bytearray(data)
    name_bytes[name_at] = 0xFF
    paths = {"key": tmp_path / "key.gguf", "name": tmp_path / "name.gguf"}
    paths["key"].write_bytes(key_bytes)
    paths["name"].write_bytes(name_bytes)
    expected = {"key": "key #0 at offset 32 is not valid UTF-8",
                "name": f"tensor #0 name at offset {name_at} is not valid UTF-8"}
    native = _native_results(paths)
    for case, path in paths.items():
        status, message = native[case]
        assert status == FORMAT and expected[case] in message, (case, native[case])
        with pytest.raises(GGUFFormatError, match=expected[case]):
            inspect_gguf(path)
