"""`luce generate --draft` and `luce bench --draft`: speculative output held to transformers'
own greedy loop on the original HF model; refusals as one line and a non-zero exit, before compute.
"""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from fixtures.random_qwen35_gguf import K_QUANT_TINY, write_random_qwen35
from fixtures.spec_pair import build_pair
from fixtures.tiny_qwen35 import tiny_qwen35
from luce.cli.main import cli


PROMPT_IDS, N = [3, 17, 42, 99, 5], 16
CKPT = {"dflash": 8, "dflash2": 8, "dspark": 7}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The converted tiny Qwen3.5 and transformers' greedy continuation of PROMPT_IDS."""
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    return gguf_path, greedy_reference(model, PROMPT_IDS, N)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("spec-cli"))


def run(*args):
    return CliRunner().invoke(cli, [*map(str, args)])


def greedy_reference(model, prompt_ids, n):
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("drafter,block,tree", [("dflash2", 16, []), ("dspark", 3, []), ("dflash", 2, []),
                                                ("dflash2", 0, ["--ddtree"]), ("dspark", 0, ["--ddtree", "--ddtree-budget", 5])])
def test_draft_output_equals_transformers_greedy(tiny, pair, drafter, block, tree):
    gguf, reference = tiny
    result = run("generate", "-m", gguf, "--draft", pair.drafters[drafter], "--draft-block-size", block, *tree,
                 "--prompt-ids", ",".join(map(str, PROMPT_IDS)), "-n", N, "--ignore-eos", "--no-adaptive",
                 "-t", 1, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["tokens"] == reference
    assert record["stats"]["spec_steps"] > 0 and record["stats"]["block_size"] == (block or CKPT[drafter])
    assert record["stats"]["adaptive"] is False


def test_stats_block_names_tau_and_acceptance(pair, luce_cmd):
    r = luce_cmd("generate", "-m", pair.target, "--draft", pair.drafters["dspark"], "--prompt-ids", "1,2,3",
                 "-n", 20, "--ignore-eos", "-t", 1)
    assert r.returncode == 0, r.stderr
    assert "tau" in r.stderr and "acceptance" in r.stderr and "rollback" in r.stderr
    # The adaptive policy's line: its measured step-cost ratio, expected and achieved speedups.
    assert "policy" in r.stderr and "x plain" in r.stderr and "achieved" in r.stderr
    always = luce_cmd("generate", "-m", pair.target, "--draft", pair.drafters["dspark"], "--prompt-ids", "1,2,3",
                      "-n", 20, "--ignore-eos", "-t", 1, "--no-adaptive")
    assert always.returncode == 0 and "speculate always" in always.stderr and "achieved" not in always.stderr


@pytest.mark.parametrize("args,message", [
    (["--draft-block-size", 17], r"--draft-block-size must be in [2, 16] for this drafter"),
    (["--draft-block-size", 1], r"--draft-block-size must be in [2, 16] for this drafter"),
])
def test_bad_block_size_one_line(pair, luce_cmd, args, message):
    r = luce_cmd("generate", "-m", pair.target, "--draft", pair.drafters["dflash"], "--prompt-ids", "1,2",
                 "-n", 4, *args)
    assert r.returncode == 1
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_bad_drafter_and_mismatched_pair_are_refused_before_compute(pair, luce_cmd, tmp_path):
    # A target passed as the drafter.
    r = luce_cmd("generate", "-m", pair.target, "--draft", pair.target, "--prompt-ids", "1,2", "-n", 4)
    assert r.returncode == 1 and "not a drafter" in r.stderr and "Traceback" not in r.stderr
    # A truncated drafter file.
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(pair.drafters["dflash"].read_bytes()[:3000])
    r = luce_cmd("generate", "-m", pair.target, "--draft", cut, "--prompt-ids", "1,2", "-n", 4)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.count(str(cut)) == 1  # the file named once
    # A drafter whose hidden size does not match the target: the inspect finding is the message.
    other = write_random_qwen35(tmp_path / "h256.gguf", K_QUANT_TINY)
    r = luce_cmd("generate", "-m", other, "--draft", pair.drafters["dflash2"], "--prompt-ids", "1,2", "-n", 4)
    assert r.returncode == 1 and "drafter hidden 64 != target hidden 256" in r.stderr
    assert r.stdout == ""


def test_speculative_options_need_a_drafter(pair):
    result = run("generate", "-m", pair.target, "--prompt-ids", "1,2", "--draft-block-size", 4)
    assert result.exit_code == 2 and "needs a drafter" in result.output


def test_bench_samples_with_the_settings_it_reports(pair):
    """`luce bench --temp`: every tg row decodes with the sampler and says so. A top-k of 1 makes
    that sampler greedy on both sides of the rejection test (drafting follows the sampler), so
    the tokens, hence tau and acceptance, must be those of the greedy bench; a broad one (seeded)
    must not, or the settings never reached the runs."""
    common = ["bench", "-m", pair.target, "--draft", pair.drafters["dspark"], "-p", 8, "-n", 24, "-r", 1,
              "--no-warmup", "-t", 1, "--no-adaptive", "-o", "json"]
    results = [run(*common), run(*common, "--temp", 0.9, "--top-k", 1), run(*common, "--temp", 3)]
    assert all(r.exit_code == 0 for r in results), [r.output for r in results]
    greedy, one_token, broad = (json.loads(r.stdout) for r in results)
    assert [r["sampling"] for r in greedy] == [None, None]
    assert [r["sampling"] for r in one_token] == ["temp 0.9, top-k 1"] * 2
    assert [(r["tau"], r["acceptance"]) for r in one_token] == [(r["tau"], r["acceptance"]) for r in greedy]
    assert broad[1]["sampling"] == "temp 3" and broad[1]["acceptance"] != greedy[1]["acceptance"]


def test_bench_refuses_a_sampler_beside_the_peer(pair):
    result = run("bench", "-m", pair.target, "--temp", 0.7, "--peer", "llama.cpp")
    assert result.exit_code == 2 and "without a sampler" in result.output


def test_bench_draft_sweeps_block_sizes(pair):
    result = run("bench", "-m", pair.target, "--draft", pair.drafters["dflash2"], "-p", 8, "-n", 16,
                 "--draft-block-size", "4,8", "--verify", "chain,tree", "-r", 1, "--no-warmup", "-t", 1, "-o", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["draft"], r["block"], r["verify"]) for r in rows] == \
        [("none", None, None), ("dflash2.gguf", 4, "chain"), ("dflash2.gguf", 4, "tree"),
         ("dflash2.gguf", 8, "chain"), ("dflash2.gguf", 8, "tree")]
    assert all(r["tau"] >= 1 and 0 <= r["acceptance"] <= 1 and r["speedup"] > 0 for r in rows[1:])
