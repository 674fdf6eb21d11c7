"""Where the shared cache's files live; imports nothing, so a worker can ask before anything
(CUDA bindings start threads on import) stands in the way of its isolation."""

from __future__ import annotations

from pathlib import Path


def key_path(cache_root: Path) -> Path:
    """The key file of a cache directory: its sibling ``<name>.key``, not inside it (a view of
    the cache given to a worker does not include it)."""
    root = Path(cache_root).absolute()
    return root.with_name(root.name + ".key")
