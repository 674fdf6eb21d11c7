"""multiminddev doctor: a full JSON report, every check present, never a crash."""

from __future__ import annotations

import json

from multiminddev.cli import main

CHECKS = {"python", "torch", "gpus", "driver", "cuda_core", "nvrtc", "nvcc", "tools", "sandbox", "model"}


def test_doctor_json_reports_every_check(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == CHECKS
    assert report["nvrtc"]["ok"] is True and report["nvrtc"]["arch"].startswith("sm_")
    assert report["torch"]["version"]
