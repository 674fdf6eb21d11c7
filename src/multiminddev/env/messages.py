"""The worker -> evaluator messages as plain data, and the evaluator's decoder that takes nothing else.

The pipe from a worker is written by the process that runs candidate code. Code that got past
the sandbox (a ``load_inline`` extension is native code by design) can write its own frames on
it, so the evaluator must never run what a frame says: ``multiprocessing``'s ``recv`` unpickles,
and unpickling calls whatever importable callable the pickle names (``os.system`` included),
in the evaluator's process, outside every isolation layer. So the worker sends only plain data
(``plain``: dicts, lists, tuples, strings, bytes, numbers, booleans, None) and the evaluator
decodes with an unpickler that resolves no global at all (``recv_message``); a frame that
names one, or is not a ``(tag, payload)`` pair, is refused unread, and the job ends there.
"""

from __future__ import annotations

import enum
import io
import math
import os
import pickle
import select
import struct
import time
from typing import Any

from multiminddev.env.config import Stage

# A nesting deeper than this is no message of ours; it would only spend the evaluator's stack.
MAX_DEPTH = 64
# The largest message frame (tensor bytes travel in frames of their own): compile logs and
# tracebacks are cut to tens of kilobytes, so a bigger frame is no message of the harness's.
MAX_MESSAGE_BYTES = 16 << 20


class MessageRefused(Exception):
    """A frame on a worker's pipe that is not a plain-data ``(tag, payload)`` message, or a
    message the harness would not send at that point of a job (``JobProtocol``)."""


class FrameStalled(TimeoutError):
    """A frame whose bytes stopped coming before the deadline: the evaluator never waits on a
    worker's half-written frame longer than the stage it belongs to may last."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the frame names {module}.{name}; messages are plain data")


def decode_message(raw: bytes | bytearray) -> tuple[str, Any]:
    """One frame's bytes as a ``(tag, payload)`` message, or ``MessageRefused``."""
    try:
        message = _PlainDataUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # noqa: BLE001 - any undecodable frame is refused the same way
        raise MessageRefused(f"undecodable frame ({type(exc).__name__}: {exc})"[:300]) from None
    if not (isinstance(message, tuple) and len(message) == 2 and isinstance(message[0], str)):
        raise MessageRefused(f"a {type(message).__name__} where a (tag, payload) pair belongs")
    _check_depth(message[1], 0)
    check_payload(*message)
    return message


def recv_message(conn: Any, deadline: float | None = None) -> tuple[str, Any]:
    """The next message on ``conn`` (EOFError/OSError when the worker is gone, ``FrameStalled``
    when its bytes stop coming before ``deadline``, a ``time.monotonic()`` instant)."""
    return decode_message(recv_bytes_fast(conn, max_bytes=MAX_MESSAGE_BYTES, deadline=deadline))


def recv_bytes_fast(conn: Any, *, expected: int | None = None, max_bytes: int | None = None,
                    deadline: float | None = None) -> bytearray:
    """``Connection.recv_bytes`` without its per-read allocation of the whole remaining size
    (which makes a 64 MB frame crawl at ~50 MB/s): read straight into one buffer.

    Follows ``multiprocessing.connection``'s framing: a 4-byte signed big-endian length, or
    -1 followed by an 8-byte length for frames of 2 GiB and more. The length is the sender's
    word: a frame of another size than ``expected``, or over ``max_bytes``, is refused
    (``MessageRefused``) before anything is allocated for it. Each read waits at most until
    ``deadline`` (``FrameStalled``): a frame's header promises bytes the writer may never send."""
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exact(fd, 4, deadline))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8, deadline))
    if size < 0 or (expected is not None and size != expected):
        raise MessageRefused(f"a frame of {size} bytes where {expected} were announced")
    if max_bytes is not None and size > max_bytes:
        raise MessageRefused(f"a frame of {size} bytes, over the {max_bytes}-byte limit")
    return _read_exact(fd, size, deadline)


def wait_readable(fd: int, deadline: float | None) -> None:
    """Return once ``fd`` has data (or end of file); ``FrameStalled`` at ``deadline``."""
    if deadline is not None:
        _wait(_poller(fd), deadline)


def _poller(fd: int) -> Any:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return poller


