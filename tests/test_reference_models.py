"""The committed reference models (models/reference/, docs/models.md): a Qwen3.5 target trained on
real text and the three drafters trained on it.

These are the drafters that actually predict, so the lossless invariant is checked here with real
acceptance (long accepted runs occur on held-out code), not only with random or oracle drafters.
"""
import json
from pathlib import Path

import pytest

from luce.engine import Engine

REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference"
TARGET = REFERENCE / "target-q8_0.gguf"
DRAFTERS = ("dflash", "dflash2", "dspark")


def held_out(kind: str) -> list[str]:
    lines = (REFERENCE / "prompts" / f"{kind}.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines]


@pytest.fixture(scope="module")
def drafter_ggufs(tmp_path_factory):
    """The committed drafter checkpoints converted exactly as a user would (f16, the default)."""
    from luce.cli.main import cli
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("reference-drafters")
    paths = {}
    for kind in DRAFTERS:
        paths[kind] = out / f"{kind}.gguf"
        result = CliRunner().invoke(cli, ["convert", str(REFERENCE / kind), "-o", str(paths[kind])])
        assert result.exit_code == 0, result.output
    return paths


@pytest.mark.parametrize("kind", DRAFTERS)
def test_converted_drafter_fits_the_reference_target(kind, drafter_ggufs, luce_cmd):
    result = luce_cmd("inspect", drafter_ggufs[kind], "--target", TARGET, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["valid"], report["findings"]


def test_tokenizer_round_trips_every_held_out_prompt():
    with Engine(TARGET, threads=2) as eng:
        for kind in ("code", "prose", "mixed"):
            for text in held_out(kind):
                assert eng.tokenizer.decode(eng.tokenizer.encode(text)) == text


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("block", [0, 4])
def test_trained_drafter_is_lossless_on_held_out_code(kind, block, drafter_ggufs):
    prompts = held_out("code")[:2]
    with Engine(TARGET, threads=2) as plain:
        expected = [plain.generate(p, max_tokens=96, ignore_eos=True).tokens for p in prompts]
    with Engine(TARGET, threads=2, draft=drafter_ggufs[kind]) as spec:
        accepted = 0
        for prompt, tokens in zip(prompts, expected):
            g = spec.generate(prompt, max_tokens=96, ignore_eos=True, draft_block_size=block,
                              adaptive=False)
            assert g.tokens == tokens
            accepted += g.stats["n_accepted"]
    assert accepted > 0  # the drafter really predicted something on held-out text


def test_bench_runs_a_held_out_prompt_set_with_and_without_the_drafter(drafter_ggufs, tmp_path):
    from click.testing import CliRunner

    from luce.cli.main import cli

    prompts = tmp_path / "code2.jsonl"
    prompts.write_text("\n".join((REFERENCE / "prompts" / "code.jsonl").read_text().splitlines()[:2]) + "\n")
    args = ["bench", "-m", str(TARGET), "--draft", str(drafter_ggufs["dflash2"]), "-n", "16", "-t", "2",
            "-r", "1", "--no-warmup", "--no-adaptive", "--draft-block-size", "4,8", "--prompts", str(prompts),
            "-o", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["draft"], r["block"]) for r in rows] == [("none", None), ("dflash2.gguf", 4), ("dflash2.gguf", 8)]
    assert all(r["tau"] >= 1.0 and 0.0 <= r["acceptance"] <= 1.0 for r in rows[1:])

    no_draft = CliRunner().invoke(cli, ["bench", "-m", str(TARGET), "--prompts", str(prompts)])
    assert no_draft.exit_code == 2 and "--draft" in no_draft.output
