"""GPU tests: baselines measured ahead by the trusted baseline workers.

A prefetched problem's candidates find every baseline figure in their job and measure none;
every problem of a baseline worker keeps its torch.compile figure; a second evaluator reads
them from the authenticated disk cache; and with prefetching, several
problems' first evaluations take less wall time than measuring each baseline in its
candidate's own evaluation.
"""

from __future__ import annotations

import time

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from tests.env._fixtures import FIXTURES, problem_for

pytestmark = pytest.mark.gpu

HONEST = [FIXTURES / "honest" / name for name in
          ("relu_basic.py", "softmax_block.py", "sum_dim_shared.py", "matmul_tiled.py")]


def _config(cache_dir, **overrides):
    return EvalConfig(num_workers=1, cache_dir=str(cache_dir), bench_budget_s=0.3, **overrides)


def _pairs(paths):
    return [(problem_for(p), p.read_text()) for p in paths]


def test_a_prefetched_problems_candidate_measures_no_baseline(tmp_path):
    [(problem, source)] = _pairs(HONEST[:1])
    with Evaluator(_config(tmp_path)) as ev:
        assert ev.prefetch_baselines([problem]) == 1
        result = ev.evaluate(problem, source)
    assert result.status is EvalStatus.OK, result.message
    assert result.timings["baseline.measured_in_job"] == 0.0
    assert result.benchmark.compiled is not None and result.benchmark.eager.median_ms > 0
    assert "parent.wait.gate" in result.timings  # the candidate's timing asked for the gate


def test_a_prefetch_that_waits_returns_with_every_figure_stored(tmp_path):
    pairs = _pairs(HONEST[:2])
    with Evaluator(_config(tmp_path)) as ev:
        assert ev.prefetch_baselines([problem for problem, _ in pairs], wait=True) == 2
        assert not any(ev._prefetch.pending(problem.source_hash) for problem, _ in pairs)
        # peak once, then eager and torch.compile per problem, all on disk already
        assert len(list((tmp_path / "baselines").glob("*.json"))) == 5
        results = [ev.evaluate(problem, source) for problem, source in pairs]
    assert all(r.status is EvalStatus.OK for r in results), [r.message for r in results]
    assert all(r.timings["baseline.measured_in_job"] == 0.0 for r in results)


def test_every_prefetched_problem_keeps_its_torch_compile_figure(tmp_path):
    # three triton-compiled problems on one baseline worker: each must get its figure
    pairs = _pairs(HONEST[:3])
    with Evaluator(_config(tmp_path, baseline_workers=1)) as ev:
        assert ev.prefetch_baselines([problem for problem, _ in pairs]) == 3
        results = [ev.evaluate(problem, source) for problem, source in pairs]
    for result in results:
        assert result.status is EvalStatus.OK, result.message
        assert result.timings["baseline.measured_in_job"] == 0.0, result.problem
        assert result.benchmark.compiled is not None


def test_a_second_run_reads_the_baselines_from_the_disk_cache(tmp_path):
    [(problem, source)] = _pairs(HONEST[:1])
    with Evaluator(_config(tmp_path)) as ev:
        ev.prefetch_baselines([problem])
        first = ev.evaluate(problem, source)
    with Evaluator(_config(tmp_path)) as ev:  # a new process would see the same: memory empty
        ev.prefetch_baselines([problem])
        second = ev.evaluate(problem, source)
    assert first.status is second.status is EvalStatus.OK
    assert second.timings["baseline.measured_in_job"] == 0.0
    assert second.benchmark.eager == first.benchmark.eager
    assert second.benchmark.compiled == first.benchmark.compiled
    assert len(list((tmp_path / "baselines").glob("*.json"))) == 3  # peak, eager, compiled


def test_without_prefetching_the_candidates_worker_measures_and_stores_them(tmp_path):
    [(problem, source)] = _pairs(HONEST[:1])
    with Evaluator(_config(tmp_path, baseline_workers=0)) as ev:
        assert ev.prefetch_baselines([problem]) == 0
        first = ev.evaluate(problem, source)
        again = ev.evaluate(problem, source)
    assert first.timings["baseline.measured_in_job"] == 3.0  # peak, eager, torch.compile
    assert again.timings["baseline.measured_in_job"] == 0.0
    assert again.benchmark.eager == first.benchmark.eager


def _wall(config, pairs, prefetch):
    start = time.perf_counter()
    with Evaluator(config) as ev:
        if prefetch:
            ev.prefetch_baselines([p for p, _ in pairs])
        results = ev.evaluate_many(pairs)
    return time.perf_counter() - start, results


def test_prefetching_overlaps_first_sight_baselines_with_evaluations(tmp_path):
    pairs = _pairs(HONEST)
    serial, serial_results = _wall(_config(tmp_path / "serial", baseline_workers=0), pairs, False)
    ahead, ahead_results = _wall(_config(tmp_path / "ahead", baseline_workers=2), pairs, True)
    assert all(r.status is EvalStatus.OK for r in serial_results + ahead_results)
    assert all(r.timings["baseline.measured_in_job"] == 0.0 for r in ahead_results)
    assert ahead < 0.85 * serial, (ahead, serial)
