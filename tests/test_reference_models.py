"""The committed reference models (models/reference/, docs/models.md): a Qwen3.5 target trained on
real text and the three drafters trained on it, committed both as checkpoints and as the Q8_0
GGUFs `make reference-ggufs` converts them to.

Oracles and invariants: gguf's own GGUFReader reads the committed and the regenerated GGUFs
(tests/fixtures/gguf_compare.py); transformers' tokenizer, loaded from the target's
tokenizer.json, gives the reference token ids; speculative greedy == plain greedy. These drafters
actually predict, so losslessness is checked here through long accepted runs and full-block
acceptances on held-out code (test_speculative.py covers random and oracle drafters).

Nothing here depends on the drafters' current weights beyond "they predict": after a retrain,
`make reference-ggufs` regenerates the GGUFs and these tests pass unchanged.
"""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.gguf_compare import gguf_differences
from luce.cli.main import cli
from luce.engine import Engine
from luce.tokenizer import Tokenizer

REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference"
TARGET = REFERENCE / "target-q8_0.gguf"
DRAFTERS = ("dflash", "dflash2", "dspark")
CONVERT_OPTIONS = ("--outtype", "q8_0")   # the Makefile's reference-ggufs options


def committed_gguf(kind: str) -> Path:
    return REFERENCE / f"{kind}-q8_0.gguf"


def held_out(kind: str) -> list[str]:
    lines = (REFERENCE / "prompts" / f"{kind}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines]


def convert(kind: str, out: Path) -> Path:
    result = CliRunner().invoke(cli, ["convert", str(REFERENCE / kind), "-o", str(out), *CONVERT_OPTIONS])
    assert result.exit_code == 0, result.output
    return out


# -- the committed GGUFs are exactly what `luce convert` makes of the committed checkpoints --------

@pytest.mark.parametrize("kind", DRAFTERS)
def test_converting_the_checkpoint_reproduces_the_committed_gguf(kind, tmp_path):
    fresh = convert(kind, tmp_path / "a.gguf")
    differences = gguf_differences(fresh, committed_gguf(kind))
    assert not differences, (f"{committed_gguf(kind).name} is stale or the converter changed; "
                             "run `make reference-ggufs`:\n" + "\n".join(differences))
    again = convert(kind, tmp_path / "b.gguf")
    assert fresh.read_bytes() == again.read_bytes(), "two conversions gave different bytes"
    assert fresh.read_bytes() == committed_gguf(kind).read_bytes(), "same content, different bytes (layout/padding)"


@pytest.mark.parametrize("kind", DRAFTERS)
def test_committed_drafter_fits_the_reference_target(kind, luce_cmd):
    result = luce_cmd("inspect", committed_gguf(kind), "--target", TARGET, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["valid"], report["findings"]


# -- tokenizer ----------------------------------------------------------------------------------

def test_tokenizer_round_trips_every_held_out_prompt_with_the_oracles_ids():
    from transformers import AutoTokenizer

    oracle = AutoTokenizer.from_pretrained(str(REFERENCE / "target"))
    ours = Tokenizer.from_gguf(TARGET)
    checked = 0
    for kind in ("code", "prose", "mixed"):
        for i, text in enumerate(held_out(kind)):
            ids = ours.encode(text)
            assert ids == oracle.encode(text, add_special_tokens=False), f"{kind}.jsonl line {i + 1}"
            assert ours.decode(ids) == text, f"{kind}.jsonl line {i + 1}"
            checked += 1
    assert checked == 48 + 36 + 36


# -- losslessness with drafters that predict -----------------------------------------------------

PROMPTS = 4         # the first held-out code prompts; the target loops on most of them, so a
TOKENS = 128        # drafter that has learned anything accepts whole blocks there


def checkpoint_block(kind: str) -> int:
    """The block size the checkpoint declares (top-level, or in dflash_config for DFlash 2)."""
    cfg = json.loads((REFERENCE / kind / "config.json").read_text())
    return cfg.get("block_size") or cfg["dflash_config"]["block_size"]


def proposals_per_block(kind: str, block: int) -> int:
    """DFlash kinds fill slot 0 with the anchor (B-1 proposals); DSpark drafts all B slots
    (spec/drafters.md §3)."""
    return block if kind == "dspark" else block - 1


@pytest.fixture(scope="module")
def plain():
    with Engine(TARGET, threads=2) as eng:
        return [eng.generate(p, max_tokens=TOKENS, ignore_eos=True).tokens
                for p in held_out("code")[:PROMPTS]]


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("mode", ["chain", "chain-block4", "tree"])
def test_trained_drafter_is_lossless_with_full_block_acceptances(kind, mode, plain):
    block = 4 if mode == "chain-block4" else checkpoint_block(kind)
    q = proposals_per_block(kind, block)
    runs = []
    with Engine(TARGET, threads=2, draft=committed_gguf(kind)) as spec:
        for i, prompt in enumerate(held_out("code")[:PROMPTS]):
            g = spec.generate(prompt, max_tokens=TOKENS, ignore_eos=True, adaptive=False,
                              draft_block_size=4 if mode == "chain-block4" else 0, ddtree=mode == "tree")
            assert g.tokens == plain[i], f"prompt {i}: speculative output differs from plain greedy"
            s = g.stats
            assert s["block_size"] == block and s["spec_steps"] > 0
            assert s["max_accepted"] <= q and s["n_accepted"] <= s["n_drafted"]
            runs.append((s["max_accepted"], s["full_accept_steps"]))
    # The drafter still predicts: on at least two prompts some step accepted a whole block
    # (a run of q drafted tokens all equal to the target's greedy choice).
    full = [i for i, (longest, n_full) in enumerate(runs) if n_full > 0 and longest == q]
    assert len(full) >= 2, f"{kind} {mode}: (longest run, full-block steps) per prompt {runs}, q = {q}"


# -- bench over a held-out prompt set ---------------------------------------------------------------

def test_bench_runs_a_held_out_prompt_set_with_and_without_the_drafter(tmp_path):
    prompts = tmp_path / "code2.jsonl"
    prompts.write_text("\n".join((REFERENCE / "prompts" / "code.jsonl").read_text().splitlines()[:2]) + "\n")
    draft = committed_gguf("dflash2")
    args = ["bench", "-m", str(TARGET), "--draft", str(draft), "-n", "16", "-t", "2",
            "-r", "1", "--no-warmup", "--no-adaptive", "--draft-block-size", "4,8", "--prompts", str(prompts),
            "-o", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["draft"], r["block"]) for r in rows] == [("none", None), (draft.name, 4), (draft.name, 8)]
    assert all(r["tau"] >= 1.0 and 0.0 <= r["acceptance"] <= 1.0 for r in rows[1:])

    no_draft = CliRunner().invoke(cli, ["bench", "-m", str(TARGET), "--prompts", str(prompts)])
    assert no_draft.exit_code == 2 and "--draft" in no_draft.output
