"""A real server on a free port (uvicorn in a thread) with the embedded model on the CPU, and a
real LoRA adapter made with peft, shared by every test of this folder."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.policy.helpers import require_default_model
from tests.serve.server_helpers import UvicornThread, make_adapter


@pytest.fixture(scope="package")
def adapter_dir(tmp_path_factory) -> Path:
    require_default_model()
    return make_adapter(tmp_path_factory.mktemp("adapter") / "tuned")


@pytest.fixture(scope="package")
def server(adapter_dir, tmp_path_factory):
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig

    config = ServeConfig(device="cpu", adapters={"generator": str(adapter_dir)},
                         max_module_bytes=20_000, max_running_jobs=2,
                         state_dir=str(tmp_path_factory.mktemp("state")),
                         adapter_roots=[str(adapter_dir.parent)])
    running = UvicornThread(build_app(config)).start()  # as `multiminddev serve` builds it
    yield running
    running.stop()


@pytest.fixture(scope="package")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                         timeout=120)
