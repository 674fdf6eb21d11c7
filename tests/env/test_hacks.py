"""Adversarial suite, CPU part: every hack fixture is refused by the static checks with the
reason its docstring expects (or is marked runtime-only and covered by test_gpu_hacks.py), and
every honest fixture passes them with zero findings.

Fixture format (module docstring): line 1 ``problem: <stem in tests/fixtures/problems>``;
hacks add line 2 ``expect: <reason_code>`` or ``expect: runtime:<code>[|<code>...]``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from multiminddev.env.results import RejectReason, StageStatus
from multiminddev.env.static_checks import run_static_checks
from multiminddev.tasks.problem import load_problem

FIXTURES = Path(__file__).parents[1] / "fixtures"
# White-box attacks (``wb_c*``, which may list several reasons) and their twins (``wbtwin_c*``)
# are test_adversarial_suite.py's.
HACKS = sorted(p for p in (FIXTURES / "hacks").glob("*.py") if not p.name.startswith("wb_"))
HONEST = sorted(p for p in (FIXTURES / "honest").glob("*.py") if not p.name.startswith("wbtwin_"))


def fixture_header(path: Path) -> dict[str, str]:
    """``problem:``/``expect:`` lines of a fixture's docstring."""
    lines = path.read_text().split('"""')[1].strip().splitlines()
    header = {}
    for line in lines[:2]:
        key, _, value = line.partition(":")
        if key.strip() in {"problem", "expect"}:
            header[key.strip()] = value.strip()
    return header


def problem_dtype(path: Path) -> str:
    return load_problem(FIXTURES / "problems" / f"{fixture_header(path)['problem']}.py").dtype


STATIC_HACKS = [p for p in HACKS if not fixture_header(p)["expect"].startswith("runtime:")]
RUNTIME_HACKS = [p for p in HACKS if fixture_header(p)["expect"].startswith("runtime:")]


def test_suite_has_at_least_15_distinct_hacks():
    assert len(HACKS) >= 15
    assert len({p.read_text() for p in HACKS}) == len(HACKS)


@pytest.mark.parametrize("path", HACKS, ids=lambda p: p.stem)
def test_hack_fixture_is_well_formed(path):
    header = fixture_header(path)
    assert (FIXTURES / "problems" / f"{header['problem']}.py").is_file()
    codes = header["expect"].removeprefix("runtime:").split("|")
    valid = {r.value for r in RejectReason} | {"incorrect"}
    assert set(codes) <= valid, codes
    assert len(path.read_text().split('"""')[1].strip().splitlines()) >= 4, "docstring: incident"


@pytest.mark.parametrize("path", STATIC_HACKS, ids=lambda p: p.stem)
def test_static_hack_is_rejected_with_expected_reason(path):
    expected = RejectReason(fixture_header(path)["expect"])
    result = run_static_checks(path.read_text(), problem_dtype=problem_dtype(path))
    assert result.status is StageStatus.FAILED
    assert expected in {f.reason for f in result.findings}, [
        (f.rule, f.line, f.message) for f in result.findings]
    assert all(f.line is not None or f.rule in {"kernel_defined", "model_new_class"}
               for f in result.findings if f.reason is expected)


@pytest.mark.parametrize("path", RUNTIME_HACKS, ids=lambda p: p.stem)
def test_runtime_hack_passes_static_checks(path):
    """Runtime-only hacks look clean to a static reader; the GPU suite must catch them."""
    result = run_static_checks(path.read_text(), problem_dtype=problem_dtype(path))
    assert result.findings == []


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_candidate_has_zero_findings(path):
    result = run_static_checks(path.read_text(), problem_dtype=problem_dtype(path))
    assert result.findings == [], [(f.rule, f.line, f.message) for f in result.findings]
    assert result.status is StageStatus.OK
    assert result.candidate_kind in {"nvrtc", "load_inline"}


def test_builtin_reference_solutions_have_zero_findings():
    """The curriculum's own reference kernels (naive and fast) are a large honest corpus."""
    builtin = pytest.importorskip("multiminddev.tasks.builtin")
    flagged = []
    for problem in builtin.builtin_problems():
        for variant in ("naive", "fast"):
            source = builtin.reference_solution(problem, variant=variant)
            if source is None:
                continue
            result = run_static_checks(source, problem_dtype=problem.dtype)
            flagged += [(problem.name, variant, f.rule, f.line) for f in result.findings]
    assert flagged == []
