"""The reference-model pipeline end to end on the CPU (`--smoke`: tiny sizes, a few steps), and
the committed held-out prompt sets.

One test runs the real entry point once (a subprocess, as the lead runs it on the GPU) and checks
what it produced against independent references: transformers loads the target and the
tokenizer, the tokenizer's split regex is transformers' own Qwen3.5 pattern, the drafter
checkpoints carry exactly the release key sets, the packed outputs fit the transfer limits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # models/ is a repo folder, not part of the wheel

from models import corpus as corpus_mod  # noqa: E402

PROMPTS = REPO / "models" / "reference" / "prompts"
MiB = 2**20


def committed_prompts() -> dict[str, list[str]]:
    return {k: [r["prompt"] for r in corpus_mod.read_jsonl(PROMPTS / f"{k}.jsonl")]
            for k in ("code", "prose", "mixed")}


def test_committed_prompt_sets_are_reproducible_and_held_out():
    """The committed JSONL files are what models/corpus.py derives from the installed packages,
    and no prompt comes from a trained-on essay."""
    all_essays = corpus_mod.essays()
    held = [e for e in all_essays if corpus_mod._rank("held:" + e["key"]) < corpus_mod.HELD_OUT_ESSAY_SHARE]
    trained = [e for e in all_essays if e not in held]
    assert held and trained
    problems = corpus_mod.humaneval_problems()
    assert len(problems) == 164
    assert corpus_mod.prompt_sets(held, problems) == committed_prompts()
    got = committed_prompts()
    assert [len(got[k]) for k in ("code", "prose", "mixed")] == [48, 36, 36]
    he_prompts = {p["prompt"] for p in problems}
    assert all(p in he_prompts for p in got["code"])
    for p in got["prose"]:
        assert any(p in e["text"] for e in held)
        assert not any(p[:200] in e["text"] for e in trained)
    train, valid, _ = corpus_mod.build(limit=3)
    names = {d["name"] for d in train}
    assert not names & {d["name"] for d in valid}
    assert not names & {e["name"] for e in held}
    assert not any(p["prompt"][:120] in d["text"] for d in train for p in problems[:20])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    cmd = [sys.executable, "-m", "models.pipeline", "--preset", "smoke", "--device", "cpu",
           "--corpus", str(root / "corpus"), "--work", str(root / "work"), "--out", str(root / "out")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_smoke_pipeline_end_to_end(smoke):
    work, out = smoke / "work", smoke / "out"
    report = json.loads((out / "report.json").read_text())

    # packed outputs: <= 8 files of < 16 MiB, tars holding exactly the model dirs
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all((out / f).stat().st_size < 16 * MiB for f in files)
    for name in ("target", "dflash", "dflash2", "dspark"):
        with tarfile.open(out / f"{name}.tar") as tf:
            members = {m.name for m in tf.getmembers() if m.isfile()}
        assert members == {f"{name}/{p.name}" for p in (work / name).iterdir()}
        assert f"{name}/MODEL_CARD.md" in members

    check_tokenizer(work / "target")
    check_target(work / "target", report)
    for kind in ("dflash", "dflash2", "dspark"):
        check_drafter(work / kind, work / "target", report["drafters"][kind])


def test_drafters_only_mode_reuses_the_given_target(smoke):
    """--target-dir: the given checkpoint is used as it is (not retrained, not repacked), the
    drafters are trained against it and are the only models packed."""
    target_dir = smoke / "work" / "target"
    before = (target_dir / "model.safetensors").read_bytes()
    work, out = smoke / "work-drafters", smoke / "out-drafters"
    cmd = [sys.executable, "-m", "models.pipeline", "--preset", "smoke", "--device", "cpu",
           "--corpus", str(smoke / "corpus"), "--work", str(work), "--out", str(out),
           "--target-dir", str(target_dir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == \
        ["dflash.tar", "dflash2.tar", "dspark.tar", "pipeline.log", "report.json"]
    assert all((out / f).stat().st_size < 16 * MiB for f in os.listdir(out))
    assert not (work / "target").exists() and not (work / "tokenizer").exists()
    assert (target_dir / "model.safetensors").read_bytes() == before
    report = json.loads((out / "report.json").read_text())
    assert report["target"] == {"reused": str(target_dir)}
    # the smoke preset draws half its regeneration prompts from the valid split, and says so
    assert (report["regen_sequences"], report["regen_valid_share"]) == (4, 0.5)
    assert "50% of the windows from the valid split" in (work / "dflash" / "MODEL_CARD.md").read_text()
    for kind in ("dflash", "dflash2", "dspark"):
        check_drafter(work / kind, target_dir, report["drafters"][kind])


def test_drafters_only_mode_refuses_a_target_of_another_shape(smoke):
    """The real preset's drafters need a hidden-256, 8-layer, 8192-vocab target: the smoke
    target is refused in one line before any training."""
    cmd = [sys.executable, "-m", "models.pipeline", "--preset", "drafters", "--device", "cpu",
           "--corpus", str(smoke / "corpus"), "--work", str(smoke / "work-refused"),
           "--target-dir", str(smoke / "work" / "target")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --target-dir") and "hidden_size 64 (want 256)" in last
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(cmd[:-2], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--preset drafters trains drafters only" in proc.stderr.strip().splitlines()[-1]


def test_init_from_continues_the_given_drafters(smoke):
    """--init-from DIR: every kind starts from DIR/<kind> (no DFlash warm start), so its first
    training loss is the loss the prior checkpoint ended near, not a fresh init's; the report and
    the model cards say where it continued from and after how many steps."""
    prior = smoke / "work"
    work, out = smoke / "work-init", smoke / "out-init"
    cmd = [sys.executable, "-m", "models.pipeline", "--preset", "smoke", "--device", "cpu",
           "--corpus", str(smoke / "corpus"), "--work", str(work), "--out", str(out),
           "--target-dir", str(prior / "target"), "--init-from", str(prior)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = json.loads((smoke / "out" / "report.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert report["init_from"] == str(prior)
    for kind in ("dflash", "dflash2", "dspark"):
        d, old = report["drafters"][kind], before["drafters"][kind]
        assert d["warm_started_from"] is None
        assert d["init_from"] == {"dir": str(prior / kind), "date": before["date"],
                                  "prior_steps": old["steps"]}
        card = (work / kind / "MODEL_CARD.md").read_text()
        assert f"continued from {before['date']} checkpoints, {old['steps']} prior steps" in card
        assert (work / kind / "config.json").read_text() == (prior / kind / "config.json").read_text()
    # a fresh DFlash starts at ~ln(vocab); the continued one where the prior run ended
    assert report["drafters"]["dflash"]["first"]["loss"] < before["drafters"]["dflash"]["first"]["loss"] - 0.1


def test_init_from_refuses_drafters_of_another_shape(smoke):
    """The drafters-long preset's shapes (hidden 256, block 16 ...) do not fit the smoke
    drafters: one line before anything is trained."""
    cmd = [sys.executable, "-m", "models.pipeline", "--preset", "drafters-long", "--device", "cpu",
           "--corpus", str(smoke / "corpus"), "--work", str(smoke / "work-refused-init"),
           "--target-dir", str(smoke / "work" / "target"), "--init-from", str(smoke / "work")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --init-from") and "does not fit the preset" in last
    assert "hidden 64 (want 256)" in last


def check_tokenizer(target_dir: Path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.models.qwen3_5 import tokenization_qwen3_5
    raw = json.loads((target_dir / "tokenizer.json").read_text())
    split = raw["pre_tokenizer"]["pretokenizers"][0]
    assert split["pattern"]["Regex"] == tokenization_qwen3_5.PRETOKENIZE_REGEX
    assert raw["normalizer"]["type"] == "NFC"
    hf = AutoTokenizer.from_pretrained(target_dir)
    fast = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    n = fast.get_vocab_size()
    assert [fast.token_to_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == \
        [n - 6, n - 5, n - 4]  # specials after the learned vocabulary, as in Qwen
    assert hf.eos_token == "<|im_end|>"
    for kind, prompts in committed_prompts().items():
        for p in prompts:
            ids = hf.encode(p, add_special_tokens=False)
            assert ids == fast.encode(p, add_special_tokens=False).ids
            assert hf.decode(ids) == p, kind
    chat = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                  add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def check_target(target_dir: Path, report: dict):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    assert type(model) is Qwen3_5ForCausalLM
    cfg = model.config
    assert {"linear_attention", "full_attention"} == set(cfg.layer_types)
    assert cfg.linear_num_key_heads != cfg.linear_num_value_heads
    assert not cfg.tie_word_embeddings
    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in stored} == {"BF16"}
    assert stored == set(Qwen3_5ForCausalLM(cfg).state_dict())
    ids = torch.randint(0, cfg.vocab_size, (1, 20))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()
    t = report["target"]
    assert 0 < t["valid_loss"] < torch.log(torch.tensor(float(cfg.vocab_size))).item() + 0.5
    curve = t["loss_curve"]
    assert sum(curve[-3:]) / 3 < curve[0]


def check_drafter(folder: Path, target_dir: Path, rep: dict):
    from safetensors import safe_open
    cfg = json.loads((folder / "config.json").read_text())
    tcfg = json.loads((target_dir / "config.json").read_text())
    tok = json.loads((target_dir / "tokenizer.json").read_text())
    mask_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|mask|>")
    assert cfg["dflash_config"]["mask_token_id"] == mask_id
    taps = cfg["dflash_config"]["target_layer_ids"]
    assert cfg["num_target_layers"] == tcfg["num_hidden_layers"]
    assert max(taps) < tcfg["num_hidden_layers"] - 1   # the last layer is never tapped
    assert cfg["hidden_size"] == tcfg["hidden_size"] and cfg["vocab_size"] == tcfg["vocab_size"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        fc = tuple(f.get_slice("fc.weight").get_shape())
    assert fc == (tcfg["hidden_size"], len(taps) * tcfg["hidden_size"])
    assert not any("embed" in k or "lm_head" in k for k in keys)
    layer_keys = {k for k in keys if k.startswith("layers.")}
    per_layer = {"dflash": 11, "dflash2": 15, "dspark": 11}[cfg_kind(cfg)]
    assert len(layer_keys) == per_layer * cfg["num_hidden_layers"]
    curve = rep["loss_curve"]
    assert all(map(lambda x: x == x and abs(x) < 1e4, curve))   # finite
    assert sum(curve[-3:]) / 3 < curve[0], curve
    acc = rep["acceptance_code"]
    assert 1 <= acc["tau"] <= acc["drafts_per_step"] + 1


def cfg_kind(cfg: dict) -> str:
    return {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2",
            "DSparkDraftModel": "dspark"}[cfg["architectures"][0]]
