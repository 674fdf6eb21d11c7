"""Baselines measured ahead of the candidates that need them.

A problem's first torch.compile baseline takes seconds (dynamo, inductor, triton: mostly CPU).
Measured inside the evaluation of its first candidate, it stalls that evaluation slot; measured
by separate trusted workers in the order the candidates will need them, it overlaps the
evaluations of other problems. ``BaselinePrefetch`` schedules those measurements (each problem
once) and lets a candidate wait for its own problem's, up to a limit. What is measured and
where it is stored is the evaluator's business (``Evaluator.prefetch_baselines``).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Container, Iterable
from typing import Any


def prefetch_order(problem_keys: Iterable[str], scheduled: Container[str] = ()) -> list[str]:
    """Each key once, in first-seen order (the order candidates will need them), without
    those already ``scheduled`` (pure)."""
    order: list[str] = []
    seen: set[str] = set()
    for key in problem_keys:
        if key not in seen and key not in scheduled:
            seen.add(key)
            order.append(key)
    return order


class BaselinePrefetch:
    """Runs ``measure(item)`` for each new key on ``workers`` threads, first come first
    served; ``wait(key, timeout_s)`` blocks until that key's measurement ended (thread-safe)."""

    def __init__(self, measure: Callable[[Any], Any], workers: int):
        if workers < 1:
            raise ValueError(f"BaselinePrefetch needs at least one worker, got {workers}")
        self._measure = measure
        self._executor = cf.ThreadPoolExecutor(max_workers=workers,
                                               thread_name_prefix="mmd-baseline")
        self._futures: dict[str, cf.Future[Any]] = {}
        self._lock = threading.Lock()

    def schedule(self, items: Iterable[tuple[str, Any]]) -> list[str]:
        """Queue the measurement of every (key, item) whose key is new; returns those keys."""
        items = list(items)
        with self._lock:
            order = prefetch_order((key for key, _ in items), self._futures)
            by_key = dict(reversed(items))  # the first item of each key
            for key in order:
                self._futures[key] = self._executor.submit(self._measure, by_key[key])
        return order

    def scheduled(self, key: str) -> bool:
        with self._lock:
            return key in self._futures

    def pending(self, key: str) -> bool:
        """Whether the key's measurement is scheduled and has not ended yet."""
        with self._lock:
            future = self._futures.get(key)
        return future is not None and not future.done()

    def wait(self, key: str, timeout_s: float | None) -> tuple[bool, float]:
        """(whether the key's measurement has ended, seconds waited); (False, 0.0) for a key
        never scheduled; ``timeout_s`` None: no limit (a baseline job has its own timeouts). A
        measurement that raised counts as ended: the caller measures."""
        with self._lock:
            future = self._futures.get(key)
        if future is None:
            return False, 0.0
        start = time.monotonic()
        done, _ = cf.wait([future], timeout=timeout_s)  # a failed one is done too: a miss
        return bool(done), time.monotonic() - start

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
