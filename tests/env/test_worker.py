"""The worker's failure classification (CPU): whose fault an out-of-memory error is."""

from __future__ import annotations

import pytest
import torch

from multiminddev.env import worker

GIB = 1 << 30
TORCH_OOM = ("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of "
             "79.18 GiB of which 2.26 GiB is free. Including non-PyTorch memory, this process has "
             "21.52 GiB memory in use.")


def test_requested_bytes_reads_torchs_message():
    assert worker.requested_bytes(TORCH_OOM) == 3 * GIB
    assert worker.requested_bytes("Tried to allocate 64.00 MiB. GPU 0") == 64 << 20
    assert worker.requested_bytes("Tried to allocate 512 B") == 512
    assert worker.requested_bytes("CUDA error: out of memory") == 0


def test_a_small_evaluation_on_a_full_gpu_is_not_the_candidates_fault():
    # the 2026-11-22 H100 run: two trainers held ~28 GiB each; a 64 MiB request failed
    assert worker.device_was_crowded(64 << 20, 1 * GIB, 80 * GIB)
    # the candidate itself asked for most of the GPU
    assert not worker.device_was_crowded(30 * GIB, 12 * GIB, 80 * GIB)
    assert not worker.device_was_crowded(1 * GIB, 40 * GIB, 80 * GIB)
    assert not worker.device_was_crowded(1, 0, 0)  # no device size known: no excuse


class _Pipe:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def test_out_of_memory_without_a_device_to_ask_stays_a_runtime_error():
    # On this machine torch.cuda.mem_get_info raises: the candidate keeps the blame.
    pipe = _Pipe()
    worker._report_exception(pipe, worker.Stage.RUN, torch.cuda.OutOfMemoryError(TORCH_OOM),
                             trusted=False)
    (tag, payload), = pipe.sent
    assert tag == "fail" and payload["kind"] == worker.FailureKind.RUNTIME
    assert "out of memory" in payload["message"] and not payload["fatal"]


def test_candidate_memory_cap_is_what_the_worker_holds_plus_a_multiple_of_the_setup_peak():
    cap = worker.candidate_memory_cap(4.0, 2.0, held_bytes=1 * GIB, setup_peak_bytes=3 * GIB,
                                      total_bytes=80 * GIB)
    assert cap.cap_bytes == 13 * GIB and cap.factor == 4.0
    # a small problem gets the floor
    small = worker.candidate_memory_cap(4.0, 2.0, held_bytes=GIB // 2, setup_peak_bytes=1 << 20,
                                        total_bytes=80 * GIB)
    assert small.cap_bytes == GIB // 2 + 2 * GIB
    # never above the card
    assert worker.candidate_memory_cap(4.0, 2.0, 10 * GIB, 30 * GIB, 80 * GIB).cap_bytes == 80 * GIB
    assert worker.candidate_memory_cap(None, 2.0, GIB, GIB, 80 * GIB) is None  # off
    assert worker.candidate_memory_cap(4.0, 2.0, GIB, GIB, 0) is None  # card size unknown
    assert "13.00 GiB" in cap.describe() and "candidate_memory_factor" in cap.describe()


def test_an_allocation_past_the_cap_is_the_candidates_doing():
    cap = worker.candidate_memory_cap(4.0, 2.0, GIB, GIB, 80 * GIB)  # 5 GiB
    assert worker.over_memory_cap(40 * GIB, GIB, cap)  # a 40 GiB scratch buffer
    assert worker.over_memory_cap(5 * GIB - GIB // 2, GIB, cap)  # over by the allocator's rounding
    assert not worker.over_memory_cap(64 << 20, 2 * GIB, cap)  # a small request under the cap
    assert not worker.over_memory_cap(40 * GIB, GIB, None)  # no cap


def test_out_of_memory_with_a_cap_but_no_device_to_ask_stays_a_runtime_error():
    pipe = _Pipe()
    cap = worker.candidate_memory_cap(4.0, 2.0, GIB, GIB, 80 * GIB)
    worker._report_exception(pipe, worker.Stage.RUN, torch.cuda.OutOfMemoryError(TORCH_OOM),
                             trusted=False, cap=cap)
    (tag, payload), = pipe.sent
    assert tag == "fail" and payload["kind"] == worker.FailureKind.RUNTIME


def test_a_no_gpu_error_raised_by_candidate_code_on_a_gpu_worker_is_its_own_runtime_error():
    # Candidate code can raise any class with any message; blaming the machine would have the
    # failure retried and left out of training.
    from multiminddev.cuda import NoGPUError

    pipe = _Pipe()
    worker._report_exception(pipe, worker.Stage.RUN, NoGPUError("no NVIDIA driver"),
                             trusted=False, gpu=True)
    (tag, payload), = pipe.sent
    assert payload["kind"] == worker.FailureKind.RUNTIME


def test_a_no_gpu_error_on_a_compile_only_worker_is_no_gpu():
    from multiminddev.cuda import NoGPUError

    pipe = _Pipe()
    worker._report_exception(pipe, worker.Stage.RUN, NoGPUError("no GPU"), trusted=False,
                             gpu=False)
    assert pipe.sent[0][1]["kind"] == worker.FailureKind.NO_GPU


def test_an_out_of_memory_look_alike_is_not_taken_for_torchs():
    class OutOfMemoryError(RuntimeError):  # what a candidate can define
        pass

    pipe = _Pipe()
    worker._report_exception(pipe, worker.Stage.RUN, OutOfMemoryError(TORCH_OOM), trusted=False)
    assert pipe.sent[0][1]["kind"] == worker.FailureKind.RUNTIME


def test_failure_summary_keeps_a_subprocess_traceback_s_cause():
    child = ("An exception occurred in a subprocess:\n\nName=triton_poi_fused_add_0\n"
             "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 40
             + "PermissionError: [Errno 13] Permission denied: '/home/.triton'\n")
    summary = worker.failure_summary(RuntimeError(child))
    assert summary.startswith("RuntimeError: An exception occurred in a subprocess:")
    assert summary.endswith("PermissionError: [Errno 13] Permission denied: '/home/.triton'")
    assert len(summary) <= 300
    assert worker.failure_summary(ValueError("one line")) == "ValueError: one line"
    assert worker.failure_summary(KeyError()) == "KeyError: "


def test_a_worker_sees_its_parents_gpu_alone():
    assert worker.only_device_environment(1, None) == "1"
    assert worker.only_device_environment(0, "2,3") == "2"
    assert worker.only_device_environment(1, " 2, 3 ") == "3"
    uuid = "GPU-39209553-d5c5-3079-561c-1ea134f16b3c"
    assert worker.only_device_environment(0, f"{uuid},GPU-1") == uuid
    with pytest.raises(ValueError, match="not among"):
        worker.only_device_environment(2, "0,1")
    with pytest.raises(ValueError, match="not among"):
        worker.only_device_environment(0, "")
