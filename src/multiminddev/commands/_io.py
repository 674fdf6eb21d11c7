"""Exit codes and input checks shared by the commands: each bad input becomes one line on
stderr (``error: ...`` saying what to do) and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import enum
import math
import sys
from collections.abc import Callable
from pathlib import Path


class ExitCode(enum.IntEnum):
    """The exit status of every ``multiminddev`` command (the one definition; ``--help`` and
    docs/cli.md list them). 1 and 2 follow grep and diff: 1 is the answer "no", 2 is trouble
    with the input (argparse's own code); 69 is sysexits.h's EX_UNAVAILABLE."""

    OK = 0
    EVALUATION_FAILED = 1  # a candidate was rejected, incorrect, did not compile, or failed to run
    BAD_INPUT = 2  # an argument, file or folder that cannot be used
    UNAVAILABLE = 69  # no GPU where one is needed, a Ray address not reachable, a model not found
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)


USAGE_ERROR = ExitCode.BAD_INPUT

EXIT_CODES_EPILOG = (
    "exit codes: 0 ok; 1 evaluation failed (a candidate rejected, incorrect, not compiling or "
    "failing to run); 2 bad input (arguments, files); 69 a resource is unavailable (no GPU "
    "where one is needed, a Ray cluster not reachable, a model not found); 130 interrupted")


class InputError(ValueError):
    """A command-line input that cannot be used; the message is the one line to print."""


class ResourceUnavailable(RuntimeError):
    """Something the command needs is not there (a GPU, a cluster, a model); the message is
    the one line to print, saying what to do."""


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> int:
    """Print ``error: message`` (one line) to stderr; return ``code`` (bad input by default)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return int(code)


def bounded_number(kind: Callable[[str], float], *, minimum: float | None = None,
                   maximum: float | None = None, above: float | None = None,
                   ) -> Callable[[str], float]:
    """An argparse ``type``: ``kind(text)`` within the bounds, else argparse's one-line usage
    error and exit 2, before the command does anything (no model loads for a bad value).
    ``above``: an exclusive lower bound."""

    def parse(text: str) -> float:
        name = "an integer" if kind is int else "a number"
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is below the minimum {minimum:g}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"{text} must be greater than {above:g}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text} is above the maximum {maximum:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its message
    return parse


POSITIVE_INT = bounded_number(int, minimum=1)
NON_NEGATIVE_INT = bounded_number(int, minimum=0)
NON_NEGATIVE_FLOAT = bounded_number(float, minimum=0.0)
POSITIVE_FLOAT = bounded_number(float, above=0.0)


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
