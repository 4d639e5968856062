"""models/gguf_to_hf.py: the committed target-q8_0.gguf back to a transformers checkpoint.

(a) transformers (the oracle) running the export gives the logits luce's CPU runtime gives for the
    GGUF itself, with LUCE_CPU_KERNELS=exact (fp32 activations, so both sides multiply the same
    float32 weights): only fp32 summation order differs. Measured max |diff| / max |ref| on these
    prompts 1.1-1.8e-5; the bar 1e-4 is the float-weight bar of test_parity_gguf_transformers.py, while
    a wrong inverse (a head order, a norm offset, A_log) moves logits by O(1) of their scale.
(b) `luce convert --outtype q8_0` of the export writes the committed GGUF's tensors byte for
    byte, and its metadata keys and values: q8_0 requantization of q8_0-dequantized values is
    idempotent (each block's max |d * q| is d * 127, exact in float32, so d comes back exactly)
    and every inverse transform is undone exactly by the converter's forward one.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # models/ is a repo folder, not part of the wheel

from models import corpus as corpus_mod  # noqa: E402
from models.gguf_to_hf import tiled_to_grouped  # noqa: E402

REF = REPO / "models" / "reference"
GGUF = REF / "target-q8_0.gguf"
REL_TOL = 1e-4
N_PROMPTS, PROMPT_LEN = 3, 48


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "target"   # the converter names the model by its dir
    proc = subprocess.run([sys.executable, "-m", "models.gguf_to_hf", str(GGUF), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def held_out_prompts(tokenizer_dir: Path) -> list[list[int]]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts = [r["prompt"] for r in corpus_mod.read_jsonl(REF / "prompts" / "code.jsonl")]
    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    return [x[-PROMPT_LEN:] for x in ids if len(x) >= PROMPT_LEN][:N_PROMPTS]


def test_exported_checkpoint_matches_luce_on_the_gguf(export_dir, monkeypatch):
    from transformers import Qwen3_5ForCausalLM

    from luce import Engine
    from luce.binding import check, ffi, lib

    monkeypatch.setenv("LUCE_CPU_KERNELS", "exact")
    torch.set_num_threads(1)
    hf = Qwen3_5ForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    prompts = held_out_prompts(export_dir)
    assert len(prompts) == N_PROMPTS
    with Engine(str(GGUF), threads=2, ctx_size=256) as eng:
        L, session = lib(), eng._session
        for ids in prompts:
            with torch.no_grad():
                ref = hf(torch.tensor([ids])).logits[0].double().numpy()
            ours = np.empty((len(ids), eng.info.n_vocab), dtype=np.float32)
            check(L.luce_session_reset(session))
            check(L.luce_session_eval(session, ffi.from_buffer("int32_t[]", np.asarray(ids, np.int32)),
                                      len(ids), ffi.from_buffer("float[]", ours), len(ids)))
            err = np.abs(ours - ref).max() / np.abs(ref).max()
            assert err < REL_TOL, f"max |luce - transformers| / max |ref| = {err:.2e}"
            assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.99


def test_reconverting_the_export_reproduces_the_gguf(export_dir, tmp_path):
    from gguf import GGUFReader

    out = tmp_path / "rt.gguf"
    proc = subprocess.run([str(Path(sys.executable).parent / "luce"), "convert", str(export_dir), "-o", str(out),
                           "--outtype", "q8_0"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = GGUFReader(str(GGUF)), GGUFReader(str(out))
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert list(ta) == list(tb)
    for name, t in ta.items():
        assert t.tensor_type == tb[name].tensor_type, name
        assert np.asarray(t.data).tobytes() == np.asarray(tb[name].data).tobytes(), name

    def fields(r):
        return {k: (list(f.types), [f.parts[i].tobytes() for i in f.data]) for k, f in r.fields.items()}
    fa, fb = fields(a), fields(b)
    assert list(fa) == list(fb)
    assert [k for k in fa if fa[k] != fb[k]] == []


def test_tiled_to_grouped_is_a_hand_checked_permutation():
    """HK = 2 key heads, HV = 6 value heads (r = 3): llama.cpp's tiled position m * HK + kh holds
    HF's head kh * r + m, so tiled [0..5] holds HF heads [0, 3, 1, 4, 2, 5]."""
    tiled_holds = np.array([0, 3, 1, 4, 2, 5])
    grouped = tiled_to_grouped(tiled_holds.astype(np.float32), key_heads=2, rows_per_head=1)
    assert grouped.tolist() == list(range(6))


def test_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf")
    proc = subprocess.run([sys.executable, "-m", "models.gguf_to_hf", str(bad), "-o", str(tmp_path / "o")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
