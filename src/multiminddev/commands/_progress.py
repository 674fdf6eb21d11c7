"""Progress lines on stderr for the commands that run episodes (``optimize``, ``bench``).

The episode runner knows nothing of terminals; these wrappers sit between it and its generation
backend and evaluator, and print one line per generation batch and one per evaluated candidate,
so that a run of several minutes is never silent. stdout stays for the result (``--json``)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class ProgressBackend:
    """A generation backend that reports each batch before and after it is generated."""

    def __init__(self, backend: Any, *, label: str = "", stream: TextIO | None = None):
        self._backend = backend
        self.tokenizer = backend.tokenizer
        self._prefix = f"[{label}] " if label else ""
        self._stream = stream
        self.batches = 0

    async def generate(self, prompts: list[list[int]], sampling: Any, role: Any) -> list[Any]:
        self.batches += 1
        name = getattr(role, "value", role)
        _line(f"{self._prefix}{name}: writing {len(prompts)} repl"
              f"{'y' if len(prompts) == 1 else 'ies'} ...", self._stream)
        start = time.perf_counter()
        outputs = await self._backend.generate(prompts, sampling, role)
        _line(f"{self._prefix}{name}: done in {time.perf_counter() - start:.1f} s", self._stream)
        return outputs


class ProgressEvaluator:
    """An async evaluator that reports each candidate's status as its evaluation ends."""

    def __init__(self, evaluator: Any, *, label: str = "", stream: TextIO | None = None):
        self._evaluator = evaluator
        self._prefix = f"[{label}] " if label else ""
        self._stream = stream
        self.evaluated = 0

    async def aevaluate(self, problem: Any, candidate: str) -> Any:
        result = await self._evaluator.aevaluate(problem, candidate)
        self.evaluated += 1
        message = _clip(" ".join(str(getattr(result, "message", "")).split()), 100)
        _line(f"{self._prefix}evaluated #{self.evaluated} {getattr(problem, 'name', problem)}: "
              f"{result.status.value}" + (f" ({message})" if message else ""), self._stream)
        return result


def _line(text: str, stream: TextIO | None) -> None:
    print(text, file=stream or sys.stderr, flush=True)


def _clip(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, marked with '...'."""
    if len(text) <= limit:
        return text
    return text[: limit - 3].rsplit(" ", 1)[0] + "..."
