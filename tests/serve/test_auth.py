"""API keys and adapter roots (``serve.auth``) against a real uvicorn server (``lifespan="off"``:
no model is loaded, which none of these routes needs before it checks its caller)."""

from __future__ import annotations

import httpx
import pytest

from multiminddev.serve.auth import PathOutsideRootsError, bearer_matches, confine_adapter_path
from tests.serve.server_helpers import UvicornThread

KEY = "k-123"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig

    state = tmp_path_factory.mktemp("keyed-state")
    config = ServeConfig(device="cpu", state_dir=str(state), api_key=KEY)
    with UvicornThread(build_app(config), lifespan="off") as srv:
        yield srv, state


def test_the_openai_client_needs_the_key(keyed):
    openai = pytest.importorskip("openai")
    url = f"{keyed[0].url}/v1"
    with pytest.raises(openai.AuthenticationError) as refused:
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
    assert refused.value.body["code"] == "invalid_api_key"
    models = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0).models.list()
    assert [m.id for m in models.data] == ["base"]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "x"}),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
    ("POST", "/v1/ab/weights", {"weights": {"a": 1.0}}),
    ("POST", "/v1/ab/promote", {"arm": "a"}),
    ("POST", "/v1/ab/arms", {"name": "a"}),
    ("POST", "/v1/kernels/optimize", {"module": "x"}),
    ("GET", "/v1/ab/status", None),
])
def test_every_v1_route_without_the_key_is_401(keyed, method, path, body):
    reply = httpx.request(method, keyed[0].url + path, json=body, timeout=30)
    assert reply.status_code == 401
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_the_page_health_and_metrics_stay_open(keyed):
    for path in ("/", "/health", "/metrics"):
        assert httpx.get(keyed[0].url + path, timeout=30).status_code == 200


@pytest.mark.parametrize("path", ["/etc", "../../../etc", "/tmp"])
def test_adapter_paths_outside_the_roots_are_refused(keyed, path):
    reply = httpx.post(keyed[0].url + "/v1/load_lora_adapter", timeout=30,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={"lora_name": "x", "lora_path": path})
    assert reply.status_code == 403 and reply.json()["error"]["param"] == "lora_path"


def test_ab_arms_outside_the_roots_are_refused(keyed, tmp_path):
    reply = httpx.post(keyed[0].url + "/v1/ab/arms", timeout=30,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={"name": "elsewhere", "path": str(tmp_path)})
    assert reply.status_code == 403


def test_a_symlink_out_of_a_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "inside").mkdir()
    (root / "link").symlink_to(tmp_path)
    assert confine_adapter_path("inside", [root]) == (root / "inside").resolve()
    with pytest.raises(PathOutsideRootsError):
        confine_adapter_path("link", [root])
    with pytest.raises(PathOutsideRootsError):
        confine_adapter_path(str(root / "inside" / ".." / ".."), [root])


def test_bearer_is_compared_whole():
    assert bearer_matches(f"Bearer {KEY}", KEY) and bearer_matches(f"bearer  {KEY}", KEY)
    assert not bearer_matches(KEY, KEY) and not bearer_matches(f"Bearer {KEY}x", KEY)
    assert not bearer_matches(None, KEY)


def test_a_host_beyond_loopback_needs_a_key():
    from multiminddev.serve import ServeConfig

    with pytest.raises(ValueError, match="--api-key"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", api_key="k").api_key == "k"
    assert ServeConfig(host="::1").api_key is None


def test_serve_on_a_public_host_without_a_key_exits_with_one_line(capsys, monkeypatch):
    from multiminddev.cli import main

    monkeypatch.delenv("MULTIMINDDEV_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--adapters", "none"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--api-key" in err and "MULTIMINDDEV_API_KEY" in err
