"""The generation loop and sampling of the native runtime, through luce.Engine: end-of-generation
handling, streaming, seeded sampling and its distribution (checked against softmax of the
logits, which test_parity_* hold to transformers)."""
from __future__ import annotations

import numpy as np
import pytest

from fixtures.random_qwen35_gguf import SPEC_TINY, write_random_qwen35
from luce import Engine

PROMPT = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_random_qwen35(tmp_path_factory.mktemp("gen") / "tiny.gguf", SPEC_TINY, seed=2)


@pytest.fixture(scope="module")
def engine(tiny_path):
    with Engine(tiny_path, threads=2, ctx_size=256) as eng:
        yield eng


def test_greedy_equals_argmax_of_logits(engine):
    """Each greedy token is the argmax of the logits of the sequence so far (lowest id on ties)."""
    gen = engine.generate(prompt_ids=PROMPT, max_tokens=8, ignore_eos=True)
    seq = list(PROMPT)
    for tok in gen.tokens:
        assert tok == int(np.argmax(engine.logits(seq)[-1]))
        seq.append(tok)


def test_stops_at_end_of_generation_id(tmp_path, engine):
    """With the 4th greedy token declared the EOS id (same weights), generation stops before its
    first occurrence; the id is not part of the output; ignore_eos runs through it."""
    free = engine.generate(prompt_ids=PROMPT, max_tokens=12, ignore_eos=True).tokens
    first = free.index(free[3])  # the id may also occur earlier
    path = write_random_qwen35(tmp_path / "eos.gguf", SPEC_TINY, seed=2, eos_token_id=free[3])
    with Engine(path, threads=2, ctx_size=256) as eng:
        gen = eng.generate(prompt_ids=PROMPT, max_tokens=12)
        assert gen.tokens == free[:first] and gen.stats["stopped_by_eos"]
        assert eng.generate(prompt_ids=PROMPT, max_tokens=12, ignore_eos=True).tokens == free


def test_streamed_text_equals_final_text(engine):
    pieces = []
    gen = engine.generate(prompt_ids=PROMPT, max_tokens=20, ignore_eos=True, on_text=pieces.append)
    assert "".join(pieces) == gen.text == engine.tokenizer.decode(gen.tokens)


def test_callback_exception_propagates(engine):
    class Stop(Exception):
        pass

    def boom(_text):
        raise Stop()

    with pytest.raises(Stop):
        engine.generate(prompt_ids=PROMPT, max_tokens=5, ignore_eos=True, on_text=boom)
    # The session is reset by the next call.
    assert len(engine.generate(prompt_ids=PROMPT, max_tokens=3, ignore_eos=True).tokens) == 3


def test_seeded_sampling_is_reproducible(engine):
    run = lambda seed: engine.generate(prompt_ids=PROMPT, max_tokens=16, temperature=1.0,
                                       seed=seed, ignore_eos=True).tokens
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_top_k_1_and_tiny_top_p_are_greedy(engine):
    greedy = engine.generate(prompt_ids=PROMPT, max_tokens=10, ignore_eos=True).tokens
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        got = engine.generate(prompt_ids=PROMPT, max_tokens=10, temperature=1.5, seed=3,
                              ignore_eos=True, **kw).tokens
        assert got == greedy, kw


def _chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson chi-square against `probs`, bins with expected < 5 pooled; True unless p < 1e-4
    (a fixed-seed test: the threshold only guards against a wrong distribution). The p-value is
    the regularized upper incomplete gamma Q(df/2, X^2/2) (torch.special.gammaincc)."""
    import torch

    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    x2 = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(x2 / 2, dtype=torch.float64)))
    return p_value > 1e-4


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.8)])
def test_first_token_distribution(engine, temperature, top_k, top_p):
    """The first sampled token over many seeds follows softmax(logits / T) restricted to the
    top-k / nucleus set and renormalised."""
    logits = engine.logits(PROMPT)[-1].astype(np.float64) / temperature
    order = np.argsort(-logits, kind="stable")
    p = np.exp(logits - logits.max())
    p /= p.sum()
    keep = np.zeros_like(p, dtype=bool)
    if top_k:
        keep[order[:top_k]] = True
    else:
        keep[:] = True
    if top_p < 1.0:
        mass = np.cumsum(p[order])
        nucleus = order[: int(np.searchsorted(mass, top_p) + 1)]
        in_nucleus = np.zeros_like(keep)
        in_nucleus[nucleus] = True
        keep &= in_nucleus
    target = np.where(keep, p, 0.0)
    target /= target.sum()

    n_draws = 2000
    counts = np.zeros_like(p)
    for seed in range(n_draws):
        tok = engine.generate(prompt_ids=PROMPT, max_tokens=1, temperature=temperature,
                              top_k=top_k, top_p=top_p, seed=seed, ignore_eos=True).tokens[0]
        counts[tok] += 1
    assert counts[~keep].sum() == 0
    assert _chi_square_ok(counts, target)


def test_text_and_chat_prompts_go_through_the_gguf_tokenizer(tmp_path_factory):
    """A text prompt is encoded with the GGUF's tokenizer; chat=True first renders it with the
    GGUF's chat template (luce.chat.render_chat, checked against transformers elsewhere)."""
    from fixtures.tiny_qwen35 import tiny_qwen35
    from luce.chat import render_chat

    _, path, _ = tiny_qwen35(tmp_path_factory, "base")
    with Engine(path, threads=1, ctx_size=256) as eng:
        tok = eng.tokenizer
        text = "The quick brown fox"
        plain = eng.generate(text, max_tokens=6, ignore_eos=True)
        assert plain.tokens == eng.generate(prompt_ids=tok.encode(text), max_tokens=6,
                                            ignore_eos=True).tokens
        rendered = render_chat(tok.chat_template, [{"role": "user", "content": text}],
                               add_generation_prompt=True)
        chat = eng.generate(text, chat=True, max_tokens=6, ignore_eos=True)
        assert chat.prompt_tokens == len(tok.encode(rendered)) > plain.prompt_tokens
        assert chat.tokens == eng.generate(prompt_ids=tok.encode(rendered), max_tokens=6,
                                           ignore_eos=True).tokens
