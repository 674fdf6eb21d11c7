"""The ``multiminddev`` entry point: --version, help text on every flag, closed pipes, a light
start."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import multiminddev
from multiminddev.cli import build_parser, main

SRC = Path(multiminddev.__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_version_prints_the_package_version(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:  # argparse's version action exits 0
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"multiminddev {multiminddev.__version__}"


def test_python_m_multiminddev_is_the_command():
    out = subprocess.run([sys.executable, "-m", "multiminddev", "--version"], capture_output=True,
                         text=True, env=_env(), check=True)
    assert out.stdout.strip() == f"multiminddev {multiminddev.__version__}"


HEAVY_STACKS = ("torch", "transformers", "peft", "trl", "ray", "fastapi", "datasets", "matplotlib")


def test_the_command_line_starts_without_the_heavy_stacks():
    # Every subcommand module is imported to build the parser, so what they import at module
    # level is paid by every command, --help and --version included.
    code = ("import sys; from multiminddev.cli import build_parser; import multiminddev.env; "
            "build_parser(); print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HEAVY_STACKS!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), check=True)
    assert out.stdout.strip() == "[]"


def _options_without_help(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest for a in action._choices_actions if a.help}
            for name, sub in action.choices.items():
                if name not in helped:
                    missing.append(f"{path} {name} (command)")
                missing += _options_without_help(sub, f"{path} {name}")
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_command_and_option_has_help_text():
    assert _options_without_help(build_parser(), "multiminddev") == []


def test_json_piped_into_head_ends_without_a_traceback():
    # `problems list --json` prints far more than a pipe buffer; head exits after one line.
    result = subprocess.run(
        f"{sys.executable} -m multiminddev.cli problems list --json | head -n 1",
        check=False, shell=True, capture_output=True, text=True, env=_env(), timeout=120)
    assert result.stdout.strip() == "["
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_every_commands_help_lists_the_exit_codes():
    from multiminddev.cli import build_parser
    from multiminddev.commands._io import ExitCode

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps them here only
    for name, command in commands.items():
        text = command.format_help()
        assert all(f"{int(code)} " in text for code in ExitCode), name
