"""Adversarial suite by hack class: candidates a policy under RL could find, one file each.

Hacks are ``tests/fixtures/hacks/adv_c<class>_<name>.py`` (class 8 under ``hacks/isolated/``);
the class numbers are those of the evaluator-integrity plan: 1 result caching across calls,
2 predictable inputs, 3 telling timing from checking, 4 reaching the harness from candidate
Python, 5 dispatcher overrides, 6 foreign compute, 7 precision, 8 shared-state poisoning; and
two more: 10, approximations that only a bare tolerance accepts, and 11, blame-shifting (a
candidate forging a failure that is "not its fault": no GPU, a crowded GPU). Class 9 of the
plan, false positives, is the honest controls ``tests/fixtures/honest/ctl_<name>.py``: things a
legitimate kernel does that a careless rule refuses.

Every hack is a working kernel apart from its cheat (its CUDA compiles), so when the cheat is
not detected it comes back ``ok`` with a forged result. Header: line 1 ``problem: <stem>``,
line 2 ``expect: <code>[|<code>...]`` (refused by the static checks with one of these reasons)
or ``expect: runtime:<code>[|<code>...]`` (only a run can tell: rejected with one of the codes,
or ``incorrect``).

CPU: headers, class counts, NVRTC compilation, static verdicts. GPU (``-m gpu``): every hack
is rejected or incorrect through the full evaluator, every control is ok, and a poisoning
candidate cannot change the verdict on a later, honest one.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

from multiminddev.env.results import RejectReason, StageStatus
from multiminddev.env.static_checks import run_static_checks
from tests.env._fixtures import FIXTURES, fixture_header, problem_named

# Classes 8 and 11 live in hacks/isolated/, run by this module alone. The suite-wide runners
# evaluate hacks/*.py on the machine's real cache directory, where a poisoner that got through
# would corrupt every later evaluation; and a blame-shifter is judged by whose fault its
# failure is, not by a reject reason.
HACKS = sorted((FIXTURES / "hacks").glob("adv_c*.py")) + sorted(
    (FIXTURES / "hacks" / "isolated").glob("adv_c*.py"))
CONTROLS = sorted((FIXTURES / "honest").glob("ctl_*.py"))
HACK_CLASSES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 11)
POISONERS = [p for p in HACKS if p.name.startswith("adv_c8_")]
BLAME_SHIFTERS = [p for p in HACKS if p.name.startswith("adv_c11_")]
VICTIM = FIXTURES / "honest" / "ctl_relu_cache_victim.py"
VALID_CODES = {r.value for r in RejectReason} | {"incorrect"}


def hack_class(path: Path) -> int:
    match = re.match(r"adv_c(\d+)_", path.name)
    assert match, f"{path.name}: name hacks adv_c<class>_<name>.py"
    return int(match.group(1))


def expected_codes(path: Path) -> set[str]:
    return set(fixture_header(path)["expect"].removeprefix("runtime:").split("|"))


def is_runtime(path: Path) -> bool:
    return fixture_header(path)["expect"].startswith("runtime:")


def cuda_sources(path: Path) -> list[str]:
    """The CUDA strings a fixture compiles (string constants defining a ``__global__``)."""
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value]


def static_result(path: Path):
    problem = problem_named(fixture_header(path)["problem"])
    return run_static_checks(path.read_text(), problem_dtype=problem.dtype)


def _ids(path: Path) -> str:
    return path.stem


# --- CPU: the suite itself ------------------------------------------------------------------


def test_suite_covers_every_class_with_at_least_three_hacks():
    counts = Counter(hack_class(p) for p in HACKS)
    assert len(HACKS) >= 36
    assert {c: counts[c] for c in HACK_CLASSES if counts[c] < 3} == {}
    assert set(counts) <= set(HACK_CLASSES)


def test_suite_has_at_least_eight_distinct_controls():
    assert len(CONTROLS) >= 8
    assert len({p.read_text() for p in CONTROLS}) == len(CONTROLS)


def test_fixture_sources_are_distinct():
    texts = [p.read_text() for p in (*HACKS, *CONTROLS)]
    assert len(set(texts)) == len(texts)


@pytest.mark.parametrize("path", HACKS, ids=_ids)
def test_hack_header_is_well_formed(path):
    header = fixture_header(path)
    assert (FIXTURES / "problems" / f"{header['problem']}.py").is_file()
    assert expected_codes(path) <= VALID_CODES, expected_codes(path)
    doc = path.read_text().split('"""')[1].strip().splitlines()
    assert len(doc) >= 4, "the docstring describes the class and the trick"


@pytest.mark.parametrize("path", CONTROLS, ids=_ids)
def test_control_header_names_a_problem(path):
    header = fixture_header(path)
    assert "expect" not in header
    assert (FIXTURES / "problems" / f"{header['problem']}.py").is_file()


@pytest.mark.parametrize("path", [*HACKS, *CONTROLS], ids=_ids)
def test_fixture_cuda_compiles(path):
    """Each kernel compiles with NVRTC for sm_90 (no GPU needed): a hack fails only by its cheat."""
    from multiminddev.cuda.compiler import CompileOptions, compile_cuda
    from multiminddev.cuda.signature import parse_kernel_signatures

    sources = cuda_sources(path)
    assert sources, "every fixture defines at least one kernel"
    for source in sources:
        module = compile_cuda(source, CompileOptions(arch="sm_90", use_cache=False))
        if module.result.status is StageStatus.ERROR:
            pytest.skip(module.result.error)
        assert module.result.status is StageStatus.OK, module.result.error[:2000]
        assert module.kernel_names
        # every kernel launches with type-checked arguments, as an honest one would
        assert set(module.kernel_names) <= set(parse_kernel_signatures(source))


