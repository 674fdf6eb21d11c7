"""The SFT-only breadth families (tasks/builtin/breadth.py), on the CPU.

Their solutions, and those of the GRPO-only practice families of the same module (the rest of
whose tests are in test_practice.py), go through the corpus's own checks (solution_checks.py:
NVRTC compilation for sm_90, launch signatures, the CPU emulator's results);
test_gpu_solutions.py evaluates them on a GPU. Here also: they stay out of the corpus (names, forwards, and computed values), their
problems load and run, and SFT examples are built from them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from multiminddev.tasks.builtin import (
    FAMILIES,
    FAMILY_BY_NAME,
    ORIGIN,
    Variant,
    breadth_by_name,
    breadth_families,
    breadth_problems,
    builtin_problems,
    make_problem,
    practice_families,
    reference_solution,
)
from multiminddev.tasks.builtin.breadth import check_disjoint
from multiminddev.tasks.builtin.spec import Family
from multiminddev.tasks.problem import load_problem_source
from tests.tasks import cuda_cpu_emulator
from tests.tasks.solution_checks import (
    check_compiles_and_launches,
    check_matches_model_in_emulator,
    exec_source,
    model_outputs,
    small_shape,
)

BREADTH = breadth_families()
FAMILY_IDS = [f.name for f in BREADTH]
# breadth's and practice's solutions: both lists are built by breadth.py from the same templates
SOLUTIONS = [(f, v, dt) for f in (*BREADTH, *practice_families()) for v in f.variants
             for dt in f.dtypes]
SOLUTION_IDS = [f"{f.name}-{v.value}-{dt}" for f, v, dt in SOLUTIONS]
GIB = 1 << 30


def test_breadth_families_are_tier0_elementwise_and_marked():
    assert 15 <= len(BREADTH) <= 20
    assert [f.name for f in BREADTH] == sorted(breadth_by_name())
    for family in BREADTH:
        assert family.tier == 0 and family.breadth and "breadth" in family.tags
        assert "elementwise" in family.tags
        assert family.atol is None and family.rtol is None  # the corpus's default tolerances
    assert sum("float16" in f.dtypes for f in BREADTH) >= 3


def test_breadth_names_are_disjoint_from_the_corpus():
    assert not {f.name for f in BREADTH} & {f.name for f in FAMILIES}
    assert not any(f.breadth for f in FAMILIES)


def test_a_collision_with_the_corpus_raises():
    relu = FAMILY_BY_NAME["relu"]
    neg = breadth_by_name()["neg"]
    with pytest.raises(RuntimeError, match="has a corpus family's name"):
        check_disjoint([dataclasses.replace(neg, name="relu")], FAMILIES)
    with pytest.raises(RuntimeError, match="computes corpus family 'relu'"):
        check_disjoint([dataclasses.replace(relu, name="relu2", breadth=True)], FAMILIES)


def test_no_breadth_family_computes_a_corpus_operation():
    """By value, not only by text: on the same randn inputs, no breadth family's Model gives
    any same-signature corpus family's outputs (e.g. a renamed held-out ``abs``)."""
    corpus = [f for f in FAMILIES if "elementwise" in f.tags]
    for family in BREADTH:
        mine = model_outputs(family)
        for other in corpus:
            if (other.forward_args, other.inputs, other.small) != (
                    family.forward_args, family.inputs, family.small):
                continue
            theirs = model_outputs(other)
            assert not torch.allclose(mine, theirs, atol=1e-3), (family.name, other.name)


def test_breadth_problems_are_in_no_split_and_not_in_the_corpus():
    problems = breadth_problems()
    assert len(problems) == sum(len(f.shapes) for f in BREADTH)
    assert {p.split for p in problems} == {""}
    assert all(p.extra["breadth"] is True and p.extra["origin"] == ORIGIN for p in problems)
    corpus = {p.name for p in builtin_problems(shapes_per_family=None)}
    assert not corpus & {p.name for p in problems}
    assert len({p.name for p in problems}) == len(problems)
    assert all("breadth" not in p.extra for p in builtin_problems(shapes_per_family=None))


@pytest.mark.parametrize("family", BREADTH, ids=FAMILY_IDS)
def test_every_shape_renders_a_loadable_problem(family: Family):
    for s in family.shapes:
        problem = load_problem_source(family.render_problem(s), name="ignored")
        assert problem.name == family.problem_name(s)
        assert (problem.tier, problem.family, problem.dtype) == (0, family.name, s.dtype)
        assert problem.extra["breadth"] is True
        assert problem.bytes_moved == family.bytes_moved(s) >= 8e6
        with torch.device("meta"):  # sizes policy of the corpus, measured without allocating
            ns = exec_source(family.render_problem(s), family.name)
            inputs = ns["get_inputs"]()
        assert sum(t.numel() * t.element_size() for t in inputs) <= GIB


@pytest.mark.parametrize("family", BREADTH, ids=FAMILY_IDS)
def test_small_problem_runs_on_cpu(family: Family):
    for dtype in family.dtypes:
        s = small_shape(family, dtype)
        ns = exec_source(family.render_problem(s), family.name)
        torch.manual_seed(0)
        out = ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())
        assert tuple(out.shape) == family.output_shape(s)
        assert out.dtype == getattr(torch, dtype) and torch.isfinite(out).all()


@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_compiles_with_nvrtc_and_launches_match_signatures(family, variant, dtype):
    check_compiles_and_launches(family, variant, dtype)


@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_passes_the_static_checks(family, variant, dtype):
    static_checks = pytest.importorskip("multiminddev.env.static_checks")
    result = static_checks.run_static_checks(family.render_solution(variant, dtype),
                                             problem_dtype=dtype)
    assert [(f.rule, f.message) for f in result.findings] == []


@pytest.mark.slow
@pytest.mark.skipif(not cuda_cpu_emulator.compiler_available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_matches_the_model_in_the_cpu_emulator(family, variant, dtype):
    check_matches_model_in_emulator(family, variant, dtype)


def test_reference_solution_finds_breadth_solutions_and_keeps_the_tables_apart():
    neg = breadth_by_name()["neg"]
    problem = make_problem(neg, neg.shapes[0])
    assert reference_solution(problem, Variant.NAIVE) == neg.render_solution(Variant.NAIVE)
    half = make_problem(neg, next(s for s in neg.shapes if s.dtype == "float16"))
    assert "__half" in reference_solution(half, Variant.FAST)
    # a problem claiming to be a corpus problem of a breadth family's name has no solution,
    # and a breadth-marked problem of a corpus family's name has none either
    unmarked = dataclasses.replace(problem, extra={"origin": ORIGIN})
    assert reference_solution(unmarked) is None
    relu = FAMILY_BY_NAME["relu"]
    marked = make_problem(relu, relu.shapes[0])
    marked = dataclasses.replace(marked, extra={**marked.extra, "breadth": True})
    assert reference_solution(marked) is None
    assert reference_solution(dataclasses.replace(problem, extra={"breadth": True})) is None


def test_sft_examples_are_built_from_breadth_problems():
    from multiminddev.train.sft_data import generator_examples, optimizer_examples

    problems = breadth_problems()
    generator = generator_examples(problems, variants=("naive",))
    assert [e.problem for e in generator] == [p.name for p in problems]
    assert {e.origin for e in generator} == {"builtin"}
    optimizer = optimizer_examples(problems)
    with_fast = [p.name for p in problems if breadth_by_name()[p.family].fast is not None]
    assert [e.problem for e in optimizer] == with_fast and with_fast
