import shutil

import pytest

from multiminddev.agents.tester import (
    OccupancyLimiter,
    deep_profile,
    estimate_occupancy,
    fit_sections,
    format_failure_feedback,
    parse_ncu_csv,
    threads_per_block_in,
)
from multiminddev.agents.tester import (
    tester_feedback as feedback_for,
)
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    Diagnostic,
    EvalResult,
    EvalStatus,
    Finding,
    KernelResources,
    RejectReason,
    StageStatus,
    StaticCheckResult,
    TimingStats,
    TrialMismatch,
    VerifyResult,
)
from multiminddev.tasks.problem import load_problem_source

CANDIDATE = '''import torch
import torch.nn as nn
from multiminddev.cuda import compile_kernels

kernels = compile_kernels(r"""
extern "C" __global__ void relu(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    y[i] = fmaxf(x[i], 0.0f)
}
""")
THREADS = 128

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        kernels.relu(grid=((x.numel() + THREADS - 1) // THREADS,), block=(THREADS,), args=(x, y, x.numel()))
        return y
'''
KERNELS = [KernelResources(name="relu", registers=64, shared_mem_bytes=0, spill_store_bytes=8,
                           spill_load_bytes=4)]
OK_COMPILE = CompileResult(status=StageStatus.OK, arch="sm_90", kernels=KERNELS)


def _result(status, **kw):
    return EvalResult(status=status, problem="relu", **kw)


# --------------------------------------------------------------------- occupancy


def test_occupancy_full_when_nothing_limits():
    occ = estimate_occupancy(registers_per_thread=32, shared_mem_per_block=0, threads_per_block=256)
    assert occ.blocks_per_sm == 8 and occ.fraction == 1.0 and occ.limiter is OccupancyLimiter.THREADS


def test_occupancy_limited_by_registers():
    # 128 regs * 32 lanes = 4096 per warp -> 16 warps per SM -> 2 blocks of 8 warps
    occ = estimate_occupancy(registers_per_thread=128, shared_mem_per_block=0, threads_per_block=256)
    assert (occ.blocks_per_sm, occ.active_warps) == (2, 16)
    assert occ.fraction == 0.25 and occ.limiter is OccupancyLimiter.REGISTERS


def test_register_allocation_rounds_up_per_warp():
    # 33 regs -> 1056 per warp, rounded to 1280 -> 51 warps -> 6 blocks of 8 warps
    occ = estimate_occupancy(registers_per_thread=33, shared_mem_per_block=0, threads_per_block=256)
    assert occ.blocks_per_sm == 6 and occ.limiter is OccupancyLimiter.REGISTERS


def test_occupancy_limited_by_shared_memory():
    # 48 KB + 1 KB reserved per block -> 228 KB // 49 KB = 4 blocks
    occ = estimate_occupancy(registers_per_thread=16, shared_mem_per_block=48 * 1024,
                             threads_per_block=128)
    assert occ.blocks_per_sm == 4 and occ.limiter is OccupancyLimiter.SHARED_MEMORY
    assert occ.fraction == 4 * 4 / 64


def test_occupancy_limited_by_block_count():
    occ = estimate_occupancy(registers_per_thread=16, shared_mem_per_block=0, threads_per_block=32)
    assert occ.blocks_per_sm == 32 and occ.fraction == 0.5 and occ.limiter is OccupancyLimiter.BLOCKS


def test_impossible_blocks_have_zero_occupancy():
    for kw in ({"threads_per_block": 2048}, {"registers_per_thread": 300},
               {"shared_mem_per_block": 300 * 1024}):
        args = {"registers_per_thread": 32, "shared_mem_per_block": 0, "threads_per_block": 256, **kw}
        occ = estimate_occupancy(**args)
        assert occ.blocks_per_sm == 0 and occ.limiter is OccupancyLimiter.INVALID


def test_threads_per_block_read_from_launch():
    assert threads_per_block_in(CANDIDATE) == 128
    assert threads_per_block_in("k.f(grid=(1,), block=(16, 16), args=())") == 256
    assert threads_per_block_in("k.f(grid=(1,), block=(n,), args=())") is None
    assert threads_per_block_in(None) is None


# --------------------------------------------------------------------- feedback per status


def test_compile_error_shows_first_errors_with_source_line():
    result = _result(EvalStatus.COMPILE_ERROR, compile=CompileResult(
        status=StageStatus.FAILED, diagnostics=[
            Diagnostic(severity="error", message='expected a ";"', line=5),
            Diagnostic(severity="warning", message="unused", line=2)]),
        message='compile error (nvrtc) at line 5: expected a ";"')
    text = feedback_for(result, CANDIDATE)
    # line numbers are the CUDA string's (line 1 is the empty line after the opening quotes)
    assert 'line 5: expected a ";"\n       4 |     y[i] = fmaxf(x[i], 0.0f)\n       5 | }' in text
    assert "unused" not in text


