"""A prompt batch spread over a Ray cluster: one engine actor per GPU, or per CPU worker.

    from luce.ray_batch import RayBatch
    with RayBatch(model, address=None, workers=0, engine_kwargs={...}, parallel=1) as batch:
        batch.run(jobs, settings, write=log.write, progress=bar.advance)

The driver (this process) is the only writer of results: each actor generates one chunk of
prompts at a time and hands the records back, and the driver writes them to the ResultLog
(luce.batch) as they arrive. With parallel 1 a chunk is one prompt; with parallel N it is
CHUNK_PER_SLOT x N prompts, which the actor runs through its engine's continuous batching (N
sequences in flight; as Ray Data's map_batches hands an actor a batch of rows). A worker that
dies (its node lost, its process killed) fails only the chunk it held; the driver starts a
replacement actor and queues that chunk again, so every prompt is answered exactly once. Every node must see the model (and drafter) at the same path, as with vLLM's Ray
backend. Ray is an optional extra (`pip install luce[ray]`), imported only here.
"""
from __future__ import annotations

from collections import deque

from luce.errors import LuceError


def _ray():
    try:
        import ray
    except ImportError:
        raise LuceError("--ray needs Ray: pip install 'luce[ray]'") from None
    return ray


class _EngineWorker:
    """The actor: one Engine for the actor's lifetime (the weights load once)."""

    def __init__(self, model: str, engine_kwargs: dict):
        from luce.engine import Engine

        self.engine = Engine(model, **engine_kwargs)

    def generate(self, jobs: list, settings: dict, parallel: int) -> list[dict]:
        from luce.batch import generate_record, generate_records

        if parallel == 1:
            return [generate_record(self.engine, job, settings) for job in jobs]
        records = []
        generate_records(self.engine, jobs, settings, parallel, records.append)
        return records


class RayBatch:
    """Actors on a Ray cluster (the module docstring tells the guarantees)."""

    MAX_RESTARTS = 8  # replacement actors before the batch gives up: a model that kills every worker
    # Prompts per chunk and slot with parallel > 1: a chunk's batch drains at its end, so the
    # slots idle for the last few prompts of each chunk; four per slot keeps that tail short and
    # still spreads a file over the workers.
    CHUNK_PER_SLOT = 4

    def __init__(self, model: str, address: str | None, workers: int, engine_kwargs: dict, parallel: int = 1):
        self.ray = _ray()
        self._started_ray = not self.ray.is_initialized()
        if self._started_ray:
            try:
                self.ray.init(address=address, include_dashboard=False, log_to_driver=False,
                              configure_logging=False)
            except Exception as e:  # ray raises ConnectionError, RuntimeError, ValueError ...
                raise LuceError(f"cannot start or join the Ray cluster{f' at {address}' if address else ''}: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        self.model, self.engine_kwargs, self.parallel = str(model), dict(engine_kwargs), parallel
        self.resources = self._actor_resources()
        self.workers = [self._start_worker() for _ in range(workers or self._default_workers())]
        self.restarts = 0

    def _default_workers(self) -> int:
        cluster = self.ray.cluster_resources()
        if self.resources.get("num_gpus"):
            return max(1, int(cluster.get("GPU", 0)))
        return max(1, int(cluster.get("CPU", 1) // self.resources["num_cpus"]))

    def _actor_resources(self) -> dict:
        """A GPU each when the cluster has GPUs and the engine may use one; else CPU threads."""
        gpus = self.ray.cluster_resources().get("GPU", 0)
        threads = self.engine_kwargs.get("threads") or 1
        self.engine_kwargs["threads"] = threads
        if gpus and self.engine_kwargs.get("device", "auto") != "cpu":
            return {"num_gpus": 1, "num_cpus": 1}
        return {"num_cpus": threads}

    def _start_worker(self):
        actor = self.ray.remote(**self.resources)(_EngineWorker)
        return actor.remote(self.model, self.engine_kwargs)

    def run(self, jobs, settings: dict, write, progress) -> None:
        """Generates every job; write(record) and progress(record) run in this process as each
        chunk's results arrive, in completion order."""
        jobs = list(jobs)
        size = 1 if self.parallel == 1 else self.CHUNK_PER_SLOT * self.parallel
        queue = deque(jobs[i:i + size] for i in range(0, len(jobs), size))
        in_flight = {}  # ObjectRef -> (worker, chunk)

        def submit(worker):
            chunk = queue.popleft()
            in_flight[worker.generate.remote(chunk, settings, self.parallel)] = (worker, chunk)

        for worker in self.workers:
            if queue:
                submit(worker)
        while in_flight:
            [ref], _ = self.ray.wait(list(in_flight), num_returns=1)
            worker, chunk = in_flight.pop(ref)
            try:
                records = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as e:
                worker = self._replace(worker, e)
                queue.appendleft(chunk)  # the prompts it held run again
                records = []
            except self.ray.exceptions.RayTaskError as e:
                raise LuceError(f"prompt {chunk[0].id!r}{' (or its chunk)' if len(chunk) > 1 else ''} failed on a "
                                f"Ray worker: {e.cause or e}") from None
            if queue:
                submit(worker)  # before writing: the worker starts its next chunk at once
            for record in records:
                write(record)
                progress(record)

    def _replace(self, dead, error):
        if self.restarts == self.MAX_RESTARTS:
            last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise LuceError(f"{self.restarts} Ray workers died; giving up (last: {last})")
        self.restarts += 1
        self.workers[self.workers.index(dead)] = fresh = self._start_worker()
        return fresh

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self._started_ray:
            self.ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

