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
    parent, child = multiprocessing.Pipe()
    groups = [[torch.randn(4, 4), torch.arange(3)], [torch.ones(2, dtype=torch.float16)]]
    send_tensor_lists(child, "outputs", groups)
    tag, payload = parent.recv()
    receive_frames(parent, payload)
    back = [[unpack_tensor(m) for m in g] for g in payload["outputs"]]
    assert tag == "outputs"
    assert all(torch.equal(a, b) for ga, gb in zip(groups, back) for a, b in zip(ga, gb))


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
    send_tensor_lists(child, "outputs", GROUPS, transfer="memfd")
    tag, payload = parent.recv()
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


def test_memfd_receiver_refuses_bytes_outside_the_file():
    import os
    from multiprocessing import reduction

    parent, child = multiprocessing.Pipe(duplex=True)
    fd = os.memfd_create("test", os.MFD_CLOEXEC)
    os.write(fd, b"\0" * 16)
    reduction.send_handle(child, fd, os.getpid())
    os.close(fd)
    payload = {"memfd_bytes": 16, "outputs": [[{"kind": "tensor", "dtype": "float32",
                                                 "shape": [4], "nbytes": 16, "offset": 8}]]}
    with pytest.raises(OSError, match="outside"):
        receive_frames(parent, payload)


def test_kind_detection():
    assert detect_kind("from multiminddev.cuda import compile_kernels") is CandidateKind.NVRTC
    assert detect_kind("from torch.utils.cpp_extension import load_inline") is CandidateKind.LOAD_INLINE
    assert detect_kind("import torch") is CandidateKind.UNKNOWN
    assert detect_kind("def (") is CandidateKind.UNKNOWN
