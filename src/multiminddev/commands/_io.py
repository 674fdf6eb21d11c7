"""Input checks shared by the commands: each bad input becomes one line on stderr (``error:
...`` saying what to do) and exit code 2, never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

USAGE_ERROR = 2


class InputError(ValueError):
    """A command-line input that cannot be used; the message is the one line to print."""


def fail(message: str) -> int:
    """Print ``error: message`` to stderr; return the usage-error exit code."""
    print(f"error: {message}", file=sys.stderr)
    return USAGE_ERROR


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def file_problem(path: Path, what: str = "file") -> str | None:
    """Why ``path`` cannot be read as a file, or None: a folder is named as such, not called
    missing."""
    if path.is_dir():
        return f"{path} is a directory; give a {what}"
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_file():
        return f"{path} is not a regular file; give a {what}"
    return None


def dir_problem(path: Path, what: str = "directory") -> str | None:
    """Why ``path`` cannot be used as a folder, or None."""
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file, not a directory; give a {what}"
    return None


def read_text(path: Path, what: str = "file") -> str:
    """The UTF-8 text of ``path``, or an InputError that names the file, the offending byte and
    the fix."""
    if (problem := file_problem(path, what)) is not None:
        raise InputError(problem)
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(not_utf8_message(path, exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def not_utf8_message(path: Path, exc: UnicodeDecodeError) -> str:
    byte = exc.object[exc.start:exc.start + 1].hex()
    return f"{path} is not UTF-8 text (byte 0x{byte} at offset {exc.start}); save it as UTF-8"
