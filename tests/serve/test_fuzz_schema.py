"""The HTTP API fuzzed from its own OpenAPI schema with schemathesis: a bounded number of
generated requests per operation against a real server (the embedded model on the CPU, with a
small ``max_tokens`` limit so generation stays cheap); no answer may be a server error (5xx)
and every answer must conform to the schema and its content type."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from tests.policy.helpers import require_default_model
from tests.serve.server_helpers import UvicornThread

EXAMPLES_PER_OPERATION = 15
# Streams and the job events never end on their own while a job runs; the page is HTML.
SKIPPED = {"/v1/kernels/jobs/{job_id}/events", "/", "/static/{path}"}


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory):
    require_default_model()
    from multiminddev.commands.serve import build_app
    from multiminddev.serve import ServeConfig

    config = ServeConfig(device="cpu", max_tokens_limit=4, max_job_turns=1,
                         max_running_jobs=1, state_dir=str(tmp_path_factory.mktemp("fuzz")))
    with UvicornThread(build_app(config), start_timeout_s=600) as srv:
        yield srv


def _operations(url):
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path not in SKIPPED:
            yield operation


def test_no_generated_request_gets_a_server_error(fuzzed_server):
    url = fuzzed_server.url
    failures = []
    operations = list(_operations(url))
    assert any(op.path == "/v1/completions" for op in operations)
    for operation in operations:
        @hypothesis.settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                             derandomize=True, phases=[hypothesis.Phase.generate],
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=operation.as_strategy())
        def fuzz(case):
            response = case.call(base_url=url, timeout=120)
            case.validate_response(response, checks=[not_a_server_error,
                                                     response_schema_conformance,
                                                     content_type_conformance])

        try:
            fuzz()
        except Exception as exc:  # noqa: BLE001 - every operation is fuzzed, then all reported
            failures.append(f"{operation.method.upper()} {operation.path}: "
                            f"{' '.join(str(exc).split())[:600]}")
    assert not failures, "\n".join(failures)
