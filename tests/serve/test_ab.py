"""A/B store, assignment and statistics: pure functions against references, the store against a
real SQLite file (restarts and crashes included)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest

from multiminddev.core.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    StageStatus,
)
from multiminddev.episode.state import Episode, Turn
from multiminddev.serve.ab import (
    ABStore,
    ArmExistsError,
    Outcome,
    Verdict,
    assign_arm,
    bootstrap_mean_interval,
    msprt,
    outcome_from_result,
    record_job,
    wilson_interval,
)

# ------------------------------------------------------------------------------ assignment


def test_assignment_is_a_function_of_the_request_id():
    weights = [("a", 1.0), ("b", 2.0), ("c", 0.5)]
    assert [assign_arm(weights, f"r{i}") for i in range(200)] == \
           [assign_arm(list(reversed(weights)), f"r{i}") for i in range(200)]


def test_assignment_follows_the_weights():
    n = 20_000
    picks = [assign_arm([("a", 3.0), ("b", 1.0)], f"req-{i}") for i in range(n)]
    sd = math.sqrt(0.75 * 0.25 / n)  # binomial standard deviation of the share
    assert abs(picks.count("a") / n - 0.75) < 5 * sd


def test_zero_weight_arm_never_serves():
    picks = {assign_arm([("a", 1.0), ("b", 0.0)], str(i)) for i in range(2000)}
    assert picks == {"a"}


def test_no_live_arm_is_an_error():
    with pytest.raises(ValueError, match="no arm has a traffic weight"):
        assign_arm([("a", 0.0)], "x")


# ------------------------------------------------------------------------------ intervals


def test_wilson_matches_the_textbook_value():
    # Newcombe (1998), Table I: 81/263 -> 0.2553 to 0.3662 (Wilson score, no correction).
    lo, hi = wilson_interval(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)


def test_wilson_at_zero_successes_starts_at_zero():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.27 < hi < 0.28  # Newcombe Table I: 0/10 -> 0 to 0.2775


def test_bootstrap_interval_matches_the_normal_interval_for_a_mean():
    x = np.random.default_rng(1).normal(5.0, 2.0, size=400)
    lo, hi = bootstrap_mean_interval(x, resamples=4000)
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert abs(lo - (x.mean() - half)) < 0.05 and abs(hi - (x.mean() + half)) < 0.05


# ------------------------------------------------------------------------------ sequential test


def _mixture_lr_by_quadrature(d: float, v: float, tau: float) -> float:
    """Reference: integrate N(d; theta, V) / N(d; 0, V) over the prior theta ~ N(0, tau^2)."""
    theta = np.linspace(-12 * tau, 12 * tau, 200_001)
    prior = np.exp(-theta**2 / (2 * tau**2)) / math.sqrt(2 * math.pi * tau**2)
    ratio = np.exp((2 * d * theta - theta**2) / (2 * v))
    return float(np.trapezoid(ratio * prior, theta))


@pytest.mark.parametrize("control,arm", [((30, 100), (45, 100)), ((50, 80), (40, 90)),
                                         ((10, 40), (12, 30))])
def test_msprt_likelihood_ratio_matches_the_integrated_mixture(control, arm):
    tau = 0.1
    test = msprt(control, arm, tau=tau, min_samples=1)
    (sc, nc), (sa, na) = control, arm
    tc, ta = (sc + 0.5) / (nc + 1), (sa + 0.5) / (na + 1)
    v = ta * (1 - ta) / na + tc * (1 - tc) / nc
    assert test.likelihood_ratio == pytest.approx(
        _mixture_lr_by_quadrature(sa / na - sc / nc, v, tau), rel=1e-6)


def test_msprt_interval_edges_are_where_the_ratio_reaches_one_over_alpha():
    alpha, tau = 0.05, 0.1
    test = msprt((40, 100), (55, 100), alpha=alpha, tau=tau, min_samples=1)
    tc, ta = 40.5 / 101, 55.5 / 101
    v = ta * (1 - ta) / 100 + tc * (1 - tc) / 100
    for edge in test.interval:
        assert _mixture_lr_by_quadrature(test.difference - edge, v, tau) == \
               pytest.approx(1 / alpha, rel=1e-4)


def test_msprt_verdicts():
    assert msprt((50, 200), (150, 200)).verdict is Verdict.BETTER
    assert msprt((150, 200), (50, 200)).verdict is Verdict.WORSE
    assert msprt((100, 200), (104, 200)).verdict is Verdict.CONTINUE
    assert msprt((5, 10), (9, 10), min_samples=20).verdict is Verdict.INSUFFICIENT_DATA


def test_msprt_keeps_its_error_rate_when_checked_after_every_outcome():
    """Both arms at the same rate, the test read after every pair of outcomes up to 400: it
    may wrongly call a winner in at most about alpha of the runs; the fixed-sample z test
    read the same way does so far more often."""
    rng = np.random.default_rng(7)
    runs, n_max, alpha = 200, 400, 0.05
    wrong_msprt = wrong_naive = 0
    for _ in range(runs):
        a = np.cumsum(rng.random(n_max) < 0.5)
        b = np.cumsum(rng.random(n_max) < 0.5)
        stopped = naive = False
        for n in range(20, n_max + 1, 2):
            sa, sb = int(a[n - 1]), int(b[n - 1])
            if not stopped and msprt((sa, n), (sb, n), alpha=alpha).verdict in (
                    Verdict.BETTER, Verdict.WORSE):
                stopped = True
            pa, pb = sa / n, sb / n
            pooled = (sa + sb) / (2 * n)
            se = math.sqrt(max(pooled * (1 - pooled) * 2 / n, 1e-12))
            naive = naive or abs(pb - pa) / se > 1.96
        wrong_msprt += stopped
        wrong_naive += naive
    assert wrong_msprt / runs <= alpha + 0.02
    assert wrong_naive / runs > 3 * max(wrong_msprt / runs, alpha)


# ------------------------------------------------------------------------------ store


def _outcome(arm: str, correct: bool | None = True, **kw) -> Outcome:
    return Outcome(arm=arm, problem_hash="p", compiled=kw.pop("compiled", True), correct=correct,
                   speedup=kw.pop("speedup", 1.5 if correct else None),
                   reward=kw.pop("reward", 1.0), latency_s=kw.pop("latency_s", 2.0), **kw)


@pytest.fixture
def store(tmp_path):
    with ABStore.in_state_dir(tmp_path) as s:
        s.add_arm("base")
        s.add_arm("new", {"generator": "/ck/generator"}, weight=1.0)
        yield s


def test_reopened_store_keeps_every_outcome(tmp_path, store):
    written = [_outcome("base" if i % 3 else "new", correct=i % 2 == 0, job_id=f"j{i}")
               for i in range(50)]
    for o in written:
        store.record(o)
    store.close()
    with ABStore.in_state_dir(tmp_path) as reopened:
        assert reopened.outcomes() == written
        assert [a.name for a in reopened.arms()] == ["base", "new"]


def test_outcomes_committed_before_a_crash_survive_it(tmp_path, store):
    """A writer killed without closing (os._exit) loses none of the outcomes it recorded."""
    script = textwrap.dedent(f"""
        import os
        from multiminddev.serve.ab import ABStore, Outcome
        store = ABStore.in_state_dir({str(tmp_path)!r})
        for i in range(40):
            store.record(Outcome(arm="new", problem_hash="p", compiled=True, correct=None,
                                 speedup=None, reward=0.5, latency_s=1.0, job_id=f"c{{i}}"))
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert [o.job_id for o in store.outcomes("new")] == [f"c{i}" for i in range(40)]


