"""gpu_report.json and gpu_report.md: everything measured, and one markdown section per stage."""
from __future__ import annotations

import json
from pathlib import Path

from .bench import BENCH_CTX, KERNEL_REPS, PREFILL_LENGTHS, VERIFY_WIDTHS
from .drafters import DRAFT_TOL
from .kernel_checks import ATTN_TOL, DELTA_TOL
from .matmul import INVARIANCE_TOKENS, MATMUL_TOL, MATMUL_WIDTHS
from .models import FAST_TOL, FLOAT_TOL, MARGIN_FACTOR, QUANT_TOL, SELF_TOL
from .spec_bench import REF_SPEC_PROMPTS, REF_SPEC_TOKENS


def _mma_cell(m: dict) -> str:
    """The tensor-core kernels' errors, or n/a where they were not run (float types, the CPU dry run)."""
    if not m.get("worst_frag"):
        return "n/a"
    return (f"{m['rel_err_frag']:.2e} {m['worst_frag']}; staged {m.get('rel_err_staged', 0):.2e}; "
            f"prefill gemm {m.get('rel_err_gemm', 0):.2e} {m.get('worst_gemm')}")


def _case_table(header: str, cases: list[dict]) -> list[str]:
    """A kernel-vs-float64 table (attention, DeltaNet), or nothing when that stage did not run."""
    if not cases:
        return []
    rows = [(f"| {a['case']} | {a.get('error') or a.get('skipped')} | | | {'FAIL' if 'error' in a else '-'} |")
            if ("error" in a or "skipped" in a) else
            (f"| {a['case']} | {a['max_abs']:.2e} | {a['rel_err']:.2e} | {a['first_bad']} | "
             f"{'ok' if a['ok'] else 'FAIL'} |") for a in cases]
    return [header, "| --- | --- | --- | --- | --- |", *rows, ""]


def _select_table(cases: list[dict]) -> list[str]:
    """The argmax / top-k table, or nothing when that stage did not run."""
    if not cases:
        return []
    rows = [(f"| {a['case']} | {a.get('error') or a.get('skipped')} | | {'FAIL' if 'error' in a else '-'} | |")
            if ("error" in a or "skipped" in a) else
            f"| {a['case']} | {a['rows_wrong']} | {a['first_wrong']} | {'ok' if a['ok'] else 'FAIL'} |"
            + (f" {a['ms']:.3f} |" if "ms" in a else " |") for a in cases]
    return ["| selection case (ties across chunks, an all -inf row) | rows wrong | first wrong [row, got, want] | ok "
            "| hook ms (median of 5, copies included) |", "| --- | --- | --- | --- | ---: |", *rows, ""]


def _step_ab_table(b: dict) -> list[str]:
    """--ab at step level: decode, verify-width step times and prefill tok/s under each setting,
    beside the default."""
    if not b.get("ab"):
        return []
    ms = lambda row: f"{row['ms']:.2f}" if isinstance(row, dict) else "-"  # noqa: E731
    tok_s = lambda row: f"{row['tok_s']:.0f}" if isinstance(row, dict) else "-"  # noqa: E731
    lines = ["", "| setting | decode ms/token | " + " | ".join(f"verify {w} ms" for w in VERIFY_WIDTHS) + " | "
             + " | ".join(f"prefill {n} tok/s" for n in PREFILL_LENGTHS) + " |",
             "| --- | ---: |" + " ---: |" * (len(VERIFY_WIDTHS) + len(PREFILL_LENGTHS))]
    runs = {"default": {"decode": b.get("decode"), "verify": b.get("verify") or {}, "prefill": b.get("prefill") or {}},
            **b["ab"]}
    for label, r in runs.items():
        if not isinstance(r, dict):
            lines.append(f"| {label} | {r} |" + " |" * (len(VERIFY_WIDTHS) + len(PREFILL_LENGTHS)))
            continue
        decode = f"{r['decode']['ms_per_token']:.2f}" if r.get("decode") else "-"
        prefill = r.get("prefill") or {}
        lines.append(f"| {label} | {decode} | " + " | ".join(ms(r["verify"].get(str(w))) for w in VERIFY_WIDTHS)
                     + " | " + " | ".join(tok_s(prefill.get(str(n))) for n in PREFILL_LENGTHS) + " |")
    return lines


