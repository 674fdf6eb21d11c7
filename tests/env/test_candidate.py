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


def test_kind_detection():
    assert detect_kind("from multiminddev.cuda import compile_kernels") is CandidateKind.NVRTC
    assert detect_kind("from torch.utils.cpp_extension import load_inline") is CandidateKind.LOAD_INLINE
    assert detect_kind("import torch") is CandidateKind.UNKNOWN
    assert detect_kind("def (") is CandidateKind.UNKNOWN
