"""The native loader against bad input: crafted GGUFs (fixtures/crafted_gguf.py, shared with the
Python reader's tests), missing / non-GGUF files, wrong architecture, unsupported weight types,
and bad calls. Each must end in ONE clear error line with the right status, never a crash, a
hang or a huge allocation."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

from fixtures.crafted_gguf import CRAFTED, CRAFTED_QWEN35, KV, VT, qwen35_gguf_parts, write_gguf
from fixtures.native_child import load_models_in_child
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine, LuceError

FORMAT, IO, UNSUPPORTED, DEVICE, INVALID, CONTEXT_FULL = 3, 2, 4, 7, 1, 6

def _load_in_child(paths: dict) -> dict:
    return load_models_in_child(paths, timeout=120)


@pytest.fixture(scope="module")
def crafted_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("crafted")
    paths = {}
    for name, writer in {**CRAFTED, **CRAFTED_QWEN35}.items():
        paths[name] = str(writer(root / f"{name}.gguf"))
    return _load_in_child(paths)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_container_is_refused_by_the_parser(crafted_results, name):
    status, message = crafted_results[name]
    assert status == FORMAT, (status, message)
    assert message and "\n" not in message
    # The container parser must catch it itself: a file that got past it would only fail later,
    # for want of the qwen35 keys these small files do not carry.
    assert not message.startswith("missing metadata key"), message


@pytest.mark.parametrize("name", sorted(CRAFTED_QWEN35))
def test_crafted_qwen35_hparams_are_refused(crafted_results, name):
    status, message = crafted_results[name]
    assert status == FORMAT, (status, message)
    assert message and "\n" not in message


@pytest.mark.parametrize("name", sorted({**CRAFTED, **CRAFTED_QWEN35}))
def test_crafted_files_through_the_engine(tmp_path, name):
    """What a user of luce.Engine (and `luce generate`) sees: one LuceError line naming the file,
    status FORMAT."""
    path = {**CRAFTED, **CRAFTED_QWEN35}[name](tmp_path / f"{name}.gguf")
    with pytest.raises(LuceError) as e:
        Engine(path)
    assert e.value.status == FORMAT and "\n" not in str(e.value) and path.name in str(e.value)


def test_oversized_block_count_names_the_key_and_bound(crafted_results):
    status, message = crafted_results["block_count_2_31"]
    assert "qwen35.block_count" in message and "2147483648" in message


def test_the_valid_base_of_the_crafted_files_loads(tmp_path):
    # Guards the tests above: the files differ from a loadable one only by their corruption.
    path = write_random_qwen35(tmp_path / "ok.gguf")
    assert _load_in_child({"ok": str(path)})["ok"][0] == 0


# --- through luce.Engine: the errors users see --------------------------------------------------

def _error(fn):
    with pytest.raises(LuceError) as e:
        fn()
    assert "\n" not in str(e.value)
    return e.value


def test_missing_file(tmp_path):
    err = _error(lambda: Engine(tmp_path / "nope.gguf"))
    assert "not found" in str(err)


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("these are not the weights you are looking for\n" * 10)
    err = _error(lambda: Engine(path))
    assert err.status == FORMAT and "not a GGUF" in str(err)


def test_wrong_architecture(tmp_path):
    parts = qwen35_gguf_parts()
    parts.kvs[0] = KV("general.architecture", VT.STRING, "llama")
    err = _error(lambda: Engine(write_gguf(tmp_path / "llama.gguf", parts)))
    assert err.status == UNSUPPORTED and "'llama'" in str(err)


def test_split_gguf_part_is_refused_with_the_reason(tmp_path):
    parts = qwen35_gguf_parts()
    parts.kvs += [KV("split.no", VT.UINT16, 0), KV("split.count", VT.UINT16, 2),
                  KV("split.tensors.count", VT.INT32, len(parts.tensors))]
    err = _error(lambda: Engine(write_gguf(tmp_path / "m-00001-of-00002.gguf", parts)))
    assert err.status == UNSUPPORTED and "split GGUF (2 parts)" in str(err)


def test_unsupported_weight_types_are_listed_with_counts(tmp_path):
    parts = qwen35_gguf_parts()
    # Types luce has no kernel for, with 32-element blocks that fit the tiny rows: MXFP4 (32 -> 17
    # bytes) on every ffn_up, Q8_1 (32 -> 40) on every ffn_down.
    def retype(t, qtype, block_bytes):
        n_blocks = int(np.prod(t.shape)) // 32
        return replace(t, ggml_type=qtype, data=bytes(n_blocks * block_bytes))
    tensors = []
    for t in parts.tensors:
        if t.name.endswith("ffn_up.weight"):
            t = retype(t, Q.MXFP4, 17)
        elif t.name.endswith("ffn_down.weight"):
            t = retype(t, Q.Q8_1, 40)
        tensors.append(t)
    n_layers = sum(t.name.endswith("ffn_up.weight") for t in tensors)
    err = _error(lambda: Engine(write_gguf(tmp_path / "mxfp4.gguf", replace(parts, tensors=tensors))))
    assert err.status == UNSUPPORTED
    assert f"mxfp4 x{n_layers} (first blk.0.ffn_up.weight)" in str(err)
    assert f"q8_1 x{n_layers} (first blk.0.ffn_down.weight)" in str(err)
    assert ("supported: f32 f16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq2_xxs iq2_xs "
            "iq3_xxs iq1_s iq4_nl iq3_s iq2_s iq4_xs iq1_m bf16") in str(err)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_random_qwen35(tmp_path_factory.mktemp("tiny") / "tiny.gguf", SPEC_TINY)


def test_gpu_without_a_device_is_refused(tiny_path):
    # No GPU on the test machines: DEVICE whether or not the GPU library was built
    # (the reasons are told apart in test_gpu_build.py).
    err = _error(lambda: Engine(tiny_path, device="gpu"))
    assert err.status == DEVICE


def test_context_larger_than_the_model_supports(tiny_path):
    err = _error(lambda: Engine(tiny_path, ctx_size=SPEC_TINY.ctx + 1))
    assert err.status == CONTEXT_FULL and str(SPEC_TINY.ctx) in str(err)
    assert _error(lambda: Engine(tiny_path, ctx_size=0)).status == INVALID


def test_bad_prompts(tiny_path):
    with Engine(tiny_path, threads=1, ctx_size=32) as eng:
        assert "empty" in str(_error(lambda: eng.logits([])))
        assert "512" in str(_error(lambda: eng.logits([1, 512])))
        assert "-1" in str(_error(lambda: eng.generate(prompt_ids=[-1, 2], max_tokens=1)))
        err = _error(lambda: eng.logits(list(range(33))))
        assert err.status == CONTEXT_FULL
        err = _error(lambda: eng.generate(prompt_ids=list(range(30)), max_tokens=3, ignore_eos=True))
        assert err.status == CONTEXT_FULL and "context size 32" in str(err)
        # The engine is still usable after refusals.
        assert eng.logits([1, 2, 3]).shape == (3, 512)


# Mutation fuzzing of the header: the KV section and tensor table of a valid model, with a few
# random bytes overwritten per case (seeded). Whatever the bytes say, a load must end in OK,
# FORMAT or UNSUPPORTED (never a crash, an OUT_OF_MEMORY from a trusted size, or a hang).
_FUZZ_CHILD = r"""
import os, random, resource, sys, json
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
from luce.binding import ffi, lib
L = lib()
base = open(sys.argv[1], "rb").read()
header_len, n_cases, out_path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(1234)
seen = {}
for case in range(n_cases):
    data = bytearray(base)
    for _ in range(rng.choice([1, 2, 4, 8])):
        pos = rng.randrange(24, header_len)
        data[pos] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    with open(out_path, "wb") as f:
        f.write(data)
    m = ffi.new("luce_model **")
    params = ffi.new("luce_model_params *", {"device": 0, "n_threads": 1, "gpu_index": 0})
    status = L.luce_model_load(out_path.encode(), params, m)
    L.luce_model_free(m[0])
    seen[status] = seen.get(status, 0) + 1
print(json.dumps(seen))
"""


def test_header_mutations_never_crash(tmp_path):
    from luce.converters.gguf_reader import GGUFFile

    path = write_random_qwen35(tmp_path / "base.gguf", seed=9)
    with GGUFFile.open(path) as f:
        header_len = f.data_offset  # KV section + tensor table + padding
    proc = subprocess.run([sys.executable, "-c", _FUZZ_CHILD, str(path), str(header_len), "400",
                           str(tmp_path / "case.gguf")],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = {int(k): v for k, v in json.loads(proc.stdout).items()}
    assert set(seen) <= {0, FORMAT, UNSUPPORTED}, seen
    assert seen.get(FORMAT, 0) > 100  # the mutations do hit validated fields
