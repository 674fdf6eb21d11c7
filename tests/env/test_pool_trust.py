"""The pool's message rules: trusted tags count only before the candidate loads, and a job is
completed for its worker (cached baselines) just before it is sent."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from types import SimpleNamespace

import pytest

from multiminddev.env.config import EvalConfig
from multiminddev.env.pool import JobOutcome, WorkerPool


def _collect(messages, *, killed=None):
    """Feed ``messages`` through a real pipe into the pool's collector, as a worker would
    (a ``bytes`` item is written as a raw frame, as code holding the pipe could)."""
    pool = WorkerPool(EvalConfig(num_workers=1))
    parent, child = multiprocessing.Pipe(duplex=True)
    for message in messages:
        child.send_bytes(message) if isinstance(message, bytes) else child.send(message)
    outcome = JobOutcome()
    killed = [] if killed is None else killed
    worker = SimpleNamespace(conn=parent, kill=lambda: killed.append(True),
                             process=SimpleNamespace(exitcode=-9))
    pool._collect(worker, outcome, {})
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


class _MakesDirectory:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_frame_that_names_a_callable_ends_the_job_unread(tmp_path):
    marker = tmp_path / "ran-in-the-evaluator"
    hostile = pickle.dumps(("benchmark", {"candidate": _MakesDirectory(str(marker))}))
    killed = []
    outcome = _collect([("begin", "setup"), ("begin", "compile"), hostile, ("done", {})],
                       killed=killed)
    assert not marker.exists() and killed == [True]
    assert outcome.refused_after_load and outcome.refused_message.startswith("compile: ")
    assert "benchmark" not in outcome.messages and "done" not in outcome.messages


def test_a_refused_frame_before_the_candidate_loads_is_the_workers_fault():
    outcome = _collect([("begin", "setup"), pickle.dumps(["begin", "compile"])])
    assert outcome.refused_message.startswith("setup: ") and not outcome.refused_after_load


def test_malformed_tensor_metadata_ends_the_job():
    outcome = _collect([("begin", "compile"), ("outputs", {"framed": True, "outputs": 3})])
    assert outcome.refused_after_load and "outputs is a int" in outcome.refused_message


def test_a_tensor_frame_of_another_size_than_announced_ends_the_job():
    outcome = _collect([("begin", "compile"),
                        ("outputs", {"framed": True, "outputs": [[{"kind": "tensor", "dtype": "float32",
                                                                 "shape": [2], "nbytes": 8}]]}),
                        b"\x00" * 4096])
    assert outcome.refused_after_load and "announced" in outcome.refused_message


def test_the_hang_stack_file_is_read_only_when_it_is_a_regular_file(tmp_path):
    from multiminddev.env.pool import _read_worker_file_tail

    dump = tmp_path / "stack.txt"
    dump.write_text("x" * 5000 + "File candidate.py, line 7")
    assert _read_worker_file_tail(dump, 40).endswith("line 7")
    assert len(_read_worker_file_tail(dump, 40)) == 40
    secret = tmp_path / "secret"
    secret.write_text("the evaluator's secret")
    link = tmp_path / "link.txt"
    link.symlink_to(secret)  # a worker that swapped its dump file for a link to another file
    with pytest.raises(OSError):
        _read_worker_file_tail(link, 4000)
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)  # opening a FIFO to read would wait for a writer
    assert _read_worker_file_tail(fifo, 4000) == ""
