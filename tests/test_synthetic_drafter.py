"""The synthetic DFlash 2 drafter (models/synthetic_drafter.py): the real Qwen3.8 shape on paper,
a tiny twin that loads against the synthetic tiny target and decodes losslessly."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import synthetic_drafter as sd  # noqa: E402
import synthetic_qwen35 as synth  # noqa: E402

from luce import Engine  # noqa: E402


def test_27b_plan_has_the_qwen38_dflash2_shapes():
    # spec/drafters.md §2.3: 5 layers x 15 tensors + fc, hidden norm, output norm, 3 selector tensors.
    s = sd.SHAPES["27b"]
    target = synth.SHAPES[s.target]
    plan = {name: ne for name, ne, _ in sd.tensor_plan(s, target.n_embd, target.n_vocab)}
    assert len(plan) == 5 * 15 + 6
    assert plan["dflash.fc.weight"] == (5 * 5120, 5120)
    assert plan["blk.0.attn_q.weight"] == (5120, 32 * 128)
    assert plan["blk.4.ffn_gate.weight"] == (5120, 17408)
    assert plan["blk.0.attn_conv.proj.weight"] == (5120, 2 * 2 * 5120 // 16)
    assert plan["dflash.selector.succ_cb"] == (256, 248320)
    assert max(s.taps) < target.n_layer - 1  # the target's last layer is never tapped


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic-pair")
    target = synth.write(root / "target.gguf", synth.SHAPES["tiny"], "q8_0", seed=3, log=None)
    drafter = sd.write(root / "drafter.gguf", sd.SHAPES["tiny"], seed=4)
    return target, drafter


def test_tiny_drafter_binds_and_decodes_losslessly(tiny_pair):
    target, drafter = tiny_pair
    ids = np.random.default_rng(0).integers(0, 4000, 20).tolist()
    with Engine(target, draft=drafter, ctx_size=256) as eng:
        info = eng.draft_info
        assert (info.kind, info.n_layer, info.block_size, info.has_selector, info.has_conv) == \
            ("DFlash 2", 2, 8, True, True)
        plain = eng.generate(prompt_ids=ids, max_tokens=30, ignore_eos=True, speculative=False).tokens
        spec = eng.generate(prompt_ids=ids, max_tokens=30, ignore_eos=True, adaptive=False)
        assert spec.tokens == plain
        assert spec.stats["spec_steps"] > 0
        # Forced acceptance (the oracle hook): every step keeps all 7 drafts, output unchanged.
        forced = eng.generate(prompt_ids=ids, max_tokens=33, ignore_eos=True, adaptive=False,
                              oracle_tokens=eng.generate(prompt_ids=ids, max_tokens=33, ignore_eos=True,
                                                         speculative=False).tokens)
        assert forced.stats["tau"] == 8.0
