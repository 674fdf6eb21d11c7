"""multiminddev doctor: a full JSON report, every check present, never a crash."""

from __future__ import annotations

import json
import re

from multiminddev.cli import main

CHECKS = {"python", "torch", "gpus", "driver", "cuda_core", "nvrtc", "nvcc", "tools", "sandbox",
          "isolation", "model"}


def test_doctor_json_reports_every_check(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == CHECKS
    assert report["nvrtc"]["ok"] is True and report["nvrtc"]["arch"].startswith("sm_")
    assert report["torch"]["version"]


def test_doctor_reports_the_workers_os_boundary(capsys):
    assert main(["doctor", "--json"]) == 0
    isolation = json.loads(capsys.readouterr().out)["isolation"]
    # probed in a child process: either a named set of namespaces or "none: <why>"
    assert re.fullmatch(r"namespaces \([a-z, ]+\), (read-only filesystem|filesystem NOT "
                        r"read-only)|none: .+", isolation["boundary"]), isolation
    assert isolation["ok"] is (isolation["status"] == "active")
