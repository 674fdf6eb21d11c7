"""Running the CLI in-process and checking the shape of its failures."""

from __future__ import annotations

from multiminddev.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``multiminddev ARGV``."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, *, contains: str,
                          exit_code: int = 2) -> None:
    """Exit ``exit_code`` (2: bad input), one ``error:`` line on stderr naming the problem,
    nothing on stdout, no traceback."""
    lines = err.strip().splitlines()
    assert code == exit_code, (code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert contains in lines[0], lines[0]
    assert "Traceback" not in out + err and out == ""