def test_compile_error_without_diagnostics_shows_the_error_tail():
    result = _result(EvalStatus.COMPILE_ERROR, compile=CompileResult(
        status=StageStatus.FAILED, error="Traceback...\nNameError: name 'kernls' is not defined"))
    assert "NameError: name 'kernls'" in feedback_for(result, CANDIDATE)


def test_mismatch_summary():
    v = VerifyResult(status=StageStatus.FAILED, trials_run=5, trials_passed=0, atol=1e-4, rtol=1e-4,
                     max_abs_error=2.5, max_rel_error=1.0, mismatches=[TrialMismatch(
                         trial=0, output_index=0, reason="allclose", max_abs_error=2.5,
                         mismatched_fraction=0.01, first_bad_indices=[[4095]],
                         expected_values=[1.5], actual_values=[0.0])])
    text = feedback_for(_result(EvalStatus.INCORRECT, compile=OK_COMPILE, verify=v), CANDIDATE)
    assert "0/5 trials passed" in text and "max abs error 2.5" in text
    assert "(4095,): expected 1.5, got 0" in text and "edge handling" in text


def test_ok_reports_timings_against_eager_and_compile():
    b = BenchmarkResult(status=StageStatus.OK, candidate=TimingStats(median_ms=0.5),
                        eager=TimingStats(median_ms=1.0), compiled=TimingStats(median_ms=0.4),
                        speedup_vs_eager=2.0, speedup_vs_compile=0.8, fraction_of_peak=0.42)
    text = feedback_for(_result(EvalStatus.OK, compile=OK_COMPILE, benchmark=b), CANDIDATE)
    assert "2.00x" in text and "torch.compile 0.4 ms: 0.80x" in text and "42% of peak" in text


def test_resources_and_occupancy_are_reported():
    text = feedback_for(_result(EvalStatus.NO_GPU, compile=OK_COMPILE), CANDIDATE)
    assert "relu: 64 regs, 0 B smem, SPILLS 8B store/4B load" in text
    # 64 regs * 32 = 2048/warp -> 32 warps -> 8 blocks of 4 warps = 50% at 128 threads
    assert "occupancy 50% (limited by registers)" in text and "128 threads/block" in text


def test_no_gpu_says_compile_only():
    text = feedback_for(_result(EvalStatus.NO_GPU, compile=OK_COMPILE), CANDIDATE)
    assert "Compile-only" in text


def test_rejected_names_the_rule():
    static = StaticCheckResult(status=StageStatus.FAILED, findings=[Finding(
        rule="torch_compute", reason=RejectReason.TORCH_COMPUTE, message="torch.relu in forward",
        line=14)])
    result = _result(EvalStatus.REJECTED, static=static, reject_reason=RejectReason.TORCH_COMPUTE)
    text = feedback_for(result, CANDIDATE)
    assert "rule broken: torch_compute" in text and "line 14: torch_compute" in text


def test_runtime_error_and_timeout_and_infra():
    rt = _result(EvalStatus.RUNTIME_ERROR, compile=OK_COMPILE,
                 verify=VerifyResult(status=StageStatus.FAILED, error="a\nb\nCUDA error: illegal memory access"))
    assert "illegal memory access" in feedback_for(rt, CANDIDATE)
    assert "infinite loop" in feedback_for(_result(EvalStatus.TIMEOUT, compile=OK_COMPILE), CANDIDATE)
    assert "not the kernel's fault" in feedback_for(_result(EvalStatus.INFRA_ERROR), None)


def test_pitfall_hints_are_included():
    text = feedback_for(_result(EvalStatus.NO_GPU, compile=OK_COMPILE), CANDIDATE)
    assert "never compared with the size" in text


@pytest.mark.parametrize("status", list(EvalStatus))
def test_every_status_gets_bounded_feedback(status):
    text = feedback_for(_result(status, message="m" * 5000), CANDIDATE, max_chars=400)
    assert text.startswith(f"Status: {status.value}.") and len(text) <= 400


def test_fit_sections_drops_low_priority_sections_first():
    assert fit_sections(["a" * 10, "b" * 10, "c" * 100], 30) == "a" * 10 + "\n" + "b" * 10


def test_format_failure_feedback():
    text = format_failure_feedback("no_code_block", "no ```python code block")
    assert "format failure (no_code_block)" in text and "class ModelNew" in text


