"""Drafting with the target's own MTP block (`draft="mtp"`, `luce generate --draft mtp`) on the CPU
backend: greedy output equals plain greedy decoding token for token at every draft count k and
prompt length, with drafts accepted and rejected; sampled output follows the target's own
distribution (chi-square, fixtures/rejection_check.py); a target without an MTP block is refused
in one line naming the file.

Two seeded fixtures (fixtures/random_qwen35_gguf.py): "random", a sane random MTP block whose
drafts are rarely right (rollback after 0 accepted), and "copy", a nearly-bigram target whose MTP
block computes roughly what the target does, so over half the drafts are accepted and the rest not.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fixtures.rejection_check import chi_square_pvalue, draw_pairs, expected_pairs
from fixtures.random_qwen35_gguf import write_random_qwen35
from luce import Engine, LuceError
from luce.cli.main import cli

PROMPTS = {
    "one": [7],
    "short": [1, 2, 3, 4, 5, 6, 7],
    "long": [int(t) for t in np.random.default_rng(5).integers(0, 500, 600)],  # prefill chunks of 512 and 88
}
N_TOKENS = 40


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {"random": write_random_qwen35(d / "random.gguf", seed=11, mtp=True, mtp_values="random"),
            "copy": write_random_qwen35(d / "copy.gguf", seed=12, mtp=True, mtp_values="copy"),
            "none": write_random_qwen35(d / "none.gguf", seed=13)}


@pytest.fixture(scope="module")
def plain(targets):
    """Greedy references from each target alone: (target, prompt) -> tokens."""
    out = {}
    for name in ("random", "copy"):
        with Engine(targets[name], threads=1) as eng:
            for prompt, ids in PROMPTS.items():
                out[name, prompt] = eng.generate(prompt_ids=ids, max_tokens=N_TOKENS, ignore_eos=True).tokens
    return out


@pytest.mark.parametrize("target", ["random", "copy"])
def test_mtp_greedy_equals_plain_at_every_draft_count(targets, plain, target):
    accepted = {}
    with Engine(targets[target], threads=1, draft="mtp") as eng:
        assert eng.draft_info.kind == "MTP" and eng.draft_info.sample_from_anchor
        for k in (1, 2, 3, 4):
            for prompt, ids in PROMPTS.items():
                g = eng.generate(prompt_ids=ids, max_tokens=N_TOKENS, ignore_eos=True, draft_block_size=k,
                                 adaptive=False)
                assert g.tokens == plain[target, prompt], (k, prompt)
                s = g.stats
                assert s["spec_steps"] > 0 and s["block_size"] == k
                # Each spec step commits its accepted drafts plus one bonus token.
                assert s["n_accepted"] + s["spec_steps"] + s["plain_steps"] + 1 == N_TOKENS
                accepted[k, prompt] = (s["n_accepted"], s["n_drafted"], s["full_accept_steps"],
                                       s["zero_accept_steps"])
    if target == "copy":  # the copying block is often right: long accepted runs and rejections
        assert sum(a[0] for a in accepted.values()) > sum(a[1] for a in accepted.values()) // 3, accepted
        assert any(zero > 0 for *_, zero in accepted.values())
        assert any(full > 0 and n_acc < n_drafted for n_acc, n_drafted, full, _ in accepted.values())


def test_mtp_auto_width_and_stats(targets, plain):
    """The cost policy (auto: 2..4 drafts a step, plain steps when drafting does not pay) is
    lossless too; without it, auto is the horizon, 4. Both report tau and the acceptance of each
    draft position as the block drafters do."""
    with Engine(targets["copy"], threads=1, draft="mtp") as eng:
        auto = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=N_TOKENS, ignore_eos=True)
        fixed = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=N_TOKENS, ignore_eos=True, adaptive=False)
    assert auto.tokens == fixed.tokens == plain["copy", "short"]
    assert auto.stats["block_auto"] and 2 <= auto.stats["block_size"] <= 4
    s = fixed.stats
    assert s["block_size"] == 4 and s["tau"] > 1.5 and len(s["position_acceptance"]) == 4
    assert 0 < s["position_acceptance"][0] <= 1


def test_mtp_oracle_proposals_roll_back_mid_run(targets, plain):
    """Proposals replaced by the plain continuation, corrupted every 5th token: full accepts and
    stops at every draft slot, each followed by a rewrite of the MTP cache past the accepted prefix."""
    ref = plain["random", "short"]
    oracle = [(t + 1) % 500 if i % 5 == 3 else t for i, t in enumerate(ref)]
    with Engine(targets["random"], threads=1, draft="mtp") as eng:
        g = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=N_TOKENS, ignore_eos=True, adaptive=False,
                         draft_block_size=4, oracle_tokens=oracle)
    assert g.tokens == ref
    s = g.stats
    assert s["full_accept_steps"] > 0 and s["spec_steps"] - s["full_accept_steps"] > 0, s


TOP_K3 = (1.0, 3, 1.0)   # temperature, top-k, top-p
NUCLEUS = (0.35, 0, 0.5)


@pytest.mark.parametrize("target", ["random", "copy"])
@pytest.mark.parametrize("setting", [TOP_K3, NUCLEUS], ids=["top_k=3", "top_p=0.5"])
def test_mtp_sampled_tokens_follow_the_target_distribution(targets, target, setting):
    prompt, draws = PROMPTS["short"], 2000
    with Engine(targets[target], threads=1, draft="mtp") as eng:
        counts, accepted, rejected = draw_pairs(eng, prompt, setting, draws, draft_block_size=2)
        expected = expected_pairs(eng, prompt, setting, draws)
    assert set(counts) <= set(expected), set(counts) - set(expected)
    pvalue, cells = chi_square_pvalue(counts, expected)
    assert pvalue > 1e-3, (pvalue, cells)
    assert rejected > 0
    if target == "copy":  # the acceptance branch runs many times too
        assert accepted > draws // 5, (accepted, rejected)


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}], ids=["top_k=1", "top_p=1e-6"])
def test_one_token_truncation_makes_sampled_mtp_drafting_greedy(targets, truncation):
    """Drafts come from the run's own sampler over the MTP logits: truncated to one token, q is
    one-hot on the block's argmax and p on the target's, so a sampled run is the greedy run, the
    same tokens and the same accepted drafts."""
    with Engine(targets["copy"], threads=1, draft="mtp") as eng:
        greedy = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=24, ignore_eos=True, adaptive=False,
                              draft_block_size=3)
        for seed in range(3):
            g = eng.generate(prompt_ids=PROMPTS["short"], max_tokens=24, ignore_eos=True, adaptive=False,
                             draft_block_size=3, temperature=1.0, seed=seed, **truncation)
            assert g.tokens == greedy.tokens, seed
            assert (g.stats["n_drafted"], g.stats["n_accepted"]) == \
                (greedy.stats["n_drafted"], greedy.stats["n_accepted"]), seed
    assert greedy.stats["n_accepted"] > 0


def test_target_without_mtp_block_is_refused_naming_the_file(targets):
    with pytest.raises(LuceError) as e:
        Engine(targets["none"], threads=1, draft="mtp")
    message = str(e.value)
    assert "\n" not in message and str(targets["none"]) in message and "MTP" in message


def test_mtp_refusals(targets):
    with Engine(targets["random"], threads=1, draft="mtp") as eng:
        with pytest.raises(LuceError, match=r"\[1, 8\]"):
            eng.generate(prompt_ids=[1, 2], max_tokens=4, draft_block_size=9, adaptive=False)
        with pytest.raises(LuceError, match="DDTree"):
            eng.generate(prompt_ids=[1, 2], max_tokens=4, ddtree=True)


def test_cli_draft_mtp(targets, plain):
    runner = CliRunner()
    ids = ",".join(map(str, PROMPTS["short"]))
    ok = runner.invoke(cli, ["generate", "-m", str(targets["copy"]), "--prompt-ids", ids, "-n", str(N_TOKENS),
                             "--ignore-eos", "--draft", "mtp", "--draft-block-size", "3", "--no-adaptive",
                             "-t", "1", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"tau"' in ok.output
    bad = runner.invoke(cli, ["generate", "-m", str(targets["none"]), "--prompt-ids", ids, "-n", "4",
                              "--draft", "mtp", "-t", "1"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert str(targets["none"]) in bad.output and "MTP" in bad.output


# ---- the drafts against an independent MTP ------------------------------------------------------

def _numpy_mtp(path):
    """The MTP block of `path` in numpy, from the file's tensors (gguf's reader), written from
    spec qwen35.md §1.7 and llama.cpp's graph_mtp: rows (token t_r, hidden input h_r) at positions
    0.. -> each row's normed output and its argmax token, attending causally over the rows."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    kv = {f.name: f for f in r.fields.values()}
    scalar = lambda key: kv[f"qwen35.{key}"].contents()  # noqa: E731
    n_main, eps = int(scalar("block_count")) - 1, float(scalar("attention.layer_norm_rms_epsilon"))
    n_rot, theta, D = int(scalar("rope.dimension_count")), float(scalar("rope.freq_base")), int(scalar("attention.key_length"))
    t = {x.name: np.asarray(x.data, np.float64) for x in r.tensors}
    blk = lambda name: t[f"blk.{n_main}.{name}"]  # noqa: E731
    H, Hkv = blk("attn_q.weight").shape[0] // (2 * D), blk("attn_k.weight").shape[0] // D
    embed, head = t["token_embd.weight"], t["output.weight"]

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x, pos):  # [L][heads][D], NeoX pairs (i, i + n_rot/2) on the first n_rot dims
        half = n_rot // 2
        ang = pos[:, None] * theta ** (-2.0 * np.arange(half) / n_rot)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half], x[..., half:n_rot] = a * cos - b * sin, b * cos + a * sin
        return x

    def rows(tokens, hidden):
        L = len(tokens)
        x = np.concatenate([norm(embed[tokens], blk("nextn.enorm.weight")),
                            norm(hidden, blk("nextn.hnorm.weight"))], -1) @ blk("nextn.eh_proj.weight").T
        a = norm(x, blk("attn_norm.weight"))
        qg = (a @ blk("attn_q.weight").T).reshape(L, H, 2 * D)
        q, gate = norm(qg[..., :D], blk("attn_q_norm.weight")), qg[..., D:]
        k = norm((a @ blk("attn_k.weight").T).reshape(L, Hkv, D), blk("attn_k_norm.weight"))
        v = (a @ blk("attn_v.weight").T).reshape(L, Hkv, D)
        pos = np.arange(L, dtype=np.float64)
        q, k = rope(q, pos), rope(k, pos)
        k, v = np.repeat(k, H // Hkv, 1), np.repeat(v, H // Hkv, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + np.triu(np.full((L, L), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), v) / (1 + np.exp(-gate))
        x = x + o.reshape(L, H * D) @ blk("attn_output.weight").T
        f = norm(x, blk("post_attention_norm.weight"))
        g = f @ blk("ffn_gate.weight").T
        x = x + (g / (1 + np.exp(-g)) * (f @ blk("ffn_up.weight").T)) @ blk("ffn_down.weight").T
        out = norm(x, blk("nextn.shared_head_norm.weight"))
        return out, (out @ head.T).argmax(-1)

    return rows


def _simulated_steps(rows, sequence, hidden, n_prompt, n_tokens, k):
    """luce's greedy loop with k drafts and no adaptive policy, over the known committed sequence
    (plain greedy = what spec commits): each step's (accepted, drafted). Drafts recurse: row p = (anchor,
    h_{p-1}), row p+i = (d_i, o of row p+i-1); committed rows pair t_q with h_{q-1} (zeros at 0)."""
    E = hidden.shape[1]
    h_prev = np.vstack([np.zeros((1, E)), hidden[:-1]])
    steps, p, generated = [], n_prompt, 1
    while generated < n_tokens:
        q = min(k, n_tokens - generated - 1)
        if q <= 0:
            break
        toks, hin, drafts = list(sequence[:p + 1]), h_prev[:p + 1], []
        for _ in range(q):
            out, ids = rows(np.array(toks), hin)
            drafts.append(int(ids[-1]))
            toks.append(drafts[-1])
            hin = np.vstack([hin, out[-1:]])
        n = 0
        while n < q and drafts[n] == sequence[p + 1 + n]:
            n += 1
        steps.append((n, q))
        p, generated = p + n + 1, generated + n + 1
    return steps


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_drafts_match_an_independent_mtp_on_transformers_hidden_states(targets, plain, k):
    """The target's final-normed hidden states from transformers reading the same file (which
    ignores the MTP block), the MTP block in numpy, luce's loop simulated: the accepted count of
    every step, summed as luce's stats sum them, must come out the same (the "copy" target accepts
    over half the drafts, so this follows the drafts themselves, not just the rejections)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    path = targets["copy"]
    prompt = PROMPTS["short"]
    sequence = prompt + plain["copy", "short"]
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model.model(torch.tensor([sequence])).last_hidden_state[0].double().numpy()
    steps = _simulated_steps(_numpy_mtp(path), sequence, hidden, len(prompt), N_TOKENS, k)
    with Engine(path, threads=1, draft="mtp") as eng:
        s = eng.generate(prompt_ids=prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_block_size=k,
                         adaptive=False).stats
    accepted = [n for n, _ in steps]
    assert sum(accepted) > sum(q for _, q in steps) // 3, steps  # often accepted: the drafts are compared
    assert (s["spec_steps"], s["n_accepted"], s["full_accept_steps"], s["zero_accept_steps"], s["max_accepted"]) == \
        (len(steps), sum(accepted), sum(n == q for n, q in steps), accepted.count(0), max(accepted)), steps


# ---- the GPU backend, emulated (docs/gpu.md "The emulated GPU") -----------------------------------

_EMU_SCRIPT = r"""
import json, sys
from luce import Engine
path, prompt, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
with Engine(path, device="gpu", threads=1, draft="mtp") as eng:
    out["plain"] = eng.generate(prompt_ids=prompt, max_tokens=n, ignore_eos=True, speculative=False).tokens
    for k in (1, 3):
        g = eng.generate(prompt_ids=prompt, max_tokens=n, ignore_eos=True, draft_block_size=k, adaptive=False)
        out[k] = [g.tokens, g.stats["n_accepted"]]
print(json.dumps(out))
"""


def test_mtp_on_the_emulated_cuda_backend_is_plain_decoding(targets, plain):
    """The MTP drafter runs on Backend ops only: on the CUDA path run by the CPU, speculative ==
    plain on the device, == the CPU backend's tokens, and the drafts are accepted as on the CPU."""
    library = Path(__file__).resolve().parents[1] / "build" / "gpu-emu-cuda" / "libluce_gpu_emu.so"
    if not library.exists():
        pytest.fail(f"{library} is missing: `make gpu-emu-cuda` builds it (`make test` does)")
    prompt, n = PROMPTS["short"], 16
    proc = subprocess.run([sys.executable, "-c", _EMU_SCRIPT, str(targets["copy"]), json.dumps(prompt), str(n)],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "LUCE_GPU_LIBRARY": str(library)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plain"] == plain["copy", "short"][:n]
    with Engine(targets["copy"], threads=1, draft="mtp") as eng:
        for k in (1, 3):
            cpu = eng.generate(prompt_ids=prompt, max_tokens=n, ignore_eos=True, draft_block_size=k, adaptive=False)
            tokens, n_accepted = out[str(k)]
            assert tokens == out["plain"], k
            assert n_accepted == cpu.stats["n_accepted"] > 0, k


def test_bench_draft_mtp(targets):
    """`luce bench --draft mtp` sweeps k beside the plain row."""
    out = CliRunner().invoke(cli, ["bench", "-m", str(targets["copy"]), "--draft", "mtp", "-p", "8", "-n", "16",
                                   "-t", "1", "-r", "1", "--no-warmup", "--draft-block-size", "1,3"])
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| ") and "tg16" in line]
    assert [r.split("|")[7].strip() for r in rows] == ["none", "mtp", "mtp"], rows


# ---- llama.cpp's draft-mtp on the same file --------------------------------------------------------

LLAMA_BIN = Path(__file__).resolve().parents[1] / "build" / "peer-cpu" / "bin"
LLAMA_PROMPT, LLAMA_N = "hello world the", 24
_LAST_LINE = b"total time ="  # llama.cpp's logger may exit before its last lines (test_llamacpp_runtime.py)


@pytest.fixture(scope="module")
def converted_copy_target(tmp_path_factory):
    """The tiny Qwen3.5 with an MTP block, converted by luce (a real tokenizer, so llama.cpp can run
    it), with the "copy" construction applied to its tensors (fixtures/random_qwen35_gguf.py,
    here at leak 0.1: this checkpoint's residual branches are larger than the fixture's)."""
    from gguf import GGUFReader

    from fixtures.gguf_edit import rewrite
    from fixtures.random_qwen35_gguf import copy_values
    from fixtures.tiny_qwen35 import tiny_qwen35

    src = tiny_qwen35(tmp_path_factory, "mtp", "f32").gguf_path
    reader = GGUFReader(src)
    hidden = int(reader.fields["qwen35.embedding_length"].contents())
    edited = {}
    for t in reader.tensors:
        values = np.array(t.data, np.float32)
        changed = copy_values(t.name, values.reshape(-1), hidden, leak=0.1).reshape(values.shape)
        if not np.array_equal(changed, values):
            edited[t.name] = changed
    out = tmp_path_factory.mktemp("llama-mtp") / "copy-mtp.gguf"
    rewrite(src, out, tensors=edited)
    return out


def _llamacpp_drafts(path, k: int) -> list[list[int]]:
    """llama-speculative-simple --spec-type draft-mtp at verbosity -v: each step's drafts, from its
    debug lines `draft candidate 0, pos i: <id>` (candidate 0 is the draft; pos 0 starts a step)."""
    import re

    tool = LLAMA_BIN / "llama-speculative-simple"
    if not tool.is_file():
        pytest.fail(f"{tool} is missing: run `make peer-cpu` (a CPU llama.cpp from build/peer/llama.cpp)")
    for _ in range(6):
        done = subprocess.run([str(tool), "-m", str(path), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
                               "-p", LLAMA_PROMPT, "-n", str(LLAMA_N), "-t", "1", "--temp", "0", "-c", "256", "-v"],
                              capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        if _LAST_LINE in done.stderr:
            break
    log = done.stderr.decode(errors="replace")
    steps: list[list[int]] = []
    for pos, token in re.findall(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)", log):
        if int(pos) == 0:
            steps.append([])
        steps[-1].append(int(token))
    return steps


def _drafts_by_anchor(steps: list[list[int]], sequence: list[int], first_anchor: int) -> dict[int, list[int]]:
    """Each greedy step's proposals keyed by its anchor's position: a step at anchor p commits its
    proposals up to the first that differs from the known greedy sequence, plus one token."""
    out, p = {}, first_anchor
    for drafts in steps:
        out[p] = drafts
        n = 0
        while n < len(drafts) and p + 1 + n < len(sequence) and drafts[n] == sequence[p + 1 + n]:
            n += 1
        p += n + 1
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_drafts_equal_llamacpp_draft_mtp_step_for_step(converted_copy_target, k):
    """luce's MTP proposals (the draft_log hook) against llama.cpp 0c1e570's draft-mtp proposals on
    the same file and prompt, greedy, step by step. llama-speculative-simple keeps the prompt's last
    token out of the prefill and makes it the first anchor, luce anchors at the first generated
    token, so the steps are matched by anchor position (both walk the same greedy sequence); luce
    proposes fewer near the end of its budget (q <= tokens left - 1), compared as prefixes. The
    "copy" block makes most proposals right, so the matched steps follow accepted runs."""
    theirs = _llamacpp_drafts(converted_copy_target, k)
    ours: list[list[int]] = []
    with Engine(converted_copy_target, threads=1, draft="mtp") as eng:
        prompt = eng.encode_prompt(LLAMA_PROMPT)
        sequence = prompt + eng.generate(LLAMA_PROMPT, max_tokens=LLAMA_N + 8, ignore_eos=True,
                                         speculative=False).tokens
        g = eng.generate(LLAMA_PROMPT, max_tokens=LLAMA_N, ignore_eos=True, draft_block_size=k, adaptive=False,
                         draft_log=ours)
    assert g.tokens == sequence[len(prompt):len(prompt) + LLAMA_N]
    assert g.stats["n_accepted"] > g.stats["n_drafted"] // 3, g.stats
    assert all(len(step) == k for step in theirs), theirs
    ours_at = _drafts_by_anchor(ours, sequence, len(prompt))
    theirs_at = _drafts_by_anchor(theirs, sequence, len(prompt) - 1)
    common = sorted(set(ours_at) & set(theirs_at))
    assert len(common) >= len(ours_at) // 2 and len(common) >= 4, (ours_at, theirs_at)
    for p in common:
        assert ours_at[p] == theirs_at[p][:len(ours_at[p])], (p, ours_at, theirs_at)


# ---- the reference pair: the committed target with its trained MTP block -----------------------

REPO = Path(__file__).resolve().parents[1]
REF = REPO / "models" / "reference"
REF_PROMPTS, REF_PROMPT_LEN, REF_TOKENS, REF_K = 8, 64, 48, 3


def _reference_mtp_gguf(tmp: Path, mtp_dir: Path) -> Path:
    """What `make reference-mtp` does: models/target_mtp.py joins the committed target (exported
    from its GGUF) with an MTP checkpoint, `luce convert --outtype q8_0` writes the GGUF."""
    sys.path.insert(0, str(REPO))  # models/ is a repo folder, not part of the wheel
    from luce.converters.convert import ConvertOptions, convert_checkpoint
    from models.target_mtp import join

    join(tmp / "target", mtp_dir)
    out = tmp / "target-mtp-q8_0.gguf"
    convert_checkpoint(tmp / "target", out, ConvertOptions(outtype="q8_0"))
    return out


def _random_mtp_checkpoint(out: Path) -> Path:
    """An untrained block of the same shapes, initialised as transformers initialises a Qwen3.5
    layer (normal(0, 0.02) matrices, zero = unit-scale norms), seeded: the floor a trained block
    must clear."""
    import torch
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(0)
    trained = load_file(str(REF / "mtp" / "model.safetensors"))
    state = {k: (torch.zeros(v.shape) if v.dim() == 1 else torch.randn(v.shape, generator=gen) * 0.02)
             .to(v.dtype) for k, v in trained.items()}
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def reference_pair(tmp_path_factory):
    trained = _reference_mtp_gguf(tmp_path_factory.mktemp("ref-mtp"), REF / "mtp")
    d = tmp_path_factory.mktemp("ref-mtp-random")
    random_block = _reference_mtp_gguf(d, _random_mtp_checkpoint(d / "mtp"))
    return {"trained": trained, "random": random_block}


def _held_out_code_prompts(eng) -> list[list[int]]:
    """HumanEval prompts (never in the MTP block's training data: it trained on the target's
    continuations of CPython and essay windows), their last 64 tokens, as the tau scoring of
    models/train_mtp.py cuts them."""
    rows = [json.loads(line)["prompt"] for line in (REF / "prompts" / "code.jsonl").read_text().splitlines()]
    ids = [eng.encode_prompt(t) for t in rows]
    return [x[-REF_PROMPT_LEN:] for x in ids if len(x) >= REF_PROMPT_LEN][:REF_PROMPTS]


def test_reference_mtp_gguf_keeps_the_target_bytes(reference_pair):
    """The converted pair is the committed target plus one nextn block: every main tensor has the
    committed file's type and bytes, the extra tensors are blk.8's, and the header says so."""
    from gguf import GGUFReader

    base, pair = GGUFReader(REF / "target-q8_0.gguf"), GGUFReader(reference_pair["trained"])
    main = {t.name: t for t in base.tensors}
    extra = [t for t in pair.tensors if t.name not in main]
    for t in pair.tensors:
        if t.name in main:
            assert t.tensor_type == main[t.name].tensor_type and \
                bytes(t.data.tobytes()) == bytes(main[t.name].data.tobytes()), t.name
    assert len(pair.tensors) - len(extra) == len(main)
    assert extra and all(t.name.startswith("blk.8.") for t in extra)
    assert {"blk.8.nextn.eh_proj.weight", "blk.8.nextn.enorm.weight", "blk.8.nextn.hnorm.weight",
            "blk.8.nextn.shared_head_norm.weight", "blk.8.attn_q.weight"} <= {t.name for t in extra}
    assert pair.fields["qwen35.block_count"].contents() == 9
    assert pair.fields["qwen35.nextn_predict_layers"].contents() == 1


def _mtp_run(path, prompts, plain_tokens):
    """Greedy MTP drafting on every prompt: asserts lossless, returns (accepted, drafted, steps)."""
    acc = drafted = steps = 0
    with Engine(path, threads=1, draft="mtp") as eng:
        for ids, want in zip(prompts, plain_tokens):
            g = eng.generate(prompt_ids=ids, max_tokens=REF_TOKENS, ignore_eos=True,
                             draft_block_size=REF_K, adaptive=False)
            assert g.tokens == want, ids[-8:]
            acc += g.stats["n_accepted"]
            drafted += g.stats["n_drafted"]
            steps += g.stats["spec_steps"]
    return acc, drafted, steps


def test_reference_mtp_is_lossless_and_predicts(reference_pair):
    """On held-out code prompts: MTP drafting with the trained block gives the committed target's
    plain greedy tokens, and its drafts are accepted far more often than an untrained block's
    (same shapes, same target, same prompts, measured in this test)."""
    with Engine(REF / "target-q8_0.gguf", threads=1) as eng:
        prompts = _held_out_code_prompts(eng)
        plain_tokens = [eng.generate(prompt_ids=ids, max_tokens=REF_TOKENS, ignore_eos=True).tokens
                        for ids in prompts]
    assert len(prompts) == REF_PROMPTS
    trained = _mtp_run(reference_pair["trained"], prompts, plain_tokens)
    untrained = _mtp_run(reference_pair["random"], prompts, plain_tokens)
    tau = {name: (a + s) / s for name, (a, _, s) in (("trained", trained), ("random", untrained))}
    rate = {name: a / d for name, (a, d, _) in (("trained", trained), ("random", untrained))}
    assert rate["random"] < 0.05, rate       # a random block's argmax is almost never the target's
    assert rate["trained"] > rate["random"] + 0.15, rate
    assert tau["trained"] > 1.4 and tau["trained"] > tau["random"] + 0.3, tau


@pytest.mark.slow
def test_train_mtp_is_seeded_and_writes_the_checkpoint_layout(tmp_path):
    """models/train_mtp.py at toy sizes, twice from scratch (continuations regenerated): with
    --steps the two runs write the same bytes, and the checkpoint holds exactly the mtp.* tensors
    the converter maps to blk.8.nextn.* (models/target_mtp.py then joins it like the committed one)."""
    sys.path.insert(0, str(REPO))
    from models import corpus as corpus_mod
    from models.gguf_to_hf import export

    corpus_mod.write(tmp_path / "corpus", None, limit=3)
    export(REF / "target-q8_0.gguf", tmp_path / "target")
    outs = []
    for run in (1, 2):
        for cached in tmp_path.glob("mtp-continuations-*.pt"):
            cached.unlink()
        out = tmp_path / f"mtp{run}"
        proc = subprocess.run([sys.executable, "-m", "models.train_mtp", "--target-dir", str(tmp_path / "target"),
                               "--corpus", str(tmp_path / "corpus"), "--steps", "3", "--sequences", "8",
                               "--eval-prompts", "2", "--device", "cpu", "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(out)
    a, b = ((o / "model.safetensors").read_bytes() for o in outs)
    assert a == b
    from safetensors import safe_open
    with safe_open(outs[0] / "model.safetensors", "np") as f:
        names = set(f.keys())
    with safe_open(REF / "mtp" / "model.safetensors", "np") as f:
        assert names == set(f.keys())
    report = json.loads((outs[0] / "report.json").read_text())
    assert report["train"]["steps"] == 3 and report["config"]["budget_s"] is None
