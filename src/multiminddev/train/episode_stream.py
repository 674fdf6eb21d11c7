"""Episodes of many problems at once, each handed over the moment it ends.

``stream_episodes`` runs one ``episode.runner.arun_episodes`` per problem (its samples as one
group, so identical candidates are still evaluated once), up to ``concurrency`` episodes at a
time, all on one event loop. Their generate calls meet in a ``BatchingBackend``: calls that
arrive while the model is busy wait, and the next batch takes every waiting call of the same
role and sampling (up to ``max_rows`` prompts). A problem whose kernel is being evaluated does
not hold the others back: its next turn joins whichever batch comes after its evaluation, so
decoding and evaluation overlap, where a step-by-step loop waits for the slowest evaluation
of each turn before decoding the next.

``run_logged_episodes`` (the training run's held-out evaluation) appends each episode to a
log as it ends and, resumed, runs only the problems the log lacks.

``on_episode(episode, sample)`` is called as each episode ends (``episode.done``), within the
step that ended it; ``skip`` lists the (problem name, sample) pairs that need no episode (a
resumed run's finished ones).

Batch composition depends on timing, so sampled episodes differ from run to run as they do
with any batching; greedy decoding (temperature 0) of a one-prompt batch is deterministic,
which is what a resumed run matches an uninterrupted one with.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from multiminddev.episode.runner import EpisodeConfig, arun_episodes
from multiminddev.episode.state import Episode, EpisodeStatus, episode_from_dict
from multiminddev.tasks.problem import Problem
from multiminddev.train.episode_log import (
    EpisodeLog,
    episode_key,
    episode_record,
    reusable_log,
)

GATHER_SECONDS = 0.05  # how long the first batch waits for the other problems' first calls
DEFAULT_MAX_ROWS = 16  # prompts per batch when the backend does not say (HF: max_batch_size)


@dataclass
class _Request:
    prompts: list[list[int]]
    sampling: Any
    role: Any
    future: asyncio.Future = field(repr=False)

    @property
    def key(self) -> tuple[str, str]:
        return str(getattr(self.role, "value", self.role)), repr(self.sampling)

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.sampling.n


class BatchingBackend:
    """A ``GenerationBackend`` that merges concurrent ``generate`` calls into batches of at
    most ``max_rows`` prompts (one call is never split) with the same role and sampling, one
    batch at a time on ``backend``. ``batch_rows`` records each batch's size."""

    def __init__(self, backend: Any, *, max_rows: int | None = None,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.max_rows = max_rows or getattr(backend, "max_batch_size", None) or DEFAULT_MAX_ROWS
        if self.max_rows < 1:
            raise ValueError("BatchingBackend.max_rows must be >= 1")
        self.gather_seconds = gather_seconds
        self.batch_rows: list[int] = []
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None

    @property
    def context_window(self) -> int | None:
        return getattr(self.backend, "context_window", None)

    async def generate(self, prompts: list[list[int]], sampling: Any, role: Any) -> list[Any]:
        request = _Request(list(prompts), sampling, role,
                           asyncio.get_running_loop().create_future())
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._drain())
        return await request.future

    def _take(self) -> list[_Request]:
        """The oldest waiting call and every later one of its kind that fits the batch."""
        key = self._pending[0].key
        batch, rows = [], 0
        for request in list(self._pending):
            if request.key == key and (not batch or rows + request.rows <= self.max_rows):
                batch.append(request)
                rows += request.rows
                self._pending.remove(request)
        return batch

    async def _drain(self) -> None:
        await asyncio.sleep(self.gather_seconds)
        while self._pending:
            batch = self._take()
            first = batch[0]
            prompts = [p for r in batch for p in r.prompts]
            self.batch_rows.append(len(prompts) * first.sampling.n)
            try:
                outputs = await self.backend.generate(prompts, first.sampling, first.role)
            except Exception as exc:  # noqa: BLE001 - every caller's episode records it as its own failure
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            at = 0
            for r in batch:
                if not r.future.done():
                    r.future.set_result(list(outputs[at:at + r.rows]))
                at += r.rows


