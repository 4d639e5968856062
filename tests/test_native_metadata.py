"""How the native loader reads qwen35 metadata: every integer width, per-layer arrays, the
optional recurrent_layers array, MTP blocks, and what it reports back (luce_model_info).

The reference for "read correctly" is the same weights with the plain u32 encoding: logits must
be identical (bit for bit: the numbers the forward uses are the same)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fixtures.crafted_gguf import KV, VT
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine, LuceError

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
ARCH = "qwen35"
INT_TYPES = [VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64]


def _logits(path, **kw):
    with Engine(path, threads=1, ctx_size=64, **kw) as eng:
        return eng.info, eng.logits(IDS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _logits(write_random_qwen35(tmp_path_factory.mktemp("ref") / "ref.gguf", seed=4))


RANGES = {VT.UINT8: (0, 2**8), VT.INT8: (-2**7, 2**7), VT.UINT16: (0, 2**16),
          VT.INT16: (-2**15, 2**15), VT.UINT32: (0, 2**32), VT.INT32: (-2**31, 2**31),
          VT.UINT64: (0, 2**64), VT.INT64: (-2**63, 2**63)}


def _retype_integers(kvs, vtype):
    """Every u32 qwen35.* key whose value fits `vtype` is re-encoded as `vtype`."""
    lo, hi = RANGES[vtype]
    out, n = [], 0
    for kv in kvs:
        if kv.key.startswith(ARCH + ".") and kv.vtype == VT.UINT32 and lo <= kv.value < hi:
            kv, n = replace(kv, vtype=vtype), n + 1
        out.append(kv)
    assert n >= 8  # most keys are small numbers; context_length (4096) needs 16 bits
    return out


@pytest.mark.parametrize("vtype", INT_TYPES, ids=lambda t: t.name)
def test_every_integer_width_is_accepted(tmp_path, reference, vtype):
    path = write_random_qwen35(tmp_path / "w.gguf", seed=4,
                               edit_kvs=lambda kvs: _retype_integers(kvs, vtype))
    info, logits = _logits(path)
    assert info == reference[0]
    np.testing.assert_array_equal(logits, reference[1])


def test_per_layer_arrays_of_mixed_widths(tmp_path, reference):
    def edit(kvs):
        n = SPEC_TINY.n_layer
        widths = {f"{ARCH}.feed_forward_length": VT.UINT16, f"{ARCH}.attention.head_count": VT.INT8,
                  f"{ARCH}.attention.head_count_kv": VT.UINT64}
        return [KV(kv.key, VT.ARRAY, [kv.value] * n, widths[kv.key]) if kv.key in widths else kv
                for kv in kvs]
    info, logits = _logits(write_random_qwen35(tmp_path / "a.gguf", seed=4, edit_kvs=edit))
    np.testing.assert_array_equal(logits, reference[1])


def test_integer_out_of_range_for_its_meaning(tmp_path):
    big = 2**40  # fits u64, not a plausible embedding width
    def edit(kvs):
        return [KV(kv.key, VT.UINT64, big) if kv.key == f"{ARCH}.embedding_length" else kv for kv in kvs]
    with pytest.raises(LuceError) as e:
        Engine(write_random_qwen35(tmp_path / "big.gguf", seed=4, edit_kvs=edit))
    assert e.value.status == 3 and "embedding_length" in str(e.value)


def test_string_where_an_integer_belongs(tmp_path):
    def edit(kvs):
        return [KV(kv.key, VT.STRING, "64") if kv.key == f"{ARCH}.embedding_length" else kv for kv in kvs]
    with pytest.raises(LuceError) as e:
        Engine(write_random_qwen35(tmp_path / "s.gguf", seed=4, edit_kvs=edit))
    assert e.value.status == 3 and "must be an integer" in str(e.value)


def test_recurrent_layers_array_overrides_the_interval_rule(tmp_path, reference):
    n, interval = SPEC_TINY.n_layer, SPEC_TINY.interval
    pattern = [(i + 1) % interval != 0 for i in range(n)]
    key = f"{ARCH}.attention.recurrent_layers"

    def same(kvs):  # the array says what the rule says; the interval key is made misleading
        kvs = [KV(kv.key, VT.UINT32, 2) if kv.key == f"{ARCH}.full_attention_interval" else kv
               for kv in kvs]
        return kvs + [KV(key, VT.ARRAY, [int(b) for b in pattern], VT.BOOL)]
    info, logits = _logits(write_random_qwen35(tmp_path / "r.gguf", seed=4, edit_kvs=same))
    np.testing.assert_array_equal(logits, reference[1])

    def flipped(kvs):  # layer 0 declared attention: its attention tensors do not exist
        return kvs + [KV(key, VT.ARRAY, [0] + [int(b) for b in pattern[1:]], VT.BOOL)]
    with pytest.raises(LuceError) as e:
        Engine(write_random_qwen35(tmp_path / "f.gguf", seed=4, edit_kvs=flipped))
    assert e.value.status == 3 and "blk.0.attn_q.weight" in str(e.value)


def test_model_info(reference, tmp_path):
    info = reference[0]
    c = SPEC_TINY
    assert (info.n_vocab, info.n_embd, info.n_layer, info.n_ff) == (c.vocab, c.hidden, c.n_layer, c.ff)
    assert (info.n_full_attention, info.n_recurrent) == (c.n_layer // c.interval,
                                                         c.n_layer - c.n_layer // c.interval)
    assert (info.n_head, info.n_head_kv, info.head_dim) == (c.n_head, c.n_kv, c.head_dim)
    assert info.n_ctx_train == c.ctx and info.eos_token_id == c.vocab - 1
    assert not info.tied_head and info.n_layer_file == c.n_layer
    with Engine(write_random_qwen35(tmp_path / "m.gguf", seed=4, mtp=True, tied=True)) as eng:
        assert eng.info.n_layer == c.n_layer and eng.info.n_layer_file == c.n_layer + 1
        assert eng.info.tied_head
