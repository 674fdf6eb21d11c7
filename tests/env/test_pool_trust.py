"""The pool's message rules: trusted tags count only before the candidate loads, and a job is
completed for its worker (cached baselines) just before it is sent."""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

from multiminddev.env.config import EvalConfig
from multiminddev.env.pool import JobOutcome, WorkerPool


def _collect(messages):
    """Feed ``messages`` through a real pipe into the pool's collector, as a worker would."""
    pool = WorkerPool(EvalConfig(num_workers=1))
    parent, child = multiprocessing.Pipe(duplex=True)
    for message in messages:
        child.send(message)
    outcome = JobOutcome()
    pool._collect(SimpleNamespace(conn=parent), outcome, {})
    pool.close()
    return outcome


def test_a_baseline_sent_before_the_candidate_loads_is_kept():
    outcome = _collect([("begin", "setup"), ("begin", "baseline"), ("baseline", {"peak_gbps": 3e3}),
                        ("begin", "compile"), ("done", {})])
    assert outcome.messages["baseline"] == {"peak_gbps": 3e3} and outcome.late_trusted == []


def test_a_baseline_sent_after_the_candidate_loaded_is_dropped():
    outcome = _collect([("begin", "setup"), ("begin", "baseline"), ("baseline", {"peak_gbps": 3e3}),
                        ("begin", "compile"), ("baseline", {"peak_gbps": 1e9}), ("done", {})])
    assert outcome.messages["baseline"] == {"peak_gbps": 3e3}
    assert outcome.late_trusted == ["baseline"]


def test_a_stage_restart_does_not_reopen_the_trusted_window():
    outcome = _collect([("begin", "compile"), ("begin", "setup"), ("baseline", {"peak_gbps": 1e9}),
                        ("done", {})])
    assert "baseline" not in outcome.messages and outcome.late_trusted == ["baseline"]
