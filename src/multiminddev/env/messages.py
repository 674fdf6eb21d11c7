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
import pickle
from typing import Any

# A nesting deeper than this is no message of ours; it would only spend the evaluator's stack.
MAX_DEPTH = 64
# The largest message frame (tensor bytes travel in frames of their own): compile logs and
# tracebacks are cut to tens of kilobytes, so a bigger frame is no message of the harness's.
MAX_MESSAGE_BYTES = 16 << 20


class MessageRefused(Exception):
    """A frame on a worker's pipe that is not a plain-data ``(tag, payload)`` message."""


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
    return message


def recv_message(conn: Any) -> tuple[str, Any]:
    """The next message on ``conn`` (EOFError/OSError when the worker is gone)."""
    from multiminddev.env.candidate import recv_bytes_fast

    try:
        raw = recv_bytes_fast(conn, max_bytes=MAX_MESSAGE_BYTES)
    except ValueError as exc:
        raise MessageRefused(str(exc)) from None
    return decode_message(raw)


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
    if isinstance(value, bool):
        return bool(value)
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
