"""Dispatcher-registration snapshot: real torch.library registrations are found, nothing else is.

Each registration is made through torch.library in this process and destroyed again in a
``finally`` (a destroyed Library deregisters its kernels), so later tests see torch unchanged.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from multiminddev.env import registry_guard
from multiminddev.env.results import RejectReason


def test_no_registration_means_no_finding():
    before = registry_guard.snapshot()
    torch.relu(torch.ones(3))  # ordinary torch use registers nothing
    assert registry_guard.changes(before, registry_guard.snapshot()) == []


def test_overriding_an_existing_aten_kernel_is_found():
    before = registry_guard.snapshot()
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # torch warns once per process that it overrides
            warnings.simplefilter("ignore")
            lib.impl("relu", lambda x: x * 2, "CPU")
        after = registry_guard.snapshot()
    finally:
        lib._destroy()
    findings = registry_guard.changes(before, after)
    assert [(f.rule, f.reason) for f in findings] == [
        ("dispatcher_registration", RejectReason.MONKEY_PATCH)]
    assert "aten::relu" in findings[0].message


def test_a_kernel_for_a_new_dispatch_key_of_an_existing_op_is_found():
    before = registry_guard.snapshot()
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("relu", lambda x: x, "PrivateUse2")
        after = registry_guard.snapshot()
    finally:
        lib._destroy()
    assert "aten::relu" in " ".join(f.message for f in registry_guard.changes(before, after))


def test_defining_a_new_operator_is_found():
    before = registry_guard.snapshot()
    lib = torch.library.Library("mmd_guard_test", "DEF")
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CPU")
        after = registry_guard.snapshot()
    finally:
        lib._destroy()
    messages = [f.message for f in registry_guard.changes(before, after)]
    assert any("new operator" in m and "mmd_guard_test::twice" in m for m in messages)


def test_destroyed_registrations_leave_no_trace():
    """The cleanup the other tests rely on: a destroyed Library restores the tables."""
    before = registry_guard.snapshot()
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("neg", lambda x: x, "PrivateUse2")
    lib._destroy()
    assert registry_guard.changes(before, registry_guard.snapshot()) == []


def test_a_dispatch_mode_left_on_the_stack_is_found():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    before = registry_guard.snapshot()
    with Spy():
        inside = registry_guard.snapshot()
    messages = [f.message for f in registry_guard.changes(before, inside)]
    assert any("torch-dispatch mode stack" in m for m in messages)


def test_replacing_the_dump_function_after_the_first_snapshot_changes_nothing(monkeypatch):
    before = registry_guard.snapshot()  # pins torch._C's functions
    monkeypatch.setattr(torch._C, "_dispatch_dump", lambda op: "forged")
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("relu", lambda x: x, "PrivateUse2")
        after = registry_guard.snapshot()
    finally:
        lib._destroy()
    assert "aten::relu" in " ".join(f.message for f in registry_guard.changes(before, after))
