"""Stages "attention", "select" and "deltanet": one device kernel at a time through libluce_gpu's
test hooks, on random inputs, against float64 numpy (attention, Gated DeltaNet) or numpy's stable
orderings (argmax / top-k). GPU only: the CPU dry run reports them skipped."""
from __future__ import annotations

import time

from .device import MAX_STEP, _hook, _ptr


ATTN_TOL = 1e-4  # max |gpu - ref| / max |ref|, fp32 kernel vs float64 numpy
# (T, n_head, n_head_kv, head_dim, n_ctx, pos0, mask), pos[t] = pos0 + t: decode deep in a long cache (many
# splits), decode at position 0 (one key, all but one split empty), a verify block, a DFlash 2 verify
# (8 tokens over ~100 keys), head dim 48 (partial chunks), a random tree mask, and a drafter-like
# mask (each row a window ending past the context, most of the cache unseen); then prefill chunks
# longer than MAX_STEP (attention_prefill_kernel: tiles of 16 queries and 32 keys, partial ones at
# both ends, one from position 0), and head dim 48 past MAX_STEP (the one-query kernel's
# fallback). Over f32 caches.
ATTN_CASES = (
    (1, 24, 4, 256, 4096, 3000, None),
    (1, 24, 4, 256, 4096, 0, None),
    (1, 8, 2, 128, 700, 699, None),
    (16, 24, 4, 256, 4096, 1000, None),
    (8, 24, 4, 256, 4096, 100, None),
    (3, 4, 2, 48, 300, 100, None),
    (5, 8, 2, 64, 512, 300, "random"),
    (8, 32, 8, 128, 2048, 1500, "window"),
    (100, 24, 4, 256, 2048, 900, None),
    (130, 8, 2, 128, 512, 0, None),
    (75, 4, 2, 64, 256, 20, None),
    (66, 4, 4, 32, 128, 1, None),
    (70, 4, 2, 48, 300, 10, None),
)
# The other cache types (K type, V type), each case as above: the kernels' compile-time pairs
# (f16, q8_0) and run-time ones (q4_0, mixed), at decode, verify and prefill widths, 16 query
# heads to a KV head (two blocks of the grouped kernel, which f32 caches do not take) and the
# drafter-like mask. The reference reads the rows as gguf.quants dequantizes its own quantization
# of them (numpy's float16 for f16).
ATTN_TYPED_CASES = (
    (1, 24, 4, 256, 4096, 3000, None, "f16", "f16"),
    (8, 24, 4, 256, 4096, 1000, None, "q8_0", "q8_0"),
    (3, 8, 2, 128, 700, 600, None, "q4_0", "q4_0"),
    (5, 8, 2, 64, 512, 300, "random", "q8_0", "f16"),
    (100, 24, 4, 256, 2048, 900, None, "f16", "f16"),
    (70, 8, 2, 128, 512, 10, None, "q8_0", "q8_0"),
    (66, 4, 2, 64, 128, 1, None, "q4_0", "f16"),
    (3, 32, 2, 128, 1024, 900, None, "f16", "f16"),
    (8, 32, 8, 128, 2048, 1500, "window", "f16", "f16"),
)
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3}  # KvType (kv_cache.h)
# Timed with --bench-shape (GPU): the 27B's full-attention layer (24 query heads over 4 KV heads of
# 256) deciding one token, and verifying 16, at these depths for each cache type.
ATTN_TIMED_DEPTHS = (8192, 32768, 131072)
ATTN_TIMED_TYPES = ("f32", "f16", "q8_0")
ATTN_TIMING_REPS = 50