def _wait(poller: Any, deadline: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if poller.poll(max(0, math.ceil(remaining * 1000.0))):
            return
        if remaining <= 0:
            raise FrameStalled("the worker stopped sending a frame it had begun, or the "
                               "descriptor a message announced")


def _read_exact(fd: int, size: int, deadline: float | None = None) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    poller = _poller(fd) if deadline is not None else None
    pos = 0
    while pos < size:
        if poller is not None:
            _wait(poller, deadline)
        n = os.readv(fd, [view[pos:]])
        if n == 0:
            raise EOFError("the worker closed the pipe mid-frame")
        pos += n
    return buf


STAGE_NAMES = frozenset(stage.value for stage in Stage)
_STR_OR_NONE = (str, type(None))
_NUMBER_OR_NONE = (int, float, type(None))
_DICT_OR_NONE = (dict, type(None))
_TENSOR_LISTS = {"outputs": list, "framed": bool, "memfd_bytes": int}
# Each tag the harness sends, with the type of its payload, or of each payload key the
# evaluator reads (a key may be absent; one of another type, or a tag not listed, is refused):
# the evaluator then reads a payload without meeting a type it does not expect.
PAYLOAD_TYPES: dict[str, Any] = {
    "ready": dict, "startup_failed": {"message": str},
    "begin": str, "gate": str,
    "compile": {"result": dict},
    "fail": {"kind": str, "stage": str, "message": str, "reason": str, "traceback": str,
             "fatal": bool, "findings": list},
    "outputs": _TENSOR_LISTS, "timed_outputs": _TENSOR_LISTS, "reference": _TENSOR_LISTS,
    "timed_reference": _TENSOR_LISTS, "ground_truth": _TENSOR_LISTS,
    "output_layouts": {"layouts": list},
    "reference_layouts": {"layouts": list, "ground_truth_note": str},
    "guards": {"coverage": _NUMBER_OR_NONE, "notes": list},
    "benchmark": {"candidate": dict, "checked_calls": int, "checked_layouts": list,
                  "timed_layouts": list},
    "baseline": {"eager": _DICT_OR_NONE, "compiled": _DICT_OR_NONE, "peak_gbps": _NUMBER_OR_NONE,
                 "gpu_name": _STR_OR_NONE, "torch_version": _STR_OR_NONE, "note": _STR_OR_NONE,
                 "measured": list, "ungated": list},
    "timings": dict,
    "done": {"notes": list},
}


def check_payload(tag: str, payload: Any) -> None:
    """``MessageRefused`` unless ``payload`` has the types ``PAYLOAD_TYPES`` gives ``tag``, and
    every tensor it announces has a torch dtype and as many bytes as its shape needs."""
    expected = PAYLOAD_TYPES.get(tag)
    if expected is None:
        raise MessageRefused(f"no harness message is tagged {tag[:40]!r}")
    if not isinstance(expected, dict):
        if not isinstance(payload, expected):
            raise MessageRefused(f"a {tag} message whose payload is a {type(payload).__name__}")
        if tag == "begin" and payload not in STAGE_NAMES:
            raise MessageRefused(f"a begin message for no stage ({payload[:40]!r})")
        return
    if not isinstance(payload, dict):
        raise MessageRefused(f"a {tag} message whose payload is a {type(payload).__name__}")
    for key, types in expected.items():
        if key in payload and not isinstance(payload[key], types):
            raise MessageRefused(f"a {tag} message whose {key} is a {type(payload[key]).__name__}")
    if expected is _TENSOR_LISTS and "outputs" in payload:
        for group in payload["outputs"]:
            if not isinstance(group, list):
                raise MessageRefused(f"a {tag} message with a group that is no list")
            for meta in group:
                _check_tensor_meta(tag, meta)


def _check_tensor_meta(tag: str, meta: Any) -> None:
    if not isinstance(meta, dict) or not isinstance(meta.get("kind"), str):
        raise MessageRefused(f"a {tag} message with an output that is no described value")
    if meta["kind"] != "tensor":
        return
    import torch

    dtype = getattr(torch, meta.get("dtype"), None) if isinstance(meta.get("dtype"), str) else None
    shape, nbytes = meta.get("shape"), meta.get("nbytes")
    if (not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or not isinstance(nbytes, int)
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise MessageRefused(f"a {tag} message with a tensor whose dtype, shape or size is not one")
    numel = 1
    for d in shape:
        numel *= d
    if numel * dtype.itemsize != nbytes:
        raise MessageRefused(f"a {tag} message announcing {nbytes} bytes for a {dtype} tensor of "
                             f"shape {shape[:8]}")
    if "offset" in meta and type(meta["offset"]) is not int:
        raise MessageRefused(f"a {tag} message with a tensor offset that is no integer")
    if "data" in meta and not (isinstance(meta["data"], bytes) and len(meta["data"]) == nbytes):
        raise MessageRefused(f"a {tag} message whose tensor bytes are not the announced {nbytes}")


# A candidate's outputs may take at most this many times the bytes of the reference outputs
# they answer, plus the allowance: room for any wrong shape worth reporting, and a bound on
# what the evaluator allocates for a message, whatever a frame announces. The worker describes
# an output beyond it instead of sending its bytes (``candidate.send_tensor_lists``).
OUTPUT_BYTES_FACTOR = 4
OUTPUT_BYTES_ALLOWANCE = 1 << 20
# The candidate's tensor messages, and the trusted reference message each one answers.
ANSWERED_BY = {"outputs": "reference", "timed_outputs": "timed_reference"}


def output_byte_limit(reference_bytes: int) -> int:
    """The most tensor bytes a candidate message answering ``reference_bytes`` may carry."""
    return OUTPUT_BYTES_FACTOR * reference_bytes + OUTPUT_BYTES_ALLOWANCE


def announced_bytes(payload: dict[str, Any]) -> int:
    """The tensor bytes a (checked) tensor-list message announces."""
    return sum(meta.get("nbytes", 0) for group in payload.get("outputs", ())
               for meta in group if meta.get("kind") == "tensor")


# The stage whose work each message reports: the harness sends it only while that stage runs.
_STAGE_OF_TAG = {
    "reference": Stage.SETUP, "timed_reference": Stage.SETUP, "ground_truth": Stage.SETUP,
    "reference_layouts": Stage.SETUP, "baseline": Stage.BASELINE, "gate": Stage.BASELINE,
    "compile": Stage.COMPILE, "outputs": Stage.RUN, "output_layouts": Stage.RUN,
    "guards": Stage.GUARDS, "benchmark": Stage.BENCHMARK, "timed_outputs": Stage.BENCHMARK,
}
_STAGE_RANK = {stage: rank for rank, stage in enumerate(Stage)}
# Sent as often as the harness needs; every other tag comes at most once in a job.
_REPEATED_TAGS = frozenset({"begin", "gate"})


class JobProtocol:
    """The order in which the harness sends one job's messages, checked as they arrive.

    Stages only move forward; each message comes in the stage whose work it reports, at most
    once (``begin`` and the gate requests of the baseline stage excepted); ``fail``,
    ``timings`` and ``done`` may end any stage; a candidate's tensor messages stay within
    ``output_byte_limit`` of the reference messages they answer. Anything else did not come
    from the harness: ``admit`` raises ``MessageRefused``, before any tensor bytes are read.
    A frame forged by native candidate code must then also take the place of the harness's
    own message, which the harness still sends."""

    def __init__(self) -> None:
        self.stage: Stage | None = None
        self.seen: set[str] = set()
        self.reference_bytes: dict[str, int] = {}

    def admit(self, tag: str, payload: Any) -> None:
        """Accept a message that ``check_payload`` passed, or raise ``MessageRefused``."""
        where = self.stage.value if self.stage is not None else "job's start"
        if tag == "begin":
            stage = Stage(payload)
            if self.stage is not None and _STAGE_RANK[stage] <= _STAGE_RANK[self.stage]:
                raise MessageRefused(f"a begin of the {stage.value} stage in the {where} stage")
            self.stage = stage
            return
        owner = _STAGE_OF_TAG.get(tag)
        if owner is not None and owner is not self.stage:
            raise MessageRefused(f"a {tag} message in the {where} stage")
        if tag in self.seen and tag not in _REPEATED_TAGS:
            raise MessageRefused(f"a second {tag} message in one job")
        self.seen.add(tag)
        if isinstance(payload, dict) and "outputs" in payload:
            self._admit_tensors(tag, payload)

    def _admit_tensors(self, tag: str, payload: dict[str, Any]) -> None:
        size = announced_bytes(payload)
        if "memfd_bytes" in payload and payload["memfd_bytes"] != size:
            raise MessageRefused(f"a {tag} message whose memory file holds "
                                 f"{payload['memfd_bytes']} bytes for {size} announced")
        if tag in ANSWERED_BY.values():
            self.reference_bytes[tag] = size
        elif tag in ANSWERED_BY:
            limit = output_byte_limit(self.reference_bytes.get(ANSWERED_BY[tag], 0))
            if size > limit:
                raise MessageRefused(f"a {tag} message announcing {size} bytes, over the "
                                     f"{limit} its reference outputs allow")


def _check_depth(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise MessageRefused(f"payload nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _check_depth(item, depth + 1)


def plain(value: Any) -> Any:
    """``value`` as data the evaluator's decoder accepts: containers and scalars of Python's own
    types (subclasses such as enums, numpy scalars and ``torch.Size`` become their base type),
    anything else its ``str``."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    item = getattr(value, "item", None)  # numpy scalars and 0-d arrays
    if callable(item) and getattr(value, "shape", None) == ():
        return plain(item())
    return str(value)


class PlainConnection:
    """A worker's end of the pipe whose ``send`` passes only plain data (``plain``), so every
    honest message decodes in the evaluator; everything else is the connection's own."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def send(self, message: Any) -> None:
        self._conn.send(plain(message))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
