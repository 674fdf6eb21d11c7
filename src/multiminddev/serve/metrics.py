"""Prometheus ``/metrics``: HTTP requests and latency per endpoint, generation (tokens generated,
tokens per second over the last minute, time to first token, requests waiting for the model),
jobs by status, and the A/B arms' outcome counters.

Every server gets its own registry (no process-global state, so several apps can live in one
process). Request metrics are labelled by the route's path template (``/v1/kernels/jobs/{job_id}``),
never the raw path, so job ids do not grow the label set; requests no route matched share the
label ``unmatched``. Latency is measured to the end of the response body, so a server-sent event
stream counts as long as it stays open. Job and A/B figures are read when scraped: the A/B
counters come from the SQLite store and so keep counting across restarts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from multiminddev.serve.ab import ABStore
from multiminddev.serve.batching import GenerationEvent

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
UNMATCHED = "unmatched"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
RATE_WINDOW_S = 60.0  # the tokens-per-second gauge averages over this window


class TokenRate:
    """Tokens per second over the last ``window_s`` seconds (thread-safe)."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, tokens: int, now: float | None = None) -> None:
        with self._lock:
            self._events.append((time.monotonic() if now is None else now, tokens))

    def per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            return sum(tokens for _, tokens in self._events) / self.window_s


class ServeMetrics:
    """The server's registry. ``jobs_by_status() -> {status: count}``, ``store`` and
    ``queue_depth() -> int`` are read at each scrape; any may be None (that family is then left
    out). ``observe_generation`` takes the batcher's ``GenerationEvent``s."""

    def __init__(self, *, jobs_by_status: Callable[[], Mapping[str, int]] | None = None,
                 store: ABStore | None = None, queue_depth: Callable[[], int] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("mmd_http_requests", "HTTP requests by endpoint and status code",
                                ["method", "endpoint", "status"], registry=self.registry)
        self.latency = Histogram("mmd_http_request_duration_seconds",
                                 "HTTP request latency to the end of the response body",
                                 ["method", "endpoint"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.tokens = Counter("mmd_generation_tokens", "Tokens generated, by model",
                              ["model"], registry=self.registry)
        self.time_to_first_token = Histogram(
            "mmd_time_to_first_token_seconds",
            "Seconds from a generation request's arrival to its first token reaching the client",
            ["model"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.token_rate = TokenRate()
        self.registry.register(_ScrapeTimeCollector(jobs_by_status, store, queue_depth,
                                                    self.token_rate))

    def observe_generation(self, event: GenerationEvent) -> None:
        self.tokens.labels(event.model).inc(event.tokens)
        self.time_to_first_token.labels(event.model).observe(event.time_to_first_token_s)
        self.token_rate.add(event.tokens)

    def observe(self, method: str, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(method, endpoint, str(status)).inc()
        self.latency.labels(method, endpoint).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeTimeCollector:
    def __init__(self, jobs_by_status: Callable[[], Mapping[str, int]] | None,
                 store: ABStore | None, queue_depth: Callable[[], int] | None,
                 token_rate: TokenRate):
        self.jobs_by_status = jobs_by_status
        self.store = store
        self.queue_depth = queue_depth
        self.token_rate = token_rate

    def describe(self) -> list[Any]:
        return []  # families are produced at collect time only

    def collect(self) -> Any:
        rate = GaugeMetricFamily("mmd_generation_tokens_per_second",
                                 f"Tokens generated per second over the last {RATE_WINDOW_S:g} s")
        rate.add_metric([], self.token_rate.per_second())
        yield rate
        if self.queue_depth is not None:
            depth = GaugeMetricFamily("mmd_generation_queue_depth",
                                      "Generation requests waiting for a generate call")
            depth.add_metric([], float(self.queue_depth()))
            yield depth
        if self.jobs_by_status is not None:
            jobs = GaugeMetricFamily("mmd_jobs", "Kernel-optimization jobs by status",
                                     labels=["status"])
            for status, count in sorted(self.jobs_by_status().items()):
                jobs.add_metric([str(status)], float(count))
            yield jobs
        if self.store is None:
            return
        counts = self.store.counts()
        arms = self.store.arms()
        families = {
            "outcomes": CounterMetricFamily("mmd_ab_outcomes", "A/B outcomes recorded per arm",
                                            labels=["arm"]),
            "compiled": CounterMetricFamily("mmd_ab_compiled", "A/B outcomes that compiled",
                                            labels=["arm"]),
            "measured": CounterMetricFamily("mmd_ab_measured",
                                            "A/B outcomes whose correctness was measured",
                                            labels=["arm"]),
            "correct": CounterMetricFamily("mmd_ab_correct", "A/B outcomes that were correct",
                                           labels=["arm"]),
        }
        weight = GaugeMetricFamily("mmd_ab_arm_weight", "A/B arm traffic weight",
                                   labels=["arm"])
        for arm in arms:
            row = counts.get(arm.name, {})
            for key, family in families.items():
                family.add_metric([arm.name], float(row.get(key, 0)))
            weight.add_metric([arm.name], arm.weight)
        yield from families.values()
        yield weight


class MetricsMiddleware:
    """Pure ASGI middleware (streams pass through untouched) that times every HTTP request."""

    def __init__(self, app: Any, metrics: ServeMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception before the response starts is a server error

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")  # FastAPI puts the matched route into the scope
            endpoint = getattr(route, "path", None) or UNMATCHED
            self.metrics.observe(scope.get("method", ""), endpoint, status,
                                 time.perf_counter() - start)


def metrics_router(metrics: ServeMetrics) -> APIRouter:
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", response_class=Response,
                responses={200: {"content": {"text/plain": {}}}})
    def exposition() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router


def install_metrics(app: FastAPI, metrics: ServeMetrics) -> None:
    """Time every request of ``app`` and serve ``/metrics``; call before the app starts."""
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.include_router(metrics_router(metrics))
