"""Session state through the C ABI: snapshot / restore (rollback by replay for speculative
verification) and the context bookkeeping around it."""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine, LuceError
from luce.binding import check, ffi, lib


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_random_qwen35(tmp_path_factory.mktemp("sess") / "s.gguf", SPEC_TINY, seed=8)


def _eval(session, ids, V):
    """Evaluates ids one call; returns the logits of its last position."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    out = np.empty(V, dtype=np.float32)
    check(lib().luce_session_eval(session, ffi.from_buffer("int32_t[]", ids), len(ids),
                                  ffi.from_buffer("float[]", out), 1))
    return out


def test_restore_leaves_no_trace_of_a_rejected_continuation(path):
    """prefix -> snapshot -> 'draft' tokens -> restore -> accepted tokens one by one gives exactly
    the logits of prefix -> accepted tokens (both DeltaNet state and attention keys rolled back)."""
    rng = np.random.default_rng(0)
    prefix, draft, accepted = (rng.integers(0, 512, n) for n in (70, 9, 6))
    L = lib()
    with Engine(path, threads=2, ctx_size=128) as eng:
        s, V = eng._session, eng.info.n_vocab
        check(L.luce_session_reset(s))
        _eval(s, prefix, V)
        ref = [_eval(s, [t], V) for t in accepted]

        check(L.luce_session_reset(s))
        _eval(s, prefix, V)
        snap = ffi.new("luce_snapshot **")
        check(L.luce_session_snapshot(s, snap))
        try:
            _eval(s, draft, V)
            assert L.luce_session_n_past(s) == len(prefix) + len(draft)
            check(L.luce_session_restore(s, snap[0]))
            assert L.luce_session_n_past(s) == len(prefix)
            got = [_eval(s, [t], V) for t in accepted]
        finally:
            L.luce_snapshot_free(snap[0])
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)


def test_snapshot_of_another_session_is_refused(path):
    L = lib()
    with Engine(path, threads=1, ctx_size=32) as a, Engine(path, threads=1, ctx_size=32) as b:
        snap = ffi.new("luce_snapshot **")
        check(L.luce_session_snapshot(a._session, snap))
        try:
            with pytest.raises(LuceError) as e:
                check(L.luce_session_restore(b._session, snap[0]))
            assert "another session" in str(e.value)
        finally:
            L.luce_snapshot_free(snap[0])
