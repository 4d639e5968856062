"""The synthetic qwen35 generator (benchmarks' model files) and `luce bench`'s parsing/printing."""
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import synthetic_qwen35 as synth  # noqa: E402

from luce import bench  # noqa: E402
from luce.cli.bench import IntList  # noqa: E402


def test_27b_plan_reproduces_the_upstream_recipe_counts():
    # spec/engine.md §2.7: the PR #625 target recipe gives IQ4_XS 440, F32 360, Q6_K 65, Q5_K 1,
    # and spec/qwen35.md §1.1: 851 main tensors + 15 in the MTP block.
    plan = synth.tensor_plan(synth.SHAPES["27b"], "iq4_xs", mtp=True)
    assert len(plan) == 866
    assert Counter(t.name for _, _, t in plan) == {"IQ4_XS": 440, "F32": 360, "Q6_K": 65, "Q5_K": 1}
    assert len(synth.tensor_plan(synth.SHAPES["27b"], "iq4_xs", mtp=False)) == 851


def test_tiny_file_is_readable_and_every_block_is_finite(tmp_path):
    path = synth.write(tmp_path / "tiny.gguf", synth.SHAPES["tiny"], "iq4_xs", seed=1, log=None)
    reader = GGUFReader(path)
    field = reader.fields["qwen35.block_count"]
    assert int(field.parts[field.data[0]][0]) == synth.SHAPES["tiny"].n_layer + 1
    types = Counter(t.tensor_type.name for t in reader.tensors)
    assert set(types) == {"F32", "IQ4_XS", "Q6_K", "Q5_K"}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name
        if t.name.endswith("ssm_a"):
            assert (values < 0).all()  # a decaying DeltaNet state


@pytest.mark.parametrize("text,expected", [
    ("512", [512]), ("128,256, 512", [128, 256, 512]), ("1-8+2", [1, 3, 5, 7]), ("0", [0]),
])
def test_bench_lists_parse_like_llama_bench(text, expected):
    assert IntList().convert(text, None, None) == expected


def test_bench_rejects_a_bad_list():
    import click
    with pytest.raises(click.BadParameter):
        IntList().convert("12,x", None, None)


def test_markdown_shows_mean_and_std_and_the_peer_ratio():
    rows = [bench.Row("m.gguf", 1.0, "luce cpu", 2, "tg128", 30.0, 1.5, 30.0, 3),
            bench.Row("m.gguf", 1.0, "llama.cpp cpu", 2, "tg128", 20.0, 0.5, None, 3)]
    bench.attach_peer_ratios(rows[:1], rows[1:])
    assert rows[0].vs_peer == pytest.approx(1.5)
    table = bench.to_markdown(rows).splitlines()
    assert table[0].split("|")[1:-1] == [" model ", " size ", " backend ", " threads ", " test ", " t/s ",
                                          " GB/s ", " vs llama.cpp "]
    assert "30.00 ± 1.50" in table[2] and "1.50x" in table[2]


def test_bench_cli_needs_something_to_measure(tmp_path):
    from luce.cli.main import cli
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = CliRunner().invoke(cli, ["bench", "-m", str(model), "-p", "0", "-n", "0"])
    assert result.exit_code == 2 and "nothing to measure" in result.output


def test_bench_names_the_tests_a_context_too_long_comes_from():
    from luce.cli.main import cli
    target = Path(__file__).resolve().parents[1] / "models" / "reference" / "target-q8_0.gguf"  # 4096 positions
    result = CliRunner().invoke(cli, ["bench", "-m", str(target), "-p", "5000", "-n", "1", "-r", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "pp5000, tg1 need a 5002-position context" in result.output and "4096" in result.output


def test_decode_bytes_leave_out_the_untied_embedding(tmp_path):
    # Hand count from the file itself (gguf-py): every kept tensor but token_embd.weight, which a
    # decode step only gathers one row of. The tiny synthetic file has an untied head.
    from luce import Engine
    path = synth.write(tmp_path / "tiny.gguf", synth.SHAPES["tiny"], "iq4_xs", seed=1, log=None)
    reader = GGUFReader(path)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    with Engine(path, threads=1, ctx_size=16) as engine:
        assert not engine.info.tied_head
        got = bench.decode_weight_bytes(path, engine.info)
        assert got == engine.info.weight_bytes - int(embd.n_bytes)
        assert got < engine.info.weight_bytes


REFERENCE_TARGET = Path(__file__).resolve().parents[1] / "models" / "reference" / "target-q8_0.gguf"


def test_bench_parallel_rows_count_every_sequences_tokens():
    """--parallel 1,3: one row per number of sequences, named as llama-bench names a decode at depth;
    every sequence's decoded tokens are counted (n_gen each, not n_gen in all)."""
    from luce.engine import Engine
    with Engine(REFERENCE_TARGET, ctx_size=32, threads=2) as engine:
        calls = []
        real = engine.generate

        def spy(**kw):
            results = real(**kw)
            calls.append((kw, results))
            return results
        engine.generate = spy
        seconds = bench.parallel_timer(engine, n_gen=5, depth=6, n_parallel=3, seed=1)()
    (kw, results), = calls
    assert kw["parallel"] == 3 and [len(p) for p in kw["prompt_ids"]] == [6, 6, 6]
    assert [len(r.tokens) for r in results] == [6, 6, 6]  # the prefill's token + 5 decoded, each
    assert seconds > 0
    rows = bench.bench_parallel(REFERENCE_TARGET, [4], 8, [1, 3], [2], "cpu", reps=1, warmup=False)
    assert [(r.test, r.parallel) for r in rows] == [("tg4 @ d8", 1), ("tg4 @ d8", 3)]
    assert "| np |" in bench.to_markdown(rows).splitlines()[0]


def test_bench_parallel_with_a_drafter_reports_its_tau():
    """--parallel with --draft: each sequence drafts in the batch; the row names the drafter and
    carries the mean tau (at least 1: the bonus token) of the run's sequences."""
    drafter = REFERENCE_TARGET.parent / "dflash2-q8_0.gguf"
    rows = bench.bench_parallel(REFERENCE_TARGET, [6], 8, [2], [2], "cpu", reps=1, warmup=False, draft=drafter)
    assert [(r.parallel, r.draft) for r in rows] == [(2, "dflash2-q8_0.gguf")] and rows[0].tau >= 1.0


@pytest.mark.parametrize("args, message", [
    (["--parallel", "0"], "0 sequences: choose 1..64"),
    (["--parallel", "65"], "65 sequences: choose 1..64"),
    (["--parallel", "4", "--peer", "llama.cpp"], "not measured with --parallel"),
    (["--parallel", "4", "--temp", "0.5"], "not measured with --parallel"),
    (["--parallel", "4", "--draft", "/nonexistent.gguf"], "does not exist"),
    (["--parallel", "4", "-n", "0"], "nothing to measure"),
])
def test_bench_parallel_refuses_what_it_cannot_measure(args, message):
    from luce.cli.main import cli
    result = CliRunner().invoke(cli, ["bench", "-m", str(REFERENCE_TARGET), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
