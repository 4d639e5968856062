"""The fuzzers' committed inputs (tests/fuzz/, docs/fuzzing.md), replayed as ordinary tests.

- The seed corpus is exactly what tests/fuzz/make_corpus.py writes (deterministic, committed).
- Every input a fuzzer once crashed on (tests/fuzz/crashes/<target>/, reasons in
  tests/fuzz/crashes/expected.json) is now refused with one line naming the reason: by the Python
  readers, and by the native loader through the C ABI. A native input whose reason is null is a
  valid file that crashed generation: the sanitized replay below runs it.
- Every seed satisfies the fuzz property in the Python readers (one-line LuceError or accepted).
- The native runtime built with ASan + UBSan (`make native-asan`, a dependency of `make test`)
  replays every native seed and reproducer, and the committed reference models (Q8_0 target,
  its three drafters run speculatively): load, generate with what loads, refuse the rest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parent / "fuzz"
sys.path.insert(0, str(FUZZ))

import fuzz_gguf  # noqa: E402
import fuzz_safetensors  # noqa: E402
import make_corpus  # noqa: E402

from fixtures.native_child import load_models_in_child  # noqa: E402

CORPUS = FUZZ / "corpus"
CRASHES = FUZZ / "crashes"
EXPECTED = json.loads((CRASHES / "expected.json").read_text())
ASAN_REPLAY = FUZZ.parent.parent / "build" / "asan" / "luce_fuzz_replay"
HARNESS = {"gguf": fuzz_gguf, "safetensors": fuzz_safetensors}


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def test_seed_corpus_is_what_make_corpus_writes(tmp_path):
    make_corpus.write_corpus(tmp_path)
    for target in ("gguf", "safetensors", "native_loader"):
        written = {p.name: p.read_bytes() for p in _files(tmp_path / target)}
        committed = {p.name: p.read_bytes() for p in _files(CORPUS / target)}
        assert written.keys() == committed.keys(), target
        changed = [name for name in written if written[name] != committed[name]]
        assert not changed, f"{target}: rerun tests/fuzz/make_corpus.py and commit ({changed[:3]})"


def test_every_reproducer_has_an_expected_reason():
    on_disk = {f"{target}/{p.name}" for target in ("gguf", "safetensors", "native_loader")
               for p in _files(CRASHES / target)}
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(k for k in EXPECTED if not k.startswith("native_loader/")))
def test_python_reader_refuses_reproducer_in_one_line(name):
    target, _ = name.split("/", 1)
    message = HARNESS[target].check_bytes((CRASHES / name).read_bytes())
    assert message is not None and EXPECTED[name] in message


def test_native_loader_refuses_reproducers_with_the_reason():
    names = sorted(k for k in EXPECTED if k.startswith("native_loader/") and EXPECTED[k] is not None)
    if not names:
        pytest.skip("no native reproducers committed")
    results = load_models_in_child({n: CRASHES / n for n in names}, timeout=120)
    for n in names:
        status, message = results[n]
        assert status != 0 and EXPECTED[n] in message and "\n" not in message, (n, status, message)


@pytest.mark.parametrize("target", ["gguf", "safetensors"])
def test_python_seeds_keep_the_fuzz_property(target):
    accepted = 0
    for path in _files(CORPUS / target):
        accepted += HARNESS[target].check_bytes(path.read_bytes()) is None
    assert accepted >= 2   # the valid seeds stay valid: the harness really reaches past the header


REFERENCE = FUZZ.parent.parent / "models" / "reference"
# (binding target, inputs, drafters among them): the fuzz corpus and reproducers against the tiny
# target (6 drafters: 3 kinds x 2 layouts, and the reproducer of a full accept that wrote past the
# verify tokens); the committed reference models (Q8_0: the quantized kernels, and the three
# trained drafters run speculatively).
REPLAYS = {
    "corpus": (CORPUS / "native_loader" / "target-tiny.gguf", [CORPUS / "native_loader", CRASHES / "native_loader"], 7),
    "reference": (REFERENCE / "target-q8_0.gguf", sorted(REFERENCE.glob("*.gguf")), 3),
}


@pytest.mark.parametrize("replay", sorted(REPLAYS))
def test_sanitized_native_replay(replay):
    if not ASAN_REPLAY.exists():
        pytest.skip("build/asan/luce_fuzz_replay missing: `make native-asan` builds it (make test does)")
    target, inputs, n_drafters = REPLAYS[replay]
    inputs = [p for p in inputs if p.exists()]
    env = dict(os.environ, LUCE_FUZZ_TARGET=str(target), LUCE_FUZZ_VERBOSE="1",
               ASAN_OPTIONS="detect_leaks=1:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    proc = subprocess.run([str(ASAN_REPLAY), *map(str, inputs)], env=env, capture_output=True, text=True,
                          timeout=600)
    n = sum(len(_files(p)) if p.is_dir() else 1 for p in inputs)
    assert n >= 4 and proc.returncode == 0 and f"replayed {n} inputs" in proc.stdout, proc.stderr[-3000:]
    # The valid inputs really ran: the target generated plainly, every drafter speculatively.
    assert proc.stderr.count("luce_drafter_load: ok") == n_drafters
    assert proc.stderr.count("luce_generate: ok") >= n_drafters + 1
    assert "luce_model_load: ok" in proc.stderr
