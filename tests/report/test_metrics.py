"""Report metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    RejectReason,
    StageStatus,
)
from multiminddev.report.metrics import (
    bootstrap_ci,
    episode_best_result,
    fast_p,
    geometric_mean,
    pass_at_k,
    per_turn_curves,
    summarize_results,
)


def result(problem, status, speedup=0.0, vs_compile=None, reason=None, device="H100") -> EvalResult:
    compiled = status not in (EvalStatus.COMPILE_ERROR, EvalStatus.REJECTED)
    return EvalResult(
        status=status,
        problem=problem,
        compile=CompileResult(status=StageStatus.OK if compiled else StageStatus.FAILED),
        benchmark=BenchmarkResult(
            status=StageStatus.OK if status is EvalStatus.OK else StageStatus.SKIPPED,
            speedup_vs_eager=speedup,
            speedup_vs_compile=vs_compile,
        ),
        reject_reason=reason,
        device=device,
    )


def test_geometric_mean_is_exp_mean_log():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)


def test_geometric_mean_ignores_non_positive_and_nan():
    assert geometric_mean([2.0, 8.0, 0.0, -1.0, float("nan")]) == pytest.approx(4.0)


def test_geometric_mean_of_nothing_is_nan():
    assert math.isnan(geometric_mean([0.0]))


def test_fast_p_hand_computed():
    correct = [True, True, False, True]
    speedups = [0.5, 1.5, 3.0, 2.5]
    assert fast_p(correct, speedups, 0.0) == 0.75  # fast_0 = correctness rate
    assert fast_p(correct, speedups, 1.0) == 0.5
    assert fast_p(correct, speedups, 1.2) == 0.5
    assert fast_p(correct, speedups, 2.0) == 0.25  # incorrect 3.0x does not count


def test_fast_p_is_strictly_greater():
    assert fast_p([True], [1.0], 1.0) == 0.0


def test_fast_p_length_mismatch_raises():
    with pytest.raises(ValueError):
        fast_p([True], [1.0, 2.0], 1.0)


def test_pass_at_k_hand_computed():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 4, 2) == 1.0


def test_pass_at_k_matches_binomial_form():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_bootstrap_ci_of_constant_is_point():
    assert bootstrap_ci([2.0] * 10, lambda v: sum(v) / len(v)) == pytest.approx((2.0, 2.0))


def test_bootstrap_ci_brackets_mean_and_is_seeded():
    values = list(range(100))
    def mean(v):
        return sum(v) / len(v)

    lo, hi = bootstrap_ci(values, mean, n=500, seed=3)
    assert lo < 49.5 < hi and hi - lo < 30
    assert bootstrap_ci(values, mean, n=500, seed=3) == (lo, hi)


RESULTS = [
    result("a", EvalStatus.OK, 2.0, vs_compile=1.0),
    result("a", EvalStatus.OK, 0.5, vs_compile=0.25),
    result("a", EvalStatus.INCORRECT),
    result("b", EvalStatus.COMPILE_ERROR),
    result("b", EvalStatus.REJECTED, reason=RejectReason.TORCH_COMPUTE),
    result("b", EvalStatus.OK, 8.0, vs_compile=4.0),
]


def test_summary_rates():
    s = summarize_results(RESULTS)
    assert s["n"] == 6 and s["problems"] == 2
    assert s["compile_rate"] == pytest.approx(4 / 6)
    assert s["correct_rate"] == pytest.approx(3 / 6)
    assert s["rejected_rate"] == pytest.approx(1 / 6)
    assert s["reject_reasons"] == {"torch_compute": 1}
    assert s["devices"] == ["H100"]


def test_summary_fast_p_and_geomeans():
    s = summarize_results(RESULTS)
    assert s["fast_p"] == pytest.approx({"0": 0.5, "1": 2 / 6, "1.2": 2 / 6, "2": 1 / 6})
    assert s["geomean_speedup_vs_eager"] == pytest.approx((2.0 * 0.5 * 8.0) ** (1 / 3))
    assert s["geomean_speedup_vs_compile"] == pytest.approx(1.0)


def test_summary_pass_at_k_per_problem_mean():
    s = summarize_results(RESULTS, ks=(1, 2, 5))
    # a: n=3 c=2; b: n=3 c=1. pass@1 = (2/3 + 1/3)/2; pass@2 = (1 + (1 - C(2,2)/C(3,2)))/2
    assert s["pass_at_k"]["1"] == pytest.approx(0.5)
    assert s["pass_at_k"]["2"] == pytest.approx((1 + 2 / 3) / 2)
    assert "5" not in s["pass_at_k"]


def test_summary_per_tier():
    s = summarize_results(RESULTS, tiers={"a": 0, "b": 2})
    assert s["per_tier"]["0"]["correct_rate"] == pytest.approx(2 / 3)
    assert s["per_tier"]["2"]["compile_rate"] == pytest.approx(1 / 3)


def test_summary_of_compile_only_run_has_no_speed_figures():
    s = summarize_results([result("a", EvalStatus.NO_GPU, device="cpu (compile only)")])
    assert s["no_gpu_rate"] == 1.0
    assert s["geomean_speedup_vs_eager"] is None


def _turn(role, res):
    return {"role": role, "eval_result": res.to_dict() if res is not None else None}


EPISODES = [
    {"turns": [_turn("generator", result("p", EvalStatus.INCORRECT)), _turn("tester", None),
               _turn("optimizer", result("p", EvalStatus.OK, 2.0)), _turn("tester", None)]},
    {"turns": [_turn("generator", result("p", EvalStatus.OK, 0.5)), _turn("tester", None),
               _turn("optimizer", result("p", EvalStatus.OK, 1.5))]},
    {"turns": [_turn("generator", None)]},  # format failure, then the episode ended
]


def test_per_turn_curves_hand_computed():
    c = per_turn_curves(EPISODES)
    assert c["attempt"] == [1, 2]
    assert c["frac_correct"] == pytest.approx([1 / 3, 2 / 3])
    assert c["fast_1"] == pytest.approx([0.0, 2 / 3])
    assert c["geomean_best_speedup"] == pytest.approx([0.5, math.sqrt(2.0 * 1.5)])
    assert c["attempts_made"] == [3, 2]


def test_per_turn_curves_reads_results_on_tester_turns():
    ep = {"turns": [_turn("generator", None), _turn("tester", result("p", EvalStatus.OK, 3.0))]}
    assert per_turn_curves([ep])["geomean_best_speedup"] == pytest.approx([3.0])


def test_episode_best_result_is_fastest_correct():
    assert episode_best_result(EPISODES[1]).speedup == pytest.approx(1.5)
    assert episode_best_result(EPISODES[2]) is None


def test_no_candidate_samples_count_as_failures():
    from multiminddev.report.metrics import NoCandidate

    s = summarize_results([result("a", EvalStatus.OK, 2.0), NoCandidate(problem="a")], ks=(1, 2))
    assert s["n"] == 2 and s["correct_rate"] == 0.5 and s["compile_rate"] == 0.5
    assert s["status_counts"]["format_failure"] == 1
    assert s["pass_at_k"] == pytest.approx({"1": 0.5, "2": 1.0})


def test_episode_best_result_prefers_compiled_over_later_compile_error():
    ep = {"turns": [_turn("generator", result("p", EvalStatus.NO_GPU)),
                    _turn("optimizer", result("p", EvalStatus.COMPILE_ERROR))]}
    assert episode_best_result(ep).status is EvalStatus.NO_GPU


def test_episode_best_result_uses_recorded_best():
    ep = {"best_result": result("p", EvalStatus.OK, 4.0).to_dict(), "turns": []}
    assert episode_best_result(ep).speedup == pytest.approx(4.0)


def test_a_file_that_is_not_utf8_is_bad_input_not_a_hack():
    results = [EvalResult(status=EvalStatus.REJECTED, problem="p",
                          reject_reason=RejectReason.ENCODING),
               EvalResult(status=EvalStatus.REJECTED, problem="p",
                          reject_reason=RejectReason.TORCH_COMPUTE)]
    summary = summarize_results(results)
    assert summary["rejected_rate"] == 0.5 and summary["bad_input_rate"] == 0.5
