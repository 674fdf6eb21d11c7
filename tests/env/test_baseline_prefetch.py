"""Baselines measured ahead of the candidates: the schedule, what a job measures, the timing
gate the pool grants, the cache a second run reads, and the worker that refuses a baseline job
once candidate code loaded."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from multiminddev.core.results import StageStatus
from multiminddev.env.benchmark import TrustedBaselines, figures_to_measure
from multiminddev.env.config import EvalConfig
from multiminddev.env.pool import JobOutcome, TimingGate, WorkerPool
from multiminddev.env.prefetch import BaselinePrefetch, prefetch_order
from tests.conftest import gpu_available

STATS = {"median_ms": 1.5, "mean_ms": 1.6, "min_ms": 1.4, "max_ms": 2.0, "std_ms": 0.1,
         "iqr_ms": 0.1, "runs": 20}

# ------------------------------------------------------------------ the schedule


def test_prefetch_order_keeps_first_sight_order_once_each():
    assert prefetch_order(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_prefetch_order_skips_what_is_already_scheduled():
    assert prefetch_order(["b", "a", "c"], scheduled={"a"}) == ["b", "c"]


def test_each_problem_is_measured_once_in_the_order_given():
    measured: list[str] = []
    prefetch = BaselinePrefetch(measured.append, workers=1)
    prefetch.schedule([("p2", "p2"), ("p1", "p1"), ("p2", "p2")])
    prefetch.schedule([("p1", "p1"), ("p3", "p3")])
    for key in ("p1", "p2", "p3"):
        assert prefetch.wait(key, 10.0)[0]
    prefetch.close()
    assert measured == ["p2", "p1", "p3"]


def test_a_candidate_waits_for_its_own_problem_only():
    release = threading.Event()
    prefetch = BaselinePrefetch(lambda item: release.wait(10.0) if item == "slow" else None,
                                workers=2)
    prefetch.schedule([("slow", "slow"), ("fast", "fast")])
    ready, _ = prefetch.wait("fast", 5.0)
    assert ready and not prefetch.wait("slow", 0.05)[0]
    release.set()
    prefetch.close()


def test_a_wait_past_its_limit_says_not_ready_and_how_long_it_waited():
    release = threading.Event()
    prefetch = BaselinePrefetch(lambda item: release.wait(10.0), workers=1)
    prefetch.schedule([("p", "p")])
    ready, waited = prefetch.wait("p", 0.2)
    release.set()
    prefetch.close()
    assert not ready and waited >= 0.2


def test_a_wait_without_a_limit_returns_when_the_measurement_ends():
    release = threading.Event()
    prefetch = BaselinePrefetch(lambda item: release.wait(10.0), workers=1)
    prefetch.schedule([("p", "p")])
    threading.Timer(0.3, release.set).start()
    ready, waited = prefetch.wait("p", None)
    prefetch.close()
    assert ready and 0.2 <= waited < 9.0


def test_a_problem_never_scheduled_is_not_waited_for():
    prefetch = BaselinePrefetch(lambda item: None, workers=1)
    assert prefetch.wait("unknown", 10.0) == (False, 0.0)
    prefetch.close()


def test_a_failed_measurement_ends_the_wait():
    def fail(item):
        raise RuntimeError("the problem does not build")

    prefetch = BaselinePrefetch(fail, workers=1)
    prefetch.schedule([("p", "p")])
    assert prefetch.wait("p", 10.0)[0]
    prefetch.close()


# ------------------------------------------------------------------ what a job measures

CACHED = {"peak_gbps": 3000.0, "eager_baseline": STATS, "compiled_baseline": STATS}


def test_a_job_carrying_every_figure_measures_none():
    assert figures_to_measure(CACHED, compile_baseline=True) == []


def test_a_job_measures_exactly_the_figures_it_lacks():
    figures = {**CACHED, "compiled_baseline": None}
    assert figures_to_measure(figures, compile_baseline=True) == ["compiled_baseline"]


def test_the_compile_baseline_is_measured_only_when_asked_for():
    empty = dict.fromkeys(CACHED)
    assert figures_to_measure(empty, compile_baseline=False) == ["peak_gbps", "eager_baseline"]


def test_a_baseline_job_skips_eager_when_eager_figures_are_not_reused():
    empty = dict.fromkeys(CACHED)
    assert figures_to_measure(empty, compile_baseline=True, eager=False) == [
        "peak_gbps", "compiled_baseline"]


def test_baseline_workers_default_to_half_the_cores_within_two_and_eight():
    from multiminddev.env.config import default_baseline_workers

    assert [default_baseline_workers(c) for c in (1, 2, 6, 16, 128)] == [2, 2, 3, 8, 8]
    assert EvalConfig().baseline_workers == default_baseline_workers()


def test_eager_reuse_is_on_by_default_and_baseline_workers_are_validated():
    assert EvalConfig().reuse_eager_baseline
    with pytest.raises(ValueError, match="baseline_workers"):
        EvalConfig(baseline_workers=-1)


# ------------------------------------------------------------------ the cache a second run reads


def test_a_second_run_reads_every_figure_from_the_authenticated_disk_cache(tmp_path):
    first = TrustedBaselines(tmp_path)
    first.record_peak_gbps("NVIDIA H200", "2.13", 4200.0)
    first.record_eager_baseline("abc", "NVIDIA H200", "2.13", STATS)
    first.record_compiled_baseline("abc", "NVIDIA H200", "2.13", {**STATS, "median_ms": 1.2})
    second = TrustedBaselines(tmp_path)  # a new process: memory empty, the disk cache kept
    assert second.figures("abc", "NVIDIA H200", "2.13") == {
        "peak_gbps": 4200.0, "eager_baseline": STATS,
        "compiled_baseline": {**STATS, "median_ms": 1.2}}
    assert sorted(p.suffix for p in (tmp_path / "baselines").iterdir()) == [".json"] * 3


def test_eager_figures_are_not_handed_out_when_not_reused(tmp_path):
    cache = TrustedBaselines(tmp_path)
    cache.record_eager_baseline("abc", "NVIDIA H200", "2.13", STATS)
    assert cache.figures("abc", "NVIDIA H200", "2.13", eager=False)["eager_baseline"] is None


def test_an_eager_figure_of_another_gpu_is_a_miss(tmp_path):
    cache = TrustedBaselines(tmp_path)
    cache.record_eager_baseline("abc", "NVIDIA H200", "2.13", STATS)
    assert cache.eager_baseline("abc", "NVIDIA H100 80GB HBM3", "2.13") is None


# ------------------------------------------------------------------ what a candidate's job carries

GPU = "NVIDIA H200"


def _record_all(store, problem):
    """What a finished baseline job leaves in the evaluator's store."""
    import torch

    store.record_peak_gbps(GPU, torch.__version__, 4000.0)
    store.record_eager_baseline(problem.source_hash, GPU, torch.__version__, STATS)
    store.record_compiled_baseline(problem.source_hash, GPU, torch.__version__, STATS)