def _reference_spec_table(rows: list[dict]) -> list[str]:
    """One line per (drafter, block, verify), each device's speculative and plain tok/s side by side."""
    if not rows:
        return []
    lines = ["", f"## Bench: reference pair, speculative vs plain, {REF_SPEC_TOKENS} tokens after each of "
                 f"{REF_SPEC_PROMPTS} held-out code prompts", ""]
    lines += [f"- {r.get('device', '')} {r.get('draft', '')}: {r.get('error') or r.get('skipped')}"
              for r in rows if "error" in r or "skipped" in r]
    measured = [r for r in rows if "tok_s" in r]
    devices = list(dict.fromkeys(r["device"] for r in measured))
    if not measured:
        return lines
    lines += ["| drafter | block | verify | tau | " + " | ".join(f"{d} spec tok/s | {d} plain tok/s | {d} speedup"
                                                           for d in devices) + " |",
              "| --- | ---: | --- | ---: |" + " ---: | ---: | ---: |" * len(devices)]
    by_key: dict = {}
    for r in measured:
        by_key.setdefault((r["draft"], r["block"], r["verify"]), {})[r["device"]] = r
    for (draft, block, verify), per in by_key.items():
        taus = " / ".join(dict.fromkeys(f"{r['tau']:.2f}" for r in per.values()))
        cells = [f"{per[d]['tok_s']:.0f} | {per[d]['plain_tok_s']:.0f} | {per[d]['speedup']:.2f}x" if d in per
                 else "- | - | -" for d in devices]
        lines.append(f"| {draft} | {block} | {verify} | {taus} | " + " | ".join(cells) + " |")
    return lines


def write_report(out: Path, report: dict) -> None:
    """gpu_report.json (everything measured) and gpu_report.md (its tables), one section per stage."""
    (out / "gpu_report.json").write_text(json.dumps(report, indent=2, default=str))
    lines = (_check_lines(report) + _drafter_check_lines(report.get("drafters")) + _kernel_bench_lines(report.get("kernels"))
             + _bench_lines(report.get("bench")) + _drafter_bench_lines(report.get("drafter_bench"))
             + _reference_spec_table(report.get("reference_spec", [])))
    lines.append(f"\nRESULT: {'PASS' if report['ok'] else 'FAIL'} ({report['seconds']:.0f} s)")
    text = "\n".join(lines) + "\n"
    (out / "gpu_report.md").write_text(text)
    print(text)


