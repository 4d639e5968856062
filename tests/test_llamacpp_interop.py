"""luce and llama.cpp's own converter agree on drafter files, both ways.

The peer is llama.cpp 0c1e570 as llama-cpp-python 0.3.36 vendors it, unpacked by `make peer-src`
into build/peer/llama.cpp (`make test` depends on it). Its convert_hf_to_gguf.py runs here as a
subprocess with its own gguf-py; none of its code is in this repository.

1. Read: llama.cpp's converter turns luce's test checkpoints (DFlash, DFlash 2 with and without
   the unary-logit scalars or bidirectional sliding windows, DSpark single-file and DeepSpec-native) into `dflash` GGUFs, taking
   the tokenizer from a tiny Qwen3.5 target's Hugging Face folder (`--target-model-dir`). Each
   file inspects as valid against the target's GGUF, and luce's drafter built from it computes
   bit for bit what luce's own conversion of the same checkpoint computes (hidden states and the
   head's candidate chain). Speculative greedy decoding with it equals plain greedy decoding.
2. Write: `luce convert --layout llama.cpp --target-model T` (T the target GGUF, or its folder)
   writes what llama.cpp's converter writes: the same keys with the same types and values, and
   the same tensor names, shapes and types. Only descriptive general.* metadata may differ.

llama.cpp running luce's files: tests/test_llamacpp_runtime.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from fixtures import drafter_checkpoints as ck
from fixtures.native_drafter import NativeDrafter
from fixtures.tiny_qwen35 import tiny_qwen35
from luce import Engine
from luce.converters.convert import ConvertOptions, convert_checkpoint
from luce.converters.validate import inspect_gguf

PEER = Path(__file__).resolve().parents[1] / "build" / "peer" / "llama.cpp"
# fixture name -> checkpoint block size
KINDS = {"zlab_dflash": 8, "dflash2": 8, "dflash2_swa": 8, "dflash2_logit_scalars": 8, "dspark_radixark": 7, "dspark_deepspec": 7}
# Multiplier 8 and cap 5 (not Muse-Glimmer's 0.196 / 20) change these random weights' walk, so
# that reading the scalars shows in the tokens.
WRITERS = {**{k: ck.FIXTURES[k] for k in KINDS},
           "dflash2_logit_scalars": partial(ck.dflash2_logit_scalars, multiplier=8.0, softcap=5.0)}
# Descriptive metadata each converter fills in its own way (name, size label, file type).
DESCRIPTIVE = {"general.name", "general.type", "general.size_label", "general.file_type",
               "general.quantization_version"}
PROMPT = [int(t) for t in np.random.default_rng(7).integers(0, 440, 30)]

# llama.cpp names a BPE pre-tokenizer by hashing the ids its tokenizer gives a fixed text, and
# knows only published tokenizers. The tiny target's tokenizer (fixtures/tiny_qwen35.py) uses
# Qwen3.5's split regex, so the runner answers "qwen35", as the real Qwen3.5 tokenizer's hash
# does; the rest of convert_hf_to_gguf.py runs unchanged. One process runs every job (a JSON
# list of argv lists), to import torch once.
RUNNER = r"""
import json, runpy, sys
peer, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path[:0] = [peer, peer + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
convert = runpy.run_path(peer + "/convert_hf_to_gguf.py", run_name="peer_convert")
for argv in jobs:
    sys.argv = ["convert_hf_to_gguf.py", *argv]
    convert["main"]()
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_qwen35(tmp_path_factory, "base", "f32")


@pytest.fixture(scope="module")
def files(tmp_path_factory, target):
    """kind -> {"src": checkpoint, "peer": llama.cpp's GGUF, "luce": luce's lucebox GGUF}."""
    if not (PEER / "convert_hf_to_gguf.py").is_file():
        pytest.fail(f"{PEER} is missing: run `make peer-src` (it unpacks llama.cpp from the "
                    f"llama-cpp-python 0.3.36 sdist)")
    root = tmp_path_factory.mktemp("interop")
    out, jobs = {}, []
    for kind in KINDS:
        src = WRITERS[kind](root / kind)
        out[kind] = {"src": src, "peer": root / f"{kind}.peer.gguf", "luce": root / f"{kind}.luce.gguf"}
        jobs.append([str(src), "--outfile", str(out[kind]["peer"]), "--outtype", "f16",
                     "--target-model-dir", str(target.hf_dir)])
        convert_checkpoint(src, out[kind]["luce"])
    env = {**os.environ, "PYTHONPATH": f"{PEER}/gguf-py"}      # its gguf-py, not the installed one
    done = subprocess.run([sys.executable, "-c", RUNNER, str(PEER), json.dumps(jobs)], capture_output=True,
                          text=True, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _schema(path: Path) -> tuple[dict, dict]:
    """(key -> (types, value)) without GGUF.* / descriptive keys, (tensor -> (shape, type))."""
    r = GGUFReader(path)
    keys = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in DESCRIPTIVE:
            continue
        value = f.contents()
        keys[f.name] = ([t.name for t in f.types], value)
    tensors = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name) for t in r.tensors}
    return keys, tensors