def _candidate_job(ev, problem, measure):
    """The job the evaluator would send a GPU worker, with ``measure`` as the problem's
    scheduled baseline job; returns (job, the evaluator's waits)."""
    ev._prefetch = BaselinePrefetch(measure, workers=1)
    ev._prefetch.schedule([(problem.source_hash, problem)])
    waits: dict[str, float] = {}
    job = ev._with_baselines(problem, {}, {"gpu": True, "device": GPU}, waits=waits)
    return job, waits


TIMED = {"candidate": STATS, "checked_calls": 8}  # a ("benchmark", ...) report


def _report(**figures):
    """A candidate worker's ("baseline", ...) report with the figures it was given."""
    import torch

    return {"eager": None, "compiled": None, "peak_gbps": None, "gpu_name": GPU,
            "torch_version": torch.__version__, "note": "", "measured": [], "ungated": [],
            **figures}


def test_a_candidate_leaves_its_figures_to_the_baseline_job_and_gets_them_after_its_job(tmp_path):
    from multiminddev.env import Evaluator
    from multiminddev.env.evaluator import BASELINES_PENDING
    from tests.env._fixtures import problem_named

    problem = problem_named("1_relu")
    with Evaluator(EvalConfig(num_workers=1, cache_dir=str(tmp_path))) as ev:
        def measure(item):
            time.sleep(0.5)
            _record_all(ev._baselines, item)

        job, waits = _candidate_job(ev, problem, measure)
        # sent at once, measuring none of them: the baseline job is already on it
        assert waits == {}
        assert job[BASELINES_PENDING] == ["peak_gbps", "eager_baseline", "compiled_baseline"]
        outcome = JobOutcome(messages={"baseline": _report(), "benchmark": TIMED})
        ev._add_prefetched_figures(problem, outcome, job[BASELINES_PENDING], waits)
    report = outcome.messages["baseline"]
    assert report["eager"] == STATS and report["compiled"] == STATS
    assert report["peak_gbps"] == 4000.0
    assert waits["baseline"] >= 0.3 and not outcome.infra_error


