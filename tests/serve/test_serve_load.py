"""The load and fault test (benchmarks/bench_serve_load.py), short: 8 clients for 15 s on
loopback with a SIGKILL and restart of a real ``multiminddev serve`` halfway; no server error,
no accepted job lost, A/B outcomes equal to the succeeded jobs of each arm."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.helpers import load_script
from tests.policy.helpers import require_default_model

pytestmark = pytest.mark.slow  # two server starts on the CPU and 15 s of load


def test_short_load_with_a_kill_and_restart_loses_nothing(tmp_path):
    require_default_model()
    bench = load_script("bench_serve_load")
    out = tmp_path / "load.json"
    code = bench.main(["--clients", "8", "--seconds", "15", "--max-jobs", "6",
                       "--drain-seconds", "90", "--state-dir", str(tmp_path / "state"),
                       "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["server_errors"] == 0, report["server_error_samples"]
    assert report["jobs_accepted"] >= 1 and report["lost"] == []
    assert report["jobs_missing_over_http"] == []
    assert report["ab_missing"] == [] and report["ab_extra"] == []
    assert report["latency"]["chat"]["n"] > 0 and report["latency"]["stream"]["n"] > 0
    assert code == 0 and report["ok"]
