"""Authenticated cache entries: what trusted code writes to disk, it reads back only if untouched.

The on-disk caches (compiled cubins, baseline timings, peak bandwidth) live in a directory any
process of the user can write, including, without OS isolation, an evaluation worker running a
hostile candidate. So every entry carries an HMAC-SHA256 over its key and content, made with a
secret the worker processes never receive; an entry whose tag does not verify (planted,
edited, or from before authentication) is a miss: it is rebuilt or re-measured, never trusted.

Where the secret lives, and why: a random 32-byte key (``secrets``) in a file *beside* the
cache directory (``<cache>.key``, mode 0600), created on first use. The alternative, a key
drawn per evaluator and kept only in its memory, is never on disk, but every new evaluator (each
training run, each CLI command) would then re-measure the peak bandwidth and re-time every
torch.compile baseline (tens of seconds per problem), and CLI tools could not share compiled
kernels at all. The file key keeps the caches useful across processes; its cost is that it is
only as secret as the file: a process of the same user that can read it can forge entries.
Hence: it sits outside the cache directory (a read-only view of the cache given to workers does
not include it), workers never load it (they compile into a private cache of their own and
never touch the baselines cache), and an OS-isolated worker's filesystem view must not show it.
A key file that others may read or that is not a regular file is refused (caching then stays
off until it is deleted and made afresh).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from multiminddev.cache_layout import key_path  # noqa: F401 - part of this module's API

KEY_BYTES = 32
_log = logging.getLogger(__name__)



def load_or_create_key(cache_root: Path) -> bytes | None:
    """The cache's secret, made on first use; None when it cannot be read or made safely (then
    the caller caches nothing: an entry it cannot authenticate is worth nothing)."""
    path = key_path(cache_root)
    key = _read_key(path)
    if key is not None or path.exists() or path.is_symlink():
        return key
    return _create_key(path)


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            _log.warning("cache key %s is not a private regular file of this user; caching is "
                         "off until it is deleted (a fresh one is then made)", path)
            return None
        data = handle.read(KEY_BYTES + 1)
    return data if len(data) == KEY_BYTES else None


def _create_key(path: Path) -> bytes | None:
    """Write a fresh key with O_EXCL (no clobbering, no following a planted link); if another
    process made one first, use theirs."""
    key = secrets.token_bytes(KEY_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        try:
            os.link(tmp, path)  # atomic and never replaces an existing key
        finally:
            tmp.unlink()
    except FileExistsError:
        return _read_key(path)
    except OSError:
        return None
    return key


def entry_tag(key: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 (hex) over length-prefixed parts, so no two part lists share a tag."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.hexdigest()


def tag_matches(key: bytes, tag: object, *parts: bytes) -> bool:
    """Whether ``tag`` authenticates ``parts`` under ``key`` (constant-time comparison)."""
    return isinstance(tag, str) and hmac.compare_digest(tag, entry_tag(key, *parts))
