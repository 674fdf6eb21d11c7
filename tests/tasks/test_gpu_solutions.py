"""GPU integrity check of the built-in corpus: every reference solution passes the evaluator.

For every family and every dtype it has, one problem (its first shape of that dtype) is
evaluated with each reference solution (naive, and fast where there is one). Every result must
be ``ok`` (compiled, correct on all trials, timed), and each fast solution must beat its naive
one by the family's ``fast_min_speedup`` (1.0 for memory-bound elementwise ops, where a naive
kernel is already near bandwidth; more for reductions, transposes, matmuls).

The measured times and speedups go to ``$MULTIMINDDEV_CORPUS_REPORT`` (JSON) when set, else to
pytest's temporary folder, and are printed (run with ``-s`` to see the table):

    MULTIMINDDEV_CORPUS_REPORT=corpus_gpu.json pytest -m gpu -s tests/tasks/test_gpu_solutions.py

``MULTIMINDDEV_CORPUS_FAMILIES=relu,softmax`` limits the run to those families.

The SFT-only breadth families (tasks/builtin/breadth.py) are checked the same way: SFT teaches
their solutions, so they must be as correct as the corpus's (their report rows say
``"breadth": true``), and so are the GRPO-only practice families (``"practice": true``):
no training reads their solutions, but a wrong one would hide a wrong ``forward``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from multiminddev.tasks.builtin import (
    FAMILIES,
    Variant,
    breadth_families,
    make_problem,
    practice_families,
    reference_solution,
)

pytestmark = pytest.mark.gpu

# MULTIMINDDEV_CORPUS_FAMILIES=relu,softmax limits a run to some families (default: all).
_ONLY = {n for n in os.environ.get("MULTIMINDDEV_CORPUS_FAMILIES", "").split(",") if n}
BREADTH = breadth_families()
BREADTH_NAMES = frozenset(f.name for f in BREADTH)  # disjoint from the corpus's names
PRACTICE = practice_families()  # GRPO-only; names disjoint from both
SELECTED = [f for f in (*FAMILIES, *BREADTH, *PRACTICE) if not _ONLY or f.name in _ONLY]
# (family, dtype, variant): every solution text the corpus can produce
CASES = [(f, dt, v) for f in SELECTED for dt in f.dtypes for v in f.variants]
CASE_IDS = [f"{f.name}-{dt}-{v.value}" for f, dt, v in CASES]
FAST_PAIRS = [(f, dt) for f in SELECTED for dt in f.dtypes if f.fast is not None]
FAST_IDS = [f"{f.name}-{dt}" for f, dt in FAST_PAIRS]


def _problem(family, dtype):
    first = next(s for s in family.shapes if s.dtype == dtype)
    return make_problem(family, first)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Evaluate all cases in one batch (parallel over the GPUs); key (family, dtype, variant)."""
    from multiminddev.env import EvalConfig, Evaluator

    pairs = []
    for family, dtype, variant in CASES:
        problem = _problem(family, dtype)
        source = reference_solution(problem, variant)
        assert source is not None, (family.name, variant)
        pairs.append((problem, source))
    # Trusted sources: a worker may serve several (a fault still replaces it).
    config = EvalConfig(num_workers=None, max_jobs_per_worker=16, num_trials=3, timeout_s=300.0,
                        benchmark=True, compile_baseline=False, bench_budget_s=1.0)
    with Evaluator(config) as evaluator:
        evaluated = evaluator.evaluate_many(pairs)
    table = {(f.name, dt, v): r for (f, dt, v), r in zip(CASES, evaluated, strict=True)}
    _write_report(table, tmp_path_factory.mktemp("corpus") / "corpus_gpu.json")
    return table


def _median_ms(result) -> float:
    return result.benchmark.candidate.median_ms


def _write_report(table, default_path: Path) -> None:
    rows = []
    for (name, dtype, variant), r in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        row = {"family": name, "breadth": name in BREADTH_NAMES,
               "practice": any(f.name == name for f in PRACTICE), "dtype": dtype,
               "variant": variant.value, "problem": r.problem,
               "status": r.status.value, "message": r.message, "device": r.device,
               "median_ms": _median_ms(r), "speedup_vs_eager": r.benchmark.speedup_vs_eager,
               "fraction_of_peak": r.benchmark.fraction_of_peak}
        naive = table.get((name, dtype, Variant.NAIVE))
        if variant is Variant.FAST and naive is not None and _median_ms(r) > 0:
            row["speedup_vs_naive"] = _median_ms(naive) / _median_ms(r)
        rows.append(row)
    path = Path(os.environ.get("MULTIMINDDEV_CORPUS_REPORT") or default_path)
    path.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\ncorpus GPU report: {path}")
    for row in rows:
        extra = f"  fast/naive {row['speedup_vs_naive']:.2f}x" if "speedup_vs_naive" in row else ""
        print(f"{row['problem']:<40} {row['variant']:<6} {row['status']:<14} "
              f"{row['median_ms']:.4f} ms  vs eager {row['speedup_vs_eager']:.2f}x{extra}")


@pytest.mark.parametrize(("family", "dtype", "variant"), CASES, ids=CASE_IDS)
def test_reference_solution_passes_the_evaluator(results, family, dtype, variant):
    result = results[(family.name, dtype, variant)]
    detail = (f"{result.message} | verify: {result.verify.error[:500]} | "
              f"{result.verify.mismatches[:1]}")
    assert result.status.value == "ok", detail
    assert result.correct
    assert _median_ms(result) > 0


@pytest.mark.parametrize(("family", "dtype"), FAST_PAIRS, ids=FAST_IDS)
def test_fast_solution_beats_the_naive_one(results, family, dtype):
    naive = results[(family.name, dtype, Variant.NAIVE)]
    fast = results[(family.name, dtype, Variant.FAST)]
    if not (naive.correct and fast.correct):
        pytest.fail(f"cannot compare: naive {naive.status.value}, fast {fast.status.value}")
    speedup = _median_ms(naive) / _median_ms(fast)
    assert speedup > family.fast_min_speedup, (
        f"{family.name} {dtype}: fast {_median_ms(fast):.4f} ms vs naive "
        f"{_median_ms(naive):.4f} ms = {speedup:.2f}x, expected > {family.fast_min_speedup}x"
    )


def test_first_shapes_run_long_enough_to_time(results):
    """The size policy: runs long enough to time reliably (allowing 2x slack for fast GPUs)."""
    too_short = []
    for (name, dtype, variant), r in results.items():
        best = Variant.FAST if (name, dtype, Variant.FAST) in results else Variant.NAIVE
        if variant is best and r.correct and _median_ms(r) < 0.010:
            too_short.append(f"{name} {dtype}: {_median_ms(r) * 1000:.1f} us")
    assert not too_short, too_short
