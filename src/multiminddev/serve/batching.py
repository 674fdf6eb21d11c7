"""Request batching: concurrent completion requests for the same model with the same sampling
settings are decoded in one generate call (up to ``max_batch_size`` prompts).

One worker coroutine takes the oldest waiting request, adds every other waiting request that
can share its batch, decodes them in a thread and hands each its own outputs. Requests with a
``seed`` never share a batch (their samples must not depend on the other rows). A request that
finds the model idle waits ``batch_wait_s`` (a few ms) for company, since a client's burst of
requests arrives one by one and would otherwise decode as a batch of one and then a batch of
the rest; requests that arrive while the model is busy go into the next batch without waiting.

Every answered request is reported to ``Batcher.observers`` as a ``GenerationEvent`` (the
Prometheus metrics count tokens and time to first token from them); ``queue_depth`` is how many
requests wait for a generate call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.policy.generation import GenerationOutput, SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GenerationEvent:
    """One answered request: its model, the tokens generated for it, and the seconds from its
    arrival to its first token reaching the client (a whole reply: the reply; a stream: the
    first chunk) and to its last."""

    model: str
    tokens: int
    time_to_first_token_s: float
    total_s: float


@dataclass
class _Pending:
    prompts: list[list[int]]
    sampling: SamplingParams
    model: str
    future: asyncio.Future[list[GenerationOutput]]
    arrived: float = field(default_factory=time.perf_counter)

    def joins(self, other: _Pending) -> bool:
        return (self.sampling.seed is None and other.sampling.seed is None
                and self.model == other.model
                and dataclasses.astuple(self.sampling) == dataclasses.astuple(other.sampling))


class Batcher:
    def __init__(self, registry: Any, max_batch_size: int, batch_wait_s: float = 0.0):
        self.registry = registry
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._waiting: list[_Pending] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batches = 0  # generate calls made, for tests and metrics
        self.observers: list[Callable[[GenerationEvent], Any]] = []

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def report(self, event: GenerationEvent) -> None:
        """Hand ``event`` to every observer; an observer's error is logged, never raised."""
        for observer in list(self.observers):
            try:
                observer(event)
            except Exception:
                log.exception("a generation observer failed")

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                       model: str) -> list[GenerationOutput]:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._run())
        pending = _Pending(prompts, sampling, model, loop.create_future())
        self._waiting.append(pending)
        self._wake.set()  # type: ignore[union-attr]
        return await pending.future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    def _take_batch(self) -> list[_Pending]:
        first = self._waiting.pop(0)
        batch, rows = [first], len(first.prompts) * first.sampling.n
        for other in list(self._waiting):
            size = len(other.prompts) * other.sampling.n
            if first.joins(other) and rows + size <= self.max_batch_size:
                batch.append(other)
                rows += size
                self._waiting.remove(other)
        return batch

    async def _run(self) -> None:
        idle = True  # the model had nothing to do when the waiting requests came
        while True:
            if not self._waiting:
                self._wake.clear()  # type: ignore[union-attr]
                await self._wake.wait()  # type: ignore[union-attr]
                idle = True
                continue
            if idle and self.batch_wait_s > 0:  # let the rest of a burst arrive
                await asyncio.sleep(self.batch_wait_s)
            idle = False
            batch = self._take_batch()
            batch = [p for p in batch if not p.future.cancelled()]  # clients that went away
            if not batch:
                continue
            prompts = [prompt for p in batch for prompt in p.prompts]
            try:
                outputs = await asyncio.to_thread(self.registry.generate, prompts,
                                                  batch[0].sampling, batch[0].model)
            except Exception as exc:  # noqa: BLE001 - each request of the batch gets the error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            self.batches += 1
            start = 0
            for p in batch:
                mine = outputs[start * p.sampling.n:(start + len(p.prompts)) * p.sampling.n]
                for out in mine:
                    out.prompt_index -= start
                start += len(p.prompts)
                if not p.future.done():
                    p.future.set_result(mine)
                    waited = time.perf_counter() - p.arrived
                    self.report(GenerationEvent(model=p.model,
                                                tokens=sum(len(o.token_ids) for o in mine),
                                                time_to_first_token_s=waited, total_s=waited))


class BatchedBackend:
    """The generation protocol (``generate(prompts, sampling, role)``) over a ``Batcher``: role
    ``r`` decodes with model ``models[r]`` (else ``default``), and its turns share generate
    calls with other kernel jobs' turns and with completion requests for the same model and
    sampling settings, instead of taking the model one job at a time."""

    def __init__(self, batcher: Batcher, registry: Any, models: dict[str, str] | None = None,
                 default: str | None = None):
        self.batcher = batcher
        self.models = {AgentRole(k).value: v for k, v in (models or {}).items()}
        self.default = default or registry.base_name
        self.tokenizer = registry.tokenizer
        self.context_window = registry.context_window
        self.tokens_generated = 0

    def model_for(self, role: AgentRole | str) -> str:
        return self.models.get(AgentRole(role).value, self.default)

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                       role: AgentRole) -> list[GenerationOutput]:
        outputs = await self.batcher.generate(prompts, sampling, self.model_for(role))
        self.tokens_generated += sum(len(o.token_ids) for o in outputs)
        return outputs
