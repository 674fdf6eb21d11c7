"""GPU tests: honest fixtures pass, wrong ones fail with the right status, faults recover the
pool, a copy-like kernel reaches >= 70% of measured bandwidth, timing is repeatable."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from tests.env._fixtures import candidates, fixture_header, problem_for, problem_named

pytestmark = pytest.mark.gpu

HONEST = candidates("honest")
WRONG = candidates("wrong")


@pytest.fixture(scope="module")
def evaluator():
    cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.5,
                     compile_timeout_s=10, run_timeout_s=10)
    with Evaluator(cfg) as ev:
        yield ev


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_candidate_is_ok(evaluator, path):
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is EvalStatus.OK, result.message
    assert result.verify.trials_passed == result.verify.trials_run == 5
    assert result.benchmark.candidate.median_ms > 0 and result.benchmark.speedup_vs_eager > 0


@pytest.mark.parametrize("path", WRONG, ids=lambda p: p.stem)
def test_wrong_candidate_gets_expected_status(evaluator, path):
    expected = EvalStatus(fixture_header(path)["expect"])
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is expected, result.message


@pytest.mark.parametrize("fault", ["relu_illegal_address", "relu_infinite_loop"])
def test_fault_replaces_worker_and_next_evaluation_succeeds(evaluator, fixtures_dir, fault):
    bad = (fixtures_dir / "wrong" / f"{fault}.py").read_text()
    good = (fixtures_dir / "honest" / "relu_basic.py").read_text()
    problem = problem_named("1_relu")
    faulted = evaluator.evaluate(problem, bad)
    assert faulted.worker_restarted
    assert faulted.status in (EvalStatus.RUNTIME_ERROR, EvalStatus.TIMEOUT)
    after = evaluator.evaluate(problem, good)
    assert after.status is EvalStatus.OK, after.message


def test_copy_like_kernel_reaches_70_percent_of_measured_bandwidth(evaluator, fixtures_dir):
    src = (fixtures_dir / "honest" / "relu_vec4.py").read_text()
    result = evaluator.evaluate(problem_named("1_relu"), src)
    assert result.status is EvalStatus.OK, result.message
    assert result.benchmark.fraction_of_peak is not None
    assert result.benchmark.fraction_of_peak >= 0.70, result.benchmark


def test_repeated_timing_of_one_kernel_agrees_within_5_percent(evaluator, fixtures_dir):
    src = (fixtures_dir / "honest" / "relu_basic.py").read_text()
    medians = [evaluator.evaluate(problem_named("1_relu"), src).benchmark.candidate.median_ms
               for _ in range(3)]
    assert min(medians) > 0
    assert (max(medians) - min(medians)) / min(medians) <= 0.05, medians


def test_compile_baseline_is_timed_and_cached(tmp_path, fixtures_dir):
    src = (fixtures_dir / "honest" / "relu_basic.py").read_text()
    cfg = EvalConfig(num_workers=1, cache_dir=str(tmp_path), bench_budget_s=0.3)
    with Evaluator(cfg) as ev:
        first = ev.evaluate(problem_named("1_relu"), src)
        second = ev.evaluate(problem_named("1_relu"), src)
    assert first.status is EvalStatus.OK, first.message
    assert first.benchmark.compiled is not None and first.benchmark.speedup_vs_compile
    assert second.benchmark.compiled == first.benchmark.compiled  # from the disk cache


@pytest.mark.parametrize("transfer", ["memfd", "pipe"])
def test_either_tensor_transfer_gives_the_expected_verdicts(transfer):
    """Through a memory file or the pipe, honest candidates pass every trial and wrong ones fail
    with their expected status."""
    cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.3,
                     compile_timeout_s=10, run_timeout_s=10, tensor_transfer=transfer)
    with Evaluator(cfg) as ev:
        for path in HONEST[:4]:
            result = ev.evaluate(problem_for(path), path.read_text())
            assert result.status is EvalStatus.OK, (path.stem, result.message)
            assert result.verify.trials_passed == result.verify.trials_run == 5
        for path in WRONG[:4]:
            expected = EvalStatus(fixture_header(path)["expect"])
            result = ev.evaluate(problem_for(path), path.read_text())
            assert result.status is expected, (path.stem, result.message)


def test_a_candidate_past_its_memory_cap_fails_alone_with_the_cap_in_its_message(evaluator,
                                                                                fixtures_dir):
    import torch

    huge = (fixtures_dir / "wrong" / "relu_huge_scratch.py").read_text()
    good = (fixtures_dir / "honest" / "relu_basic.py").read_text()
    free_before = torch.cuda.mem_get_info()[0]
    result = evaluator.evaluate(problem_named("1_relu"), huge)
    assert result.status is EvalStatus.RUNTIME_ERROR, result.message
    assert "out of GPU memory" in result.message and "cap" in result.message, result.message
    # the 40 GiB were never taken from the card: the worker stopped at its cap
    assert torch.cuda.mem_get_info()[0] > free_before - (8 << 30)
    after = evaluator.evaluate(problem_named("1_relu"), good)
    assert after.status is EvalStatus.OK, after.message


def test_a_candidate_reaches_no_gpu_but_its_own(fixtures_dir):
    # each worker sees its GPU alone: copies to another fail instead of loading its evaluations
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    path = fixtures_dir / "honest" / "relu_basic.py"
    source = path.read_text().replace("y = torch.empty_like(x)",
                                      "y = torch.empty_like(x)\n        x.to('cuda:1')")
    assert "cuda:1" in source
    cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.3)
    with Evaluator(cfg) as ev:
        results = [ev.evaluate(problem_for(path), source) for _ in range(2)]
    for result in results:
        assert result.status is EvalStatus.RUNTIME_ERROR, result.message


def test_the_real_toolchain_build_is_checked_by_the_candidates_own_objects():
    """On the real CUDA toolchain (nvcc + torch's headers), the trusted builder: an honest
    extension passes the symbol check whatever the toolchain itself imports, and a candidate
    whose own code calls `syscall` (a name token pasting hides from the source patterns) is
    refused, even where the toolchain's static archives import `syscall` into every build."""
    from multiminddev.env import inline_build

    cache = str(EvalConfig().cache_path)  # the evaluator's: the toolchain reference is built once
    honest = inline_build.extract_inline_specs(
        (HONEST[0].parent / "softmax_load_inline_dispatch.py").read_text())
    assert honest is not None
    outcome = inline_build.build_extension(honest[0].args, cache, "sm_90")
    assert outcome["status"] == "ok" and outcome["findings"] == [], outcome
    hidden = r"""
#include <torch/extension.h>
#include <unistd.h>
#define CALL(a, b) a##b
__global__ void copy_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor copy_cuda(torch::Tensor x) {
    CALL(sys, call)(1, 5, "x", 1);
    auto y = torch::empty_like(x);
    long n = x.numel();
    copy_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
    spec = inline_build.InlineSpec.from_call({
        "name": "hidden_syscall", "cpp_sources": "torch::Tensor copy_cuda(torch::Tensor x);",
        "cuda_sources": hidden, "functions": ["copy_cuda"]})
    refused = inline_build.build_extension(spec.args, cache, "sm_90")
    assert refused["status"] == "rejected" and refused["sha256"] is None, refused.get("log")
    assert any("`syscall`" in f["message"] for f in refused["findings"])


# ----------------------- checked calls look like the others; every rule on every verified output

OBSERVABLES = Path(__file__).resolve().parent / "fixtures"


def _observable(name):
    path = OBSERVABLES / f"{name}.py"
    return path, EvalStatus(fixture_header(path)["expect"])


@pytest.mark.parametrize("name", ["observe_first_allocation", "workspace_reuse_honest"])
def test_a_first_allocation_never_tells_checked_calls_and_a_reused_workspace_is_ok(evaluator,
                                                                                  name):
    # observe_first_allocation returns wrong outputs from the first call on which its detector
    # fires: ok means it never fired, on any warm-up or timed call before the last check.
    path, expected = _observable(name)
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is expected, result.message
    verify = result.verify  # 1_relu: 128 MiB per call, 8 checks among 10 timed calls
    assert verify.timed_checks_run == verify.timed_checks_passed >= 8
    assert verify.timed_check_escape is not None and verify.timed_check_escape < 1e-3


def test_tf32_after_an_exact_first_call_is_incorrect_on_a_later_trial(evaluator):
    path, expected = _observable("tf32_after_first_call")
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is expected, result.message
    assert "precision" in {m.reason for m in result.verify.mismatches}
    assert "trial 1" in result.message


def test_an_expanded_output_after_the_trials_is_incorrect_on_a_checked_call(evaluator):
    path, expected = _observable("expand_after_trials")
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is expected, result.message
    assert "timed check" in result.message and "stride 0" in result.message
