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

RELU = load_problem_source("""import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(1024)]
def get_init_inputs():
    return []
""", name="relu")


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


def test_the_harness_isolates_itself_before_it_needs_a_gpu(tmp_path):
    """Run as ncu runs it, on this machine: it reads its inputs, sets up the worker's boundary
    and stops at the GPU check, before any candidate code (here one that would write a file)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the real profile's test covers the harness")
    marker = tmp_path / "ran"
    (tmp_path / "problem.py").write_text(RELU.source)
    (tmp_path / "candidate.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "config.json").write_text(json.dumps(EvalConfig().to_dict()))
    done = subprocess.run([sys.executable, "-m", "multiminddev.env.profile_harness",
                           str(tmp_path / "problem.py"), str(tmp_path / "candidate.py"),
                           str(tmp_path / "config.json"), "relu"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == harness.NO_GPU_EXIT, done.stderr[-500:]
    assert not marker.exists()