def test_figures_the_baseline_job_did_not_keep_make_an_infra_error_that_a_retry_measures(tmp_path):
    import torch

    from multiminddev.env import Evaluator
    from multiminddev.env.evaluator import BASELINES_PENDING
    from tests.env._fixtures import problem_named

    problem = problem_named("1_relu")
    with Evaluator(EvalConfig(num_workers=1, cache_dir=str(tmp_path))) as ev:
        release = threading.Event()
        # torch.compile failed on the model and the eager timing was lost: only peak is kept
        job, waits = _candidate_job(
            ev, problem, lambda item: (release.wait(10.0),
                                       ev._baselines.record_peak_gbps(GPU, torch.__version__, 4e3)))
        outcome = JobOutcome(messages={"baseline": _report(), "benchmark": TIMED})
        release.set()
        ev._add_prefetched_figures(problem, outcome, job[BASELINES_PENDING], waits)
        assert "eager_baseline" in outcome.infra_error and "compiled" not in outcome.infra_error
        assert "torch.compile baseline not measured" in outcome.messages["baseline"]["note"]
        # the retry: that baseline job has ended, so the candidate's worker measures the rest
        again = ev._with_baselines(problem, {}, {"gpu": True, "device": GPU}, waits={})
    assert BASELINES_PENDING not in again
    assert figures_to_measure(again, compile_baseline=True) == ["eager_baseline",
                                                                "compiled_baseline"]


def test_a_candidate_that_was_not_timed_does_not_wait_for_its_figures(tmp_path):
    from multiminddev.env import Evaluator
    from multiminddev.env.evaluator import BASELINES_PENDING
    from tests.env._fixtures import problem_named

    problem = problem_named("1_relu")
    release = threading.Event()
    with Evaluator(EvalConfig(num_workers=1, cache_dir=str(tmp_path))) as ev:
        job, waits = _candidate_job(ev, problem, lambda item: release.wait(10.0))
        outcome = JobOutcome(messages={"baseline": _report()})  # it failed before its timing
        started = time.monotonic()
        ev._add_prefetched_figures(problem, outcome, job[BASELINES_PENDING], waits)
        assert time.monotonic() - started < 1.0 and not outcome.infra_error
        release.set()


def test_a_correct_candidate_without_an_eager_figure_is_not_timed_against_anything():
    from multiminddev.env.assemble import _benchmark
    from tests.env._fixtures import problem_named

    outcome = JobOutcome(messages={"baseline": _report(), "benchmark": TIMED})
    bench = _benchmark(problem_named("1_relu"), outcome, EvalConfig())
    assert bench.status is StageStatus.ERROR and bench.speedup_vs_eager == 0.0


def test_a_candidate_whose_figures_are_cached_does_not_wait(tmp_path):
    from multiminddev.env import Evaluator
    from tests.env._fixtures import problem_named

    problem = problem_named("1_relu")
    release = threading.Event()
    with Evaluator(EvalConfig(num_workers=1, cache_dir=str(tmp_path))) as ev:
        _record_all(ev._baselines, problem)
        job, waits = _candidate_job(ev, problem, lambda item: release.wait(10.0))
        release.set()
    assert figures_to_measure(job, compile_baseline=True) == [] and waits == {}


# ------------------------------------------------------------------ the timing gate


def _collect_with_gate(messages, gate, config=None, kills=None):
    """Run the pool's collector over a real pipe; returns the outcome and what the worker's
    end of the pipe received (the gate's answers). ``kills`` collects, per kill of the
    worker, whether the gate was still held then."""
    pool = WorkerPool(config or EvalConfig(num_workers=1))
    parent, child = multiprocessing.Pipe(duplex=True)
    for message in messages:
        child.send(message)
    outcome = JobOutcome()
    kills = [] if kills is None else kills
    worker = SimpleNamespace(conn=parent, jobs_done=0,
                             kill=lambda: kills.append(not gate.acquire(0.0)))
    pool._collect(worker, outcome, {}, gate)
    pool.close()
    answers = []
    while child.poll(0.1):
        answers.append(child.recv())
    return outcome, answers


def test_the_gate_is_granted_and_free_again_after_release():
    gate = TimingGate()
    _, answers = _collect_with_gate([("begin", "baseline"), ("gate", "acquire"),
                                     ("gate", "release"), ("done", {})], gate)
    assert answers == [("gate", "granted")] and gate.acquire(0.0)