def _attention_mask(rng, kind: str | None, T: int, n_ctx: int, pos0: int):
    """None (causal), random ancestor sets whose last row sees nothing (zeros expected), or windows:
    row t sees keys [t * 37, pos0 + 8) (a shared context, then the whole block of 8)."""
    import numpy as np

    if kind is None:
        return None
    if kind == "random":
        mask = (rng.random((T, n_ctx)) < 0.3).astype(np.uint8)
        mask[-1] = 0
        return mask
    mask = np.zeros((T, n_ctx), dtype=np.uint8)
    for t in range(T):
        mask[t, t * 37:pos0 + 8] = 1
    return mask


def _attention_ref(q, k, v, pos, mask):
    """float64 softmax attention over the visible keys (causal j <= pos[t], or mask[t][j] != 0)."""
    import numpy as np

    T, H, D = q.shape
    Hkv, n_ctx, _ = k.shape
    group = H // Hkv
    out = np.zeros((T, H, D))
    for t in range(T):
        vis = mask[t].astype(bool) if mask is not None else np.arange(n_ctx) <= pos[t]
        if not vis.any():
            continue
        for h in range(H):
            kk, vv = k[h // group][vis].astype(np.float64), v[h // group][vis].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) / np.sqrt(D)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vv
    return out


def _as_cache_rows(x, kv_type: str):
    """x's values as a cache of kv_type holds them: gguf.quants' round trip for the block types."""
    import numpy as np

    if kv_type == "f32":
        return x
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType.Q8_0 if kv_type == "q8_0" else GGMLQuantizationType.Q4_0
    return quants.dequantize(quants.quantize(x, qt), qt).reshape(x.shape).astype(np.float32)


def _call_attention(fn, q, k, v, pos, mask, n_head_kv: int, split: int, types=("f32", "f32"), reps: int = 0):
    """The hook on host arrays: (out, microseconds a call or None)."""
    import ctypes

    import numpy as np

    ptr = _ptr

    T, H, D = q.shape
    out = np.zeros(q.shape, dtype=np.float32)
    us = ctypes.c_float(0.0)
    err = ctypes.create_string_buffer(512)
    st = fn(ctypes.c_int32(0), ptr(q), ptr(k), ptr(v), ptr(pos), ptr(mask), T, H, n_head_kv, D, k.shape[1],
            ctypes.c_int32(split), ctypes.c_int32(KV_TYPES[types[0]]), ctypes.c_int32(KV_TYPES[types[1]]),
            ctypes.c_int32(reps), ctypes.byref(us), ptr(out), err, ctypes.c_size_t(len(err)))
    if st != 0:
        raise RuntimeError(err.value.decode())
    return out, (us.value if reps else None)


def check_attention(dut: str, timed: bool = False) -> list[dict]:
    """Split-KV and one-pass GPU attention vs float64 numpy on random inputs, over every cache type
    (libluce_gpu's luce_gpu_attention hook; GPU only); timed: also the ATTN_TIMED shapes' times."""
    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_attention is a GPU test hook", "ok": True}]
    fn = _hook("libluce_gpu.so", "luce_gpu_attention")
    rng = np.random.default_rng(11)
    rows = []
    for T, H, Hkv, D, n_ctx, pos0, kind, *types in ATTN_CASES + ATTN_TYPED_CASES:
        types = tuple(types) or ("f32", "f32")
        pos = np.arange(pos0, pos0 + T, dtype=np.int32)
        q = rng.standard_normal((T, H, D), dtype=np.float32)
        k = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        v = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        mask = _attention_mask(rng, kind, T, n_ctx, pos0)
        # Keys no query sees stand for cache rows never written: NaN, so touching one shows
        # (f32 caches: the hook stores the others through the cache's encoder).
        if types == ("f32", "f32"):
            unseen = ~mask.any(axis=0).astype(bool) if mask is not None else np.arange(n_ctx) > pos[-1]
            k[:, unseen] = np.nan
            v[:, unseen] = np.nan
        ref = _attention_ref(q, _as_cache_rows(k, types[0]), _as_cache_rows(v, types[1]), pos, mask)

        def run(split: int, rows_at: slice = slice(None)):
            mm = np.ascontiguousarray(mask[rows_at]) if mask is not None else None
            return _call_attention(fn, np.ascontiguousarray(q[rows_at]), k, v, np.ascontiguousarray(pos[rows_at]), mm,
                                   Hkv, split, types)[0]

        for split in (1, 0):
            case = f"T={T} H={H}/{Hkv} D={D} ctx={n_ctx} pos0={pos0}{f' {kind} mask' if kind else ''} " \
                   f"{'split' if split else 'one-pass'}{'' if types == ('f32', 'f32') else ' %s/%s' % types}"
            try:
                out = run(split)
                # Verify rows must be the bits of one-token decode rows (speculative == plain);
                # prefill chunks (wider than any verify step) have their own kernel and order.
                verify = split and 1 < T <= MAX_STEP
                alone = np.concatenate([run(1, slice(t, t + 1)) for t in range(T)]) if verify else out
            except RuntimeError as e:
                rows.append({"case": case, "error": str(e), "ok": False})
                continue
            diff = np.abs(out - ref)
            rel = float(diff.max() / max(np.abs(ref).max(), 1e-30))
            bad = np.argwhere(diff > ATTN_TOL * max(np.abs(ref).max(), 1e-30))
            same = bool(np.array_equal(out, alone, equal_nan=True))
            rows.append({"case": case + ("" if same else ", rows != one-token rows"), "max_abs": float(diff.max()),
                         "rel_err": rel, "first_bad": bad[0].tolist() if len(bad) else None,
                         "ok": rel <= ATTN_TOL and same})
    return rows + (_time_attention(fn, rng) if timed else [])


def _time_attention(fn, rng) -> list[dict]:
    """ATTN_TIMED_DEPTHS x ATTN_TIMED_TYPES, decode (1 token) and verify (16): microseconds a call
    and the cache bytes it reads a microsecond (GB/s: each K and V row once)."""
    import numpy as np

    H, Hkv, D = 24, 4, 256
    row_bytes = {"f32": 4 * D, "f16": 2 * D, "q8_0": D + D // 16}
    rows = []
    for n_ctx in ATTN_TIMED_DEPTHS:
        k = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        v = rng.standard_normal((Hkv, n_ctx, D), dtype=np.float32)
        for kv_type in ATTN_TIMED_TYPES:
            for T in (1, 16):
                pos = np.arange(n_ctx - T, n_ctx, dtype=np.int32)
                q = rng.standard_normal((T, H, D), dtype=np.float32)
                case = f"timed: T={T} H={H}/{Hkv} D={D} depth={n_ctx} {kv_type}"
                try:
                    _, us = _call_attention(fn, q, k, v, pos, None, Hkv, 1, (kv_type, kv_type), ATTN_TIMING_REPS)
                except RuntimeError as e:
                    rows.append({"case": case, "error": str(e), "ok": False})
                    continue
                gb_s = 2 * Hkv * n_ctx * row_bytes[kv_type] / (us * 1e3)
                rows.append({"case": case, "us": round(us, 1), "cache_GB_s": round(gb_s, 1), "ok": True})
    return rows


# (rows, n, k): k 0 is argmax_rows. A vocabulary row of the 27B (248320: 61 chunks of 4096 with a
# ragged last one), one row as a DSpark chain step asks, a short row, and DDTree's widths.
# The last five also time the call (the hook's wall clock, the rows' copies included, the same for
# every k of one shape): the top-k costs a selection round per candidate, and sampled speculative
# decoding ranks proposal rows with k up to 32 (speculative.cpp PROPOSAL_TOP_K), verify rows with
# the user's top-k up to 256.
SELECT_CASES = ((8, 248320, 0), (1, 248320, 0), (3, 5000, 0), (8, 248320, 1), (7, 248320, 8), (2, 9000, 40),
                (1, 248320, 32), (1, 248320, 256), (15, 248320, 20), (15, 248320, 32), (15, 248320, 256))
SELECT_TIMED = 5  # the last cases of SELECT_CASES
SELECT_TIMING_REPS = 5


def _select_rows(rng, n_rows: int, n: int):
    """Random rows whose best values tie across chunks (the lower index must win), plus an
    all -inf row (argmax: index 0, as the CPU backend)."""
    import numpy as np

    x = rng.standard_normal((n_rows, n), dtype=np.float32)
    for r in range(n_rows):
        hi = x[r].max() + 1.0
        x[r, rng.choice(n, size=3, replace=False)] = hi  # a three-way tie for the top
    if n_rows > 2:
        x[-1] = -np.inf
    return x


def check_select(dut: str) -> list[dict]:
    """argmax_rows and topk_rows on the device vs numpy's stable orderings (value descending, then
    index ascending; libluce_gpu's luce_gpu_select hook; GPU only)."""
    import ctypes

    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_select is a GPU test hook", "ok": True}]
    fn, ptr = _hook("libluce_gpu.so", "luce_gpu_select"), _ptr
    rng = np.random.default_rng(17)
    rows = []
    for i, (n_rows, n, k) in enumerate(SELECT_CASES):
        x = _select_rows(rng, n_rows, n)
        want = np.argsort(-x, axis=1, kind="stable")[:, :max(k, 1)].astype(np.int32)
        ids = np.full((n_rows, max(k, 1)), -7, dtype=np.int32)
        vals = np.zeros((n_rows, max(k, 1)), dtype=np.float32)
        err = ctypes.create_string_buffer(512)
        call = lambda: fn(ctypes.c_int32(0), ptr(x), ctypes.c_int32(n_rows), ctypes.c_int64(n),  # noqa: E731
                          ctypes.c_int32(k), ptr(ids), ptr(vals), err, ctypes.c_size_t(len(err)))
        st = call()
        case = f"{'argmax' if k == 0 else f'top {k}'} of {n_rows} x {n}"
        if st != 0:
            rows.append({"case": case, "error": err.value.decode(), "ok": False})
            continue
        bad = [r for r in range(n_rows) if not np.array_equal(ids[r], want[r])
               or (k > 0 and not np.array_equal(vals[r], x[r, want[r]]))]
        row = {"case": case, "rows_wrong": len(bad),
               "first_wrong": [bad[0], ids[bad[0]][:4].tolist(), want[bad[0]][:4].tolist()] if bad else None,
               "ok": not bad}
        if i >= len(SELECT_CASES) - SELECT_TIMED:
            times = []
            for _ in range(SELECT_TIMING_REPS):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            row["ms"] = 1e3 * sorted(times)[len(times) // 2]
        rows.append(row)
    return rows


DELTA_TOL = 1e-4  # max |gpu - ref| / max |ref| over outputs, final state and history
DELTA_EPS = 1e-6  # the L2 norm clamp of the random cases
# (HK, HV, DK, DV, T): the 27B's layer (DK 128: two threads per state column), DK 64, the tiny
# fixtures' DK 32, DK 48 (no register kernel: the device-memory kernel either way), and 21 tokens
# of DK 128 (a state carried through a longer step).
# Steps wider than MAX_STEP without history take the prefill kernel (deltanet.cu), in chunks of 8
# tokens: 77 (a short last chunk) at DK = 128, 72 at 64, 65 at 32 with DV = 40 (a block's columns
# past DV), 66 at 16 (4 lanes a column).
DELTA_CASES = ((16, 48, 128, 128, 1), (16, 48, 128, 128, 16), (4, 8, 64, 64, 5), (4, 8, 32, 32, 3),
               (2, 4, 48, 48, 4), (4, 8, 128, 128, 21), (4, 8, 128, 128, 77), (4, 8, 64, 64, 72),
               (2, 4, 32, 40, 65), (2, 4, 16, 16, 66))
# Tree mode (DDTree verify): each token starts from its parent's state (-1: the step's initial
# state, t = 7 back at the root level); t = 3, 6, 8 and 10 branch off earlier tokens.
DELTA_TREE_PARENTS = (-1, 0, 1, 0, 3, 4, 1, -1, 2, 8, 5, 10)
DELTA_TREE_CASES = ((4, 8, 128, 128), (2, 4, 64, 64), (2, 4, 48, 48))


def _deltanet_ref(conv, b, a, ssm_a, dt_bias, hk, hv, dk, dv, eps, state, parent=None) -> dict:
    """float64 Gated DeltaNet over T tokens (spec/qwen35.md §1.4 steps 3-7; v head j reads k head
    j % HK): {"out": [T][HV][DV], "state": the final state, "history": the per-token states}.
    parent: tree mode, token t starts from token parent[t]'s state (< 0: `state`), and the state
    returned is `state`."""
    import numpy as np

    T = conv.shape[0]
    S = state.astype(np.float64).copy()
    out = np.zeros((T, hv, dv))
    hist = np.zeros((T, hv, dk, dv))
    sp = lambda x: x if x > 20 else np.log1p(np.exp(x))  # noqa: E731
    for t in range(T):
        if parent is not None:
            S = (state.astype(np.float64) if parent[t] < 0 else hist[parent[t]]).copy()
        row = conv[t].astype(np.float64)
        for j in range(hv):
            kh = j % hk
            q = row[kh * dk:(kh + 1) * dk]
            k = row[hk * dk + kh * dk:hk * dk + (kh + 1) * dk]
            v = row[2 * hk * dk + j * dv:2 * hk * dk + (j + 1) * dv]
            q = q / max(np.linalg.norm(q), eps) / np.sqrt(dk)
            k = k / max(np.linalg.norm(k), eps)
            beta = 1 / (1 + np.exp(-float(b[t, j])))
            decay = np.exp(float(ssm_a[j]) * sp(float(a[t, j]) + float(dt_bias[j])))
            S[j] *= decay
            delta = beta * (v - k @ S[j])
            S[j] += np.outer(k, delta)
            out[t, j] = q @ S[j]
            hist[t, j] = S[j]
    return {"out": out, "state": state.astype(np.float64) if parent is not None else S, "history": hist}


def _deltanet_inputs(rng, hk, hv, dk, dv, T):
    """Random inputs of one DeltaNet case: conv rows, b, a, ssm_a, dt_bias, initial state."""
    import numpy as np

    conv = rng.standard_normal((T, 2 * hk * dk + hv * dv), dtype=np.float32)
    b = rng.standard_normal((T, hv), dtype=np.float32)
    a = rng.standard_normal((T, hv), dtype=np.float32)
    ssm_a = -np.exp(rng.standard_normal(hv).astype(np.float32))
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    state0 = (0.1 * rng.standard_normal((hv, dk, dv))).astype(np.float32)
    return conv, b, a, ssm_a, dt_bias, state0


# luce_gpu_deltanet's kernel argument (gpu::DeltaKernel)
DELTA_KERNELS = {0: "device memory", 1: "registers", 2: "registers, state loaded early"}


def _deltanet_case(label: str, inputs, dims, ref, registers: int, history: bool,
                   parent=None) -> tuple[dict, dict]:
    """One luce_gpu_deltanet call against the float64 reference: (report row, the outputs)."""
    import ctypes

    import numpy as np

    fn, ptr = _hook("libluce_gpu.so", "luce_gpu_deltanet"), _ptr
    conv, b, a, ssm_a, dt_bias, state0 = inputs
    hk, hv, dk, dv, T = dims
    state = state0.copy()
    out = np.zeros((T, hv, dv), dtype=np.float32)
    hist = np.zeros((T, hv, dk, dv), dtype=np.float32) if history else None
    par = None if parent is None else np.ascontiguousarray(parent, dtype=np.int32)
    err = ctypes.create_string_buffer(512)
    st = fn(ctypes.c_int32(0), ptr(conv), ptr(b), ptr(a), ptr(ssm_a), ptr(dt_bias), hk, hv, dk, dv,
            ctypes.c_float(DELTA_EPS), T, ptr(state), ptr(out), ptr(hist), ctypes.c_int32(registers),
            None if par is None else par.ctypes.data_as(ctypes.c_void_p), err, ctypes.c_size_t(len(err)))
    kernel = DELTA_KERNELS[registers]
    case = "HK={} HV={} DK={} DV={} T={} ".format(*dims) + kernel + label
    if st != 0:
        return {"case": case, "error": err.value.decode(), "ok": False}, {}
    got = {"out": out, "state": state, **({"history": hist} if history else {})}
    worst = {"max_abs": 0.0, "rel_err": 0.0, "first_bad": None}
    for name, y in got.items():
        diff = np.abs(y - ref[name])
        scale = max(float(np.abs(ref[name]).max()), 1e-30)
        rel = float(diff.max()) / scale
        if rel > worst["rel_err"]:
            worst.update(max_abs=float(diff.max()), rel_err=rel)
        bad = np.argwhere(diff > DELTA_TOL * scale)
        if len(bad) and worst["first_bad"] is None:
            worst["first_bad"] = f"{name}{bad[0].tolist()}"
    return {"case": case, **worst, "ok": worst["rel_err"] <= DELTA_TOL}, got


def check_deltanet(dut: str) -> list[dict]:
    """Register-resident and device-memory GPU DeltaNet vs float64 numpy on random inputs
    (libluce_gpu's luce_gpu_deltanet hook; GPU only), with and without the history and in tree
    mode. Up to MAX_STEP tokens the register kernel orders its sums the same way with history as
    without, so those runs must also agree bit for bit: decode / verify exactness at kernel level
    (wider steps without history take the prefill kernel and its own order); with its state
    loaded early (LUCE_GPU_DELTANET_EARLY) it must give the same bits as without."""
    import numpy as np

    if dut != "gpu":
        return [{"case": "all", "skipped": "luce_gpu_deltanet is a GPU test hook", "ok": True}]
    rng = np.random.default_rng(13)
    rows = []
    for dims in DELTA_CASES:
        inputs = _deltanet_inputs(rng, *dims)
        ref = _deltanet_ref(*inputs[:5], *dims[:4], DELTA_EPS, inputs[5])
        runs = {}
        for registers, history in ((1, True), (0, True), (1, False), (2, True)):
            row, runs[registers, history] = _deltanet_case("" if history else ", no history", inputs, dims, ref,
                                                           registers, history)
            rows.append(row)
        same_bits = [("history on / off", runs[1, True], runs[1, False], ("out", "state"), dims[4] <= MAX_STEP),
                     ("state loaded early / not", runs[2, True], runs[1, True], ("out", "state", "history"), True)]
        for what, x, y, keys, applies in same_bits:
            if applies and x and y and not all(np.array_equal(x[k], y[k]) for k in keys):
                rows.append({"case": "HK={} HV={} DK={} DV={} T={} registers: ".format(*dims) + what,
                             "error": "outputs differ in bits", "ok": False})
    for hk, hv, dk, dv in DELTA_TREE_CASES:
        dims = (hk, hv, dk, dv, len(DELTA_TREE_PARENTS))
        inputs = _deltanet_inputs(rng, *dims)
        ref = _deltanet_ref(*inputs[:5], hk, hv, dk, dv, DELTA_EPS, inputs[5], DELTA_TREE_PARENTS)
        for registers in (1, 0, 2):  # 2: state loaded early, the default kernel of verify steps
            rows.append(_deltanet_case(f", tree {list(DELTA_TREE_PARENTS)}", inputs, dims, ref, registers, True,
                                       DELTA_TREE_PARENTS)[0])
    return rows
