"""The Tester's report of Nsight Compute figures, from ncu's own CSV output."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiminddev.agents.tester import profiler_feedback, stall_reasons
from multiminddev.agents.tester import tester_feedback as report_of
from multiminddev.env import profile as p
from multiminddev.env.profile import KernelProfile, ProfileStatus, parse_ncu_csv

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ncu" / "softmax_two_kernels.csv"


@pytest.fixture
def kernels():
    return parse_ncu_csv(FIXTURE.read_text())


def test_the_csv_gives_one_entry_per_launch_in_order(kernels):
    assert [k.kernel for k in kernels] == ["softmax_max_kernel", "softmax_norm_kernel"]


def test_times_are_nanoseconds_whatever_unit_ncu_printed(kernels):
    assert kernels[0].metrics[p.DURATION] == 9856.0  # "9,856" nsecond
    assert kernels[1].metrics[p.DURATION] == pytest.approx(21340.0)  # 21.34 usecond


def test_output_without_the_table_gives_no_kernel():
    assert parse_ncu_csv("==PROF== Connected to process 1\n==PROF== Disconnected\n") == []


def test_the_report_is_of_the_longest_launch(kernels):
    text = profiler_feedback(KernelProfile(status=ProfileStatus.OK, kernels=tuple(kernels)))
    assert text.splitlines()[0] == ("Profiler (Nsight Compute, kernel softmax_norm_kernel, the "
                                    "longest of 2 launches, 21.3 us):")
    assert "- achieved occupancy: 48.5% of the SM's warp slots" in text
    assert "- memory throughput: 80.4% of peak (DRAM 78.9%)" in text
    assert "- warp execution efficiency: 87% (27.8 of 32 threads active per instruction)" in text
    assert ("- top stall reasons (cycles per issued instruction): long_scoreboard 14.9, "
            "barrier 6.0, wait 2.5") in text
    assert "Reading: memory-bound" in text


def test_the_issuing_cycle_is_no_stall_reason(kernels):
    assert "selected" not in [reason for reason, _ in stall_reasons(kernels[0].metrics)]


def test_a_profile_without_figures_adds_nothing():
    for profile in (None, KernelProfile(status=ProfileStatus.SKIPPED, message="no ncu"),
                    KernelProfile(status=ProfileStatus.FAILED, message="exit 13")):
        assert profiler_feedback(profile) == ""


def test_the_tester_report_puts_the_figures_after_the_status(kernels):
    from multiminddev.env.results import BenchmarkResult, EvalStatus, StageStatus, TimingStats
    from tests.agents.test_tester import CANDIDATE, OK_COMPILE, _result

    timing = BenchmarkResult(status=StageStatus.OK, candidate=TimingStats(median_ms=0.5),
                             eager=TimingStats(median_ms=1.0), speedup_vs_eager=2.0)
    result = _result(EvalStatus.OK, compile=OK_COMPILE, benchmark=timing)
    profile = KernelProfile(status=ProfileStatus.OK, kernels=tuple(kernels))
    text = report_of(result, CANDIDATE, profile=profile, max_chars=4000)
    assert text.index("2.00x") < text.index("Profiler (Nsight Compute") < text.index("register")


@pytest.mark.gpu
def test_a_real_profile_of_a_correct_kernel_has_its_figures():
    import shutil

    from multiminddev.tasks.problem import load_problem_source
    from tests.agents.test_tester import CANDIDATE

    if shutil.which("ncu") is None:
        pytest.skip("ncu (Nsight Compute) is not on PATH")
    problem = load_problem_source('''import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(1 << 22)]
def get_init_inputs():
    return []
''', name="relu")
    good = CANDIDATE.replace("y[i] = fmaxf(x[i], 0.0f)", "if (i < n) y[i] = fmaxf(x[i], 0.0f);")
    profile = p.profile_kernel(problem, good)
    assert profile.status is ProfileStatus.OK, profile.message
    (kernel,) = profile.kernels  # only the candidate's launch: not the inputs' setup
    assert {p.OCCUPANCY, p.MEMORY_THROUGHPUT, p.THREADS_PER_WARP_INSTRUCTION} <= set(kernel.metrics)
    assert stall_reasons(kernel.metrics)
    assert "achieved occupancy" in profiler_feedback(profile)