def test_a_job_that_ends_holding_the_gate_gives_it_back():
    gate = TimingGate()
    _collect_with_gate([("begin", "baseline"), ("gate", "acquire"), ("done", {})], gate)
    assert gate.acquire(0.0)


def test_a_held_gate_makes_the_job_wait_without_counting_against_its_stage():
    gate = TimingGate()
    gate.acquire(0.0)  # another job is timing on this GPU
    threading.Timer(1.5, gate.release).start()
    config = EvalConfig(num_workers=1, baseline_timeout_s=6.0)  # 6 s - GATE_MARGIN_S = 1 s
    outcome, answers = _collect_with_gate([("begin", "baseline"), ("gate", "acquire"),
                                           ("gate", "release"), ("done", {})], gate, config)
    assert answers == [("gate", "open")]  # it gave up waiting after ~1 s, and says so
    assert outcome.timed_out_stage is None and 0.9 < outcome.waits["gate"] < 1.5


def test_a_gate_wait_extends_the_stage_by_the_time_waited():
    gate = TimingGate()
    gate.acquire(0.0)
    threading.Timer(0.5, gate.release).start()
    config = EvalConfig(num_workers=1, baseline_timeout_s=10.0)
    outcome, answers = _collect_with_gate([("begin", "baseline"), ("gate", "acquire"),
                                           ("gate", "release"), ("done", {})], gate, config)
    assert answers == [("gate", "granted")] and outcome.waits["gate"] >= 0.4
    assert outcome.stages_seconds["baseline"] < 0.3  # the wait is not the stage's time


def test_a_candidate_cannot_give_the_gate_back_before_its_job_ends():
    gate, held = TimingGate(), [False]
    parent, child = multiprocessing.Pipe(duplex=True)
    worker = SimpleNamespace(conn=parent)
    WorkerPool._answer_gate(worker, gate, held, "acquire", 1.0)
    WorkerPool._answer_gate(worker, gate, held, "release", 1.0, candidate_loaded=True)
    assert child.recv() == ("gate", "granted")
    assert held == [True] and not gate.acquire(0.0)


def test_candidate_code_asking_for_a_busy_gate_is_answered_at_once():
    gate, held = TimingGate(), [False]
    gate.acquire(0.0)  # a baseline is being timed
    parent, child = multiprocessing.Pipe(duplex=True)
    waited = WorkerPool._answer_gate(SimpleNamespace(conn=parent), gate, held, "acquire", 30.0,
                                     candidate_loaded=True)
    assert child.recv() == ("gate", "open") and waited < 1.0 and held == [False]


def test_a_job_that_held_the_gate_through_its_candidate_phase_frees_it_at_its_end():
    gate, kills = TimingGate(), []
    outcome, _ = _collect_with_gate([("begin", "baseline"), ("gate", "acquire"),
                                     ("begin", "compile"), ("begin", "benchmark"), ("done", {})],
                                    gate, kills=kills)
    # its worker is killed while the gate is still held: nothing the candidate left to run
    # (a finalizer, an exit handler) meets the next job's timing
    assert kills == [True]
    assert gate.acquire(0.0)
    assert outcome.stages_seconds["teardown"] >= 0.0  # the kill's cost is in the timings


def test_a_worker_that_ran_no_candidate_is_not_killed_at_its_jobs_end():
    gate, kills = TimingGate(), []
    outcome, _ = _collect_with_gate([("begin", "baseline"), ("gate", "acquire"), ("done", {})],
                                    gate, kills=kills)
    assert kills == [] and gate.acquire(0.0)
    assert "teardown" not in outcome.stages_seconds


def test_a_worker_that_serves_more_candidates_is_kept():
    # max_jobs_per_worker > 1 keeps the process (docs/evaluator.md: weaker isolation)
    gate, kills = TimingGate(), []
    _collect_with_gate([("begin", "baseline"), ("gate", "acquire"), ("begin", "compile"),
                        ("begin", "benchmark"), ("done", {})], gate,
                       EvalConfig(num_workers=1, max_jobs_per_worker=4), kills=kills)
    assert kills == [] and gate.acquire(0.0)


# ------------------------------------------------------------------ who may measure


def _baseline_job_messages(state):
    from multiminddev.env.worker import _run_baseline_job

    parent, child = multiprocessing.Pipe(duplex=True)
    job = {"kind": "baseline", "problem": {}, "config": EvalConfig().to_dict()}
    _run_baseline_job(child, state, job)
    messages = []
    while parent.poll(0.1):
        messages.append(parent.recv())
    return messages


