"""Kernel-optimization jobs: one Generator -> Tester -> Optimizer episode per submitted module.

``JobManager.submit(source, options, adapters, arm)`` checks the module (size, Python, a
KernelBench ``Model``) and queues a job; at most ``ServeConfig.max_running_jobs`` episodes run
at once on the server's event loop (generation in the registry's worker thread, evaluation in
the evaluator's worker processes). A job that fails ends ``failed`` with its message; nothing it
does reaches another job or the server.

Hooks for other components (the A/B layer):
- ``assign_arm(source, options) -> (adapters, arm)``: called for a job submitted without
  adapters and arm; returns {role: model name} and the arm's name (either may be None).
- ``adapters_for_arm(arm) -> {role: model name}``: a job that names its arm runs on that arm's
  adapters (KeyError: no such arm); unset, a job that names an arm is refused, since its
  outcome could be recorded nowhere.

With ``ServeConfig.state_dir`` every accepted job is written to ``state_dir/jobs/<id>.json``
when it is accepted and again when it ends, and ``get`` reads a job this process does not hold
from there: after a restart an earlier job is still found, and one the previous process did
not finish reads ``failed`` with the reason.
- ``on_finished``: callbacks ``f(job)`` called once per job when it ends (succeeded or failed);
  an exception in one is logged and ignored.
- ``backend_for(adapters) -> GenerationBackend``: where a job's agents generate (``create_app``
  sets the served models through its batcher, ``serve.batching.BatchedBackend``, so concurrent
  jobs share generate calls; a bare ``JobManager`` uses ``ModelRegistry.backend``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.core.problem import ProblemError, load_problem_source
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode.runner import arun_episodes, outcome_line, single_episode_config
from multiminddev.policy.generation import SamplingParams
from multiminddev.rewards.functions import RewardConfig
from multiminddev.serve.config import ServeConfig
from multiminddev.serve.limits import LimitError
from multiminddev.serve.registry import ModelRegistry, UnknownModelError

log = logging.getLogger(__name__)

TRAINABLE_ROLES = (AgentRole.GENERATOR.value, AgentRole.OPTIMIZER.value)
JOB_ID = re.compile(r"^[0-9a-f]{16}$")  # uuid4 hex prefix: also a safe file name
INTERRUPTED = "the server stopped before this job finished; submit it again"


class JobError(ValueError):
    """A job cannot be submitted (bad module, bad options); ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int = 422, param: str | None = None):
        super().__init__(" ".join(message.split()))
        self.status = status
        self.param = param


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the episode ran to its end (best kernel may still be none)
    FAILED = "failed"  # the episode could not run (model, evaluator, an internal error)

    @property
    def done(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass(kw_only=True)
class JobOptions:
    turns: int = 3
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 1024
    target_speedup: float = 2.0
    patience: int = 2
    seed: int | None = None
    name: str = "module"  # the problem's name in results

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError("turns must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.patience < 0 or self.target_speedup < 0:
            raise ValueError("patience and target_speedup must be >= 0")


@dataclass(kw_only=True)
class Job:
    id: str
    source: str
    options: JobOptions
    adapters: dict[str, str]  # role -> model name
    arm: str | None = None
    status: JobStatus = JobStatus.QUEUED
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    episode: Any = None  # multiminddev.episode.Episode once the job ran
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def latency_s(self) -> float | None:
        return self.finished - self.created if self.finished is not None else None

    def summary(self) -> dict[str, Any]:
        """What a poll returns: status, one line per turn, the best kernel and its result."""
        episode = self.episode
        best = episode.best_result if episode is not None else None
        return {
            "id": self.id, "status": self.status.value, "arm": self.arm,
            "adapters": dict(self.adapters), "options": dataclasses.asdict(self.options),
            "created": self.created, "started": self.started, "finished": self.finished,
            "latency_s": self.latency_s, "error": self.error,
            "episode_status": episode.status.value if episode is not None else None,
            "turns": [turn_event(t, outcome_line(t)) for t in (episode.turns if episode else [])],
            "best_turn": episode.best_turn if episode is not None else None,
            "best_source": episode.best_source if episode is not None else None,
            "best_result": best.to_dict() if best is not None else None,
            "verified": bool(episode.verified) if episode is not None else False,
            "compile_only": bool(episode.compile_only) if episode is not None else False,
            "best_speedup": episode.best_speedup if episode is not None else 0.0,
            "best_reward": max((t.reward for t in episode.turns if t.reward is not None),
                               default=None) if episode is not None else None,
        }


@dataclass(kw_only=True)
class StoredJob:
    """A job read back from the state folder (written by an earlier server process)."""

    record: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.record["id"])

    @property
    def status(self) -> JobStatus:
        return JobStatus(self.record["status"])

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.record.items() if k != "source"}


