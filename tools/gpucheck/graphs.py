"""Stage "graphs": step graphs, programmatic dependent launch, the fused attention prologue and the
early DeltaNet state load must each give the bits of plain eager launches."""
from __future__ import annotations

from pathlib import Path

from .device import env, plain_generate


GRAPH_STEPS = 24  # one-token steps compared between graph replay and eager launches


def check_graphs(path: Path, dut: str, threads: int) -> dict:
    """Step graphs (the default) against eager launches (LUCE_GPU_GRAPHS=0), each with programmatic
    dependent launch (the default on sm_90+), against eager launches without it (LUCE_GPU_PDL=0,
    every kernel waiting for the whole previous one), against the attention prologue as five
    launches instead of one (LUCE_GPU_FUSED_ATTN=0, eager) and against the DeltaNet state loaded
    after the previous kernel ends instead of before (LUCE_GPU_DELTANET_EARLY=0, graphs) on one
    fixture model: the logits of a prefill and GRAPH_STEPS one-token greedy steps must be bitwise
    identical, and so must the tokens of a greedy generation (the device-argmax path)."""
    import numpy as np

    from luce import Engine
    from luce.binding import check, ffi, lib

    def run(graphs: str, pdl: str = "1", fused: str = "1", early: str = "1"):
        with env(LUCE_GPU_GRAPHS=graphs, LUCE_GPU_PDL=pdl, LUCE_GPU_FUSED_ATTN=fused, LUCE_GPU_DELTANET_EARLY=early):
            eng = Engine(path, device=dut, threads=threads)
        try:
            L, session, V = lib(), eng._session, eng.info.n_vocab
            ids = np.random.default_rng(17).integers(0, V, 12).astype(np.int32)
            rows = np.zeros((GRAPH_STEPS + 1, V), dtype=np.float32)
            check(L.luce_session_reset(session))
            check(L.luce_session_eval(session, ffi.from_buffer("int32_t[]", ids), len(ids),
                                      ffi.from_buffer("float[]", rows[0]), 1))
            for i in range(GRAPH_STEPS):
                tok = np.array([int(np.argmax(rows[i]))], dtype=np.int32)
                check(L.luce_session_eval(session, ffi.from_buffer("int32_t[]", tok), 1,
                                          ffi.from_buffer("float[]", rows[i + 1]), 1))
            tokens, _ = plain_generate(eng, ids, GRAPH_STEPS)
            return rows, tokens
        finally:
            eng.close()

    graph_rows, graph_tokens = run("1")
    others = {"serial": run("0", pdl="0"), "eager": run("0"), "unfused": run("0", fused="0"),
              "late state": run("1", early="0")}
    diff = np.argwhere(np.any([rows != graph_rows for rows, _ in others.values()], axis=0))
    res = {"model": path.name, "steps": GRAPH_STEPS, "identical_logits": not len(diff),
           "max_abs": max(float(np.abs(rows - graph_rows).max()) for rows, _ in others.values()),
           "first_diff": diff[0].tolist() if len(diff) else None,
           "identical_tokens": all(tokens == graph_tokens for _, tokens in others.values()),
           "differing": [name for name, (rows, tokens) in others.items()
                         if not np.array_equal(rows, graph_rows) or tokens != graph_tokens]}
    res["ok"] = res["identical_logits"] and res["identical_tokens"]
    return res
