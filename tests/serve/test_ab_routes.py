"""The A/B HTTP routes and ``multiminddev ab`` against real uvicorn servers and a real store."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from fastapi import FastAPI

from multiminddev.cli import main
from multiminddev.serve.ab import ABStore
from multiminddev.serve.ab_routes import ab_router
from tests.serve.helpers import UvicornThread, job_app


def _checkpoint(root):
    for role in ("generator", "optimizer"):
        (root / role).mkdir(parents=True)
        (root / role / "adapter_config.json").write_text("{}")
    return root


@pytest.fixture
def served(tmp_path):
    store = ABStore.in_state_dir(tmp_path / "state")
    store.add_arm("base")
    app = FastAPI()
    app.include_router(ab_router(store, admin_token="s3cret"))
    with UvicornThread(app) as srv:
        yield srv, store
    store.close()


AUTH = {"Authorization": "Bearer s3cret"}


def test_add_arm_from_a_checkpoint_folder(served, tmp_path):
    srv, store = served
    ck = _checkpoint(tmp_path / "ck")
    r = httpx.post(srv.url + "/v1/ab/arms", json={"name": "run7", "path": str(ck), "weight": 0.5},
                   headers=AUTH)
    assert r.status_code == 201
    assert store.arm("run7").adapters == {"generator": str(ck / "generator"),
                                          "optimizer": str(ck / "optimizer")}


def test_changes_need_the_admin_token(served):
    srv, _ = served
    r = httpx.post(srv.url + "/v1/ab/promote", json={"arm": "base"})
    assert r.status_code == 401 and "admin token" in r.json()["detail"]
    assert httpx.get(srv.url + "/v1/ab/status").status_code == 200


@pytest.mark.parametrize("body,code,needle", [
    ({"name": "x", "path": "/no/such/folder"}, 400, "not a folder"),
    ({"name": "base"}, 409, "exists"),
    ({"name": "bad name!"}, 400, "arm name"),
    ({"name": "x", "adapters": {"generator": "/no/such"}}, 400, "does not exist"),
])
def test_bad_arms_get_a_clear_4xx(served, body, code, needle):
    srv, _ = served
    r = httpx.post(srv.url + "/v1/ab/arms", json=body, headers=AUTH)
    assert r.status_code == code and needle in r.json()["detail"]


def test_promote_over_http(served):
    srv, store = served
    store.add_arm("new", weight=0.1)
    r = httpx.post(srv.url + "/v1/ab/promote", json={"arm": "new"}, headers=AUTH)
    assert r.status_code == 200
    assert {a["name"]: a["share"] for a in r.json()["arms"]} == {"base": 0.0, "new": 1.0}
    assert httpx.post(srv.url + "/v1/ab/promote", json={"arm": "zz"},
                      headers=AUTH).status_code == 404


def test_server_restart_mid_ab_keeps_every_outcome(tmp_path):
    """Jobs finished through one server are all in the next server's status."""
    state = tmp_path / "state"
    store = ABStore.in_state_dir(state)
    store.add_arm("base")
    store.add_arm("new", weight=1.0)
    # No candidate kernels: each job ends at once with a "no kernel" outcome on its arm.
    with UvicornThread(job_app(store, evaluator=None, candidates=[])) as srv:
        ids = [httpx.post(srv.url + "/v1/kernels/optimize",
                          json={"module": _problem_source()}).json()["id"]
               for _ in range(12)]
        jobs = [_wait_done(srv.url, i) for i in ids]
    store.close()

    reopened = ABStore.in_state_dir(state)
    with UvicornThread(job_app(reopened, evaluator=None, candidates=[])) as srv:
        status = httpx.get(srv.url + "/v1/ab/status").json()
    reopened.close()
    assert status["outcomes"] == 12
    per_arm = {a["name"]: a["n"] for a in status["arms"]}
    assert per_arm == {arm: sum(j["arm"] == arm for j in jobs) for arm in ("base", "new")}


def _problem_source() -> str:
    from tests.episode.helpers import RELU_PROBLEM

    return RELU_PROBLEM


def _wait_done(url: str, job_id: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/v1/kernels/jobs/{job_id}").json()
        if job["status"] == "succeeded":
            return job
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not finish")


# ------------------------------------------------------------------------------ the CLI


def test_cli_changes_reach_a_running_server_through_the_shared_file(served, capsys):
    srv, _ = served
    state = served[1].path.parent
    assert main(["ab", "add-arm", "new", "--state-dir", str(state), "--weight", "3"]) == 0
    status = httpx.get(srv.url + "/v1/ab/status").json()
    assert {a["name"]: a["share"] for a in status["arms"]} == {"base": 0.25, "new": 0.75}


def test_cli_promote_over_url(served, capsys):
    srv, store = served
    store.add_arm("new")
    assert main(["ab", "promote", "new", "--url", srv.url, "--token", "s3cret"]) == 0
    assert store.control() == "new"


def test_cli_status_over_url_prints_every_arm(served, capsys):
    srv, store = served
    store.add_arm("new")
    assert main(["ab", "status", "--url", srv.url, "--json"]) == 0
    assert [a["name"] for a in json.loads(capsys.readouterr().out)["arms"]] == ["base", "new"]


def test_cli_refusal_is_one_line(served, capsys):
    srv, _ = served
    assert main(["ab", "promote", "zz", "--url", srv.url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 401" in err


def test_cli_status_table(tmp_path, capsys):
    with ABStore.in_state_dir(tmp_path) as store:
        store.add_arm("base")
        store.add_arm("run7")
    assert main(["ab", "status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["arm", "traffic", "n"]
    assert out[1].startswith("base *") and "control" in out[1]
    assert out[2].startswith("run7") and "insufficient_data" in out[2]


def test_cli_status_without_arms_says_how_to_add_one(tmp_path, capsys):
    assert main(["ab", "status", "--state-dir", str(tmp_path)]) == 2
    assert "ab add-arm" in capsys.readouterr().err


def test_cli_add_arm_reads_the_checkpoint_folder(tmp_path, capsys):
    ck = _checkpoint(tmp_path / "ck")
    assert main(["ab", "add-arm", "run7", str(ck), "--state-dir", str(tmp_path / "s")]) == 0
    with ABStore.in_state_dir(tmp_path / "s") as store:
        assert sorted(store.arm("run7").adapters) == ["generator", "optimizer"]


def test_cli_promote_on_a_wrong_state_dir_writes_nothing(tmp_path, capsys):
    assert main(["ab", "promote", "base", "--state-dir", str(tmp_path / "typo")]) == 2
    assert not (tmp_path / "typo").exists()


def test_install_ab_records_each_finished_job(tmp_path):
    from dataclasses import dataclass, field

    from multiminddev.serve.ab_routes import install_ab

    @dataclass
    class Jobs:  # the job manager's hook list, which install_ab appends to
        on_finished: list = field(default_factory=list)

    @dataclass
    class Job:
        id: str = "j1"
        arm: str = "base"
        source: str = "src"
        status: str = "succeeded"
        episode: object = None
        latency_s: float = 2.0

    app = FastAPI()
    app.state.jobs = Jobs()
    with ABStore.in_state_dir(tmp_path) as store:
        store.add_arm("base")
        install_ab(app, store)
        for callback in app.state.jobs.on_finished:
            callback(Job())
        assert [(o.arm, o.job_id, o.compiled) for o in store.outcomes()] == [("base", "j1", False)]
        from fastapi.testclient import TestClient

        assert TestClient(app).get("/v1/ab/status").json()["outcomes"] == 1