def turn_event(turn: Any, line: str) -> dict[str, Any]:
    result = turn.eval_result
    return {"index": turn.index, "role": turn.role.value, "summary": line, "text": turn.text,
            "candidate_source": turn.candidate_source, "feedback": turn.feedback,
            "parse_failure": turn.parse_failure.value if turn.parse_failure else None,
            "status": result.status.value if result is not None else None,
            "compiled": bool(result.compiled) if result is not None else False,
            "correct": bool(result.correct) if result is not None else False,
            "speedup": float(result.speedup) if result is not None and result.correct else None,
            "reward": turn.reward, "improved": turn.improved,
            "generate_seconds": turn.generate_seconds, "eval_seconds": turn.eval_seconds}


def check_module(source: str, max_bytes: int, name: str = "module") -> Any:
    """The module as a Problem, or a JobError saying what is wrong with it."""
    size = len(source.encode())
    if size > max_bytes:
        raise JobError(f"module is {size} bytes; this server takes at most {max_bytes}", 413)
    if not source.strip():
        raise JobError("module is empty: send a KernelBench module with class Model(nn.Module), "
                       "get_inputs() and get_init_inputs()")
    try:
        return load_problem_source(source, name=name)
    except (ProblemError, ValueError, TypeError) as exc:
        raise JobError(str(exc)) from exc


