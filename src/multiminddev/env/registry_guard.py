"""Dispatcher-registration snapshot: what candidate code registered with torch while importing.

The static checks refuse ``torch.library``, ``torch.ops`` and ``torch._C`` in candidate Python and
``TORCH_LIBRARY`` in its native code, but a static reading can be fooled; this guard reads the
dispatcher itself. Call ``snapshot()`` in the worker just before importing the candidate and
again just after (and, if wanted, after the correctness trials), then ``changes(before, after)``:
every difference is a ``Finding`` (rule ``dispatcher_registration``, reason ``MONKEY_PATCH``).
Take the first snapshot after the trusted setup (importing e.g. ``torch._dynamo`` registers
operators of its own) and before the candidate runs: it also pins the C functions read.

What one snapshot records, and why:

- every operator name the dispatcher knows (``torch._C._dispatch_get_all_op_names``): a new name
  is a new op defined by ``torch.library.define`` / ``custom_op`` / ``TORCH_LIBRARY``;
- a digest of every operator's dispatch table (``torch._C._dispatch_dump``, one line per
  registered kernel with where it was registered): a kernel added for a key, or an existing
  kernel replaced (``Library("aten", "IMPL").impl("relu", fn, "CUDA")`` — the classic override
  that hides torch compute behind an allowed op, or fakes the comparison the guards rely on)
  changes the table, whether it came from Python or from C++ in a ``load_inline`` extension;
- the depth of the torch-dispatch and torch-function mode stacks: a mode pushed at import time
  and never popped intercepts every later op, including the harness's own.

Cost: the table digest dominates, one ``_dispatch_dump`` per operator (~3,600 ops in torch
2.13, about 50 ms on a contended two-core CPU, less on a GPU host's CPU); the name set and the
mode stacks take well under a millisecond. Nothing here allocates on, or synchronises, the GPU.

What it does not see: ``py_impl`` kernels on ``torch._ops`` overload objects (only used by the
Python dispatcher that ``torch.compile`` enables; the static checks refuse ``torch._ops`` and
``torch._C``), and patches to Python functions (``check_monkey_patch``'s job) — a snapshot of
the dispatcher is not a snapshot of the interpreter.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from multiminddev.env.results import Finding, RejectReason

RULE = "dispatcher_registration"
_MAX_LISTED = 5  # operators named in one finding's message; the rest are counted


@dataclass(frozen=True, kw_only=True)
class RegistrySnapshot:
    """The dispatcher's registrations at one moment (see the module docstring)."""

    tables: dict[str, bytes] = field(default_factory=dict)  # op name -> digest of its table
    dispatch_modes: int = 0  # torch-dispatch mode stack depth
    function_modes: int = 0  # torch-function mode stack depth


def _digest(table: str) -> bytes:
    return hashlib.blake2b(table.encode(), digest_size=16).digest()


@functools.cache
def _dispatcher_api() -> tuple[Callable[[], list[str]], Callable[[str], str], Callable[[], int],
                               Callable[[], int]]:
    """torch's C functions, looked up once: the first snapshot is taken before the candidate
    is imported, so a candidate that later replaces ``torch._C._dispatch_dump`` with a liar
    does not change what the after-snapshot reads."""
    import torch  # imported here: env/ stays importable (and this module testable) without it

    c = torch._C
    return (c._dispatch_get_all_op_names, c._dispatch_dump, c._len_torch_dispatch_stack,
            c._len_torch_function_stack)


def snapshot() -> RegistrySnapshot:
    """Read the dispatcher's op names, per-op kernel tables and the mode stacks."""
    op_names, dump, dispatch_depth, function_depth = _dispatcher_api()
    return RegistrySnapshot(
        tables={op: _digest(dump(op)) for op in op_names()},
        dispatch_modes=dispatch_depth(),
        function_modes=function_depth(),
    )


def changes(before: RegistrySnapshot, after: RegistrySnapshot) -> list[Finding]:
    """One finding per kind of change between two snapshots; ``[]`` when nothing changed."""
    findings = []
    added = sorted(set(after.tables) - set(before.tables))
    if added:
        findings.append(_finding(
            f"defined new operator(s) {_listed(added)}",
            "do not define operators (torch.library.define / custom_op / TORCH_LIBRARY); launch "
            "your kernels directly"))
    changed = sorted(op for op, digest in after.tables.items()
                     if op in before.tables and before.tables[op] != digest)
    removed = sorted(set(before.tables) - set(after.tables))
    if changed or removed:
        findings.append(_finding(
            f"registered or replaced kernels of existing operator(s) {_listed(changed + removed)}",
            "do not register kernels for torch operators (torch.library.impl / Library / "
            "TORCH_LIBRARY_IMPL); torch ops must keep their own kernels, and your forward must "
            "launch your kernels directly"))
    for name, b, a in (("torch-dispatch", before.dispatch_modes, after.dispatch_modes),
                       ("torch-function", before.function_modes, after.function_modes)):
        if a != b:
            findings.append(_finding(
                f"left the {name} mode stack at depth {a} (was {b})",
                "do not enter dispatch or function modes; they intercept every torch op"))
    return findings


def _listed(ops: list[str]) -> str:
    shown = ", ".join(ops[:_MAX_LISTED])
    return shown + (f" and {len(ops) - _MAX_LISTED} more" if len(ops) > _MAX_LISTED else "")


def _finding(what: str, fix: str) -> Finding:
    return Finding(rule=RULE, reason=RejectReason.MONKEY_PATCH,
                   message=f"candidate code {what} while loading: {fix}")
