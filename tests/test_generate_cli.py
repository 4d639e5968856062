"""`luce generate` through click's CliRunner and as a real subprocess.

Success paths are held to oracles we did not write: greedy tokens equal a greedy loop over the
original transformers model; prompt ids and generated text go through transformers' tokenizer
built from the same GGUF (and its apply_chat_template for --chat).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gguf import GGUFWriter

from fixtures.tiny_qwen35 import tiny_qwen35
from luce.cli.main import cli

N = 8  # generated tokens per check


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    hf_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return model, gguf_path, hf_tok


def run(*args, input=None):
    return CliRunner().invoke(cli, ["generate", *map(str, args)], input=input)


def greedy_reference(model, prompt_ids, n):
    """Greedy decoding by full recompute with the original HF model."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def one_json(result) -> dict:
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # --json: one object and nothing else on stdout
    return json.loads(lines[0])


# --------------------------------------------------------------------------------------------
# results against transformers


def test_greedy_json_matches_transformers(tiny):
    model, gguf, hf_tok = tiny
    prompt = "The quick brown fox jumps over"
    record = one_json(run("-m", gguf, "-p", prompt, "-n", N, "--ignore-eos", "--json"))
    prompt_ids = hf_tok.encode(prompt, add_special_tokens=False)
    assert record["prompt_tokens"] == len(prompt_ids)
    assert record["tokens"] == greedy_reference(model, prompt_ids, N)
    assert record["text"] == hf_tok.decode(record["tokens"])
    stats = record["stats"]
    assert stats["prompt_tokens"] == len(prompt_ids) and stats["generated_tokens"] == N
    assert stats["prefill_tok_s"] > 0 and stats["decode_tok_s"] > 0


def test_streamed_text_equals_json_text_and_stats_go_to_stderr(tiny):
    _, gguf, _ = tiny
    args = ("-m", gguf, "-p", "Numbers: 0 1 2", "-n", N, "--ignore-eos")
    record = one_json(run(*args, "--json"))
    plain = run(*args)
    assert plain.exit_code == 0, plain.output
    assert plain.stdout == record["text"] + "\n"
    assert "prompt tokens" in plain.stderr and "decode" in plain.stderr and "tok/s" in plain.stderr
    assert str(record["prompt_tokens"]) in plain.stderr


def test_prompt_ids_equal_text_prompt(tiny):
    _, gguf, hf_tok = tiny
    ids = hf_tok.encode("I'm sure it's fine", add_special_tokens=False)
    by_text = one_json(run("-m", gguf, "-p", "I'm sure it's fine", "-n", N, "--ignore-eos", "--json"))
    by_ids = one_json(run("-m", gguf, "--prompt-ids", ",".join(map(str, ids)), "-n", N, "--ignore-eos", "--json"))
    assert by_ids["tokens"] == by_text["tokens"] and by_ids["prompt_tokens"] == len(ids)


def test_chat_uses_the_gguf_template(tiny):
    model, gguf, hf_tok = tiny
    record = one_json(run("-m", gguf, "-p", "Hello!", "--chat", "-n", N, "--ignore-eos", "--json"))
    prompt_ids = hf_tok.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    assert record["prompt_tokens"] == len(prompt_ids)
    assert record["tokens"] == greedy_reference(model, prompt_ids, N)


def test_prompt_file_and_stdin(tiny, tmp_path):
    _, gguf, _ = tiny
    want = one_json(run("-m", gguf, "-p", "line one\nline two", "-n", 4, "--json"))
    path = tmp_path / "prompt.txt"
    path.write_text("line one\nline two\n")  # one trailing newline is dropped, as in llama.cpp
    from_file = one_json(run("-m", gguf, "-f", path, "-n", 4, "--json"))
    from_stdin = one_json(run("-m", gguf, "-f", "-", "-n", 4, "--json", input="line one\nline two\n"))
    assert from_file["tokens"] == from_stdin["tokens"] == want["tokens"]
    assert from_file["prompt_tokens"] == want["prompt_tokens"]


def test_sampling_is_reproducible_with_a_seed(tiny):
    _, gguf, _ = tiny
    args = ("-m", gguf, "-p", "The dog", "-n", 16, "--ignore-eos", "--temp", 1.5, "--top-k", 40, "--top-p", 0.9,
            "-s", 1234, "--json")
    first, second = one_json(run(*args)), one_json(run(*args))
    assert first["tokens"] == second["tokens"] and len(first["tokens"]) == 16