def _assert_same_schema(ours: Path, theirs: Path) -> None:
    (ok, ot), (tk, tt) = _schema(ours), _schema(theirs)
    assert sorted(ok) == sorted(tk), (sorted(set(ok) ^ set(tk)))
    for name in tk:
        assert ok[name] == tk[name], (name, str(ok[name])[:200], str(tk[name])[:200])
    assert ot == tt, sorted(set(ot.items()) ^ set(tt.items()))


# ---- 1. llama.cpp's files in luce -----------------------------------------------------------

@pytest.mark.parametrize("kind", list(KINDS))
def test_llamacpp_file_inspects_valid_against_the_target(files, target, kind):
    report = inspect_gguf(files[kind]["peer"], target.gguf_path)
    assert report.valid, [f.__dict__ for f in report.findings]
    s = report.summary
    assert s["layout"] == "llama.cpp" and s["vocab"] == 512 and s["mask_token_id"] == ck.MASK
    assert s["target_layer_ids"] == ck.TAPS and s["block_size"] == KINDS[kind]
    # DeepSpec ships a frozen copy of the target's embedding; llama.cpp's converter keeps it.
    codes = [f.code for f in report.findings]
    assert codes == (["own-embedding"] if kind == "dspark_deepspec" else []), report.findings
    ours = inspect_gguf(files[kind]["luce"]).summary
    for key in ("format", "heads_present", "output_multiplier", "final_logit_softcapping", "sample_from_anchor",
                "yarn", "n_target_layers"):
        assert s[key] == ours[key], key


@pytest.mark.parametrize("kind", list(KINDS))
def test_llamacpp_file_drafts_exactly_as_luces_own(files, target, kind):
    """Same weights, two converters: the drafter's hidden states and its head's candidate chain
    agree to the bit (both store f16 matrices from the bf16 checkpoint and f32 norms)."""
    rng = np.random.default_rng(11)
    feats = rng.standard_normal((12, len(ck.TAPS) * ck.H)).astype(np.float32)
    block = [17] + [ck.MASK] * (KINDS[kind] - 1)
    with NativeDrafter(target.gguf_path, files[kind]["peer"]) as peer, \
            NativeDrafter(target.gguf_path, files[kind]["luce"]) as own:
        assert peer.info == own.info
        hidden = own.forward(feats, block)
        np.testing.assert_array_equal(peer.forward(feats, block), hidden)
        p_tokens, p_conf = peer.chain(hidden, anchor=17)
        o_tokens, o_conf = own.chain(hidden, anchor=17)
        np.testing.assert_array_equal(p_tokens, o_tokens)
        np.testing.assert_array_equal(p_conf, o_conf)


