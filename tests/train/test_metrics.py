"""Metrics: metrics.jsonl schema, TensorBoard output, rates from real EvalResults."""

from __future__ import annotations

import math

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    StageStatus,
)
from multiminddev.episode import Episode, Turn
from multiminddev.tasks.problem import load_problem_source
from multiminddev.train.metrics import (
    STEP_KEYS,
    MetricsConfig,
    MetricsLogger,
    PhaseTimer,
    read_metrics,
    rollout_metrics,
)
from tests.problems import RELU_1024


def _result(status: EvalStatus, speedup: float = 0.0) -> EvalResult:
    ok = StageStatus.OK
    return EvalResult(status=status, problem="relu",
                      compile=CompileResult(status=ok if status is not EvalStatus.COMPILE_ERROR
                                            else StageStatus.FAILED),
                      benchmark=BenchmarkResult(status=ok, speedup_vs_eager=speedup))


def _episode(*results):
    problem = load_problem_source(RELU_1024, name="relu", tier=0)
    turns = [Turn(index=i, role=AgentRole.GENERATOR if i == 0 else AgentRole.OPTIMIZER,
                  eval_result=r) for i, r in enumerate(results)]
    return Episode(problem=problem, turns=turns)


def test_step_record_goes_to_jsonl_and_tensorboard(tmp_path):
    logger = MetricsLogger(MetricsConfig(output_dir=tmp_path))
    record = {k: 0.0 for k in STEP_KEYS} | {"step": 1, "episodes": 8, "compile_only": True,
                                           "reward/compile": 0.1}
    logger.log_step(record)
    logger.close()
    back = read_metrics(tmp_path / "metrics.jsonl")
    assert back[0]["step"] == 1 and back[0]["compile_only"] is True and "reward/compile" in back[0]
    assert any((tmp_path / "tensorboard").iterdir())


def test_record_missing_a_key_is_refused(tmp_path):
    logger = MetricsLogger(MetricsConfig(output_dir=tmp_path, tensorboard=False))
    with pytest.raises(ValueError, match="fast_1"):
        logger.log_step({k: 0 for k in STEP_KEYS if k != "fast_1"})


def test_rates_and_geomean_from_results():
    ok = EvalStatus.OK
    episodes = [_episode(_result(EvalStatus.COMPILE_ERROR), _result(ok, 2.0)),
                _episode(_result(ok, 0.5)),
                _episode(_result(EvalStatus.REJECTED))]
    m = rollout_metrics(episodes, compile_only=False)
    assert m["compile_rate"] == pytest.approx(3 / 4)  # rejected: compiled stage OK in this fixture
    assert m["pass_rate"] == pytest.approx(2 / 4)
    assert m["hack_rate"] == pytest.approx(1 / 4)
    assert m["geomean_speedup"] == pytest.approx(math.sqrt(2.0 * 0.5))
    assert m["fast_1"] == pytest.approx(1 / 3)


def test_compile_only_reports_no_speedups():
    m = rollout_metrics([_episode(_result(EvalStatus.OK, 3.0))], compile_only=True)
    assert m["geomean_speedup"] == 0.0 and m["fast_1"] == 0.0


def test_repeat_rate_counts_optimizer_turns_that_resubmitted_a_kernel():
    ok = _result(EvalStatus.OK, 1.0)
    copied = _episode(ok, ok, ok)
    for turn, source, repeat in zip(copied.turns, ("a", "a", "b"), (None, 0, None)):
        turn.candidate_source, turn.repeat_of = source, repeat
    formatless = _episode(ok, None)  # an Optimizer turn without a candidate is not counted
    formatless.turns[0].candidate_source = "a"
    assert rollout_metrics([copied, formatless], compile_only=False)["repeat_rate"] == 0.5
    assert rollout_metrics([_episode(ok)], compile_only=False)["repeat_rate"] == 0.0


def test_phase_timer_reports_every_phase():
    timer = PhaseTimer()
    with timer("rollout"):
        pass
    out = timer.as_metrics()
    assert set(out) == {f"time_{p}" for p in
                        ("rollout", "reward", "advantage", "update", "log", "checkpoint")}


@pytest.mark.gpu
def test_reference_solutions_measure_as_correct_on_gpu():
    """On the GPU a built-in reference kernel is correct and timed, so speedups are reported."""
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.tasks.builtin import builtin_problems, reference_solution

    problem = builtin_problems(tiers=[0], split="heldout")[0]
    source = reference_solution(problem, "fast")
    with Evaluator(EvalConfig(num_workers=1, compile_baseline=False)) as ev:
        result = ev.evaluate(problem, source)
    episode = Episode(problem=problem, turns=[Turn(index=0, role=AgentRole.GENERATOR,
                                                   eval_result=result, candidate_source=source)])
    m = rollout_metrics([episode], compile_only=False)
    assert result.status is EvalStatus.OK, result.message
    assert m["pass_rate"] == 1.0 and m["geomean_speedup"] > 0


def test_rejections_are_counted_per_hack_class():
    from multiminddev.env.results import RejectReason

    def rejected(reason):
        result = _result(EvalStatus.REJECTED)
        result.reject_reason = reason
        return result

    episodes = [_episode(rejected(RejectReason.TORCH_COMPUTE), rejected(RejectReason.TORCH_COMPUTE)),
                _episode(rejected(RejectReason.STALE_OUTPUT), _result(EvalStatus.OK, 1.5))]
    m = rollout_metrics(episodes, compile_only=False)
    assert m["hack_rate"] == pytest.approx(3 / 4)
    assert m["hack_rate/torch_compute"] == pytest.approx(2 / 4)
    assert m["hack_rate/stale_output"] == pytest.approx(1 / 4)
    assert not any(k.startswith("hack_rate/") and k.endswith("pointer_cache") for k in m)
