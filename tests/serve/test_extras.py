"""The served app as ``multiminddev serve`` builds it (``serve/extras.py``): jobs are assigned
A/B arms from the state folder, each arm's adapters load into the registry, finished jobs are
recorded on their arm and survive a restart; the page and ``/metrics`` are served."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import FIXTURES
from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced
from tests.serve.server_helpers import UvicornThread

RELU = (FIXTURES / "problems" / "1_relu.py").read_text()


@pytest.fixture(scope="module")
def served(adapter_dir, tmp_path_factory):
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig
    from multiminddev.serve.ab import ABStore

    state = tmp_path_factory.mktemp("ab-state")
    with ABStore.in_state_dir(state) as store:
        store.add_arm("control", None, weight=1.0)
        store.add_arm("tuned", {"generator": str(adapter_dir)}, weight=1.0)
    app = build_app(ServeConfig(device="cpu", state_dir=str(state), max_running_jobs=2))
    running = UvicornThread(app).start()
    tokenizer = app.state.registry.tokenizer
    # the agents replay a known kernel: a real compile-only evaluation per job, in seconds
    app.state.jobs.backend_for = lambda adapters: ReplayBackend(
        tokenizer, lambda role, call, i: fenced(RELU_KERNEL))
    ids = [httpx.post(f"{running.url}/v1/kernels/optimize", timeout=60,
                      json={"module": RELU, "turns": 1, "max_new_tokens": 8}).json()["id"]
           for _ in range(6)]
    jobs = [_wait(running.url, i) for i in ids]
    yield {"server": running, "state": state, "jobs": jobs}
    running.stop()


def _wait(url, job_id, timeout=300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/kernels/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not finish")


def test_every_job_gets_an_arm_and_its_adapters(served):
    jobs = served["jobs"]
    assert all(j["status"] == "succeeded" for j in jobs), jobs
    for job in jobs:
        assert job["arm"] in ("control", "tuned")
        expected = {} if job["arm"] == "control" else {"generator": "tuned-generator"}
        assert job["adapters"] == expected


def test_the_tuned_arm_adapter_is_loaded_under_its_arm_name(served):
    if any(j["arm"] == "tuned" for j in served["jobs"]):
        names = [m["id"] for m in httpx.get(f"{served['server'].url}/v1/models").json()["data"]]
        assert "tuned-generator" in names


def test_finished_jobs_are_recorded_on_their_arms(served):
    status = httpx.get(f"{served['server'].url}/v1/ab/status", timeout=30).json()
    counts = {a["name"]: a["n"] for a in status["arms"]}
    expected = {"control": 0, "tuned": 0}
    for job in served["jobs"]:
        expected[job["arm"]] += 1
    assert counts == expected


def test_outcomes_survive_the_server(served):
    from multiminddev.serve.ab import ABStore

    with ABStore.in_state_dir(served["state"]) as store:
        assert sorted(o.job_id for o in store.outcomes()) == sorted(j["id"] for j in served["jobs"])


def test_the_page_and_metrics_are_served(served):
    url = served["server"].url
    page = httpx.get(url + "/", timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert 'status="succeeded"' in metrics
