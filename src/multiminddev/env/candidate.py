"""Candidate and problem modules as data: hashing, kind detection, loading, tensor transport.

Tensors cross the worker -> evaluator pipe as plain bytes (``pack_tensor``), never through
torch's shared-memory reducers, so a dead worker cannot leave half-shared storage behind and
the evaluator's copy is its own. With ``transfer="memfd"`` the bytes go into an anonymous
memory file instead, sealed against writes and resizing, whose descriptor is passed over the
pipe and then closed in the worker: neither the worker's handles nor any candidate code can
change what was sent, and the evaluator refuses a file without those seals. The kernel frees it when the evaluator drops its mapping, even if the worker dies.
"""

from __future__ import annotations

import ast
import enum
import fcntl
import hashlib
import importlib.util
import os
import sys
import types
import warnings
from pathlib import Path
from typing import Any

from multiminddev import pyast
from multiminddev.env.messages import recv_bytes_fast, wait_readable


class CandidateKind(str, enum.Enum):
    NVRTC = "nvrtc"  # multiminddev.cuda.compile_kernels
    LOAD_INLINE = "load_inline"  # torch.utils.cpp_extension.load_inline (compat path)
    UNKNOWN = "unknown"


def candidate_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def detect_kind(source: str) -> CandidateKind:
    """Which build path the candidate uses, from the names it references (no execution)."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return CandidateKind.UNKNOWN
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
    if "load_inline" in names:
        return CandidateKind.LOAD_INLINE
    if "compile_kernels" in names:
        return CandidateKind.NVRTC
    return CandidateKind.UNKNOWN


def load_module_from_source(source: str, name: str, directory: Path) -> types.ModuleType:
    """Write ``source`` to ``directory/name.py`` and import it (tracebacks show real lines)."""
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def as_output_list(outputs: Any) -> list[Any]:
    """A forward's result as a list of outputs (a tensor, or a tuple/list of them)."""
    if isinstance(outputs, (list, tuple)):
        return list(outputs)
    return [outputs]


def pack_tensor(t: Any) -> dict[str, Any]:
    """A tensor (any dtype, any device) as a picklable dict of bytes; other values by repr."""
    meta, raw = tensor_frame(t)
    if raw is not None:
        meta["data"] = bytes(raw)
    return meta


def tensor_frame(t: Any, room: int | None = None) -> tuple[dict[str, Any], Any]:
    """(metadata, raw byte buffer or None) for sending the bytes as a separate frame. A tensor
    of more than ``room`` bytes is described, not sent (it reads as a wrong output)."""
    import torch

    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        # Only plain values are asked for their repr: an object's own __repr__ is its code.
        plain_value = type(t) in (int, float, bool, complex, str, type(None))
        return {"kind": "other", "type": type(t).__name__,
                "repr": repr(t)[:200] if plain_value else f"a {type(t).__name__} object"}, None
    if room is not None and t.numel() * t.element_size() > room:
        return {"kind": "other", "type": "Tensor",
                "repr": f"a {str(t.dtype).removeprefix('torch.')} tensor of shape "
                        f"{list(t.shape)[:8]}, larger than the evaluator takes for this "
                        f"problem's outputs"}, None
    cpu = t.detach().to("cpu").contiguous()
    meta = {"kind": "tensor", "dtype": str(cpu.dtype).removeprefix("torch."),
            "shape": list(cpu.shape), "nbytes": cpu.numel() * cpu.element_size()}
    if not cpu.numel():
        return meta, None
    return meta, memoryview(cpu.reshape(-1).view(torch.uint8).numpy())


def send_tensor_lists(conn: Any, tag: str, lists: list[list[Any]], *,
                      transfer: str = "pipe", limit_bytes: int | None = None) -> int:
    """Send ``(tag, {"outputs": metadata})`` then each tensor's bytes as its own frame
    (no pickling of tensor data: one copy into the pipe, one out), or, with ``transfer=
    "memfd"``, the bytes in one anonymous memory file whose descriptor follows the message.
    Past ``limit_bytes`` in all (``messages.output_byte_limit``: the evaluator refuses more),
    tensors are described instead of sent. Returns the tensor bytes the message announced."""
    frames = _frames(lists, limit_bytes)
    if transfer == "memfd":
        _send_via_memfd(conn, tag, frames)
    else:
        conn.send((tag, {"outputs": [[meta for meta, _ in group] for group in frames],
                         "framed": True}))
        for group in frames:
            for _, raw in group:
                if raw is not None:
                    conn.send_bytes(raw)
    return sum(meta["nbytes"] for group in frames for meta, _ in group if meta["kind"] == "tensor")


