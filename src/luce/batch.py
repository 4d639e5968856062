"""Offline batches: a prompt file in, one JSON result line per prompt out, resumable.

    jobs = read_prompt_jobs("questions.jsonl")            # [PromptJob(id, index, prompt)]
    with ResultLog("answers.jsonl", resume=True) as log:   # ids already answered: log.done
        for job in jobs:
            if job.id not in log.done:
                log.write({"id": job.id, ...})

A prompt's id is its line's "id" field (a string or an integer), else its line number, so a
result can always be traced to its prompt and a rerun can skip what is answered. A line may also
set its own "max_tokens", "temperature", "top_k", "top_p" and "seed" (numbers), which override
the run's for that prompt (vLLM's per-request sampling parameters); other fields are ignored. The log is
append-only: each result is one complete line written with a single write() and fsync'ed, so a
crash or Ctrl-C leaves every finished result and at most one partial last line, which resume
cuts off (it was never a result). A log is never truncated or replaced: without resume an
existing non-empty file is refused.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from luce.errors import LuceError


@dataclass(frozen=True)
class PromptJob:
    id: str | int      # the line's "id", else its 1-based line number
    index: int         # 0-based position among the file's prompts
    prompt: str
    settings: dict = field(default_factory=dict)  # the line's own max_tokens / sampling (LINE_SETTINGS)


# The settings a prompt line may give for itself: whether each is an integer, and the values it
# takes (the ranges of luce generate's options).
LINE_SETTINGS = {
    "max_tokens": (True, lambda v: v >= 0, ">= 0"),
    "temperature": (False, lambda v: v >= 0, ">= 0"),
    "top_k": (True, lambda v: v >= 0, ">= 0"),
    "top_p": (False, lambda v: 0 < v <= 1, "in (0, 1]"),
    "seed": (True, lambda v: 0 <= v < 2**64, "in 0..2^64-1"),
}


def read_prompt_jobs(path: str) -> list[PromptJob]:
    """One prompt per non-blank line: a JSON string, or an object with a "prompt" string, an
    optional "id" (string or integer, unique in the file) and optional LINE_SETTINGS numbers."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise LuceError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise LuceError(f"{path} is not UTF-8 text") from None
    jobs, seen = [], {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        job = _parse_prompt_line(path, number, line, len(jobs))
        if job.id in seen:
            raise LuceError(f"{path}:{number}: id {job.id!r} repeats line {seen[job.id]}")
        seen[job.id] = number
        jobs.append(job)
    if not jobs:
        raise LuceError(f"{path}: no prompts")
    return jobs


def _parse_prompt_line(path: str, number: int, line: str, index: int) -> PromptJob:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise LuceError(f"{path}:{number}: not valid JSON ({e.msg})") from None
    prompt = item.get("prompt") if isinstance(item, dict) else item
    if not isinstance(prompt, str):
        raise LuceError(f'{path}:{number}: expected a JSON string or an object with a "prompt" string')
    if not prompt:
        raise LuceError(f"{path}:{number}: the prompt is empty")
    job_id = item.get("id", number) if isinstance(item, dict) else number
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)):
        raise LuceError(f'{path}:{number}: "id" must be a string or an integer')
    settings = {}
    for key, (integer, valid, bounds) in LINE_SETTINGS.items():
        if isinstance(item, dict) and key in item:
            value = item[key]
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not valid(value):
                raise LuceError(f'{path}:{number}: "{key}" must be {"an integer" if integer else "a number"} {bounds}')
            settings[key] = value
    return PromptJob(job_id, index, prompt, settings)


class ResultLog:
    """An append-only JSONL file of results keyed by prompt id (module docstring)."""

    def __init__(self, path: str, resume: bool = False):
        self.path = path
        self.done: set = set()
        self._fd = -1
        self._open(resume)

    def _open(self, resume: bool) -> None:
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(self._fd).st_size
            if size and not resume:
                raise LuceError(f"{self.path} already holds results: --resume continues it "
                                "(skipping the prompts it answers); give another --output to start over")
            if size:
                self._read_done()
        except OSError as e:
            self.close()
            raise LuceError(f"cannot write {self.path}: {e.strerror or e}") from None
        except LuceError:
            self.close()
            raise

    def _read_done(self) -> None:
        """Collects the ids of the complete lines and cuts a partial last line off."""
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._fd, 1 << 20):
            chunks.append(chunk)
        data = b"".join(chunks)
        complete = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(complete.splitlines(), 1):
            try:
                record = json.loads(line)
                self.done.add(record["id"])
            except (ValueError, TypeError, KeyError):
                raise LuceError(f"{self.path}:{number}: not a luce result line (a JSON object with an \"id\"); "
                                "is this the right --output?") from None
        if len(complete) < len(data):
            os.ftruncate(self._fd, len(complete))

    def write(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        view = memoryview(line)
        while view:  # one write() for a regular file; the loop only guards a short write
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        self.done.add(record["id"])

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def result_record(gen) -> dict:
    """The JSON form of one Generation (docs/cli.md, --json)."""
    return {"text": gen.text, "tokens": list(gen.tokens), "prompt_tokens": gen.prompt_tokens, "stats": gen.stats}


def generate_record(engine, job: PromptJob, settings: dict) -> dict:
    """One prompt's result line: its id and index, then the result or the engine's refusal."""
    head = {"id": job.id, "index": job.index}
    try:
        return head | result_record(engine.generate(prompt=job.prompt, **(settings | job.settings)))
    except LuceError as e:
        return head | {"error": str(e)}


def generate_records(engine, jobs: list[PromptJob], settings: dict, parallel: int, emit) -> None:
    """The jobs through the engine's continuous batching, `parallel` sequences in flight; emit(record)
    as each sequence finishes (a finished slot takes the next prompt at once). A prompt the engine
    refuses (empty, or longer than the context with its max_tokens) gets its error record first
    and stays out of the batch."""
    runnable, ids_list = [], []
    for job in jobs:
        try:
            ids = engine.encode_prompt(job.prompt, chat=settings.get("chat", False))
            engine.check_fits(ids, job.settings.get("max_tokens", settings["max_tokens"]))
        except LuceError as e:
            emit({"id": job.id, "index": job.index, "error": str(e)})
            continue
        runnable.append(job)
        ids_list.append(ids)
    if not runnable:
        return

    def on_result(i: int, gen) -> None:
        emit({"id": runnable[i].id, "index": runnable[i].index} | result_record(gen))

    options = {key: value for key, value in settings.items() if key != "chat"}
    for key in LINE_SETTINGS:  # one value per prompt where a line gave its own
        if key in options and any(key in job.settings for job in runnable):
            options[key] = [job.settings.get(key, options[key]) for job in runnable]
    engine.generate(prompt_ids=ids_list, parallel=min(parallel, len(ids_list)), on_result=on_result, **options)
