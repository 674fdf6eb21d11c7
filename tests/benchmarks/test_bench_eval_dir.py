"""bench_eval_dir's pure parts: candidates per minute and the per-stage split of eval-dir rows."""

from __future__ import annotations

import pytest

from multiminddev.env.results import EvalStatus
from tests.benchmarks.helpers import eval_result, load_script

bench = load_script("bench_eval_dir")


def test_rates_over_the_whole_run_and_between_first_and_last_result():
    rates = bench.throughput(4, 12.0, [3.0, 5.0, 7.0, 9.0])
    assert rates["candidates_per_min"] == pytest.approx(20.0)
    assert rates["steady_candidates_per_min"] == pytest.approx(30.0)  # 3 results in 6 s
    assert rates["first_result_s"] == 3.0


def test_one_result_has_no_steady_rate():
    assert bench.throughput(1, 10.0, [4.0])["steady_candidates_per_min"] is None


def test_the_split_averages_each_timing_over_the_rows_that_have_it():
    rows = []
    for setup, baseline in ((1.0, 3.0), (2.0, None)):
        row = eval_result(EvalStatus.OK, speedup=1.5).to_dict()
        row["timings"] = {"stage.setup": setup}
        if baseline is not None:
            row["timings"]["parent.wait.baseline"] = baseline
        rows.append(row)
    split = bench.split(rows)
    assert split["status_counts"] == {"ok": 2}
    assert split["timings"]["stage.setup"] == {"mean_s": 1.5, "total_s": 3.0, "n": 2}
    assert split["timings"]["parent.wait.baseline"] == {"mean_s": 3.0, "total_s": 3.0, "n": 1}
