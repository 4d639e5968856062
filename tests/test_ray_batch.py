"""`--ray`: a prompt batch over a local Ray instance with two CPU engine workers.

The invariant is the one a single engine gives: every prompt answered exactly once, with the
tokens a one-by-one greedy run gives (each worker is an ordinary Engine; greedy decoding is
deterministic, and a batch's greedy tokens are one-by-one's). The worker-kill test kills an actor while it holds a prompt, as a lost node
would; the driver must start a replacement and run that prompt again, writing nothing twice.
"""
from __future__ import annotations

import json

import pytest
import ray
from click.testing import CliRunner

from fixtures.tiny_qwen35 import tiny_qwen35
from luce.batch import ResultLog, generate_record, read_prompt_jobs
from luce.cli.main import cli
from luce.engine import Engine

# One local Ray instance for the module: its tests run in one xdist worker (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")

PROMPTS = ["The quick brown fox", "def forward(self):", "人工智能", "Once upon", "import numpy", "a b c d"]
SETTINGS = dict(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    _, gguf, _ = tiny_qwen35(tmp_path_factory, "base")
    return gguf


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": p}) for i, p in enumerate(PROMPTS)) + "\n")
    return path


@pytest.fixture(scope="module")
def one_by_one(target, prompt_file):
    with Engine(target, device="cpu", threads=1) as eng:
        return {job.id: generate_record(eng, job, SETTINGS)["tokens"] for job in read_prompt_jobs(prompt_file)}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
    yield
    ray.shutdown()


def test_two_workers_answer_every_prompt_once(target, prompt_file, one_by_one, local_ray, tmp_path):
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(cli, ["generate", "-m", str(target), "--prompts", str(prompt_file), "--output",
                                      str(out), "-n", "6", "--ignore-eos", "--device", "cpu", "-t", "1", "--ray"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(one_by_one)
    assert {line["id"]: line["tokens"] for line in lines} == one_by_one


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_killed_worker_loses_and_duplicates_nothing(target, prompt_file, one_by_one, local_ray, tmp_path,
                                                       monkeypatch, parallel):
    """A worker killed while it holds a prompt (parallel 1) or a chunk (parallel 2, chunks of two
    here): what it held runs again on a replacement, whole; no line of it was written before,
    none twice after."""
    from luce.ray_batch import RayBatch

    monkeypatch.setattr(RayBatch, "CHUNK_PER_SLOT", 1)
    jobs = read_prompt_jobs(prompt_file)
    killed = []
    with RayBatch(target, None, 2, dict(device="cpu", threads=1), parallel=parallel) as batch, \
            ResultLog(str(tmp_path / "out.jsonl")) as log:
        def kill_a_busy_worker(record):
            # after the first result both workers hold work (the driver refills at once)
            if not killed:
                killed.append(batch.workers[0])
                ray.kill(batch.workers[0], no_restart=True)

        batch.run(jobs, SETTINGS, log.write, kill_a_busy_worker)
        assert batch.restarts == 1 and killed[0] not in batch.workers
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(one_by_one)  # each exactly once
    assert {line["id"]: line["tokens"] for line in lines} == one_by_one


def test_workers_batching_chunks_answer_every_prompt_once(target, prompt_file, one_by_one, local_ray, tmp_path,
                                                          monkeypatch):
    """--ray --parallel 2: each actor runs its chunks through continuous batching (two sequences in
    flight); greedy tokens are those of one-by-one decoding. Chunks of one prompt per slot here
    (the default is four), so the six prompts make three chunks over the two workers."""
    from luce.ray_batch import RayBatch

    monkeypatch.setattr(RayBatch, "CHUNK_PER_SLOT", 1)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(cli, ["generate", "-m", str(target), "--prompts", str(prompt_file), "--output",
                                      str(out), "-n", "6", "--ignore-eos", "--device", "cpu", "-t", "1", "--ray",
                                      "--parallel", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(one_by_one)
    assert {line["id"]: line["tokens"] for line in lines} == one_by_one


def test_ray_options_need_a_batch(target):
    for args, message in ((["-p", "hi", "--ray"], "--ray and --ray-workers spread a --prompts batch"),
                          (["-p", "hi", "--parallel", "2"], "--parallel runs a --prompts batch"),
                          (["--prompts", "x.jsonl", "--ray-workers", "2"], "--ray-workers goes with --ray")):
        result = CliRunner().invoke(cli, ["generate", "-m", str(target), *args])
        assert result.exit_code == 2 and message in result.stderr, result.output
