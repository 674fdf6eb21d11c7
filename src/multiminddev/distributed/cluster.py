"""Connecting this process to a Ray cluster (Ray is imported here, lazily, and nowhere above).

An address is what ``--ray`` takes: ``local`` starts a new single-machine cluster in this
process (stopped again by whoever started it), ``auto`` joins the cluster already running on
this machine (``ray start --head``; a ConnectionError if there is none), and ``HOST:PORT`` or
``ray://HOST:PORT`` joins that cluster. A process already connected keeps its connection
whatever the address says: Ray allows one per process.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Any

# Every actor this package names lives in this namespace, so evaluators and trainers started by
# different drivers on one cluster find the same shared actors (the baseline store).
RAY_NAMESPACE = "multiminddev"
LOCAL = "local"
AUTO = "auto"
# Seconds a TCP connect to a cluster's address may take before the cluster counts as not
# reachable: ray.init itself retries an unreachable address for minutes without a word.
REACHABILITY_TIMEOUT_S = 5.0


class RayUnavailableError(RuntimeError):
    """Ray is missing or the cluster cannot be reached; the message says what to do."""


def import_ray() -> ModuleType:
    """``ray``, or an error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailableError(
            "Ray is not installed: pip install 'multiminddev[ray]' (or run without --ray)"
        ) from None
    return ray


def validate_address(address: str) -> str:
    """The address as given, or ValueError naming the accepted forms (pure)."""
    text = address.strip()
    if text in (LOCAL, AUTO):
        return text
    host_port = text.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r}: use 'auto' (the cluster running on this "
                         "machine), 'local' (start one here) or HOST:PORT / ray://HOST:PORT")
    return text


def host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``HOST:PORT`` or ``ray://HOST:PORT`` address; None for ``local``
    and ``auto`` (pure)."""
    text = validate_address(address)
    if text in (LOCAL, AUTO):
        return None
    host, _, port = text.removeprefix("ray://").rpartition(":")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = REACHABILITY_TIMEOUT_S) -> None:
    """Return once a TCP connection to the address's host and port opens within ``timeout_s``;
    else RayUnavailableError naming the address, the reason and what to do. ``local`` and
    ``auto`` need no check (Ray answers for them at once)."""
    target = host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except (OSError, UnicodeError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (
            getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        raise RayUnavailableError(
            f"Ray cluster at {address!r} is not reachable ({reason}; tried {timeout_s:g} s): "
            f"check the host and port (Ray's GCS port, 6379 by default, or the client port "
            f"10001 for ray://) and that `ray start --head` runs there") from None


@dataclass(kw_only=True, frozen=True)
class LocalClusterConfig:
    """Sizes of a cluster started in this process (address ``local``); None: Ray detects them."""

    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_mib: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_cpus", "num_gpus", "object_store_mib"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if self.object_store_mib is not None and self.object_store_mib < 80:
            raise ValueError("object_store_mib must be >= 80 (Ray's minimum), got "
                             f"{self.object_store_mib}")


def connect(address: str = LOCAL, local: LocalClusterConfig | None = None) -> bool:
    """Connect this process to Ray. True when this call started the connection, so the caller
    shuts it down (``disconnect``) when done; False when one was already open (it is used as is).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = validate_address(address)
    kwargs: dict[str, Any] = {"namespace": RAY_NAMESPACE}
    if address == LOCAL:
        local = local or LocalClusterConfig()
        kwargs.update(include_dashboard=False, num_cpus=local.num_cpus, num_gpus=local.num_gpus)
        if local.object_store_mib is not None:
            kwargs["object_store_memory"] = local.object_store_mib * 1024 * 1024
    check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as exc:
        raise RayUnavailableError(
            f"no Ray cluster at {address!r} ({' '.join(str(exc).split())[:200]}): start one with "
            "`ray start --head` (then --ray auto) or use --ray without a value for a local one"
        ) from None
    return True


def disconnect(started: bool) -> None:
    """Shut Ray down if ``connect`` started it (a connection found open is left open)."""
    if started:
        import_ray().shutdown()


def cluster_gpus() -> int:
    """GPUs in the whole cluster, over every live node (Ray's own resource view)."""
    return int(import_ray().cluster_resources().get("GPU", 0))


def cluster_nodes() -> list[dict[str, Any]]:
    """Live nodes: ``{"node_id", "address", "cpus", "gpus"}`` each."""
    nodes = []
    for node in import_ray().nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        nodes.append({"node_id": node.get("NodeID", ""), "address": node.get("NodeManagerAddress", ""),
                      "cpus": resources.get("CPU", 0), "gpus": resources.get("GPU", 0)})
    return nodes


def add_ray_argument(parser: Any) -> None:
    """``--ray [ADDRESS]`` on a command's parser (``args.ray``: None without the flag)."""
    parser.add_argument(
        "--ray", nargs="?", const=LOCAL, default=None, metavar="ADDRESS", type=_address_arg,
        help="evaluate on a Ray cluster: one evaluation actor per GPU of every node; no value "
             "starts a local cluster, 'auto' joins the one running here (ray start --head), "
             "HOST:PORT another (needs the ray extra)")


def _address_arg(value: str) -> str:
    import argparse

    try:
        return validate_address(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