def test_llamacpp_logit_scalars_change_the_selector_walk(files, target):
    """dflash.logit_scale / final_logit_softcapping are read: with them the walk differs from
    the same weights without them (so the equality above is not vacuous)."""
    hidden = np.random.default_rng(12).standard_normal((7, ck.H)).astype(np.float32) * 4
    walks = []
    for kind in ("dflash2", "dflash2_logit_scalars"):
        with NativeDrafter(target.gguf_path, files[kind]["peer"]) as d:
            walks.append(d.chain(hidden, anchor=17)[0])
    assert not np.array_equal(*walks)


@pytest.fixture(scope="module")
def plain(target):
    with Engine(target.gguf_path, threads=1) as eng:
        return eng.generate(prompt_ids=PROMPT, max_tokens=40, ignore_eos=True).tokens


@pytest.mark.parametrize("kind", list(KINDS))
def test_llamacpp_file_is_lossless_in_generate(files, target, plain, kind):
    stats = []
    for which in ("peer", "luce"):
        with Engine(target.gguf_path, threads=1, draft=files[kind][which]) as eng:
            for block in (2, KINDS[kind]):
                g = eng.generate(prompt_ids=PROMPT, max_tokens=40, ignore_eos=True, draft_block_size=block,
                                 adaptive=False)
                assert g.tokens == plain, (kind, which, block)
                assert g.stats["spec_steps"] > 0
                stats.append((which, block, g.stats["n_drafted"], g.stats["n_accepted"]))
    half = len(stats) // 2
    assert [s[1:] for s in stats[:half]] == [s[1:] for s in stats[half:]]


# ---- 2. luce's --layout llama.cpp files are llama.cpp's schema -------------------------------

@pytest.mark.parametrize("kind", ["zlab_dflash", "dflash2", "dflash2_logit_scalars", "dspark_radixark"])
@pytest.mark.parametrize("from_", ["gguf", "hf"])
def test_luce_llamacpp_layout_is_the_upstream_schema(files, target, tmp_path, kind, from_):
    out = tmp_path / "luce-llama.cpp.gguf"
    model = target.gguf_path if from_ == "gguf" else target.hf_dir
    convert_checkpoint(files[kind]["src"], out, ConvertOptions(layout="llama.cpp", target_model=model))
    _assert_same_schema(out, files[kind]["peer"])


def test_files_luce_wrote_before_matching_llamacpp_still_load(files, target, tmp_path):
    """luce's earlier llama.cpp layout: dflash.vocab_size and dflash.mask_token_id, no tokenizer,
    conv projections without `.weight`. Such files still load, to the same drafter."""
    from fixtures.gguf_edit import U32, rewrite
    from luce.converters.gguf_reader import GGUFFile

    new = tmp_path / "new.gguf"
    convert_checkpoint(files["dflash2"]["src"], new, ConvertOptions(layout="llama.cpp", target_model=target.gguf_path))
    with GGUFFile.open(new) as gf:
        tokenizer = [k for k in gf.kv if k.startswith("tokenizer.")]
        projs = [n for n in gf.tensors if n.endswith("_conv_proj.weight")]
        renamed = {n.removesuffix(".weight"): np.array(gf.tensor_array(n)) for n in projs}
    assert len(projs) == 2 * ck.L
    old = rewrite(new, tmp_path / "old.gguf", drop_kv=tokenizer, drop_tensors=projs, tensors=renamed,
                  set_kv={"dflash.vocab_size": (ck.V, U32), "dflash.mask_token_id": (ck.MASK, U32)})
    report = inspect_gguf(old, target.gguf_path)
    assert report.valid and not report.findings, report.findings
    feats = np.random.default_rng(13).standard_normal((5, len(ck.TAPS) * ck.H)).astype(np.float32)
    block = [17] + [ck.MASK] * 7
    with NativeDrafter(target.gguf_path, old) as a, NativeDrafter(target.gguf_path, new) as b:
        assert a.info == b.info
        np.testing.assert_array_equal(a.forward(feats, block), b.forward(feats, block))
