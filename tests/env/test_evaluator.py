"""Evaluator on a machine without a GPU: static + compile, status no_gpu, never an exception.

(On a GPU machine these CPU expectations do not hold; the GPU suite covers that case.)
"""

from __future__ import annotations

import asyncio

import pytest

from multiminddev.env import EvalConfig, EvalResult, EvalStatus, Evaluator, StageStatus
from tests.conftest import gpu_available
from tests.env._fixtures import FIXTURES, candidates, problem_for, problem_named

pytestmark = pytest.mark.skipif(gpu_available(), reason="CPU-machine behaviour (no_gpu)")

NVRTC_HONEST = [p for p in candidates("honest") if "load_inline" not in p.name]
COMPILED_IN_INIT = {"ctl_helper_returns_compiled.py",
                    "wbtwin_c2_kernel_compiled_in_init_from_init_inputs.py",
                    "wbtwin_c4_defines_from_class_attributes.py"}


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(num_workers=1, compile_timeout_s=20)) as ev:
        yield ev


def test_honest_fixtures_compile_and_report_no_gpu(evaluator):
    results = evaluator.evaluate_many([(problem_for(p), p.read_text()) for p in NVRTC_HONEST])
    for path, result in zip(NVRTC_HONEST, results, strict=True):
        assert result.status is EvalStatus.NO_GPU, (path.name, result.message)
        if path.name in COMPILED_IN_INIT:  # ModelNew compiles when built: never on a CPU here
            assert result.compile.status is StageStatus.SKIPPED
            continue
        assert result.compile.status is StageStatus.OK and result.compile.kernels
        assert result.compile.arch == "sm_90"
        assert "no GPU" in result.message and result.verify.status is StageStatus.SKIPPED


def test_compile_error_reports_line_numbers(evaluator):
    path = FIXTURES / "wrong" / "relu_compile_error.py"
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is EvalStatus.COMPILE_ERROR
    assert result.compile.errors[0].line == 4
    assert "line 4" in result.message


def test_load_inline_candidate_is_skipped_with_a_reason(evaluator):
    path = FIXTURES / "honest" / "relu_load_inline.py"
    result = evaluator.evaluate(problem_for(path), path.read_text())
    assert result.status is EvalStatus.NO_GPU
    assert result.compile.backend == "load_inline" and result.compile.status is StageStatus.SKIPPED
    assert "CPU build" in result.message


def test_syntax_error_is_rejected_without_running(evaluator):
    result = evaluator.evaluate(problem_named("1_relu"), "class ModelNew(:\n    pass\n")
    assert result.status is EvalStatus.REJECTED and result.reject_reason.value == "syntax"
    assert result.compile.status is StageStatus.SKIPPED


def test_result_survives_a_json_round_trip(evaluator):
    path = FIXTURES / "honest" / "relu_vec4.py"
    result = evaluator.evaluate(problem_for(path), path.read_text())
    back = EvalResult.from_dict(__import__("json").loads(result.to_json()))
    assert back == result


def test_submit_returns_a_future_and_aevaluate_awaits(evaluator):
    path = FIXTURES / "honest" / "relu_basic.py"
    future = evaluator.submit(problem_for(path), path.read_text())
    assert future.result(timeout=120).status is EvalStatus.NO_GPU
    result = asyncio.run(evaluator.aevaluate(problem_for(path), path.read_text()))
    assert result.status is EvalStatus.NO_GPU


def test_closed_evaluator_answers_infra_error():
    ev = Evaluator(EvalConfig(num_workers=1))
    ev.close()
    result = ev.evaluate(problem_named("1_relu"), "x = 1")
    assert result.status is EvalStatus.INFRA_ERROR and "closed" in result.message


def _failing_first(ev, failures):
    """Make the first ``failures`` evaluations of ``ev`` meet an infrastructure error (as a GPU
    crowded by another process gives), then evaluate for real."""
    from multiminddev.env.evaluator import _infra_result

    real, calls = ev._evaluate, []

    def evaluate(problem, candidate):
        calls.append(problem)
        if len(calls) <= failures:
            return _infra_result(problem, candidate, "the GPU ran out of memory")
        return real(problem, candidate)

    ev._evaluate = evaluate
    return calls


def _evaluate_with_infra_failures(config, failures):
    """(calls to the evaluation, final result) for relu_basic whose first ``failures``
    evaluations meet an infrastructure error."""
    path = FIXTURES / "honest" / "relu_basic.py"
    with Evaluator(config) as ev:
        calls = _failing_first(ev, failures)
        return calls, ev.evaluate(problem_for(path), path.read_text())


def test_an_infrastructure_error_is_evaluated_again():
    calls, result = _evaluate_with_infra_failures(
        EvalConfig(num_workers=1, infra_retries=1, infra_retry_delay_s=0.1), 1)
    assert len(calls) == 2 and result.status is EvalStatus.NO_GPU


def test_retries_end_with_the_infrastructure_error_and_say_how_many():
    calls, result = _evaluate_with_infra_failures(
        EvalConfig(num_workers=1, infra_retries=2, infra_retry_delay_s=0.01), 5)
    assert len(calls) == 3 and result.status is EvalStatus.INFRA_ERROR
    assert "(after 3 attempts)" in result.message
    calls, result = _evaluate_with_infra_failures(EvalConfig(num_workers=1, infra_retries=0), 5)
    assert result.status is EvalStatus.INFRA_ERROR
    assert len(calls) == 1
