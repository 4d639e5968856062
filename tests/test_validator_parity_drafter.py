"""The drafter's rules agree too: for crafted drafters, `luce inspect --target` says "invalid"
exactly when the native drafter loader (native/src/drafter_load.cpp, called directly, without the
inspect pass luce.Engine runs first) refuses the file.

The files are converted test checkpoints (DFlash, DFlash 2, DSpark, and DFlash in the llama.cpp
layout) with one change each: every numeric key set to zero, -1, 2^31, 2^40, a string, a float or
dropped; metadata arrays of the wrong element type or length; block sizes beyond what the
runtime allocates; tensors of the wrong shape. Unchanged files are among them and must load.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType

from fixtures import drafter_checkpoints as ck
from fixtures.crafted_gguf import TinyQwen35, write_valid_qwen35
from fixtures.gguf_edit import ARR, BOOL, F32, STR, U32, rewrite
from luce.converters import schema
from luce.converters.convert import ConvertOptions, convert_checkpoint
from luce.converters.gguf_reader import INTEGER_TYPES, GGUFFile
from luce.converters.validate import ERROR, inspect_gguf

I32, U64 = GGUFValueType.INT32, GGUFValueType.UINT64
DRAFTER_LOAD_CPP = Path(__file__).resolve().parents[1] / "native" / "src" / "drafter_load.cpp"
SOURCES = {"dflash": ("zlab_dflash", "lucebox"), "dflash2": ("dflash2_swa", "lucebox"),
           "dspark": ("dspark_radixark", "lucebox"), "dflash-llama.cpp": ("zlab_dflash", "llama.cpp")}

_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 32))
from luce.binding import ffi, lib
L = lib()
target, paths = sys.argv[1], json.loads(sys.argv[2])
m = ffi.new("luce_model **")
params = ffi.new("luce_model_params *", {"device": 0, "n_threads": 1, "gpu_index": 0})
assert L.luce_model_load(target.encode(), params, m) == 0, ffi.string(L.luce_last_error())
out = {}
for name, path in paths.items():
    d = ffi.new("luce_drafter **")
    status = L.luce_drafter_load(path.encode(), m[0], d)
    out[name] = [status, ffi.string(L.luce_last_error()).decode() if status else ""]
    if status == 0:
        L.luce_drafter_free(d[0])
print(json.dumps(out))
"""


def _numeric_keys(path) -> list[str]:
    with GGUFFile.open(path) as gf:
        return [k for k, (vt, _) in gf.kv_type.items() if vt in INTEGER_TYPES | {GGUFValueType.FLOAT32}
                and not k.startswith(("general.", "tokenizer."))]


def _arrays(path) -> dict[str, tuple]:
    with GGUFFile.open(path) as gf:
        return {k: (list(np.asarray(gf.kv[k]).tolist()), et) for k, (vt, et) in gf.kv_type.items()
                if vt == GGUFValueType.ARRAY and not k.startswith("tokenizer.")}


def _tensor_shapes(path) -> dict[str, tuple]:
    with GGUFFile.open(path) as gf:
        return {n: t.shape for n, t in gf.tensors.items()}


def _cases(source: str, path) -> dict[str, dict]:
    cases = {f"{source}:unchanged": {}}
    for key in _numeric_keys(path):
        for label, spec in [("0", (0, U32)), ("-1", (-1, I32)), ("33", (33, U32)), ("2^24+1", (2**24 + 1, U32)),
                            ("2^31", (2**31, U32)), ("2^40", (2**40, U64)), ("2^32+16", (2**32 + 16, U64)),
                            ("string", ("8", STR)), ("float", (8.5, F32))]:
            cases[f"{source}:{key}={label}"] = dict(set_kv={key: spec})
        cases[f"{source}:{key}:missing"] = dict(drop_kv={key})
    for key, (values, etype) in _arrays(path).items():
        n = len(values)
        cases[f"{source}:{key}:short"] = dict(set_kv={key: (values[:-1], ARR, etype)})
        cases[f"{source}:{key}:long"] = dict(set_kv={key: (values + values[-1:], ARR, etype)})
        cases[f"{source}:{key}:float"] = dict(set_kv={key: ([float(v) for v in values], ARR, F32)})
        cases[f"{source}:{key}:string"] = dict(set_kv={key: ([str(v) for v in values], ARR, STR)})
        other = (BOOL, [bool(v) for v in values]) if etype != BOOL else (I32, [int(v) for v in values])
        cases[f"{source}:{key}:{other[0].name.lower()}"] = dict(set_kv={key: (other[1], ARR, other[0])})
        cases[f"{source}:{key}:scalar"] = dict(set_kv={key: (1, U32)})
        cases[f"{source}:{key}:missing"] = dict(drop_kv={key})
        if etype != BOOL and n:
            cases[f"{source}:{key}:negative"] = dict(set_kv={key: ([-1] * n, ARR, I32)})
            cases[f"{source}:{key}:huge"] = dict(set_kv={key: ([2**31 - 1] * n, ARR, I32)})
    for name, shape in _tensor_shapes(path).items():
        hf = tuple(reversed(shape))          # rewrite takes numpy (HF) order
        wrong = hf[:-1] + (hf[-1] + 1,)
        cases[f"{source}:{name}:shape"] = dict(tensors={name: np.zeros(wrong, np.float32)})
        cases[f"{source}:{name}:missing"] = dict(drop_tensors={name})
    return cases