def _check_lines(report: dict) -> list[str]:
    """The header, then the checks: kernels against their oracles, models against the CPU, graphs."""
    lines = [f"# luce GPU check — {report['date']}", "",
             f"- device: {report.get('device', '?')}; host {report['host']}",
             f"- build: {json.dumps(report.get('build'))}",
             f"- tolerances: float {FLOAT_TOL:g}, quantized {QUANT_TOL:g} with exact kernels, {FAST_TOL:g} with "
             f"fast (int8-activation) kernels (max |gpu-cpu| / max |cpu|); GPU prefill vs GPU decode "
             f"{SELF_TOL:g} (exact) / the model's tolerance (fast); margin factor {MARGIN_FACTOR:g}", "",
             "| weight type | rows x cols | exact: rel err vs gguf.quants x fp32 | fast: rel err vs int8-activation "
             "oracle [width, token, row of worst] | tensor-core (LUCE_GPU_MATMUL=frag; staged): same | widths where row != 1-token row | "
             "widths where dp4a != tensor-core bits | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |",
             *[(f"| {m['type']} | error: {m['error']} | | | | | | FAIL |" if "error" in m else
                f"| {m['type']} | {m['rows']} x {m['cols']} | {m['rel_err']:.2e} | {m['rel_err_fast']:.2e} "
                f"{m['worst_fast']} | {_mma_cell(m)} | "
                f"{m['invariance_broken_at'] or 'none'} | {m.get('kernels_differ_at') or 'none'} | "
                f"{'ok' if m['ok'] else 'FAIL'} |")
               for m in report.get("matmul", [])],
             f"(matmul tolerance {MATMUL_TOL:g} of max |x| @ |W|^T; widths {', '.join(map(str, MATMUL_WIDTHS))}; "
             f"invariance over {INVARIANCE_TOKENS} tokens)",
             *[f"- the same checks under {label}: " + ("ok, all {} cases".format(len(rows)) if all(m["ok"] for m in rows)
               else "FAIL: " + ", ".join(f"{m['type']} {m.get('rows', '')}x{m.get('cols', '')}" for m in rows if not m["ok"]))
               for label, rows in report.get("matmul_ab", {}).items()],
             "",
             *_case_table(f"| attention case | max abs | rel err vs float64 (tol {ATTN_TOL:g}) | "
                          "first bad [t, h, d] | ok |", report.get("attention", [])),
             *_select_table(report.get("select", [])),
             *_case_table(f"| DeltaNet case | max abs | rel err vs float64 (tol {DELTA_TOL:g}) | first bad | ok |",
                          report.get("deltanet", [])),
             "| model | rel diff vs CPU | 512-token chunk vs CPU | tol | prefill vs decode (GPU) | greedy: margin-checked identical | near-tie identical | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in report["checks"]:
        if "error" in c:
            lines.append(f"| {c['model']} | error: {c['error']} | | | | | | FAIL |")
            continue
        long_diff = "—" if c["long_rel_diff"] is None else f"{c['long_rel_diff']:.2e}"
        lines.append(f"| {c['model']} | {c['rel_diff']:.2e} | {long_diff} | {c['tolerance']:g} | {c['self_rel_diff']:.2e} | "
                     f"{c['checked_identical']}/{c['prompts_checked']} | "
                     f"{c['near_tie_identical']}/{c['prompts'] - c['prompts_checked']} | "
                     f"{'ok' if c['ok'] else 'FAIL'} |")
    g = report.get("graphs")
    if g:
        lines.append(f"\n- step graphs (default) vs eager (LUCE_GPU_GRAPHS=0) vs eager without programmatic "
                     f"dependent launch (LUCE_GPU_PDL=0) vs eager with the attention prologue unfused "
                     f"(LUCE_GPU_FUSED_ATTN=0) vs graphs with the DeltaNet state loaded late "
                     f"(LUCE_GPU_DELTANET_EARLY=0), {g.get('model')}: " + (
            f"error: {g['error']}" if "error" in g else
            f"logits of prefill + {g['steps']} one-token steps bitwise identical: {g['identical_logits']} "
            f"(max abs diff {g['max_abs']:.2e}, first diff {g['first_diff']}"
            f"{', differing: ' + ', '.join(g['differing']) if g.get('differing') else ''}); greedy tokens identical: "
            f"{g['identical_tokens']} -> {'ok' if g['ok'] else 'FAIL'}"))
    lines += [""] if report.get("sampling") else []
    for r in report.get("sampling", []):
        lines.append(f"- seeded sampling vs the numpy sampler, {r['case']}: " + (
            f"error: {r['error']}" if "error" in r else
            f"{r['tokens']} tokens, first difference {r['first_diff']} -> {'ok' if r['ok'] else 'FAIL'}"))
    lines += [""] if report.get("rejection") else []
    for r in report.get("rejection", []):
        lines.append(f"- rejection sampling, reference pair, {r['case']}: " + (
            f"error: {r['error']}" if "error" in r else
            f"{r['draws']} draws of (t0, t1) over {r['cells']} cells, chi-square p = {r['pvalue']:.3g}, "
            f"{r['accepted']} drafts accepted / {r['rejected']} rejected, {r['outside']} pairs outside p's "
            f"support -> {'ok' if r['ok'] else 'FAIL'}"))
    if "memcheck" in report:
        lines.append(f"\n- compute-sanitizer memcheck (synthetic tiny iq4_xs + matmul hook): {report['memcheck']['status']}")
    for n in report.get("notes", []):
        lines.append(f"\nNOTE: {n}")
    return lines


def _drafter_check_lines(drafters: list[dict] | None) -> list[str]:
    """The reference drafters on the GPU against the CPU and against plain decoding."""
    if not drafters:
        return []
    lines = ["", "| drafter | hidden rel diff (tol {:g}) | chain GPU == CPU | conf diff | spec == plain (GPU) "
              "| spec GPU == CPU | DDTree | tau GPU / CPU | ok |".format(DRAFT_TOL),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in drafters:
        if "error" in r or "skipped" in r:
            lines.append(f"| {r['kind']} | " + (f"error: {r['error']} | | | | | | | FAIL |" if "error" in r
                                               else f"skipped: {r['skipped']} | | | | | | | - |"))
            continue
        g = r["generate"]
        col = lambda k: ", ".join(x[k] if len(x[k]) < 60 else x[k][:57] + "..." for x in g)  # noqa: E731
        taus = ", ".join(f"{x['tau']:.2f} / {x['tau_cpu']:.2f}" for x in g)
        lines.append(f"| {r['kind']} | {r['hidden_rel_diff']:.2e} | {r['chain_identical']} | "
                     f"{r['confidence_diff']:.1e} | {col('lossless')} | {col('gpu_vs_cpu')} | {col('ddtree')} | "
                     f"{taus} | "
                     f"{'ok' if r['ok'] else 'FAIL'} |")
    return lines


def _kernel_bench_lines(ks: list[dict] | None) -> list[str]:
    """The matmul kernel bench: each shape and width under each kernel."""
    if not ks:
        return []
    ab = list(next((k["ab"] for k in ks if "ab" in k), {}))
    lines = ["", f"## Matmul kernels: device time per call, {KERNEL_REPS} calls (activations quantized once)", "",
             "| type | rows x cols | T | default: us (GB/s of weights) | x T=1 | dp4a forced | fragment tensor-core "
             "forced | staged tensor-core forced | prefill GEMM forced |" + "".join(f" default, {a} |" for a in ab),
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(ab)]
    for k in ks:
        if "error" in k:
            lines.append(f"| error: {k['error']} | | | | | | | | |")
            continue
        cell = lambda r: f"{r['us']:.1f} ({r['GBps']:.0f})"  # noqa: E731
        lines.append(f"| {k['type']} | {k['rows']} x {k['cols']} | {k['T']} | {cell(k['auto'])} | "
                     f"{k['x_width1']:.2f} | {cell(k['dp4a'])} | {cell(k['frag'])} | {cell(k['staged'])} | "
                     f"{cell(k['gemm'])} |" + "".join(f" {cell(k['ab'][a])} |" for a in ab))
    return lines


def _bench_lines(b: dict | None) -> list[str]:
    """The synthetic target: decode against the floor, prefill, verify widths, the A/B settings."""
    if not b:
        return []
    lines = ["", f"## Bench: synthetic {b['shape']} {b['mix']} ({b.get('file_gib')} GiB)", ""]
    if "error" in b:
        lines.append(f"error: {b['error']}")
    bw = b.get("copy_bandwidth_Bps")
    lines.append(f"- load {b.get('load_seconds')} s; weights read per decode token "
                 f"{b['bytes_per_token'] / 2**30:.2f} GiB; copy bandwidth "
                 f"{(bw or 0) / 1e12:.2f} TB/s (read+write); floor {b.get('floor_ms', float('nan')):.2f} ms/token")
    d = b.get("decode")
    if d:
        lines.append(f"- decode (step graphs): {d['tok_s']:.1f} tok/s, {d['ms_per_token']:.2f} ms/token"
                     + (f", {100 * d['fraction_of_floor']:.0f}% of the floor" if "fraction_of_floor" in d else ""))
    for label, ds in (b.get("decode_sampled") or {}).items():
        lines.append(f"- decode sampled ({label}): {ds['tok_s']:.1f} tok/s, {ds['ms_per_token']:.2f} ms/token")
    for key, what in (("decode_eager", "without step graphs (LUCE_GPU_GRAPHS=0)"),
                      ("decode_no_pdl", "without programmatic dependent launch (LUCE_GPU_PDL=0)")):
        dg = b.get(key)
        if dg:
            lines.append(f"- decode {what}: " + (
                f"{dg['tok_s']:.1f} tok/s, {dg['ms_per_token']:.2f} ms/token" if isinstance(dg, dict) else dg))
    for n, p in (b.get("prefill") or {}).items():
        lines.append(f"- prefill {n}: " + (f"{p['tok_s']:.0f} tok/s ({p['seconds']:.3f} s, the fastest of "
                                           f"{', '.join(f'{r:.3f}' for r in p['runs_seconds'])} s)"
                                           if isinstance(p, dict) else p))
    if b.get("verify"):
        lines += ["", "| verify width | ms/step (incl. w logits rows downloaded) | x width 1 | "
                  "ms/step (last row's logits only) |", "| --- | --- | --- | --- |"]
        for w, row in b["verify"].items():
            lines.append(f"| {w} | " + (f"{row['ms']:.2f} | {row.get('x_width1', float('nan')):.2f} | "
                                        f"{row.get('ms_last_row_logits', float('nan')):.2f} |"
                                        if isinstance(row, dict) else f"{row} | | |"))
    lines += _step_ab_table(b)
    if b.get("profile"):
        lines.append(f"\n- per-op profile of decode, verify-16 and prefill-512 steps: {Path(b['profile']).name}")
    if b.get("memory"):
        m = b["memory"]
        lines.append(f"\n- luce's peak memory (decode, then prefill up to 2048 tokens; ctx {BENCH_CTX}): "
                     f"{m['peak']} MiB, of which weights {m['weights']} MiB")
    lines.append(f"- device memory in use after the bench (nvidia-smi, context included): "
                 f"{b.get('device_memory_used_mib')} MiB")
    return lines


def _drafter_bench_lines(db: dict | None) -> list[str]:
    """The synthetic DFlash 2 pair: whole speculative steps against a plain step, verify inside the loop."""
    if not db:
        return []
    lines = ["", f"## Bench: DFlash 2 step, synthetic {db.get('shape')} pair, block {db.get('block')}", ""]
    if "error" in db or "skipped" in db:
        lines.append(f"- {db.get('error') or db.get('skipped')}")
    else:
        lines.append(f"- drafter {db['drafter_mib']} MiB; plain step {db['plain_ms']:.2f} ms")
        if db.get("memory"):
            lines.append(f"- luce's peak memory, target and drafter (ctx 1024): {db['memory']['peak']} MiB")
        for name in ("zero_accept", "full_accept", "ddtree_oracle"):
            r = db.get(name)
            if r is None:
                continue
            lines.append(f"- {name}: " + (r if isinstance(r, str) else
                         f"step {r['step_ms']:.2f} ms = {r['x_plain']:.2f}x plain (draft {r['draft_ms']:.2f}, "
                         f"verify {r['verify_ms']:.2f}, rollback {r['rollback_ms']:.2f} ms; "
                         f"{r['spec_steps']} steps, tau {r['tau']:.2f})"))
        for width, r in (db.get("loop_verify") or {}).items():
            lines.append(f"- verify step of {width} rows inside the speculative loop (history written, argmax "
                         "on the device; full-width steps of two zero-acceptance runs): " +
                         (r if isinstance(r, str) else
                          f"{r['verify_ms']:.2f} ms = {r['x_plain']:.2f}x the plain step ({r['steps']} steps)"))
        if db.get("profile"):
            lines.append(f"- per-op profile of the zero-acceptance run: {Path(db['profile']).name}")
    return lines