def test_promote_moves_all_traffic_and_makes_the_control(store):
    store.promote("new")
    assert {store.assign(f"r{i}").name for i in range(300)} == {"new"}
    assert store.control() == "new"


def test_a_second_store_on_the_same_file_sees_changes_at_once(tmp_path, store):
    with ABStore.in_state_dir(tmp_path) as other:
        other.set_weights({"base": 0.0})
    assert store.assign("anything").name == "new"


def test_first_arm_is_the_control(store):
    assert store.control() == "base"


def test_duplicate_arm_is_refused(store):
    with pytest.raises(ArmExistsError, match="exists"):
        store.add_arm("base")


def test_weights_leaving_no_traffic_are_refused(store):
    with pytest.raises(ValueError, match="no arm with traffic"):
        store.set_weights({"base": 0.0, "new": 0.0})
    assert [a.weight for a in store.arms()] == [1.0, 1.0]


def test_unknown_arm_is_named_in_the_error(store):
    with pytest.raises(KeyError, match="known arms: base, new"):
        store.promote("nope")
    with pytest.raises(KeyError, match="nope"):
        store.record(_outcome("nope"))


def test_summary_finds_the_better_arm(store):
    for i in range(200):
        store.record(_outcome("base", correct=i % 4 == 0))
        store.record(_outcome("new", correct=i % 4 != 0))
    arms = {a["name"]: a for a in store.summary()["arms"]}
    assert arms["base"]["test"]["verdict"] == "control"
    assert arms["new"]["test"]["verdict"] == "better"
    assert arms["new"]["correct_rate"] == 0.75
    lo, hi = arms["new"]["correct_ci"]
    assert lo < 0.75 < hi


