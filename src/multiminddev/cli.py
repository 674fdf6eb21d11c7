"""The ``multiminddev`` command: one entry point, one module per subcommand in ``commands/``."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import multiminddev.commands as commands_pkg
from multiminddev import __version__
from multiminddev.commands._io import (
    EXIT_CODES_EPILOG,
    ExitCode,
    InputError,
    ResourceUnavailable,
)
from multiminddev.distributed.cluster import RayUnavailableError
from multiminddev.policy.model import PolicyError
from multiminddev.tasks.problem import ProblemError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multiminddev",
        description="Train and evaluate language models that write CUDA kernels.",
        epilog=EXIT_CODES_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the package version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands_pkg.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    for command in subparsers.choices.values():  # every command's --help lists the exit codes
        command.epilog = f"{command.epilog}\n\n{EXIT_CODES_EPILOG}" if command.epilog else \
            EXIT_CODES_EPILOG
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return ExitCode.BAD_INPUT
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except SystemExit as exc:  # a handler that stopped after printing its error: main returns
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(f"error: {exc.code}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
    except _unavailable_errors() as exc:
        # What the command needs is not there (a model, a Ray cluster): one line saying what
        # to do, and the exit code scripts can tell from bad input.
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return ExitCode.UNAVAILABLE
    except _user_errors() as exc:
        # The errors whose messages say what to do (a problem, a file given on the command
        # line): one line, not a traceback.
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return ExitCode.BAD_INPUT


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    return (ResourceUnavailable, RayUnavailableError, PolicyError)


def _user_errors() -> tuple[type[BaseException], ...]:
    return (InputError, ProblemError, FileNotFoundError, IsADirectoryError,
            NotADirectoryError, PermissionError)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split())


def _stdout_closed() -> int:
    """The reader of a pipe (``| head``) exited early. As the Python docs advise (signal module,
    "Note on SIGPIPE"): point stdout at devnull so the interpreter's last flush does not raise
    again, and exit 1."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (tests)
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main())