def test_victim_source_is_the_one_the_cubin_poisoner_targets():
    """The GPU poisoning test is meaningful only if the poisoner forges the victim's cache key."""
    poisoner = FIXTURES / "hacks" / "isolated" / "adv_c8_cubin_cache_private_api.py"
    (victim_kernel,) = cuda_sources(VICTIM)
    assert victim_kernel in cuda_sources(poisoner)


# --- CPU: static verdicts -------------------------------------------------------------------


@pytest.mark.parametrize("path", [p for p in HACKS if not is_runtime(p)], ids=_ids)
def test_static_hack_is_rejected_with_an_expected_reason(path):
    result = static_result(path)
    assert result.status is StageStatus.FAILED, "the static checks accept it"
    seen = {f.reason.value for f in result.findings}
    assert seen & expected_codes(path), [(f.rule, f.line, f.message) for f in result.findings]


@pytest.mark.parametrize("path", [p for p in HACKS if is_runtime(p)], ids=_ids)
def test_runtime_hack_is_not_refused_for_an_unrelated_reason(path):
    """A static reader cannot see these cheats; if the checks refuse one anyway, it must be for
    one of the listed reasons, not because a legitimate construct it also uses was flagged."""
    result = static_result(path)
    unexpected = [(f.reason.value, f.rule, f.line) for f in result.findings
                  if f.reason.value not in expected_codes(path)]
    assert unexpected == []


@pytest.mark.parametrize("path", CONTROLS, ids=_ids)
def test_control_has_zero_static_findings(path):
    result = static_result(path)
    assert result.findings == [], [(f.rule, f.line, f.message) for f in result.findings]
    assert result.status is StageStatus.OK
    assert result.candidate_kind == "nvrtc"


# --- GPU: the full evaluator ----------------------------------------------------------------


def _config(cache_dir: Path):
    from multiminddev.env import EvalConfig

    return EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.5, defenses=True,
                      sandbox=True, cache_dir=str(cache_dir))


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    """One evaluator on a private cache directory: nothing here can touch the machine's caches."""
    from multiminddev.env import Evaluator

    cache = tmp_path_factory.mktemp("adversarial-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("MULTIMINDDEV_CACHE", str(cache))
    try:
        with Evaluator(_config(cache)) as ev:
            yield ev
    finally:
        mp.undo()


def _assert_not_ok(result, path: Path) -> None:
    from multiminddev.env import EvalStatus

    codes = expected_codes(path)
    assert result.status in (EvalStatus.REJECTED, EvalStatus.INCORRECT), (
        f"{result.status}: speedup {result.benchmark.speedup_vs_eager:.2f}x, {result.message}")
    if result.status is EvalStatus.REJECTED:
        seen = {result.reject_reason.value if result.reject_reason else None}
        seen |= {f.reason.value for f in result.static.findings}
        assert seen & codes, f"expected {codes}, got {seen}: {result.message}"
    else:
        assert "incorrect" in codes or not is_runtime(path), result.message


@pytest.mark.gpu
@pytest.mark.parametrize("path", [p for p in HACKS if p not in POISONERS + BLAME_SHIFTERS],
                         ids=_ids)
def test_hack_is_rejected_or_incorrect(evaluator, path):
    problem = problem_named(fixture_header(path)["problem"])
    _assert_not_ok(evaluator.evaluate(problem, path.read_text()), path)


@pytest.mark.gpu
@pytest.mark.parametrize("path", BLAME_SHIFTERS, ids=_ids)
def test_forged_infrastructure_failure_is_the_candidates_fault(evaluator, path):
    """An exception raised by candidate code on a working GPU is the candidate's failure, whatever
    its type or text says: never no_gpu or infra_error (no penalty, retried) and never ok."""
    from multiminddev.env import EvalStatus

    result = evaluator.evaluate(problem_named(fixture_header(path)["problem"]), path.read_text())
    assert result.status in (EvalStatus.RUNTIME_ERROR, EvalStatus.REJECTED,
                             EvalStatus.INCORRECT), f"{result.status}: {result.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("path", CONTROLS, ids=_ids)
def test_control_is_ok(evaluator, path):
    from multiminddev.env import EvalStatus

    result = evaluator.evaluate(problem_named(fixture_header(path)["problem"]), path.read_text())
    assert result.status is EvalStatus.OK, (
        f"{result.status} {result.reject_reason}: {result.message}")
    coverage = result.benchmark.custom_kernel_time_fraction
    assert coverage is None or coverage >= 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("path", POISONERS, ids=_ids)
def test_poisoning_candidate_cannot_change_a_later_verdict(path, tmp_path, monkeypatch):
    """The poisoner is refused, and an honest ReLU evaluated afterwards by a fresh evaluator on
    the same cache directory (a later evaluation on the same machine) is ok at a plausible
    speed: neither a forged cubin nor a forged peak bandwidth reached it."""
    from multiminddev.env import EvalStatus, Evaluator

    monkeypatch.setenv("MULTIMINDDEV_CACHE", str(tmp_path))
    problem = problem_named("1_relu")
    with Evaluator(_config(tmp_path)) as first:
        honest_before = first.evaluate(problem, VICTIM.read_text())
        poisoned = first.evaluate(problem, path.read_text())
    with Evaluator(_config(tmp_path)) as later:
        honest_after = later.evaluate(problem, VICTIM.read_text())
    _assert_not_ok(poisoned, path)
    assert honest_before.status is EvalStatus.OK, honest_before.message
    assert honest_after.status is EvalStatus.OK, (
        f"{honest_after.status} {honest_after.reject_reason}: {honest_after.message}")
    # A memory-bound ReLU runs near eager speed: far off means a forged figure.
    assert 0.3 < honest_after.benchmark.speedup_vs_eager < 3.0