def test_batch_writes_one_line_per_prompt_in_order(tiny, tmp_path):
    _, gguf, _ = tiny
    prompts = ["The quick brown fox", "def forward(self):", "人工智能"]
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join([json.dumps(prompts[0]), json.dumps({"prompt": prompts[1], "id": 7}), "",
                              json.dumps({"prompt": prompts[2]})]) + "\n")
    out = tmp_path / "out.jsonl"
    result = run("-m", gguf, "--prompts", src, "--output", out, "-n", 4, "--ignore-eos")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert [line["id"] for line in lines] == [1, 7, 4]  # the line's "id", else its line number
    for line, prompt in zip(lines, prompts):
        single = one_json(run("-m", gguf, "-p", prompt, "-n", 4, "--ignore-eos", "--json"))
        assert line["tokens"] == single["tokens"] and line["text"] == single["text"]
    assert result.stdout == ""  # results went to --output; progress lines are on stderr
    # without --output the same records stream to stdout as JSON lines
    to_stdout = run("-m", gguf, "--prompts", src, "-n", 4, "--ignore-eos")
    assert [json.loads(x)["tokens"] for x in to_stdout.stdout.splitlines()] == [line["tokens"] for line in lines]


def test_batch_keeps_going_past_a_refused_prompt(tiny, tmp_path):
    _, gguf, _ = tiny
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join(json.dumps(p) for p in ["short", "word " * 40, "also short"]) + "\n")
    out = tmp_path / "out.jsonl"
    result = run("-m", gguf, "--prompts", src, "--output", out, "-n", 2, "-c", 16)
    assert result.exit_code == 1
    assert "1 of 3 prompts failed" in result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [("error" in line) for line in lines] == [False, True, False]


def test_interrupted_batch_keeps_finished_lines(tiny, tmp_path, monkeypatch):
    """Each result is flushed as it finishes: a run stopped during prompt 2 keeps prompt 1."""
    from luce.engine import Engine

    _, gguf, _ = tiny
    real_generate, calls = Engine.generate, []

    def generate_then_interrupt(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate_then_interrupt)
    src, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    src.write_text('"one"\n"two"\n"three"\n')
    result = run("-m", gguf, "--prompts", src, "--output", out, "-n", 2)
    assert result.exit_code != 0
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["index"] == 0