def _frames(lists: list[list[Any]], limit_bytes: int | None) -> list[list[tuple[dict[str, Any], Any]]]:
    room = limit_bytes
    frames = []
    for group in lists:
        frames.append([])
        for t in group:
            meta, raw = tensor_frame(t, room)
            frames[-1].append((meta, raw))
            if room is not None and meta["kind"] == "tensor":
                room -= meta["nbytes"]
    return frames


def _send_via_memfd(conn: Any, tag: str, frames: list[list[tuple[dict[str, Any], Any]]]) -> None:
    from multiprocessing import reduction

    fd = os.memfd_create("mmd-tensors", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        size = 0
        for group in frames:
            for meta, raw in group:
                if raw is not None:
                    meta["offset"] = size
                    _write_all(fd, raw)
                    size += meta["nbytes"]
        # Sealed before it leaves: candidate code that reopened the file (/proc/self/fd) while
        # it was written can neither change the bytes the evaluator verifies later nor shrink
        # the file under the evaluator's mapping (a read past the end would kill the evaluator).
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, transfer_seals() | fcntl.F_SEAL_SEAL)
        conn.send((tag, {"outputs": [[meta for meta, _ in group] for group in frames],
                         "memfd_bytes": size}))
        if size:
            from multiminddev.env.sandbox import harness_section

            with harness_section():  # sendmsg is refused to candidate code by the sandbox
                reduction.send_handle(conn, fd, os.getppid())  # the pid matters on Windows only
    finally:
        os.close(fd)  # from here on nothing in this process can reach the file


def transfer_seals() -> int:
    """The seals a tensor transfer file must carry (Linux; memfd transfer is Linux only)."""
    return fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def _write_all(fd: int, raw: Any) -> None:
    view = memoryview(raw).cast("B")
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])


def receive_frames(conn: Any, payload: dict[str, Any], deadline: float | None = None) -> None:
    """Attach the frames that follow a framed message to its metadata (in place); for a memfd
    message, map the file that follows and attach read-only views of it. Waits for them until
    ``deadline`` at most (``messages.FrameStalled``)."""
    if "memfd_bytes" in payload:
        _receive_memfd(conn, payload, deadline)
        return
    if not payload.get("framed"):
        return
    for group in payload["outputs"]:
        for meta in group:
            if meta.get("kind") == "tensor" and meta.get("nbytes"):
                meta["data"] = recv_bytes_fast(conn, expected=int(meta["nbytes"]),
                                               deadline=deadline)


def _receive_memfd(conn: Any, payload: dict[str, Any], deadline: float | None = None) -> None:
    import mmap
    from multiprocessing import reduction

    size = int(payload["memfd_bytes"])
    if size <= 0:
        return
    wait_readable(conn.fileno(), deadline)
    fd = reduction.recv_handle(conn)
    try:
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & transfer_seals() != transfer_seals():
            raise OSError("the tensor transfer file is not sealed against writes and resizing")
        if os.fstat(fd).st_size < size:
            raise OSError(f"tensor transfer file holds {os.fstat(fd).st_size} bytes, "
                          f"the message announced {size}")
        region = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    view = memoryview(region)
    for group in payload["outputs"]:
        for meta in group:
            if meta.get("kind") == "tensor" and meta.get("nbytes"):
                start = int(meta.get("offset", -1))
                end = start + meta["nbytes"]
                if start < 0 or end > size:
                    raise OSError(f"tensor bytes [{start}, {end}) lie outside the {size}-byte transfer")
                meta["data"] = view[start:end]


def unpack_tensor(packed: dict[str, Any]) -> Any:
    """Inverse of ``pack_tensor``; non-tensors come back as a ``NonTensorOutput``."""
    import torch

    if packed.get("kind") != "tensor":
        return NonTensorOutput(packed.get("type", "?"), packed.get("repr", ""))
    dtype = getattr(torch, packed["dtype"])
    data = packed.get("data")
    if not data:
        return torch.empty(packed["shape"], dtype=dtype)
    with warnings.catch_warnings():  # read-only bytes (pack_tensor) are fine: only compared
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(dtype).reshape(packed["shape"])


class NonTensorOutput:
    """A forward output that was not a tensor (verify reports it as a dtype mismatch)."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.text}>"
