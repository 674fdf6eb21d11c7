"""The pool's message rules: trusted tags count only before the candidate loads, and a job is
completed for its worker (cached baselines) just before it is sent."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from types import SimpleNamespace

import pytest

from multiminddev.env.config import EvalConfig
from multiminddev.env.pool import JobOutcome, WorkerPool


def _collect(messages, *, killed=None):
    """Feed ``messages`` through a real pipe into the pool's collector, as a worker would
    (a ``bytes`` item is written as a raw frame, as code holding the pipe could)."""
    pool = WorkerPool(EvalConfig(num_workers=1))
    parent, child = multiprocessing.Pipe(duplex=True)

    def write() -> None:  # from a thread: frames larger than the pipe's buffer block until read
        try:
            for message in messages:
                child.send_bytes(message) if isinstance(message, bytes) else child.send(message)
        except OSError:  # the collector stopped reading and the test closed the pipe
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    outcome = JobOutcome()
    killed = [] if killed is None else killed
    worker = SimpleNamespace(conn=parent, kill=lambda: killed.append(True),
                             process=SimpleNamespace(exitcode=-9))
    pool._collect(worker, outcome, {})
    pool.close()
    parent.close()
    writer.join(5.0)
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


def test_a_baseline_sent_after_the_candidate_loaded_ends_the_job_unread():
    killed = []
    outcome = _collect([("begin", "compile"), ("baseline", {"peak_gbps": 1e9}), ("done", {})],
                       killed=killed)
    assert "baseline" not in outcome.messages and outcome.late_trusted == ["baseline"]
    assert killed == [True] and "done" not in outcome.messages


def test_a_stage_restart_is_refused():
    outcome = _collect([("begin", "compile"), ("begin", "setup"), ("baseline", {"peak_gbps": 1e9}),
                        ("done", {})])
    assert outcome.refused_after_load and "begin of the setup stage" in outcome.refused_message
    assert "baseline" not in outcome.messages


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


def _tensor_message(nbytes, tag="outputs"):
    return (tag, {"framed": True, "outputs": [[{"kind": "tensor", "dtype": "uint8",
                                              "shape": [nbytes], "nbytes": nbytes}]]})


def test_a_second_benchmark_message_ends_the_job():
    """Native candidate code that writes its own benchmark frame must also stop the harness's
    from coming: the harness's own message then arrives as a second one and is refused."""
    outcome = _collect([("begin", "compile"), ("begin", "run"), ("begin", "benchmark"),
                        ("benchmark", {"candidate": {"median_ms": 1e-3}, "checked_calls": 8}),
                        ("benchmark", {"candidate": {"median_ms": 2.0}, "checked_calls": 8}),
                        ("done", {})])
    assert outcome.refused_after_load and "second benchmark" in outcome.refused_message
    assert "done" not in outcome.messages


@pytest.mark.parametrize("messages, why", [
    ([("begin", "compile"), ("benchmark", {"candidate": {}, "checked_calls": 1})],
     "benchmark message in the compile stage"),
    ([("begin", "compile"), ("gate", "acquire")], "gate message in the compile stage"),
    ([("begin", "compile"), ("begin", "run"), ("begin", "run")], "begin of the run stage"),
    ([("begin", "compile"), ("begin", "benchmark"), ("outputs", {"framed": True, "outputs": []})],
     "outputs message in the benchmark stage"),
])
def test_a_message_out_of_the_harness_order_ends_the_job(messages, why):
    killed = []
    outcome = _collect([*messages, ("done", {})], killed=killed)
    assert killed == [True] and outcome.refused_after_load and why in outcome.refused_message


def test_candidate_outputs_far_larger_than_the_reference_are_refused_before_allocation():
    """The evaluator allocates what a tensor frame announces: a candidate message may announce
    at most output_byte_limit(reference bytes), so a forged 1 TiB tensor is never allocated."""
    from multiminddev.env.messages import output_byte_limit

    reference = _tensor_message(1000, tag="reference")
    setup = [("begin", "setup"), reference, b"\x00" * 1000, ("begin", "compile"), ("begin", "run")]
    fits = output_byte_limit(1000)
    outcome = _collect([*setup, _tensor_message(fits), b"\x00" * fits, ("done", {})])
    assert not outcome.refused_message and len(outcome.messages["outputs"]["outputs"][0][0]["data"]) == fits
    outcome = _collect([*setup, ("outputs", {"framed": True, "outputs": [[{
        "kind": "tensor", "dtype": "float32", "shape": [1 << 38], "nbytes": 1 << 40}]]})])
    assert outcome.refused_after_load and "over the" in outcome.refused_message


def test_a_worker_that_stops_mid_frame_is_timed_out_not_waited_for(monkeypatch):
    """A frame header promises bytes the writer may never send: the evaluator waits for them
    no longer than the stage's deadline plus FRAME_GRACE_S, then times the stage out."""
    import time

    from multiminddev.env import pool as pool_module

    monkeypatch.setattr(pool_module, "FRAME_GRACE_S", 0.5)
    start = time.monotonic()
    killed = []
    pool = WorkerPool(EvalConfig(num_workers=1, run_timeout_s=1.0))
    parent, child = multiprocessing.Pipe(duplex=True)
    for message in [("begin", "compile"), ("begin", "run"), _tensor_message(64)]:
        child.send(message)
    os.write(child.fileno(), (64).to_bytes(4, "big") + b"\x00" * 10)  # 10 of 64 bytes, then nothing
    outcome = JobOutcome()
    worker = SimpleNamespace(conn=parent, kill=lambda: killed.append(True),
                             process=SimpleNamespace(exitcode=-9, is_alive=lambda: False),
                             stack_at_hang=lambda: "")
    pool._collect(worker, outcome, {})
    pool.close()
    assert outcome.timed_out_stage == "run" and killed == [True]
    assert time.monotonic() - start < 30


def test_a_tensor_frame_of_another_size_than_announced_ends_the_job():
    outcome = _collect([("begin", "compile"), ("begin", "run"),
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
