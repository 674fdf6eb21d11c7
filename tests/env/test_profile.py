"""Nsight Compute profiles: what an ncu run's exit status and output mean, and the harness's
boundary on a machine without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from multiminddev.env import profile_harness as harness
from multiminddev.env.config import EvalConfig
from multiminddev.env.profile import ProfileStatus, profile_from_output, profile_kernel
from multiminddev.tasks.problem import load_problem_source
from tests.problems import RELU_1024

RELU = load_problem_source(RELU_1024, name="relu")


def test_without_ncu_nothing_runs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    profile = profile_kernel(RELU, "raise SystemExit('must not run')")
    assert profile.status is ProfileStatus.SKIPPED and "ncu" in profile.message


def test_a_harness_that_stopped_before_the_candidate_names_the_step():
    profile = profile_from_output(harness.ISOLATION_EXIT, "", "IsolationError: refused")
    assert profile.status is ProfileStatus.FAILED
    assert profile.message.startswith("the evaluation boundary could not be set up")


def test_a_run_without_a_profiled_kernel_is_a_failure():
    profile = profile_from_output(0, "==PROF== Disconnected from process 1\n", "")
    assert profile.status is ProfileStatus.FAILED and "no kernel" in profile.message


def test_no_gpu_is_a_skip_not_a_failure():
    assert profile_from_output(harness.NO_GPU_EXIT, "", "").status is ProfileStatus.SKIPPED


def _harness_inputs(tmp_path, marker):
    (tmp_path / "problem.py").write_text(RELU.source)
    (tmp_path / "candidate.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "config.json").write_text(json.dumps(EvalConfig().to_dict()))
    return [str(tmp_path / "problem.py"), str(tmp_path / "candidate.py"),
            str(tmp_path / "config.json"), "relu"]


def _no_gpu_here():
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the real profile's test covers the harness")


HARNESS = [sys.executable, "-m", "multiminddev.env.profile_harness"]


def test_the_harness_isolates_itself_before_it_needs_a_gpu(tmp_path):
    """Started as ``profile_kernel`` starts it (the launcher, then the run; here without ncu in
    between): it reads its inputs, its forked child sets up the worker's boundary and stops at
    the GPU check, before any candidate code (here one that would write a file). NO_GPU_EXIT
    comes only from behind a complete boundary: a refused step exits ISOLATION_EXIT."""
    _no_gpu_here()
    marker = tmp_path / "ran"
    args = _harness_inputs(tmp_path, marker)
    done = subprocess.run([*HARNESS, "launch", args[2], "--", *HARNESS, *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == harness.NO_GPU_EXIT, done.stderr[-500:]
    assert not marker.exists()


def test_a_profiled_run_outside_a_private_network_stops_before_the_candidate(tmp_path):
    """Started without the launcher, on the host's network: refused, the candidate unread."""
    from multiminddev.env.isolation import network_interfaces

    if network_interfaces() == ["lo"]:
        pytest.skip("this machine's network namespace has a loopback alone")
    marker = tmp_path / "ran"
    done = subprocess.run([*HARNESS, *_harness_inputs(tmp_path, marker)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == harness.ISOLATION_EXIT, done.stderr[-500:]
    assert "launch" in done.stderr and not marker.exists()


def test_the_launcher_refuses_a_malformed_command_line(tmp_path):
    done = subprocess.run([*HARNESS, "launch", "config.json", "echo"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == harness.SETUP_EXIT and "usage" in done.stderr