class ProgressLine:
    """``episodes done/total, rate, ETA`` on ``stream`` as each episode ends."""

    def __init__(self, total: int, *, label: str = "", done: int = 0,
                 stream: TextIO | None = None) -> None:
        self.total, self.done, self.start_done = total, done, done
        self.prefix = f"[{label}] " if label else ""
        self.stream = stream
        self.start = time.perf_counter()

    def __call__(self, episode: Episode, sample: int) -> None:
        self.done += 1
        seconds = time.perf_counter() - self.start
        rate = (self.done - self.start_done) / seconds if seconds > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        print(f"{self.prefix}episodes {self.done}/{self.total} ({episode.problem.name} "
              f"#{sample}: {episode.status.value}), {rate * 60:.1f}/min, ETA "
              f"{_duration(eta)}", file=self.stream or sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    if math.isnan(seconds):  # nothing finished yet
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


async def astream_episodes(
    problems: Sequence[Problem],
    backend: Any,
    evaluator: Any,
    config: EpisodeConfig,
    *,
    samples: int = 1,
    concurrency: int = 64,
    skip: Collection[tuple[str, int]] = (),
    on_episode: Callable[[Episode, int], Any] | None = None,
) -> list[tuple[int, int, Episode]]:
    """(problem index, sample, episode) for every pair not in ``skip``, in problem and sample
    order. ``backend`` is wrapped in a ``BatchingBackend`` unless it is one already;
    ``concurrency`` bounds the episodes in flight (a problem's samples start together)."""
    if samples < 1 or concurrency < 1:
        raise ValueError("stream_episodes: samples and concurrency must be >= 1")
    batching = backend if isinstance(backend, BatchingBackend) else BatchingBackend(backend)
    slots = asyncio.Semaphore(max(1, concurrency // samples))
    skip = set(skip)

    async def one_problem(index: int, problem: Problem) -> list[tuple[int, int, Episode]]:
        wanted = [s for s in range(samples) if (problem.name, s) not in skip]
        if not wanted:
            return []
        handed: set[int] = set()

        def hand_over(episodes: list[Episode]) -> None:
            for g, episode in enumerate(episodes):
                if g in handed or not episode.done:
                    continue
                handed.add(g)
                # the ids and groups an all-at-once run gives: problem index, sample
                episode.episode_id = f"{problem.name}-{index}-{wanted[g]}"
                episode.group = index
                if on_episode is not None:
                    on_episode(episode, wanted[g])

        async with slots:
            episodes = await arun_episodes([problem], batching, evaluator, config,
                                           group_size=len(wanted), on_step=hand_over)
        for episode in episodes:  # the runner closes episodes still running after max_turns
            if episode.status is EpisodeStatus.RUNNING:
                episode.status = EpisodeStatus.MAX_TURNS
        hand_over(episodes)
        return [(index, wanted[g], e) for g, e in enumerate(episodes)]

    groups = await asyncio.gather(*(one_problem(i, p) for i, p in enumerate(problems)))
    return [item for group in groups for item in group]


def stream_episodes(problems: Sequence[Problem], backend: Any, evaluator: Any,
                    config: EpisodeConfig, **kwargs: Any) -> list[tuple[int, int, Episode]]:
    """Synchronous :func:`astream_episodes` (inside an event loop, await that one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(astream_episodes(problems, backend, evaluator, config, **kwargs))
    raise RuntimeError("stream_episodes was called inside a running event loop; "
                       "use `await astream_episodes(...)` there")


def run_logged_episodes(
    problems: Sequence[Problem],
    backend: Any,
    evaluator: Any,
    config: EpisodeConfig,
    *,
    episodes_file: Any,
    record: Any,
    resume: bool,
    concurrency: int = 64,
    progress: bool = False,
) -> list[Episode]:
    """One episode per problem, in problem order, each appended to ``episodes_file`` as it
    ends. With ``resume``, the episodes the file holds for the same ``record`` (the settings
    and agents that decide them) are read back instead of run again, but for those that ended
    in an error (``episode_log.reusable_log``); otherwise the file starts empty.
    ``progress``: a line on stderr per episode (done/total, rate, ETA)."""
    kept = reusable_log(episodes_file, record, resume=resume)
    log = EpisodeLog(episodes_file)
    line = ProgressLine(len(problems), done=len(kept.rows)) if progress else None

    def hand_over(episode: Episode, sample: int) -> None:
        log.append(episode_record(episode, sample))
        if line is not None:
            line(episode, sample)

    fresh = stream_episodes(problems, backend, evaluator, config, concurrency=concurrency,
                            skip=kept.finished(), on_episode=hand_over)
    by_key = {episode_key(row): episode_from_dict(row) for row in kept.rows}
    by_key.update({(e.problem.name, sample): e for _, sample, e in fresh})
    return [by_key[(p.name, 0)] for p in problems if (p.name, 0) in by_key]
