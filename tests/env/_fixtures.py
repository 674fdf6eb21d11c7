"""Helpers for env tests: read fixture candidates and the problem each one names."""

from __future__ import annotations

import functools
from pathlib import Path

from multiminddev.tasks.problem import Problem, load_problem

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture_header(path: Path) -> dict[str, str]:
    """``problem:`` and ``expect:`` lines of a candidate's module docstring."""
    text = path.read_text()
    doc = text.split('"""', 2)[1] if text.startswith('"""') else ""
    fields = {}
    for line in doc.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("problem", "expect"):
            fields[key.strip()] = value.strip()
    return fields


@functools.cache
def problem_named(stem: str) -> Problem:
    return load_problem(FIXTURES / "problems" / f"{stem}.py")


def candidates(folder: str, prefix_exclude: str = "sec_") -> list[Path]:
    """Our fixture candidates in ``folder`` (files of other owners, ``sec_*``, excluded)."""
    return sorted(p for p in (FIXTURES / folder).glob("*.py") if not p.name.startswith(prefix_exclude))


def problem_for(path: Path) -> Problem:
    return problem_named(fixture_header(path)["problem"])