def test_unmeasured_correctness_stays_out_of_the_correct_rate(store):
    store.record(_outcome("base", correct=None))
    store.record(_outcome("base", correct=False, compiled=False))
    base = store.summary()["arms"][0]
    assert (base["n"], base["compiled"], base["n_known"], base["correct"]) == (2, 1, 1, 0)


def test_summary_is_json_clean_without_outcomes(store):
    import json

    text = json.dumps(store.summary(), allow_nan=False)
    assert '"n": 0' in text


# ------------------------------------------------------------------------------ outcomes


def _result(status: EvalStatus, speedup: float = 0.0) -> EvalResult:
    compiled = status is not EvalStatus.COMPILE_ERROR
    return EvalResult(status=status, problem="p",
                      compile=CompileResult(status=StageStatus.OK if compiled
                                            else StageStatus.FAILED),
                      benchmark=BenchmarkResult(status=StageStatus.OK, speedup_vs_eager=speedup))


@pytest.mark.parametrize("status,compiled,correct,speedup", [
    (EvalStatus.OK, True, True, 2.5),
    (EvalStatus.NO_GPU, True, None, None),
    (EvalStatus.INCORRECT, True, False, None),
    (EvalStatus.COMPILE_ERROR, False, False, None),
])
def test_outcome_from_result(status, compiled, correct, speedup):
    o = outcome_from_result(arm="a", source="src", result=_result(status, 2.5), reward=0.1,
                            latency_s=3.0)
    assert (o.compiled, o.correct, o.speedup) == (compiled, correct, speedup)


def test_a_job_without_a_kernel_counts_as_a_failure():
    o = outcome_from_result(arm="a", source="src", result=None, reward=None, latency_s=1.0)
    assert (o.compiled, o.correct) == (False, False)


@dataclass(kw_only=True)
class _FinishedJob:
    """The fields a job manager's job exposes to its on_finished callbacks."""

    id: str
    arm: str | None
    source: str
    status: str
    episode: Episode | None
    latency_s: float | None


def _episode(result: EvalResult | None, rewards: list[float]) -> Episode:
    from multiminddev.agents.roles import AgentRole
    from multiminddev.tasks.problem import load_problem_source
    from tests.episode.helpers import RELU_PROBLEM

    turns = [Turn(index=i, role=AgentRole.GENERATOR, reward=r) for i, r in enumerate(rewards)]
    return Episode(problem=load_problem_source(RELU_PROBLEM, name="relu"), turns=turns,
                   best_result=result)


def test_record_job_stores_the_episode_outcome(store):
    job = _FinishedJob(id="j1", arm="new", source="src", status="succeeded",
                       episode=_episode(_result(EvalStatus.OK, 3.0), [0.25, 1.0]), latency_s=4.0)
    record_job(store, job)
    (o,) = store.outcomes()
    assert (o.arm, o.correct, o.speedup, o.reward, o.latency_s, o.job_id) == \
           ("new", True, 3.0, 1.25, 4.0, "j1")


def test_record_job_skips_jobs_outside_the_test(store):
    record_job(store, _FinishedJob(id="a", arm=None, source="s", status="succeeded",
                                   episode=None, latency_s=1.0))
    record_job(store, _FinishedJob(id="b", arm="base", source="s", status="failed",
                                   episode=None, latency_s=1.0))
    assert store.outcomes() == []