def test_ncu_csv_parsing():
    csv_text = ('==PROF== Connected\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
                '"0","relu","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","81.2"\n')
    assert parse_ncu_csv(csv_text) == [{"kernel": "relu", "unit": "%", "value": "81.2",
                                        "metric": "dram__throughput.avg.pct_of_peak_sustained_elapsed"}]


@pytest.mark.gpu
def test_deep_profile_runs_available_tools():
    problem = load_problem_source('''import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(4096)]
def get_init_inputs():
    return []
''', name="relu")
    good = CANDIDATE.replace("y[i] = fmaxf(x[i], 0.0f)", "if (i < n) y[i] = fmaxf(x[i], 0.0f);")
    report = deep_profile(problem, good)
    if shutil.which("ncu") is None:
        assert "skipped" in report["ncu"]
    else:
        assert report["ncu"].get("metrics")
    if shutil.which("compute-sanitizer") is None:
        assert "skipped" in report["sanitizer"]["memcheck"]
    else:
        memcheck = report["sanitizer"]["memcheck"]
        assert "error" not in memcheck, memcheck  # the harness must run: its stderr says why not
        assert memcheck["clean"], memcheck


def test_deep_profile_skips_cleanly_without_tools(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    problem = load_problem_source("import torch\nclass Model: pass\ndef get_inputs(): return []\n"
                                  "def get_init_inputs(): return []\n", name="p")
    report = deep_profile(problem, CANDIDATE)
    assert "skipped" in report["ncu"] and "skipped" in report["sanitizer"]["racecheck"]


@pytest.mark.parametrize(("exit_code", "expect"), [(0, "clean"), (3, "finding"), (1, "error")])
def test_sanitizer_exit_codes_separate_findings_from_a_failed_harness(tmp_path, monkeypatch,
                                                                       exit_code, expect):
    from multiminddev.agents.tester import _run_sanitizer

    # A stand-in for the tool's command line contract only (exit 3 = it found errors): what is
    # tested is how its outcomes are reported, which the GPU test checks with the real tool.
    tool = tmp_path / "compute-sanitizer"
    tool.write_text("#!/bin/sh\necho '========= Invalid __global__ read of size 4 bytes'\n"
                    f"echo 'Traceback: harness died' >&2\nexit {exit_code}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    report = _run_sanitizer(["python3", "harness.py"], "memcheck", timeout_s=30)
    if expect == "clean":
        assert report["clean"] and "error" not in report
    elif expect == "finding":
        assert not report["clean"] and report["findings"] == [
            "Invalid __global__ read of size 4 bytes"]
        assert "Invalid __global__ read" in report["output"]
    else:
        assert "harness failed" in report["error"] and "harness died" in report["stderr"]
        assert "clean" not in report


# The layout of compute-sanitizer 2025's memcheck report (headlines after "========= ", details
# indented further), with one kernel error and one host API error.
MEMCHECK_REPORT = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at relu+0x70
=========     by thread (255,0,0) in block (15,0,0)
=========     Address 0x7f3a2c004000 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2c5a3f] in libcuda.so.1
=========
========= Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA API call to cuGetProcAddress_v2.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 2 errors
"""


def test_parse_sanitizer_findings_keeps_headlines_only():
    from multiminddev.agents.tester import parse_sanitizer_findings

    assert parse_sanitizer_findings(MEMCHECK_REPORT) == [
        "Invalid __global__ write of size 4 bytes",
        ('Program hit CUDA_ERROR_NOT_FOUND (error 500) due to "named symbol not found" on CUDA '
         "API call to cuGetProcAddress_v2.")]
    assert parse_sanitizer_findings("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == []


@pytest.mark.parametrize(("kernel_error", "clean"), [(True, False), (False, True)])
def test_host_api_errors_alone_leave_the_kernel_clean(tmp_path, monkeypatch, kernel_error, clean):
    from multiminddev.agents.tester import _run_sanitizer

    lines = MEMCHECK_REPORT.splitlines()
    report_text = MEMCHECK_REPORT if kernel_error else "\n".join(lines[:1] + lines[8:])
    (tmp_path / "report.txt").write_text(report_text)
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(f"#!/bin/sh\ncat {tmp_path / 'report.txt'}\nexit 3\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    report = _run_sanitizer(["python3", "harness.py"], "memcheck", timeout_s=30)
    assert report["clean"] is clean
    assert report["api_errors"] and report["api_errors"][0].startswith("Program hit CUDA_ERROR_NOT_FOUND")
    assert report["findings"] == (["Invalid __global__ write of size 4 bytes"] if kernel_error else [])
