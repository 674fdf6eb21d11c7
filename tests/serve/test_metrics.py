"""``/metrics`` read back through prometheus-client's own text parser, from a real server."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families

from multiminddev.serve.ab import ABStore, Outcome
from multiminddev.serve.metrics import ServeMetrics
from tests.episode.helpers import RELU_PROBLEM
from tests.serve.helpers import UvicornThread, job_app


@pytest.fixture
def served(tmp_path):
    store = ABStore.in_state_dir(tmp_path)
    store.add_arm("base")
    store.add_arm("new", weight=0.0)
    holder: dict = {}

    def jobs_by_status():
        statuses = [j.status for j in holder["app"].state.jobs.values()]
        return {s: statuses.count(s) for s in set(statuses)}

    metrics = ServeMetrics(jobs_by_status=jobs_by_status, store=store)
    holder["app"] = app = job_app(store, None, [], metrics=metrics)
    with UvicornThread(app) as srv:
        yield srv, store
    store.close()


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _run_job(url: str) -> str:
    response = httpx.post(url + "/v1/kernels/optimize", json={"module": RELU_PROBLEM})
    job_id = response.json()["id"]
    with httpx.stream("GET", f"{url}/v1/kernels/jobs/{job_id}/events") as events:
        assert "event: done" in "".join(events.iter_text())
    return job_id


def test_requests_are_counted_per_route_template(served):
    srv, _ = served
    ids = [_run_job(srv.url) for _ in range(2)]
    for job_id in ids:
        httpx.get(f"{srv.url}/v1/kernels/jobs/{job_id}")
    key = ("mmd_http_requests_total",
           (("endpoint", "/v1/kernels/jobs/{job_id}"), ("method", "GET"), ("status", "200")))
    assert _samples(srv.url)[key] == 2.0


def test_job_ids_never_become_labels(served):
    srv, _ = served
    job_id = _run_job(srv.url)
    httpx.get(f"{srv.url}/v1/kernels/jobs/{job_id}")
    assert job_id not in httpx.get(srv.url + "/metrics").text


def test_unknown_paths_share_one_label(served):
    srv, _ = served
    for path in ("/a", "/b/c"):
        httpx.get(srv.url + path)
    key = ("mmd_http_requests_total",
           (("endpoint", "unmatched"), ("method", "GET"), ("status", "404")))
    assert _samples(srv.url)[key] == 2.0


def test_bad_requests_are_counted_with_their_status(served):
    srv, _ = served
    assert httpx.post(srv.url + "/v1/kernels/optimize", json={"module": "("}).status_code == 400
    key = ("mmd_http_requests_total",
           (("endpoint", "/v1/kernels/optimize"), ("method", "POST"), ("status", "400")))
    assert _samples(srv.url)[key] == 1.0


def test_latency_histogram_counts_each_request(served):
    srv, _ = served
    _run_job(srv.url)
    key = ("mmd_http_request_duration_seconds_count",
           (("endpoint", "/v1/kernels/jobs/{job_id}/events"), ("method", "GET")))
    assert _samples(srv.url)[key] == 1.0


def test_jobs_by_status(served):
    srv, _ = served
    _run_job(srv.url)
    _run_job(srv.url)
    assert _samples(srv.url)[("mmd_jobs", (("status", "succeeded"),))] == 2.0


def test_per_arm_outcome_counters(served):
    srv, store = served
    store.record(Outcome(arm="new", problem_hash="p", compiled=True, correct=True, speedup=2.0,
                         reward=1.0, latency_s=1.0))
    _run_job(srv.url)  # base (new has weight 0): no kernel
    samples = _samples(srv.url)
    assert samples[("mmd_ab_outcomes_total", (("arm", "base"),))] == 1.0
    assert samples[("mmd_ab_compiled_total", (("arm", "base"),))] == 0.0
    assert samples[("mmd_ab_correct_total", (("arm", "new"),))] == 1.0
    assert samples[("mmd_ab_arm_weight", (("arm", "new"),))] == 0.0


def test_generation_is_measured_for_whole_replies_and_streams(server):
    """The real server with the embedded model: tokens, time to first token and the queue."""
    def generation(samples):
        return {name: value for (name, labels), value in samples.items()
                if name.startswith(("mmd_generation", "mmd_time_to_first_token"))
                and dict(labels).get("model", "base") == "base"}

    before = generation(_samples(server.url))
    body = {"model": "base", "prompt": "def relu(x):", "max_tokens": 4, "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                      timeout=120) as reply:
        assert "[DONE]" in "".join(reply.iter_text())
    after = generation(_samples(server.url))
    tokens = whole["usage"]["completion_tokens"] * 2  # greedy: the stream decodes the same
    assert after["mmd_generation_tokens_total"] - before.get(
        "mmd_generation_tokens_total", 0) == tokens
    assert after["mmd_time_to_first_token_seconds_count"] - before.get(
        "mmd_time_to_first_token_seconds_count", 0) == 2
    assert after["mmd_generation_tokens_per_second"] > 0
    assert after["mmd_generation_queue_depth"] == 0