def test_bounds_are_drafter_loads():
    """schema.py's loader bounds are drafter_load.cpp's constexprs of the same name."""
    decl = re.search(r"constexpr int64_t (MAX_LAYERS[^;]+);", DRAFTER_LOAD_CPP.read_text()).group(1)
    cpp = dict(re.findall(r"(MAX_\w+) = ([^,]+)", decl))
    assert len(cpp) == 11, cpp
    env = {"INT32_MAX": 2**31 - 1}
    for name, expr in cpp.items():
        assert getattr(schema, name) == eval(expr.strip(), {}, env), name    # noqa: S307 - literals and shifts


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    root = tmp_path_factory.mktemp("crafted_drafters")
    target = write_valid_qwen35(root / "target.gguf")
    paths, cases = {}, {}
    for source, (fixture, layout) in SOURCES.items():
        base = root / f"{source}.gguf"
        convert_checkpoint(ck.FIXTURES[fixture](root / source), base,
                           ConvertOptions(layout=layout, target_model=target if layout == "llama.cpp" else None))
        for i, (name, edit) in enumerate(_cases(source, base).items()):
            paths[name] = rewrite(base, root / f"{source}-{i}.gguf", **edit) if edit else base
            cases[name] = edit
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(target), json.dumps({k: str(v) for k, v in paths.items()})],
                          capture_output=True, text=True, timeout=600, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return target, paths, json.loads(proc.stdout)


def test_inspect_says_invalid_iff_the_drafter_loader_refuses(crafted):
    target, paths, native = crafted
    mismatches = []
    for name, path in paths.items():
        report = inspect_gguf(path, target)
        errors = [f.message for f in report.findings if f.severity == ERROR]
        errors += [f.message for f in (report.target.findings if report.target else []) if f.severity == ERROR]
        status, message = native[name]
        assert "\n" not in message
        if report.valid != (status == 0):
            mismatches.append((name, errors[:1], message))
    assert not mismatches, "\n".join(map(str, mismatches))
    refused = sum(status != 0 for status, _ in native.values())
    assert native["dflash:unchanged"][0] == 0 and 0.5 * len(native) < refused < len(native), refused   # both kinds


def test_many_distinct_reasons(crafted):
    """Fixture strength: the refusals come from many rules, not one early check."""
    _, _, native = crafted
    reasons = {re.sub(r"-?\d+", "N", m) for s, m in native.values() if s}
    assert len(reasons) >= 40, sorted(reasons)


# Pairs: the same drafters against targets they do not fit (hidden size, vocabulary smaller or
# larger than the codebooks and the Markov head, too few layers for the taps). The native loader
# binds a drafter to a loaded target; inspect judges the pair with --target.
TARGETS = {"hidden 128": TinyQwen35(hidden=128), "vocab 256": TinyQwen35(vocab=256),
           "vocab 1024": TinyQwen35(vocab=1024), "2 layers": TinyQwen35(n_layer=2, interval=2),
           "8 layers": TinyQwen35(n_layer=8), "same": TinyQwen35()}


def test_pairs_agree(tmp_path, crafted):
    _, paths, _ = crafted
    drafters = {name: paths[f"{name}:unchanged"] for name in SOURCES}
    mismatches, refused = [], 0
    for label, cfg in TARGETS.items():
        target = write_valid_qwen35(tmp_path / f"target-{label.replace(' ', '_')}.gguf", cfg)
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(target),
                               json.dumps({k: str(v) for k, v in drafters.items()})],
                              capture_output=True, text=True, timeout=300, cwd="/")
        assert proc.returncode == 0, proc.stderr[-2000:]
        for name, (status, message) in json.loads(proc.stdout).items():
            refused += status != 0
            report = inspect_gguf(drafters[name], target)
            if report.valid != (status == 0):
                mismatches.append((label, name, [f.message for f in report.findings if f.severity == ERROR][:1],
                                   message))
    assert not mismatches, "\n".join(map(str, mismatches))
    assert 6 <= refused < len(TARGETS) * len(SOURCES), refused      # both verdicts occur


@pytest.mark.parametrize("case", ["dflash2:qwen35-dflash-draft.dflash.block_size=2^32+16",
                                  "dspark:qwen35-dflash-draft.dflash.dspark.markov_rank=33",
                                  "dflash-llama.cpp:dflash.target_layers:float"])
def test_generate_with_a_bad_drafter_prints_inspects_reason(crafted, case):
    """`luce generate --draft`: exit 1, one `Error:` line holding inspect's first error, no traceback."""
    from conftest import run_luce
    target, paths, native = crafted
    assert native[case][0] != 0
    reason = next(f.message for f in inspect_gguf(paths[case], target).findings if f.severity == ERROR)
    done = run_luce("generate", "-m", target, "--draft", paths[case], "--prompt-ids", "1,2", "-n", "1", "-t", "1")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("Error:") and reason in lines[0], (reason, lines)


@pytest.mark.parametrize("change", ["long", "huge", "negative", "float", "scalar"])
def test_drafter_rope_sections_out_of_range(crafted, change):
    """llama.cpp-layout drafters carry [d/2, 0, 0, 0]; sections that do not fit the head are refused
    by both, with the target rule's message word for word."""
    target, paths, native = crafted
    name = f"dflash-llama.cpp:dflash.rope.dimension_sections:{change}"
    status, message = native[name]
    errors = [f.message for f in inspect_gguf(paths[name], target).findings if f.severity == ERROR]
    assert status != 0 and message in errors, (message, errors)
    assert native["dflash-llama.cpp:unchanged"][0] == 0
