"""luce's `--layout llama.cpp` drafters run in llama.cpp itself, losslessly.

The peer is a CPU build of llama.cpp 0c1e570 (the tree llama-cpp-python 0.3.36 vendors), made
by `make peer-cpu` into build/peer-cpu/bin (cached; `make test` depends on it). On the tiny
Qwen3.5 target luce converts, llama.cpp's greedy text with each drafter
(`llama-speculative-simple -md`, which picks draft-dflash / draft-dspark from the file) equals
its plain greedy text (`llama-completion`). A random drafter's proposals are all rejected, so a
DSpark drafter whose Markov head encodes the target's own greedy continuation (luce's plain
tokens) shows that llama.cpp accepts proposals from luce's file, too.

llama.cpp prints text, not ids; padding ids (UNUSED tokens) print as nothing, so the check is on
the visible text, which for these prompts holds most of the tokens.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from fixtures import drafter_checkpoints as ck
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine
from luce.converters.convert import ConvertOptions, convert_checkpoint

BIN = Path(__file__).resolve().parents[1] / "build" / "peer-cpu" / "bin"
PROMPT = "hello world the"
N_SPEC, N_PLAIN = 24, 40          # the speculative run may print a token past -n; plain runs longer
COMMON = ["-t", "1", "--temp", "0", "-c", "256"]


def _dflash2_top_k4(folder):
    """llama.cpp refuses a DFlash 2 drafter with hidden < top_k * (top_k + 1) (its selector
    lattice); the fixture's hidden 64 fits top_k 4, not the fixture's 8."""
    folder = ck.dflash2(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dflash_config"]["selector_top_k"] = 4
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _greedy_dspark(folder, continuation: list[int]):
    """DSpark whose Markov bias W2 W1[prev] puts +20 on the target's next greedy token after prev
    (one rank per transition), with a zero final norm so the unary logits vanish and a
    confidence head that always says 1."""
    R = ck.MARKOV_RANK
    tensors = {k: v.float() for k, v in ck.trunk_tensors(torch.Generator().manual_seed(21)).items()}
    tensors["norm.weight"] = torch.zeros(ck.H)
    w1, w2 = torch.zeros(ck.V, R), torch.zeros(ck.V, R)
    successor = {}
    for prev, nxt in zip(continuation, continuation[1:]):
        if len(successor) == R or successor.get(prev, nxt) != nxt:
            break
        successor[prev] = nxt
    for r, (prev, nxt) in enumerate(successor.items()):
        w1[prev, r], w2[nxt, r] = 1.0, 20.0
    tensors |= {"markov_head.markov_w1.weight": w1, "markov_head.markov_w2.weight": w2,
                "confidence_head.proj.weight": torch.zeros(1, ck.H + R),
                "confidence_head.proj.bias": torch.full((1,), 20.0)}
    return ck.write_checkpoint(folder, ck._dspark_config("DSparkDraftModel"), tensors)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    for tool in ("llama-completion", "llama-speculative-simple"):
        if not (BIN / tool).is_file():
            pytest.fail(f"{BIN / tool} is missing: run `make peer-cpu` (a CPU llama.cpp from build/peer/llama.cpp)")
    return tiny_qwen35(tmp_path_factory, "base", "f32")


# Both tools end with common_perf_print's "total time" line. llama.cpp's logger thread is never
# joined at exit (common/log.cpp, common_log_main leaks it on purpose), so on a pipe a run
# sometimes exits before its last lines are written (seen: 2 runs in 40): without the marker the
# text and the stats are cut short, and the run is repeated.
_LAST_LINE = b"total time ="
_ATTEMPTS = 6


def _run(tool: str, *args) -> subprocess.CompletedProcess:
    for _ in range(_ATTEMPTS):
        done = subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        if _LAST_LINE in done.stderr:
            return done
    pytest.fail(f"{tool} never printed its last log line in {_ATTEMPTS} runs:\n"
                + done.stderr.decode(errors="replace")[-3000:])


def _generated(stdout: bytes) -> bytes:
    text = stdout.strip(b"\n")
    assert text.startswith(PROMPT.encode()), text[:200]
    return text[len(PROMPT):]


@pytest.fixture(scope="module")
def plain(target) -> bytes:
    done = _run("llama-completion", "-m", target.gguf_path, "-p", PROMPT, "-n", N_PLAIN, "-no-cnv", "--no-warmup",
                *COMMON)
    return _generated(done.stdout)


def _speculative(target, drafter: Path) -> tuple[bytes, dict]:
    done = _run("llama-speculative-simple", "-m", target.gguf_path, "-md", drafter, "-p", PROMPT, "-n", N_SPEC,
                *COMMON)
    log = done.stderr.decode(errors="replace")
    stats = {k: int(v) for k, v in re.findall(r"(n_drafted|n_accept)\s*=\s*(\d+)", log)}
    return _generated(done.stdout), stats


def _assert_same_greedy_text(spec: bytes, plain: bytes) -> None:
    assert len(spec) >= 20, spec                          # enough visible text to compare
    assert plain.startswith(spec), (spec, plain)


@pytest.mark.parametrize("make", [ck.zlab_dflash, _dflash2_top_k4, ck.dspark_radixark],
                         ids=["dflash", "dflash2", "dspark"])
def test_luce_drafter_is_lossless_in_llamacpp(target, plain, tmp_path, make):
    out = tmp_path / "drafter.gguf"
    convert_checkpoint(make(tmp_path / "src"), out, ConvertOptions(layout="llama.cpp", target_model=target.gguf_path))
    spec, stats = _speculative(target, out)
    assert stats["n_drafted"] > 0, stats                   # llama.cpp loaded it and drafted with it
    _assert_same_greedy_text(spec, plain)


def test_llamacpp_accepts_proposals_from_a_luce_file(target, plain, tmp_path):
    with Engine(target.gguf_path, threads=1) as eng:
        continuation = eng.generate(PROMPT, max_tokens=N_PLAIN, ignore_eos=True).tokens
    out = tmp_path / "greedy-dspark.gguf"
    convert_checkpoint(_greedy_dspark(tmp_path / "src", continuation), out,
                       ConvertOptions(layout="llama.cpp", target_model=target.gguf_path, outtype="f32"))
    spec, stats = _speculative(target, out)
    assert stats["n_accept"] > 0, stats
    _assert_same_greedy_text(spec, plain)
