"""--prompt-cache DIR / Engine(prompt_cache=DIR): prompt heads kept on disk (luce.prompt_cache).

The invariant: greedy tokens with the cache, cold or warm, equal those without it (the loaded
head is the state its own prefill leaves: tests/test_session_state.py holds that bit for bit).
Hand-counted: which head a prompt stores (its last whole 256-token block before the last token)
and which one a later prompt loads. Settings that change the state (another model, cache type,
rotation) never share entries; a damaged entry is dropped and the prompt prefilled in full.
Entries are written on a background thread; a prompt that can use the head in flight waits for it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import run_luce
from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine
from luce.errors import LuceError

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "models" / "reference" / "target-q8_0.gguf"
CODE = [json.loads(line)["prompt"] for line in (REPO / "models" / "reference" / "prompts" / "code.jsonl")
        .read_text().splitlines()]
PROMPT = " ".join(CODE[:5])          # 918 tokens: head 768
LONGER = PROMPT + " " + CODE[5]      # the same head and more
OTHER = " ".join(CODE[6:9])
RUN = dict(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def plain():
    with Engine(TARGET, threads=2, ctx_size=2048) as eng:
        return {p: (eng.generate(p, **RUN).tokens, len(eng.encode_prompt(p))) for p in (PROMPT, LONGER, OTHER)}


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.tokens"))


def test_cold_and_warm_runs_give_the_plain_tokens(tmp_path, plain):
    with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path) as eng:
        runs = [eng.generate(p, **RUN) for p in (PROMPT, PROMPT, LONGER, OTHER)]
    assert [g.tokens for g in runs] == [plain[p][0] for p in (PROMPT, PROMPT, LONGER, OTHER)]
    n = plain[PROMPT][1]
    head = (n - 1) // 256 * 256
    assert head == 768  # the fixture prompt's size, so the counts below mean what they say
    assert [g.stats["prompt_cached_tokens"] for g in runs] == [0, head, head, 0]
    assert runs[1].stats["prompt_tokens"] == n - head  # what luce_generate still prefilled
    # LONGER stored its own head, which extends PROMPT's (dropped); OTHER stored one of its own.
    longer_head = (plain[LONGER][1] - 1) // 256 * 256
    assert longer_head > head
    kept = sorted(len(p.read_bytes()) // 4 for p in _entries(tmp_path))
    assert kept == sorted([longer_head, (plain[OTHER][1] - 1) // 256 * 256])


def test_settings_that_change_the_state_do_not_share_entries(tmp_path, plain):
    with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path) as eng:
        eng.generate(PROMPT, **RUN)
    for kwargs in (dict(kv_cache="f16"), dict(kv_rotate=True)):
        with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path, **kwargs) as eng:
            assert eng.generate(PROMPT, **RUN).stats["prompt_cached_tokens"] == 0
    tiny = write_random_qwen35(tmp_path / "tiny.gguf", SPEC_TINY, seed=2)
    with Engine(tiny, threads=2, ctx_size=1024, prompt_cache=tmp_path) as eng:
        ids = [i % eng.info.n_vocab for i in range(300)]
        assert eng.generate(prompt_ids=ids, **RUN).stats["prompt_cached_tokens"] == 0
    assert len({p.parent for p in _entries(tmp_path)}) == 4  # one folder per model and setting


def test_a_damaged_entry_is_dropped_and_the_prompt_prefilled(tmp_path, plain):
    with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path) as eng:
        eng.generate(PROMPT, **RUN)
        eng.flush_prompt_cache()  # the head is written in the background
        [tokens_file] = _entries(tmp_path)
        state = tokens_file.with_suffix(".state")
        whole = state.stat().st_size
        state.write_bytes(state.read_bytes()[:-8])
        again = eng.generate(PROMPT, **RUN)
        assert again.tokens == plain[PROMPT][0] and again.stats["prompt_cached_tokens"] == 0
        eng.flush_prompt_cache()
        assert _entries(tmp_path) == [tokens_file] and state.stat().st_size == whole  # stored afresh
        assert eng.generate(PROMPT, **RUN).stats["prompt_cached_tokens"] == 768


def test_a_head_that_cannot_be_stored_costs_the_cache_not_the_answer(tmp_path, plain):
    from luce.engine import PromptCacheWarning

    with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path / "cache") as eng:
        for entry in (tmp_path / "cache").iterdir():  # the identity folder gone: nowhere to write
            entry.rmdir()
        with pytest.warns(PromptCacheWarning, match="could not store a prompt's head: No such file"):
            g = eng.generate(PROMPT, **RUN)
            eng.flush_prompt_cache()  # the write, on its thread, fails; the wait reports it
    assert g.tokens == plain[PROMPT][0]


def test_an_entry_is_the_state_file_the_runtime_writes(tmp_path, plain):
    """The background write stores luce_session_state_image's bytes: the file
    luce_session_state_save writes for the same head and identity, byte for byte."""
    with Engine(TARGET, threads=2, ctx_size=2048, prompt_cache=tmp_path / "cache") as eng:
        eng.generate(PROMPT, **RUN)
        eng.flush_prompt_cache()
        [tokens_file] = _entries(tmp_path / "cache")
        entry = tokens_file.with_suffix(".state").read_bytes()
        # StateHeader (session_file.cpp): magic[8], version, identity_len (u32), identity[64].
        identity = entry[16:16 + int.from_bytes(entry[12:16], "little")]
        assert len(identity) == 32
        head = np.fromfile(tokens_file, dtype="<i4").tolist()
        eng.save_state(head, tmp_path / "saved.state", identity=identity)
    assert entry == (tmp_path / "saved.state").read_bytes()


def test_a_prompt_cache_with_a_drafter_is_refused():
    with pytest.raises(LuceError, match="does not combine with a drafter"):
        Engine(TARGET, prompt_cache="unused", draft="mtp")


def test_cli_prompt_cache(tmp_path, plain):
    args = ["generate", "-m", str(TARGET), "-p", PROMPT, "-n", "16", "--ignore-eos", "-t", "2", "-c", "2048",
            "--prompt-cache", str(tmp_path / "cache")]
    first, second = run_luce(*args, "--json"), run_luce(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["tokens"] == plain[PROMPT][0]
    assert "prompt cache" in second.stderr and "768 loaded" in second.stderr
    for extra, message in ((["--draft", "mtp"], "--prompt-cache goes with plain decoding"),
                           (["--prompts", "x.jsonl", "--parallel", "2"], "--prompt-cache goes with plain decoding")):
        bad = run_luce("generate", "-m", str(TARGET), "--prompt-cache", str(tmp_path / "cache"), *extra,
                       *([] if "--prompts" in extra else ["-p", "hi"]))
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    (tmp_path / "file").write_text("")
    bad = run_luce("generate", "-m", str(TARGET), "-p", "hi", "--prompt-cache", str(tmp_path / "file"))
    assert bad.returncode in (1, 2) and "file" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