def test_resume_answers_every_prompt_exactly_once(tiny, tmp_path, monkeypatch):
    """A run killed during prompt 2, with a half-written line left behind (a crash mid-write),
    then --resume: the half line is cut off, prompt 1 is not run again, and every prompt has one
    result equal to a fresh run's."""
    from luce.engine import Engine

    _, gguf, _ = tiny
    src, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n"three"\n')
    real_generate, prompts_run = Engine.generate, []

    def generate_logged(self, *args, **kwargs):
        prompts_run.append(kwargs["prompt"])
        if prompts_run == ["one", "two"]:
            raise KeyboardInterrupt
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate_logged)
    assert run("-m", gguf, "--prompts", src, "--output", out, "-n", 3, "--ignore-eos").exit_code != 0
    out.write_bytes(out.read_bytes() + b'{"id": "b", "text": "tw')
    resumed = run("-m", gguf, "--prompts", src, "--output", out, "-n", 3, "--ignore-eos", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "1 of 3 prompts already answered" in resumed.stderr
    assert prompts_run == ["one", "two", "two", "three"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["a", "b", 3]
    fresh = tmp_path / "fresh.jsonl"
    assert run("-m", gguf, "--prompts", src, "--output", fresh, "-n", 3, "--ignore-eos").exit_code == 0
    assert [line["tokens"] for line in lines] == [json.loads(x)["tokens"] for x in fresh.read_text().splitlines()]
    n_run = len(prompts_run)
    again = run("-m", gguf, "--prompts", src, "--output", out, "-n", 3, "--resume")
    assert again.exit_code == 0 and len(out.read_text().splitlines()) == 3 and len(prompts_run) == n_run


def test_existing_results_are_never_overwritten(not_a_gguf, tmp_path):
    """Without --resume a non-empty --output is refused before the model loads, and left as it was."""
    src, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    src.write_text('"one"\n')
    out.write_text('{"id": 1, "text": "kept"}\n')
    assert_one_line_error(run("-m", not_a_gguf, "--prompts", src, "--output", out), 1, "already holds results")
    assert out.read_text() == '{"id": 1, "text": "kept"}\n'
    out.write_text("not a result\n")
    assert_one_line_error(run("-m", not_a_gguf, "--prompts", src, "--output", out, "--resume"), 1,
                          "out.jsonl:1: not a luce result line")
    assert out.read_text() == "not a result\n"


@pytest.mark.parametrize("lines,message", [
    (['{"id": 1, "prompt": "a"}', '{"id": 1, "prompt": "b"}'], "prompts.jsonl:2: id 1 repeats line 1"),
    (['{"id": 2, "prompt": "a"}', '"b"'], "prompts.jsonl:2: id 2 repeats line 1"),  # line numbers are ids
    (['{"id": [1], "prompt": "a"}'], '"id" must be a string or an integer'),
    (['{"id": true, "prompt": "a"}'], '"id" must be a string or an integer'),
])
def test_prompt_ids_are_checked(not_a_gguf, tmp_path, lines, message):
    src = tmp_path / "prompts.jsonl"
    src.write_text("\n".join(lines) + "\n")
    result = run("-m", not_a_gguf, "--prompts", src, "--output", tmp_path / "out.jsonl")
    assert_one_line_error(result, 1, message)
    assert not (tmp_path / "out.jsonl").exists() or (tmp_path / "out.jsonl").stat().st_size == 0


def test_chat_without_a_template_is_refused(tiny, tmp_path):
    from luce.converters.qwen35 import convert_qwen35

    _, gguf, _ = tiny
    hf_dir = tmp_path / "hf"
    shutil.copytree(gguf.parent / "hf", hf_dir)
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
    convert_qwen35(hf_dir, tmp_path / "plain.gguf")
    assert_one_line_error(run("-m", tmp_path / "plain.gguf", "-p", "hi", "--chat"), 1, "no chat template")


# --------------------------------------------------------------------------------------------
# bad input: one line, non-zero exit, checked before the model loads where possible


@pytest.fixture(scope="module")
def not_a_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "notes.gguf"
    path.write_text("this is not a GGUF file\n")
    return path


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "llama.gguf"
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_one_line_error(result, exit_code, message):
    assert result.exit_code == exit_code, result.output
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


@pytest.mark.parametrize("args,message", [
    (["-p", "a", "--prompt-ids", "1,2"], "exactly one prompt source"),
    ([], "exactly one prompt source"),
    (["--prompt-ids", "1,2", "--chat"], "--chat renders text prompts"),
    (["-p", "a", "--output", "x.jsonl"], "--output goes with --prompts"),
    (["--prompts", "x.jsonl", "--resume"], "--resume continues an --output file"),
    (["--prompt-ids", "1,x,3"], "comma-separated integers"),
    (["--prompt-ids", ","], "no token ids given"),
    (["-p", "a", "--top-p", "0"], "--top-p"),
    (["-p", "a", "-n", "-1"], "--max-tokens"),
    (["-p", "a", "--temp", "-0.5"], "--temp"),
    (["-p", "a", "--device", "tpu"], "--device"),
])
def test_usage_errors_exit_2(not_a_gguf, args, message):
    # the model is not even a GGUF: these must be refused before anything loads it
    assert_one_line_error(run("-m", not_a_gguf, *args), 2, message)


def test_without_a_model_the_bundled_reference_target_runs():
    """`luce generate` without -m uses the reference target shipped in the wheel and says
    so; its tokens are those of the committed GGUF run explicitly."""
    import luce

    bundled = luce.reference_target()
    repo_copy = Path(__file__).resolve().parents[1] / "models" / "reference" / "target-q8_0.gguf"
    assert bundled.read_bytes() == repo_copy.read_bytes()
    implicit = run("-p", "def add(a, b):", "-n", "12", "--json", "-t", "1")
    explicit = run("-m", repo_copy, "-p", "def add(a, b):", "-n", "12", "--json", "-t", "1")
    assert implicit.exit_code == 0, implicit.output
    assert "bundled reference target" in implicit.stderr
    assert json.loads(implicit.stdout)["tokens"] == json.loads(explicit.stdout)["tokens"]


def test_missing_model_file(tmp_path):
    assert_one_line_error(run("-m", tmp_path / "nope.gguf", "-p", "hi"), 2, "does not exist")


@pytest.mark.parametrize("make_args,message", [
    (lambda d: ["-p", ""], "the prompt is empty"),
    (lambda d: ["-f", d / "missing.txt"], "cannot read prompt file"),
    (lambda d: ["-f", d / "empty.txt"], "the prompt is empty"),
    (lambda d: ["--prompts", d / "bad.jsonl"], "bad.jsonl:2: not valid JSON"),
    (lambda d: ["--prompts", d / "noprompt.jsonl"], 'noprompt.jsonl:1: expected a JSON string or an object with a "prompt"'),
    (lambda d: ["--prompts", d / "blank.jsonl"], "no prompts"),
    (lambda d: ["--prompts", d / "bad.jsonl", "--output", d / "missing" / "out.jsonl"], "output folder"),
])
def test_bad_prompt_inputs_fail_before_loading(not_a_gguf, tmp_path, make_args, message):
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "bad.jsonl").write_text('"ok"\n{not json\n')
    (tmp_path / "noprompt.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert_one_line_error(run("-m", not_a_gguf, *make_args(tmp_path)), 1, message)


def test_not_a_gguf_is_refused(not_a_gguf):
    result = run("-m", not_a_gguf, "-p", "hi")
    assert result.exit_code != 0
    assert_one_line_error(result, result.exit_code, "not a GGUF")
    assert result.stderr.strip().count("\n") == 0


def test_unsupported_architecture_is_refused(llama_gguf):
    result = run("-m", llama_gguf, "-p", "hi")
    assert result.exit_code != 0 and "llama" in result.stderr and "Traceback" not in result.output


def test_prompt_longer_than_context(tiny):
    _, gguf, _ = tiny
    result = run("-m", gguf, "-p", "word " * 40, "-c", 16)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "context" in result.stderr


def test_token_id_out_of_range(tiny):
    _, gguf, _ = tiny
    assert_one_line_error(run("-m", gguf, "--prompt-ids", "1,512"), 1, "token id 512 is out of range")


@pytest.mark.parametrize("value", ["12", "2048", "big"])
def test_bad_prefill_step_setting(tiny, monkeypatch, value):
    _, gguf, _ = tiny
    monkeypatch.setenv("LUCE_PREFILL_STEP", value)
    assert_one_line_error(run("-m", gguf, "-p", "hi", "-n", 2), 1,
                          f"LUCE_PREFILL_STEP={value}: not an integer in 64..1024")


# --------------------------------------------------------------------------------------------
# real subprocess


def test_subprocess_generate_json_and_error(tiny, luce_cmd):
    model, gguf, hf_tok = tiny
    ok = luce_cmd("generate", "-m", gguf, "-p", "The quick brown fox", "-n", 4, "--ignore-eos", "--json")
    assert ok.returncode == 0, ok.stderr
    record = json.loads(ok.stdout)
    assert record["tokens"] == greedy_reference(model, hf_tok.encode("The quick brown fox", add_special_tokens=False), 4)
    bad = luce_cmd("generate", "-m", gguf, "--prompt-ids", "1,99999")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "out of range" in bad.stderr


def test_subprocess_closed_pipe_ends_quietly(tiny):
    """`luce generate ... | head -c 1`: the reader leaves early; no traceback, exit 141."""
    import subprocess

    from conftest import LUCE_SCRIPT

    _, gguf, _ = tiny
    proc = subprocess.Popen([str(LUCE_SCRIPT), "generate", "-m", str(gguf), "-p", "The quick", "-n", "3000",
                             "--ignore-eos", "-c", "4096"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    assert len(proc.stdout.read(1)) == 1
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and b"Traceback" not in err


def test_auto_device_says_why_it_ran_on_the_cpu(luce_cmd, tmp_path):
    """A GPU library that cannot be loaded: --device auto (the default) falls back to the CPU and
    says so under the stats; with no GPU library at all (a CPU-only build) it says nothing."""
    import os

    bogus = tmp_path / "libluce_gpu.so"
    bogus.write_bytes(b"not an ELF file")
    for library, noted in ((bogus, True), (tmp_path / "absent.so", False)):
        r = luce_cmd("generate", "--prompt-ids", "1,2,3", "-n", 2, "-t", 1,
                     env={**os.environ, "LUCE_GPU_LIBRARY": str(library)})
        assert r.returncode == 0, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("running on the CPU: ") == noted and ("cannot load the GPU backend" in last) == noted


def test_cache_type_options_reach_the_engine(tiny):
    """-ctk / -ctv / --kv-rotate build the same cache as the Python API's arguments: the same tokens."""
    from luce import Engine

    _, gguf, _ = tiny
    ids = [5, 17, 33, 2, 9, 41, 7]
    got = one_json(run("-m", gguf, "--prompt-ids", ",".join(map(str, ids)), "-n", N, "--ignore-eos", "--json",
                       "-t", 1, "-ctk", "q4_0", "-ctv", "q8_0", "--kv-rotate"))
    with Engine(gguf, threads=1, cache_type_k="q4_0", cache_type_v="q8_0", kv_rotate=True) as eng:
        assert got["tokens"] == eng.generate(prompt_ids=ids, max_tokens=N, ignore_eos=True).tokens




def test_fa_window_warns_once_on_stderr(luce_cmd, tiny):
    """--fa-window: a prompt past the window is named in one stderr line, and the run goes on."""
    _, gguf, _ = tiny
    ids = ",".join(str(i) for i in range(3, 203))
    r = luce_cmd("generate", "-m", gguf, "--prompt-ids", ids, "-n", 2, "-t", 1, "--fa-window", 64, "-c", 256)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("warning:")] == [
        "warning: the prompt (200 tokens) outgrows fa_window 64: the full-attention layers see only its last 64 "
        "positions"]
