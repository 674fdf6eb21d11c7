"""The served app as ``multiminddev serve`` builds it (``serve/extras.py``): jobs are assigned
A/B arms from the state folder, each arm's adapters load into the registry, finished jobs are
recorded on their arm and survive a restart; the page and ``/metrics`` are served."""

from __future__ import annotations

import json
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


def test_a_job_naming_an_unknown_arm_is_refused(served):
    url = served["server"].url
    reply = httpx.post(f"{url}/v1/kernels/optimize", timeout=60,
                       json={"module": RELU, "turns": 1, "max_new_tokens": 8, "arm": "zzz"})
    assert reply.status_code == 404 and "zzz" in reply.json()["error"]["message"]


def test_a_job_naming_its_arm_runs_on_that_arms_adapters_and_is_recorded_there(served):
    url = served["server"].url
    for arm, adapters in (("control", {}), ("tuned", {"generator": "tuned-generator"})):
        reply = httpx.post(f"{url}/v1/kernels/optimize", timeout=60,
                           json={"module": RELU, "turns": 1, "max_new_tokens": 8, "arm": arm})
        assert reply.status_code == 202
        job = _wait(url, reply.json()["id"])
        assert (job["arm"], job["adapters"], job["status"]) == (arm, adapters, "succeeded")
        recorded = [o.arm for o in _outcomes(served["state"]) if o.job_id == job["id"]]
        assert recorded == [arm]


def _outcomes(state):
    from multiminddev.serve.ab import ABStore

    with ABStore.in_state_dir(state) as store:
        return store.outcomes()


def test_jobs_are_found_after_a_restart_on_the_same_state_folder(served):
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig

    earlier = served["jobs"][0]
    config = ServeConfig(device="cpu", state_dir=str(served["state"]))
    with UvicornThread(build_app(config), lifespan="off") as again:
        reply = httpx.get(f"{again.url}/v1/kernels/jobs/{earlier['id']}", timeout=30)
        assert reply.status_code == 200
        assert {k: reply.json()[k] for k in ("status", "arm", "best_source")} == \
            {k: earlier[k] for k in ("status", "arm", "best_source")}
        with httpx.stream("GET", f"{again.url}/v1/kernels/jobs/{earlier['id']}/events",
                          timeout=30) as events:
            lines = [line for line in events.iter_lines() if line.startswith("event: ")]
        assert lines == ["event: done"]


def test_a_job_the_previous_server_did_not_finish_reads_failed_with_the_reason(served):
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig

    folder = served["state"] / "jobs"
    record = json.loads((folder / f"{served['jobs'][0]['id']}.json").read_text())
    unfinished = {**record, "id": "0123456789abcdef", "status": "running", "finished": None}
    (folder / "0123456789abcdef.json").write_text(json.dumps(unfinished))
    config = ServeConfig(device="cpu", state_dir=str(served["state"]))
    with UvicornThread(build_app(config), lifespan="off") as again:
        job = httpx.get(f"{again.url}/v1/kernels/jobs/0123456789abcdef", timeout=30).json()
    assert job["status"] == "failed" and "stopped before this job finished" in job["error"]
