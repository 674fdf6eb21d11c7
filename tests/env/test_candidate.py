"""Candidate helpers: kind detection and tensor transport."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from multiminddev.env.candidate import (
    CandidateKind,
    NonTensorOutput,
    detect_kind,
    pack_tensor,
    receive_frames,
    send_tensor_lists,
    unpack_tensor,
)
from multiminddev.env.messages import PlainConnection, recv_message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_pack_round_trip_keeps_dtype_shape_and_values(dtype):
    t = (torch.randn(3, 5, 2) * 10).to(dtype)
    back = unpack_tensor(pack_tensor(t))
    assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_non_contiguous_and_empty_tensors_round_trip():
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(unpack_tensor(pack_tensor(t)), t)
    assert unpack_tensor(pack_tensor(torch.empty(0, 3))).shape == (0, 3)


def test_non_tensor_output_is_marked():
    assert isinstance(unpack_tensor(pack_tensor(3.5)), NonTensorOutput)


def test_framed_send_over_a_pipe():
    """Through the worker's connection and the evaluator's plain-data decoder, as in a job."""
    parent, child = multiprocessing.Pipe()
    groups = [[torch.randn(4, 4), torch.arange(3)], [torch.ones(2, dtype=torch.float16)]]
    send_tensor_lists(PlainConnection(child), "outputs", groups)
    tag, payload = recv_message(parent)
    receive_frames(parent, payload)
    back = [[unpack_tensor(m) for m in g] for g in payload["outputs"]]
    assert tag == "outputs"
    assert all(torch.equal(a, b) for ga, gb in zip(groups, back) for a, b in zip(ga, gb))


@pytest.mark.parametrize("transfer", ["pipe", "memfd"])
def test_outputs_past_the_limit_are_described_and_the_evaluator_accepts_the_message(transfer):
    """A wrong output far larger than the reference's reads as a wrong output, not as a
    message the evaluator refuses: the worker describes it instead of sending its bytes."""
    from multiminddev.env.messages import JobProtocol, announced_bytes

    parent, child = multiprocessing.Pipe()
    small, large = torch.randn(4), torch.zeros(1 << 16)
    sent = send_tensor_lists(PlainConnection(child), "outputs", [[small, large]],
                             transfer=transfer, limit_bytes=small.numel() * 4 + 1000)
    tag, payload = recv_message(parent)
    protocol = JobProtocol()
    protocol.admit("begin", "run")
    protocol.admit(tag, payload)  # 16 bytes of tensors: within any limit
    assert sent == announced_bytes(payload) == small.numel() * 4
    receive_frames(parent, payload)
    kept, described = (unpack_tensor(m) for m in payload["outputs"][0])
    assert torch.equal(kept, small) and isinstance(described, NonTensorOutput)
    assert "larger than the evaluator takes" in described.text


GROUPS = [[torch.randn(4, 4), torch.arange(3), 2.5],
          [torch.ones(2, dtype=torch.float16), torch.empty(0, 3), torch.tensor([True, False])]]


def _same(sent, received) -> bool:
    for a, b in zip(sent, received, strict=True):
        if isinstance(a, torch.Tensor):
            if not (b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)):
                return False
        elif not isinstance(b, NonTensorOutput):
            return False
    return True


def test_memfd_send_in_one_process_round_trips():
    parent, child = multiprocessing.Pipe(duplex=True)  # a socketpair: descriptors can travel
    send_tensor_lists(PlainConnection(child), "outputs", GROUPS, transfer="memfd")
    tag, payload = recv_message(parent)
    assert tag == "outputs" and payload["memfd_bytes"] == 4 * 16 + 8 * 3 + 2 * 2 + 2
    receive_frames(parent, payload)
    back = [[unpack_tensor(m) for m in g] for g in payload["outputs"]]
    assert all(_same(ga, gb) for ga, gb in zip(GROUPS, back, strict=True))


def _memfd_sender_under_sandbox(conn, workdir):
    """A worker's view: sandbox on, send through a memfd, then try what candidate code could."""
    import os
    import socket

    from multiminddev.env import sandbox

    sandbox.install_sandbox(workdir)
    before = set(os.listdir("/proc/self/fd"))
    send_tensor_lists(conn, "outputs", [[torch.arange(1 << 20, dtype=torch.float32)]],
                      transfer="memfd")
    left = [os.readlink(f"/proc/self/fd/{fd}") for fd in set(os.listdir("/proc/self/fd")) - before]
    a, b = socket.socketpair()
    try:
        socket.send_fds(a, [b"x"], [b.fileno()])  # sendmsg outside the harness: still refused
        refused = False
    except sandbox.SandboxViolation:
        refused = True
    conn.send(("checks", {"fds_left": [x for x in left if "memfd" in x], "refused": refused}))


