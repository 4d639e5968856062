"""A session's state in a file (luce_session_state_save / _load, Engine.save_state and
logits(state=...)): the unit the disk prefix cache keeps of a prompt.

The invariant: evaluating the rest of a prompt after loading the state of its head gives the
logits of evaluating the whole prompt, bit for bit on the CPU (rows of up to 64 tokens are
batch-invariant), for every KV cache type and with the rotation. A file that disagrees with the
session (identity, cache type or rotation, format version, model shape, length) is refused with
one line before any of it is read, and a save is whole or absent.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.emulated_gpu import run_on_emulated_cuda
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine
from luce.errors import LuceError

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "models" / "reference" / "target-q8_0.gguf"
IDS = [int(i) for i in np.random.default_rng(7).integers(0, 8000, 60)]
HEAD = 44
CACHES = {"f32": {}, "f16": dict(kv_cache="f16"),
          "q8_0 K, q4_0 V, rotated": dict(cache_type_k="q8_0", cache_type_v="q4_0", kv_rotate=True)}


@pytest.mark.parametrize("cache", list(CACHES))
def test_the_rest_after_a_loaded_head_is_the_whole_prompt(tmp_path, cache):
    with Engine(TARGET, threads=2, ctx_size=128, **CACHES[cache]) as eng:
        eng.save_state(IDS[:HEAD], tmp_path / "head.state", identity=b"target")
        whole = eng.logits(IDS)[HEAD:]
        rest = eng.logits(IDS[HEAD:], state=tmp_path / "head.state", identity=b"target")
    assert np.array_equal(rest, whole)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("state") / "head.state"
    with Engine(TARGET, threads=2, ctx_size=128) as eng:
        eng.save_state(IDS[:HEAD], path, identity=b"target")
    return path


def _refused(path, message, identity=b"target", **engine_kwargs):
    engine_kwargs = {"threads": 2, "ctx_size": 128} | engine_kwargs
    model = engine_kwargs.pop("model", TARGET)
    with Engine(model, **engine_kwargs) as eng, pytest.raises(LuceError) as err:
        eng.logits([i % eng.info.n_vocab for i in IDS[HEAD:]], state=path, identity=identity)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_another_identity_is_refused(saved):
    _refused(saved, "was written for another model or settings", identity=b"other")
    _refused(saved, "was written for another model or settings", identity=b"")


@pytest.mark.parametrize("cache", [dict(kv_cache="f16"), dict(kv_cache="f32", kv_rotate=True),
                                   dict(cache_type_k="f32", cache_type_v="q8_0")])
def test_another_cache_type_or_rotation_is_refused(saved, cache):
    _refused(saved, "holds another KV cache type or rotation", **cache)


def test_another_model_shape_is_refused(saved, tmp_path):
    tiny = write_random_qwen35(tmp_path / "tiny.gguf", SPEC_TINY, seed=3)
    _refused(saved, "does not match this model's state sizes", model=tiny)


def test_a_truncated_file_is_refused(saved, tmp_path):
    cut = tmp_path / "cut.state"
    cut.write_bytes(saved.read_bytes()[:-4])
    _refused(cut, "does not match this model's state sizes")


def test_not_a_state_or_another_version_is_refused(saved, tmp_path):
    _refused(TARGET, "is not a luce session state")
    newer = tmp_path / "v2.state"
    data = bytearray(saved.read_bytes())
    data[8:12] = (2).to_bytes(4, "little")  # the version word after the 8-byte magic
    newer.write_bytes(bytes(data))
    _refused(newer, "of format version 2 (this luce reads 1)")


def test_a_state_longer_than_the_context_is_refused(saved):
    _refused(saved, f"holds {HEAD} positions; the session has 32", ctx_size=32)


def test_a_refused_load_leaves_the_session_usable(saved):
    with Engine(TARGET, threads=2, ctx_size=128) as eng:
        before = eng.logits(IDS[:8])
        with pytest.raises(LuceError):
            eng.logits(IDS[:8], state=saved, identity=b"other")
        assert np.array_equal(eng.logits(IDS[:8]), before)


def test_a_save_is_whole_or_absent(tmp_path, saved):
    with Engine(TARGET, threads=2, ctx_size=128) as eng:
        with pytest.raises(LuceError, match="cannot write"):
            eng.save_state(IDS[:HEAD], tmp_path / "missing" / "head.state")
        target = tmp_path / "head.state"
        target.write_bytes(b"an older entry")
        eng.save_state(IDS[:HEAD], target, identity=b"target")  # replaced whole
    assert target.read_bytes() == saved.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.state"]  # no partial file left


_EMU_PROBE = r"""
import json, sys
import numpy as np
from luce import Engine
target, folder, ids, head = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
logits = {}
for device in ("cpu", "gpu"):
    with Engine(target, device=device, threads=2, ctx_size=128) as eng:
        eng.save_state(ids[:head], f"{folder}/{device}.state")
for device in ("cpu", "gpu"):
    with Engine(target, device=device, threads=2, ctx_size=128) as eng:
        for written in ("cpu", "gpu"):
            logits[device + " from " + written] = eng.logits(ids[head:], state=f"{folder}/{written}.state")
        logits[device + " whole"] = eng.logits(ids)[head:]
scale = float(np.abs(logits["cpu whole"]).max())
print(json.dumps({k: float(np.abs(v - logits["cpu whole"]).max()) / scale for k, v in logits.items()}))
"""


def test_cpu_and_emulated_gpu_read_each_others_states(tmp_path):
    """The backends lay the file out alike (the GPU downloads and uploads its own buffers): a state
    written on either continues on either within the GPU-vs-CPU tolerance of the whole prompt."""
    errors = run_on_emulated_cuda(_EMU_PROBE, TARGET, tmp_path, json.dumps(IDS), HEAD)
    assert errors["cpu from cpu"] == 0.0
    # This model's GPU rows differ from the CPU's by about 1.2e-2 of the largest logit (int8
    # activations in other blocks); a state laid out differently would be off by the logits' size.
    assert all(err < 3e-2 for err in errors.values()), errors
