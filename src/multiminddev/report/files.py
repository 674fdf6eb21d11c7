"""Output files written whole or not at all."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename it
    over ``path``: a crash or a full disk leaves the old file (or none), never half of the new
    one. The rename is atomic because both names are on one file system."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates the file 0600; the file written is a report for others to read, so
        # it gets the mode open() would give it: an existing file's own, else 0666 less umask.
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def current_umask() -> int:
    """The process's umask: Linux's /proc/self/status says it without changing it; elsewhere
    it is set and restored at once (os has no getter)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass(kw_only=True)
class JsonlRows:
    """The JSON objects of a JSONL file, and the 1-based numbers of the lines that were not one
    (not UTF-8, not JSON, or JSON but not an object: e.g. a line cut short by a crash)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)


def read_jsonl_rows(path: str | Path) -> JsonlRows:
    """Read a JSONL file line by line; bad lines are counted, not raised (a run killed mid-write
    leaves a torn last line, and one bad line should not hide the rest)."""
    out = JsonlRows()
    for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            row = None
        if isinstance(row, dict):
            out.rows.append(row)
        else:
            out.bad_lines.append(number)
    return out


def describe_bad_lines(path: str | Path, bad_lines: list[int]) -> str:
    """One line: which lines of ``path`` were skipped (the first few numbers)."""
    shown = ", ".join(str(n) for n in bad_lines[:5]) + (", ..." if len(bad_lines) > 5 else "")
    what = "line that is not a JSON object" if len(bad_lines) == 1 else \
        "lines that are not JSON objects"
    return (f"{path}: skipped {len(bad_lines)} {what} (not UTF-8, cut short or malformed; "
            f"line {shown})")