def _state(**overrides):
    from multiminddev.env.worker import WorkerState

    return WorkerState(gpu=False, device_index=None, device_name="cpu", workdir=Path("."),
                       **overrides)


def test_a_worker_that_loaded_candidate_code_refuses_a_baseline_job():
    messages = _baseline_job_messages(_state(candidate_loaded=True))
    assert [tag for tag, _ in messages] == ["fail"]
    assert messages[0][1]["kind"] == "infra_error" and "candidate" in messages[0][1]["message"]


def test_a_baseline_job_without_a_gpu_measures_nothing():
    messages = _baseline_job_messages(_state())
    assert [tag for tag, _ in messages] == ["done"]


@pytest.mark.skipif(gpu_available(), reason="CPU-machine behaviour")
def test_nothing_is_prefetched_where_nothing_is_timed(tmp_path):
    from multiminddev.env import Evaluator
    from tests.env._fixtures import problem_named

    with Evaluator(EvalConfig(num_workers=1, cache_dir=str(tmp_path))) as ev:
        assert ev.prefetch_baselines([problem_named("1_relu")]) == 0


def test_a_retired_worker_exits_on_its_own_while_the_caller_goes_on():
    pool = WorkerPool(EvalConfig(num_workers=1))
    worker = pool.start_worker(None)
    assert worker.wait_ready(120.0), worker.startup_error
    worker.stop_soon()  # returns at once; the exit is reaped in the background
    worker.reaper.join(30.0)
    pool.close()
    assert worker.process.exitcode == 0  # it left when asked, it was not killed


def _queued(gate: TimingGate, count: int) -> None:
    deadline = time.monotonic() + 5.0
    while len(gate._waiting) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_gate_goes_to_jobs_in_the_order_they_asked():
    """A job that asks again right after releasing waits behind the ones already waiting."""
    gate, order = TimingGate(), []
    gate.acquire(0.0)

    def job(name: str) -> None:
        if gate.acquire(10.0):
            order.append(name)
            time.sleep(0.05)
            gate.release()

    first = threading.Thread(target=job, args=("baseline",))
    first.start()
    _queued(gate, 1)
    gate.release()
    job("next candidate")  # asks at once, as back-to-back candidate jobs do
    first.join(10)
    assert order == ["baseline", "next candidate"]


def test_a_waiter_that_gives_up_leaves_the_line():
    gate, got = TimingGate(), []
    gate.acquire(0.0)
    quitter = threading.Thread(target=lambda: got.append(("quitter", gate.acquire(0.2))))
    patient = threading.Thread(target=lambda: got.append(("patient", gate.acquire(10.0))))
    quitter.start()
    _queued(gate, 1)
    patient.start()
    _queued(gate, 2)
    quitter.join(5)
    gate.release()
    patient.join(5)
    assert got == [("quitter", False), ("patient", True)]


def test_releasing_a_gate_nobody_holds_is_an_error():
    with pytest.raises(RuntimeError, match="not held"):
        TimingGate().release()


def test_a_baseline_job_says_why_its_figures_were_not_kept():
    from multiminddev.env.evaluator import prefetch_miss

    def outcome(**kw):
        return JobOutcome(**kw)

    kept = {"eager": {"median_ms": 1.0}, "compiled": {"median_ms": 0.5}, "ungated": []}
    assert prefetch_miss(outcome(messages={"baseline": kept}), compile_baseline=True) == ""
    assert prefetch_miss(outcome(messages={"done": {}}), compile_baseline=True) == ""  # all cached
    assert "timing gate: compiled_baseline" in prefetch_miss(
        outcome(messages={"baseline": {**kept, "ungated": ["compiled_baseline"]}}),
        compile_baseline=True)
    failed = {**kept, "compiled": None, "note": "torch.compile baseline failed: X"}
    assert prefetch_miss(outcome(messages={"baseline": failed}), compile_baseline=True) \
        == "torch.compile baseline failed: X"
    assert prefetch_miss(outcome(messages={"baseline": failed}), compile_baseline=False) == ""
    assert prefetch_miss(outcome(timed_out_stage="baseline"), compile_baseline=True) \
        == "timed out in baseline"
    assert "died in setup" in prefetch_miss(outcome(died_in_stage="setup", exitcode=-9),
                                            compile_baseline=True)