class JobManager:
    def __init__(self, config: ServeConfig, registry: ModelRegistry):
        self.config = config
        self.registry = registry
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.on_finished: list[Callable[[Job], Any]] = []
        self.assign_arm: Callable[[str, JobOptions], tuple[dict[str, str] | None, str | None]] \
            | None = None
        self.adapters_for_arm: Callable[[str], dict[str, str]] | None = None
        # The generation backend of a job, from its {role: model name}: by default the served
        # models themselves; a GenerationBackend to another server (vLLM) fits here too.
        self.backend_for: Callable[[dict[str, str]], Any] = registry.backend
        self.evaluator: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._changed: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """On the server's event loop: create the evaluator and the job slots."""
        self.evaluator = Evaluator(self.config.eval_config or EvalConfig())
        self._slots = asyncio.Semaphore(self.config.max_running_jobs)
        self._changed = asyncio.Condition()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.evaluator is not None:
            await asyncio.to_thread(self.evaluator.close)

    # ------------------------------------------------------------------ submit / query

    def default_adapters(self) -> dict[str, str]:
        """Loaded adapters named after a role drive that role; the base drives the others."""
        return {role: role for role in TRAINABLE_ROLES if role in self.registry.adapters}

    def submit(self, source: str, options: JobOptions | None = None,
               adapters: dict[str, str] | None = None, arm: str | None = None) -> Job:
        options = options or JobOptions()
        try:
            self.config.limits.check_job(options.turns, options.max_new_tokens)
        except LimitError as exc:
            raise JobError(str(exc), 400, exc.param) from None
        check_module(source, self.config.max_module_bytes, options.name)
        if arm is not None:
            adapters = self._arm_adapters(arm, adapters)
        elif adapters is None and self.assign_arm is not None:
            adapters, arm = self.assign_arm(source, options)
        chosen = self.default_adapters() if adapters is None else dict(adapters)
        for role, name in chosen.items():
            if role not in TRAINABLE_ROLES:
                raise JobError(f"adapters: role {role!r} is not one of {list(TRAINABLE_ROLES)}")
            try:
                self.registry.check(name)
            except UnknownModelError as exc:
                raise JobError(f"adapters[{role!r}]: {exc}", 404) from exc
        waiting = sum(1 for j in self.jobs.values() if j.status is JobStatus.QUEUED)
        if waiting >= self.config.max_queued_jobs:
            raise JobError(f"{waiting} jobs are waiting already; retry later", 429)
        job = Job(id=uuid.uuid4().hex[:16], source=source, options=options, adapters=chosen,
                  arm=arm)
        self.jobs[job.id] = job
        self._save(job)  # an accepted job is on disk before the client hears of it
        self._forget_old()
        task = asyncio.get_running_loop().create_task(self._run(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def _arm_adapters(self, arm: str, adapters: dict[str, str] | None) -> dict[str, str]:
        if adapters is not None:
            raise JobError("give adapters or arm, not both: an arm runs on its own adapters",
                           400)
        if self.adapters_for_arm is None:
            raise JobError(f"arm {arm!r}: this server runs no A/B test (start it with "
                           "--state-dir and add arms with 'multiminddev ab add-arm')", 400)
        try:
            return self.adapters_for_arm(arm)
        except KeyError as exc:
            raise JobError(f"arm {arm!r}: {exc.args[0] if exc.args else 'no such arm'}",
                           404) from None

    def get(self, job_id: str) -> Job | StoredJob | None:
        """The job, from memory or, where this process does not hold it, the state folder."""
        job = self.jobs.get(job_id)
        if job is not None or self.config.jobs_dir is None or not JOB_ID.match(job_id):
            return job
        try:
            record = json.loads((self.config.jobs_dir / f"{job_id}.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("id") != job_id:
            return None
        if record.get("status") not in (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value):
            record = {**record, "status": JobStatus.FAILED.value, "error": INTERRUPTED}
        return StoredJob(record=record)

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        job = self.jobs[job_id]

        async def until_done() -> None:
            async with self._changed:  # type: ignore[union-attr]
                await self._changed.wait_for(lambda: job.status.done)  # type: ignore[union-attr]

        await asyncio.wait_for(until_done(), timeout)
        return job

    async def events(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every event of the job, from the first, then new ones as they happen, until it ends;
        a job of an earlier server process has only its ``done`` event."""
        job = self.jobs.get(job_id)
        if job is None:
            stored = self.get(job_id)
            if stored is not None:
                yield {"event": "done", **stored.summary()}
            return
        sent = 0
        while True:
            async with self._changed:  # type: ignore[union-attr]
                await self._changed.wait_for(  # type: ignore[union-attr]
                    lambda seen=sent: len(job.events) > seen or job.status.done)
            while sent < len(job.events):
                yield job.events[sent]
                sent += 1
            if job.status.done and sent >= len(job.events):
                return

    # ------------------------------------------------------------------ running

    async def _run(self, job: Job) -> None:
        assert self._slots is not None
        try:
            async with self._slots:
                job.status, job.started = JobStatus.RUNNING, time.time()
                await self._emit(job, {"event": "started", "adapters": job.adapters,
                                       "arm": job.arm})
                await self._episode(job)
                job.status = JobStatus.SUCCEEDED
        except asyncio.CancelledError:
            job.status, job.error = JobStatus.FAILED, "the server shut down"
            raise
        except Exception as exc:
            log.exception("job %s failed", job.id)
            job.status, job.error = JobStatus.FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            job.finished = time.time()
            self._save(job)
            for callback in list(self.on_finished):
                try:
                    callback(job)
                except Exception:
                    log.exception("an on_finished callback failed for job %s", job.id)
            await self._emit(job, {"event": "done", **job.summary()})

    async def _episode(self, job: Job) -> None:
        opts = job.options
        problem = check_module(job.source, self.config.max_module_bytes, opts.name)
        sampling = SamplingParams(temperature=opts.temperature, top_p=opts.top_p,
                                  max_new_tokens=opts.max_new_tokens, seed=opts.seed)
        backend = self.backend_for(job.adapters)
        window = getattr(backend, "context_window", None) or self.registry.context_window
        config = dataclasses.replace(
            single_episode_config(turns=opts.turns, sampling=sampling,
                                  target_speedup=opts.target_speedup, patience=opts.patience,
                                  context_window=window),
            element_type=self.config.element_type_line)
        # every turn gets the training reward, so outcomes compare across arms and with training
        config.reward = RewardConfig()
        pending: list[dict[str, Any]] = []

        def on_step(episodes: list[Any]) -> None:
            job.episode = episodes[0]
            turn = episodes[0].turns[-1] if episodes[0].turns else None
            if turn is not None:
                pending.append({"event": "turn", **turn_event(turn, outcome_line(turn))})

        async def drain() -> None:
            while pending:
                await self._emit(job, pending.pop(0))

        task = asyncio.ensure_future(arun_episodes([problem], backend, self.evaluator, config,
                                                   on_step=on_step))
        while not task.done():  # turns go out while the episode goes on
            await asyncio.wait([task], timeout=0.2)
            await drain()
        job.episode = task.result()[0]
        await drain()
        if job.episode.error and job.episode.status.value == "error":
            raise RuntimeError(job.episode.error)

    async def _emit(self, job: Job, event: dict[str, Any]) -> None:
        job.events.append(event)
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    def _forget_old(self) -> None:
        done = [j for j in self.jobs.values() if j.status.done]
        for job in done[: max(0, len(done) - self.config.max_finished_jobs)]:
            self.jobs.pop(job.id, None)

    def _save(self, job: Job) -> None:
        folder = self.config.jobs_dir
        if folder is None:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            summary = {**job.summary(), "source": job.source}
            tmp = folder / f"{job.id}.json.tmp"
            tmp.write_text(json.dumps(summary, indent=1, default=str))
            tmp.replace(folder / f"{job.id}.json")
        except OSError as exc:
            log.warning("could not write job %s to %s: %s", job.id, folder, exc)
