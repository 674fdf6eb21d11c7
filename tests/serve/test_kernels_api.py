"""The kernel-optimization API against a real server: jobs run real episodes (embedded model
on the CPU, the real evaluator, compile-only without a GPU)."""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import pytest

from tests.conftest import FIXTURES
from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced

RELU = (FIXTURES / "problems" / "1_relu.py").read_text()
SMALL = {"turns": 1, "max_new_tokens": 8, "temperature": 0}


def submit(server, **body):
    return httpx.post(f"{server.url}/v1/kernels/optimize", json={"module": RELU, **SMALL, **body},
                      timeout=60)


def wait(server, job_id, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{server.url}/v1/kernels/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture(scope="module")
def jobs(server):
    """One failing and one normal job, submitted together and run to their end, with an
    on_finished callback watching (episodes on the CPU are slow, so the tests share them)."""
    finished = []
    server.app.state.jobs.on_finished.append(finished.append)
    # ~19 kB of hex names: far more prompt tokens than the window leaves next to 4000 new
    # ones, so this episode fails before it generates anything
    names = "\n".join(f"# {random.Random(i).getrandbits(128):032x}" for i in range(500))
    failing = submit(server, module=RELU + "\n" + names, max_new_tokens=4000)
    normal = submit(server)
    try:
        assert (failing.status_code, normal.status_code) == (202, 202)
        ids = {"failing": failing.json()["id"], "normal": normal.json()["id"]}
        polled = {key: wait(server, job_id) for key, job_id in ids.items()}
    finally:
        server.app.state.jobs.on_finished.remove(finished.append)
    return {"ids": ids, "polled": polled, "finished": finished}


def test_an_optimize_job_runs_its_turns_and_reports_them(jobs):
    job = jobs["polled"]["normal"]
    assert job["status"] == "succeeded"
    assert [t["role"] for t in job["turns"]] == ["generator"]
    assert job["adapters"] == {"generator": "generator"}  # the adapter named after the role


def test_job_events_replay_every_turn_then_done(server, jobs):
    job_id = jobs["ids"]["normal"]
    with httpx.stream("GET", f"{server.url}/v1/kernels/jobs/{job_id}/events",
                      timeout=240) as reply:
        events = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: ")]
    assert [e["event"] for e in events] == ["started", "turn", "done"]
    assert events[-1]["status"] == "succeeded"


def test_on_finished_callbacks_see_each_job(jobs):
    seen = {(j.id, j.arm, j.status.value) for j in jobs["finished"]}
    ids = jobs["ids"]
    assert seen == {(ids["failing"], None, "failed"), (ids["normal"], None, "succeeded")}


def test_a_failing_job_leaves_another_unharmed(jobs):
    failed, normal = jobs["polled"]["failing"], jobs["polled"]["normal"]
    assert failed["status"] == "failed" and "prompt does not fit" in failed["error"]
    assert normal["status"] == "succeeded"


def test_finished_jobs_are_written_to_the_state_dir(server, jobs):
    folder = server.app.state.config.jobs_dir
    written = json.loads((folder / f"{jobs['ids']['normal']}.json").read_text())
    assert written["status"] == "succeeded" and written["source"] == RELU


def test_a_job_whose_agent_writes_a_kernel_gets_it_evaluated(server):
    """The evaluation half of a job: a backend that replays a working kernel (the embedded
    model does not write one in a few tokens); compile-only on a machine without a GPU."""
    jobs = server.app.state.jobs
    tokenizer = server.app.state.registry.tokenizer
    served = jobs.backend_for
    jobs.backend_for = lambda adapters: ReplayBackend(tokenizer,
                                                      lambda role, call, i: fenced(RELU_KERNEL))
    try:
        job = wait(server, submit(server).json()["id"])
    finally:
        jobs.backend_for = served
    assert job["status"] == "succeeded" and job["best_source"]
    assert job["best_result"]["status"] in ("ok", "no_gpu")
    assert job["compile_only"] == (job["best_result"]["status"] == "no_gpu")


@pytest.mark.parametrize(("body", "status"), [
    ({"module": "class Model(:\n"}, 422),  # not Python
    ({"module": "x = 1\n"}, 422),  # no Model
    ({"module": "#" * 30_000}, 413),  # over max_module_bytes
    ({"module": RELU, "adapters": {"generator": "nope"}}, 404),
    ({"module": RELU, "adapters": {"tester": "base"}}, 422),
    ({"module": RELU, "turns": 0}, 400),
    ({"module": RELU, "turns": 99}, 400),  # every value out of range: 400, like turns 0
    ({"module": RELU, "max_new_tokens": 10**6}, 400),
    ({"module": RELU, "arm": "b"}, 404),  # no such arm: the outcome could go nowhere
    ({"module": RELU, "arm": "b", "adapters": {"generator": "base"}}, 400),
    ({"modul": RELU}, 400),
])
def test_bad_modules_get_a_4xx_with_a_one_line_message(server, body, status):
    reply = httpx.post(f"{server.url}/v1/kernels/optimize", json=body, timeout=60)
    assert reply.status_code == status
    message = reply.json()["error"]["message"]
    assert message and "\n" not in message


def test_a_body_that_is_not_json_gets_400(server):
    reply = httpx.post(f"{server.url}/v1/kernels/optimize", content=b"module=x",
                       headers={"content-type": "application/json"}, timeout=60)
    assert reply.status_code == 400


def test_an_unknown_job_is_404(server):
    assert httpx.get(f"{server.url}/v1/kernels/jobs/nope", timeout=30).status_code == 404
    traversal = httpx.get(f"{server.url}/v1/kernels/jobs/..%2F..%2Fetc", timeout=30)
    assert traversal.status_code == 404


def test_limits_are_served_and_name_the_field_out_of_range(server):
    limits = httpx.get(f"{server.url}/v1/kernels/limits", timeout=30).json()
    config = server.app.state.config
    assert limits["max_job_turns"] == config.max_job_turns
    reply = submit(server, turns=limits["max_job_turns"] + 1)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "turns"
    below = submit(server, turns=0)
    assert below.status_code == 400 and below.json()["error"]["param"] == "turns"


def test_concurrent_jobs_share_generate_calls(server):
    """Jobs' turns go through the server's batcher: two one-turn jobs that wait while the model
    decodes a completion request take one generate call between them (each alone would take
    the model once), and each gets the greedy reply it gets alone."""
    alone = wait(server, submit(server, max_new_tokens=4).json()["id"])
    batcher = server.app.state.batcher
    before = batcher.batches
    long_reply = {"model": "base", "prompt": "Tell a long story.", "max_tokens": 64,
                  "temperature": 0}

    async def two_jobs_behind_a_completion():
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
            busy = asyncio.create_task(http.post("/v1/completions", json=long_reply))
            await asyncio.sleep(0.5)  # the model is decoding the long reply now
            replies = [await http.post("/v1/kernels/optimize",
                                       json={"module": RELU, **SMALL, "max_new_tokens": 4})
                       for _ in range(2)]
            await busy
            return [r.json()["id"] for r in replies]

    together = [wait(server, job_id) for job_id in asyncio.run(two_jobs_behind_a_completion())]
    assert batcher.batches - before == 2  # the completion, then both jobs' turns at once
    assert [j["turns"][0]["text"] for j in together] == [alone["turns"][0]["text"]] * 2
