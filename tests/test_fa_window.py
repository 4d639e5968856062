"""--fa-window: the full-attention layers see only the last N positions.

The oracle is the Hugging Face model the tiny GGUF was converted from, run with a banded causal
attention mask (query i sees keys i - N + 1 .. i): transformers applies a 4-D mask to the
full-attention layers only, which is what the window means. A window wider than the prompt is
no window at all, and speculative output equals plain output under a window.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.emulated_gpu import run_on_emulated_cuda
from fixtures.native_eval import assert_logits_close
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine, LuceError
from luce.engine import FaWindowWarning

torch.set_num_threads(1)

N_PROMPT, WINDOW = 200, 64


def banded_mask(n: int, window: int) -> torch.Tensor:
    i = torch.arange(n)
    band = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    return torch.where(band, 0.0, float("-inf"))[None, None]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, gguf_path, _ = tiny_qwen35(tmp_path_factory, "base")
    ids = [int(i) for i in np.random.default_rng(4).integers(0, model.config.vocab_size, N_PROMPT)]
    return model, gguf_path, ids


def test_window_logits_match_hf_with_a_banded_mask(tiny):
    model, path, ids = tiny
    with torch.no_grad():
        ref = model(torch.tensor([ids]), attention_mask=banded_mask(len(ids), WINDOW)).logits[0].double().numpy()
        full = model(torch.tensor([ids])).logits[0].double().numpy()
    assert np.abs(ref[WINDOW:] - full[WINDOW:]).max() > 1e-2  # the window really changes the answer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FaWindowWarning)
        with Engine(path, threads=2, ctx_size=256, fa_window=WINDOW) as eng:
            assert_logits_close(eng.logits(ids), ref, 1e-4, "prefill with fa_window")


def test_window_greedy_tokens_match_hf(tiny):
    """Decode steps past the window: each token is HF's argmax over the banded mask, recomputed."""
    model, path, ids = tiny
    prompt, out = ids[:120], list(ids[:120])
    with torch.no_grad():
        for _ in range(8):
            logits = model(torch.tensor([out]), attention_mask=banded_mask(len(out), WINDOW)).logits[0, -1]
            out.append(int(logits.argmax()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FaWindowWarning)
        with Engine(path, threads=2, ctx_size=256, fa_window=WINDOW) as eng:
            assert eng.generate(prompt_ids=prompt, max_tokens=8, ignore_eos=True).tokens == out[len(prompt):]


def test_a_window_wider_than_the_prompt_changes_nothing(tiny):
    _, path, ids = tiny
    with Engine(path, threads=2, ctx_size=256) as eng:
        plain = eng.logits(ids)
    with Engine(path, threads=2, ctx_size=256, fa_window=N_PROMPT) as eng:
        np.testing.assert_array_equal(eng.logits(ids), plain)


def test_speculative_equals_plain_under_a_window():
    """The reference pair on a held-out code prompt repeated past the window: DFlash 2 drafting
    (always on) gives the plain tokens, and accepts some drafts."""
    from pathlib import Path

    from luce.batch import read_prompt_jobs

    ref = Path(__file__).resolve().parents[1] / "models" / "reference"
    text = read_prompt_jobs(str(ref / "prompts" / "code.jsonl"))[0].prompt
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FaWindowWarning)
        with Engine(ref / "target-q8_0.gguf", threads=2, ctx_size=1024, fa_window=64) as eng:
            prompt = eng.tokenizer.encode(text)
            assert len(prompt) > 64
            plain = eng.generate(prompt_ids=prompt, max_tokens=48, ignore_eos=True).tokens
        with Engine(ref / "target-q8_0.gguf", threads=2, ctx_size=1024, fa_window=64,
                    draft=ref / "dflash2-q8_0.gguf") as eng:
            spec = eng.generate(prompt_ids=prompt, max_tokens=48, ignore_eos=True, adaptive=False)
    assert spec.tokens == plain and spec.stats["tau"] > 1.0


def test_the_first_prompt_past_the_window_warns_once(tiny):
    _, path, ids = tiny
    with Engine(path, threads=2, ctx_size=256, fa_window=WINDOW) as eng:
        with pytest.warns(FaWindowWarning, match=f"prompt \\({N_PROMPT} tokens\\) outgrows fa_window {WINDOW}"):
            eng.generate(prompt_ids=ids, max_tokens=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FaWindowWarning)
            eng.generate(prompt_ids=ids, max_tokens=1)  # once per engine


@pytest.mark.parametrize("window", [10, 63, -1])
def test_a_bad_window_is_one_error(tiny, window):
    _, path, _ = tiny
    with pytest.raises(LuceError, match=f"fa-window {window}: 0 \\(off\\) or at least 64 positions"):
        Engine(path, threads=2, ctx_size=256, fa_window=window)


def test_batches_refuse_a_window(tiny):
    _, path, ids = tiny
    with Engine(path, threads=2, ctx_size=256, fa_window=WINDOW) as eng:
        with pytest.raises(LuceError, match="not applied inside a batch"):
            eng.generate(prompt_ids=[ids[:10], ids[:20]], max_tokens=2)


_EMU_PROBE = r"""
import json, sys, warnings
import numpy as np
from luce import Engine
warnings.simplefilter("ignore")
ids = json.loads(sys.argv[2])
res = {}
for dev in ("cpu", "gpu"):
    with Engine(sys.argv[1], device=dev, threads=2, ctx_size=256, fa_window=64) as eng:
        res[dev] = eng.logits(ids)
        res[dev + " tokens"] = eng.generate(prompt_ids=ids[:150], max_tokens=12, ignore_eos=True).tokens
print(json.dumps({"err": float(np.abs(res["gpu"] - res["cpu"]).max() / np.abs(res["cpu"]).max()),
                  "tokens": res["gpu tokens"] == res["cpu tokens"]}))
"""


def test_gpu_window_is_the_cpu_window(tiny):
    """The GPU kernels start each query at its window (one-query, split-KV and prefill kernels): on
    the emulated CUDA backend a 200-token prompt's logits under a 64-position window are the CPU's
    within the f32 GPU-vs-CPU bar, and greedy tokens past the window are equal."""
    _, path, ids = tiny
    got = run_on_emulated_cuda(_EMU_PROBE, path, json.dumps(ids))
    assert got["err"] <= 1e-4 and got["tokens"], got
