"""How a process's ``CUDA_VISIBLE_DEVICES`` names its GPUs, read the same way everywhere."""

from __future__ import annotations


def cuda_visible_ids(visible: str) -> list[str]:
    """The GPU names a ``CUDA_VISIBLE_DEVICES`` value lists, in order (indices, UUIDs or MIG
    names; blanks dropped): entry i is what this process calls GPU i (pure)."""
    return [entry.strip() for entry in visible.split(",") if entry.strip()]
