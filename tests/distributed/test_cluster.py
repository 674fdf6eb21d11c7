"""Connecting to a Ray cluster: an address that does not answer fails within a bounded time,
in one line naming the address."""

from __future__ import annotations

import socket
import time

import pytest

from multiminddev.distributed.cluster import (
    RayUnavailableError,
    check_reachable,
    connect,
    host_port,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_host_port_of_each_address_form():
    assert host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert host_port("ray://head:10001") == ("head", 10001)
    assert host_port("local") is None and host_port("auto") is None


def test_a_listening_address_is_reachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2)


def test_a_closed_port_is_not_reachable_and_the_error_names_it():
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(RayUnavailableError) as info:
        check_reachable(address, timeout_s=2)
    assert address in str(info.value) and "ray start --head" in str(info.value)


def test_an_address_that_never_answers_fails_within_the_timeout():
    """A non-routable address (TEST-NET-1, RFC 5737): no answer, so the timeout decides."""
    start = time.monotonic()
    with pytest.raises(RayUnavailableError):
        check_reachable("192.0.2.1:6379", timeout_s=1)
    assert time.monotonic() - start < 5


def test_connect_checks_the_address_before_ray_waits_on_it():
    pytest.importorskip("ray")
    start = time.monotonic()
    with pytest.raises(RayUnavailableError):
        connect(f"127.0.0.1:{_closed_port()}")
    assert time.monotonic() - start < 10
