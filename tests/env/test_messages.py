"""The worker -> evaluator messages: plain data out, and a decoder that builds no object a frame
names (unpickling would run it in the evaluator)."""

from __future__ import annotations

import enum
import multiprocessing
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from multiminddev.env.messages import (
    MAX_DEPTH,
    MAX_MESSAGE_BYTES,
    MessageRefused,
    check_payload,
    PlainConnection,
    decode_message,
    plain,
    recv_message,
)


class _MakesDirectory:
    """Pickles as a call of ``os.mkdir``: what a hostile frame would ask the decoder to run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


class _Colour(str, enum.Enum):
    RED = "red"


def test_a_frame_naming_a_callable_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    raw = pickle.dumps(("done", {"notes": [_MakesDirectory(str(marker))]}))
    with pytest.raises(MessageRefused, match="plain data"):
        decode_message(raw)
    assert not marker.exists()
    pickle.loads(raw)  # the same frame through an ordinary unpickler runs the call
    assert marker.exists()


@pytest.mark.parametrize("message, why", [
    (["done", {}], "list where a"),
    (("done",), "tuple where a"),
    ((3, {}), "tuple where a"),
    ("done", "str where a"),
])
def test_a_frame_that_is_no_tag_payload_pair_is_refused(message, why):
    with pytest.raises(MessageRefused, match=why):
        decode_message(pickle.dumps(message))


def test_garbage_and_deep_nesting_are_refused():
    with pytest.raises(MessageRefused, match="undecodable"):
        decode_message(b"\x80\x05not a pickle")
    deep: list = []
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(MessageRefused, match="nested deeper"):
        decode_message(pickle.dumps(("done", deep)))


def test_plain_data_decodes_as_sent():
    message = ("timings", {"median_ms": 0.25, "times": [0.2, 0.3], "shape": (4, 8), "ok": True,
                             "notes": None, "raw": b"\x00\x01", "n": 2 ** 70, "tags": {"a"}})
    assert decode_message(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)) == message


def test_plain_turns_library_types_into_their_python_base():
    value = plain({"kind": _Colour.RED, "ms": np.float64(0.5), "n": np.int64(3),
                   "flag": np.bool_(True), "shape": torch.Size([2, 3]), "ids": {4},
                   "dtype": torch.float16, "view": memoryview(b"ab")})
    assert value == {"kind": "red", "ms": 0.5, "n": 3, "flag": True, "shape": (2, 3),
                     "ids": [4], "dtype": "torch.float16", "view": b"ab"}
    assert [type(v) for v in value.values()] == [str, float, int, bool, tuple, list, str, bytes]
    decode_message(pickle.dumps(("timings", value)))  # and the decoder takes it


def test_a_plain_connection_reaches_the_strict_decoder_through_a_real_pipe():
    parent, child = multiprocessing.Pipe(duplex=True)
    PlainConnection(child).send(("compile", {"kind": _Colour.RED, "ms": np.float32(1.5)}))
    assert recv_message(parent) == ("compile", {"kind": "red", "ms": 1.5})
    child.send(("compile", {"kind": _Colour.RED}))  # the enum itself: a global in the frame
    with pytest.raises(MessageRefused):
        recv_message(parent)


def test_an_oversized_frame_is_refused_before_it_is_read():
    parent, child = multiprocessing.Pipe(duplex=True)
    os.write(child.fileno(), struct.pack("!i", MAX_MESSAGE_BYTES + 1))  # the length alone
    with pytest.raises(MessageRefused, match="over the"):
        recv_message(parent)


@pytest.mark.parametrize("message, why", [
    (("verdict", {"status": "ok"}), "no harness message"),
    (("begin", "celebrate"), "no stage"),
    (("begin", 3), "payload is a int"),
    (("fail", {"kind": "rejected", "message": 7}), "message is a int"),
    (("benchmark", "fast"), "payload is a str"),
    (("guards", {"coverage": "1.0"}), "coverage is a str"),
    (("outputs", {"outputs": [3]}), "group that is no list"),
    (("outputs", {"outputs": [[{"kind": "tensor", "dtype": "load", "shape": [2], "nbytes": 8}]]}),
     "dtype, shape or size"),
    # nothing to read, and a shape the evaluator would have to allocate: 4 TB of zeros
    (("outputs", {"outputs": [[{"kind": "tensor", "dtype": "float32", "shape": [1 << 20, 1 << 20],
                                "nbytes": 0}]]}), "announcing 0 bytes"),
    (("reference", {"outputs": [[{"kind": "tensor", "dtype": "float16", "shape": [4], "nbytes": 8,
                                  "data": b"\x00"}]]}), "not the announced"),
    (("outputs", {"outputs": [[{"kind": "tensor", "dtype": "float32", "shape": [2], "nbytes": 8,
                                "offset": "0"}]], "memfd_bytes": 8}), "offset that is no integer"),
])
def test_a_payload_of_another_shape_than_the_harness_sends_is_refused(message, why):
    with pytest.raises(MessageRefused, match=why):
        decode_message(pickle.dumps(message))


def test_every_kind_of_output_the_harness_describes_passes_the_check():
    from multiminddev.env.candidate import pack_tensor, tensor_frame

    outputs = [[pack_tensor(torch.ones(3, 2, dtype=torch.bfloat16)), pack_tensor(torch.empty(0, 5)),
                tensor_frame(torch.arange(4))[0], pack_tensor(2.5)]]
    decode_message(pickle.dumps(("outputs", {"outputs": outputs, "framed": True})))


def _tensors(nbytes):
    return {"framed": True, "outputs": [[{"kind": "tensor", "dtype": "uint8", "shape": [nbytes],
                                          "nbytes": nbytes}]]}


@pytest.mark.parametrize("job", [
    [("begin", "setup"), ("reference", _tensors(100)), ("timed_reference", _tensors(100)),
     ("ground_truth", _tensors(800)), ("reference_layouts", {"layouts": []}),
     ("begin", "baseline"), ("gate", "acquire"), ("gate", "release"), ("gate", "acquire"),
     ("gate", "release"), ("baseline", {}), ("gate", "acquire"), ("begin", "compile"),
     ("compile", {"result": {}}), ("begin", "run"), ("outputs", _tensors(100)),
     ("output_layouts", {"layouts": []}), ("begin", "guards"), ("guards", {"notes": []}),
     ("begin", "benchmark"), ("benchmark", {"candidate": {}, "checked_calls": 8}),
     ("timed_outputs", _tensors(100)), ("timings", {}), ("done", {"notes": []})],
    [("begin", "baseline"), ("gate", "acquire"), ("gate", "release"), ("baseline", {}),
     ("timings", {}), ("done", {"notes": []})],
    [("begin", "compile"), ("compile", {"result": {}}), ("fail", {"kind": "no_gpu"})],
    [("fail", {"kind": "infra_error"})],
], ids=["candidate", "baseline-only", "compile-only", "failed-at-start"])
def test_the_harness_own_message_orders_are_admitted(job):
    from multiminddev.env.messages import JobProtocol

    protocol = JobProtocol()
    for tag, payload in job:
        check_payload(tag, payload)
        protocol.admit(tag, payload)