def test_memfd_send_works_under_the_sandbox_and_leaves_the_worker_no_handle(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_memfd_sender_under_sandbox, args=(child, tmp_path))
    proc.start()
    try:
        assert parent.poll(120), "the sandboxed sender did not answer"
        tag, payload = parent.recv()
        receive_frames(parent, payload)
        (tensor,) = [unpack_tensor(m) for m in payload["outputs"][0]]
        assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.float32))
        _, checks = parent.recv()
        assert checks == {"fds_left": [], "refused": True}
    finally:
        proc.join(30)


def _hand_over_memfd(data: bytes, seals: int) -> tuple[object, dict]:
    """A memfd holding ``data`` with ``seals``, sent over a fresh pipe the way a worker does."""
    import fcntl
    import os
    from multiprocessing import reduction

    parent, child = multiprocessing.Pipe(duplex=True)
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    reduction.send_handle(child, fd, os.getpid())
    os.close(fd)
    return parent, {"memfd_bytes": len(data)}


def _float_meta(offset: int, count: int) -> dict:
    return {"kind": "tensor", "dtype": "float32", "shape": [count], "nbytes": 4 * count,
            "offset": offset}


def test_memfd_receiver_refuses_bytes_outside_the_file():
    from multiminddev.env.candidate import transfer_seals

    parent, payload = _hand_over_memfd(b"\0" * 16, transfer_seals())
    payload["outputs"] = [[_float_meta(8, 4)]]
    with pytest.raises(OSError, match="outside"):
        receive_frames(parent, payload)


def test_memfd_receiver_refuses_a_file_that_could_still_change():
    # without the seals, whoever else holds the file could rewrite the bytes before they are
    # verified, or shrink it under the evaluator's mapping (a read past the end: SIGBUS)
    import fcntl

    for seals in (0, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW, fcntl.F_SEAL_WRITE):
        parent, payload = _hand_over_memfd(b"\0" * 16, seals)
        payload["outputs"] = [[_float_meta(0, 4)]]
        with pytest.raises(OSError, match="not sealed"):
            receive_frames(parent, payload)


def test_candidate_code_that_reopened_the_transfer_file_cannot_change_what_was_sent(monkeypatch):
    import os

    from multiminddev.env import candidate

    reopened: list[int] = []
    write_all = candidate._write_all

    def write_and_reopen(fd, raw):  # what a candidate thread could do while the file is written
        reopened.append(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
        write_all(fd, raw)

    monkeypatch.setattr(candidate, "_write_all", write_and_reopen)
    parent, child = multiprocessing.Pipe(duplex=True)
    sent = torch.arange(16, dtype=torch.float32)
    send_tensor_lists(child, "outputs", [[sent]], transfer="memfd")
    _, payload = parent.recv()
    receive_frames(parent, payload)
    try:
        with pytest.raises(PermissionError):
            os.pwrite(reopened[0], b"\xff" * 64, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(reopened[0], 0)
    finally:
        os.close(reopened[0])
    (back,) = [unpack_tensor(m) for m in payload["outputs"][0]]
    assert torch.equal(back, sent)


def test_kind_detection():
    assert detect_kind("from multiminddev.cuda import compile_kernels") is CandidateKind.NVRTC
    assert detect_kind("from torch.utils.cpp_extension import load_inline") is CandidateKind.LOAD_INLINE
    assert detect_kind("import torch") is CandidateKind.UNKNOWN
    assert detect_kind("def (") is CandidateKind.UNKNOWN


class _PosesAsTensor:
    """An output that answers isinstance(torch.Tensor) through a __class__ property and would
    compute in its own .cpu()/__repr__ (a lazy output), recording whether the harness called them."""

    called: list[str] = []

    @property
    def __class__(self):
        return torch.Tensor

    def cpu(self):
        self.called.append("cpu")
        return torch.zeros(1)

    def __repr__(self):
        self.called.append("repr")
        return "tensor([0.])"


def test_an_object_posing_as_a_tensor_is_described_without_running_its_code():
    from multiminddev.env.timed_checks import _poses_as_tensor
    from multiminddev.env.worker import to_host

    lazy = _PosesAsTensor()
    assert isinstance(lazy, torch.Tensor) and _poses_as_tensor(lazy)
    assert not _poses_as_tensor(torch.zeros(1)) and not _poses_as_tensor(2.5)
    assert to_host(lazy, pinned=False) is lazy
    described = unpack_tensor(pack_tensor(lazy))
    assert isinstance(described, NonTensorOutput) and "_PosesAsTensor" in described.text
    assert _PosesAsTensor.called == []
