"""The GRPO-only practice families (tasks/builtin/breadth.py's second list), on the CPU.

Their solutions go through the corpus's checks with breadth's, in test_breadth.py (NVRTC
compilation for sm_90, launch signatures, static checks, the CPU emulator's results);
test_gpu_solutions.py evaluates them on a GPU. Here: they compute no corpus or breadth operation (by name, by ``forward`` and by value),
SFT's specs never load them, their prompts carry no marker, and their specs load them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from multiminddev.tasks.builtin import (
    FAMILIES,
    Variant,
    breadth_families,
    make_problem,
    practice_by_name,
    practice_families,
    practice_problems,
    reference_solution,
)
from multiminddev.tasks.builtin.breadth import check_disjoint
from multiminddev.tasks.builtin.spec import Family
from multiminddev.tasks.loaders import ProblemError, load_problems
from multiminddev.tasks.problem import load_problem_source
from tests.tasks.solution_checks import exec_source, model_outputs

PRACTICE = practice_families()
BREADTH = breadth_families()
FAMILY_IDS = [f.name for f in PRACTICE]


def test_practice_families_are_tier0_elementwise_fp32_and_marked():
    assert 20 <= len(PRACTICE) <= 24
    assert [f.name for f in PRACTICE] == sorted(practice_by_name())
    for family in PRACTICE:
        assert family.tier == 0 and family.practice and not family.breadth
        assert {"elementwise", "practice"} <= set(family.tags)
        assert family.dtypes == ("float32",)
        assert family.atol is None and family.rtol is None
    # some read __init__ parameters, as the held-out `scale` does
    assert sum(bool(f.init_args) for f in PRACTICE) >= 4
    assert sum(f.forward_args == "a, b" for f in PRACTICE) >= 4


def test_practice_names_and_forwards_are_disjoint_from_corpus_and_breadth():
    names = {f.name for f in PRACTICE}
    assert not names & {f.name for f in FAMILIES}
    assert not names & {f.name for f in BREADTH}
    cos = practice_by_name()["cos"]
    sin = next(f for f in BREADTH if f.name == "sin")
    with pytest.raises(RuntimeError, match="computes breadth family 'sin'"):
        check_disjoint([dataclasses.replace(sin, name="sine2")], BREADTH, other="breadth")
    with pytest.raises(RuntimeError, match="has a breadth family's name"):
        check_disjoint([dataclasses.replace(cos, name="sin")], BREADTH, other="breadth")


def test_no_practice_family_computes_a_corpus_or_breadth_operation():
    """By value: on the same randn inputs no practice family's Model gives the outputs of any
    same-signature corpus or breadth family (a renamed held-out ``abs`` would fail here), nor
    of another practice family."""
    others = [f for f in (*FAMILIES, *BREADTH, *PRACTICE) if "elementwise" in f.tags]
    for family in PRACTICE:
        mine = model_outputs(family)
        assert torch.isfinite(mine).all(), family.name
        for other in others:
            if other.name == family.name or (other.forward_args, other.inputs, other.small) != (
                    family.forward_args, family.inputs, family.small):
                continue
            assert not torch.allclose(mine, model_outputs(other), atol=1e-3), (family.name, other.name)


def test_practice_prompts_read_as_corpus_prompts_and_solutions_are_found_by_name():
    problems = practice_problems()
    assert len(problems) == sum(len(f.shapes) for f in PRACTICE)
    assert {p.split for p in problems} == {""}
    for p in problems:
        assert "breadth" not in p.extra and "practice" not in p.extra
        assert "practice" not in p.source and "breadth" not in p.source
        assert reference_solution(p) == practice_by_name()[p.family].render_solution(
            Variant.NAIVE)
    # a breadth-marked problem of a practice family's name has no solution
    marked = dataclasses.replace(problems[0], extra={**problems[0].extra, "breadth": True})
    assert reference_solution(marked) is None


@pytest.mark.parametrize("family", PRACTICE, ids=FAMILY_IDS)
def test_every_shape_renders_a_loadable_problem_that_runs_small_on_cpu(family: Family):
    for s in family.shapes:
        problem = load_problem_source(family.render_problem(s), name="ignored")
        assert (problem.name, problem.tier, problem.family) == (family.problem_name(s), 0,
                                                                 family.name)
    ns = exec_source(family.render_problem(family.small), family.name)
    out = ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())
    assert tuple(out.shape) == family.output_shape(family.small)


def test_specs_load_practice_and_sft_specs_never_do():
    every = load_problems("builtin:practice")
    assert {p.family for p in every} == set(practice_by_name())
    assert len(load_problems("builtin:practice:shapes1")) == len(PRACTICE)
    assert len(load_problems("builtin:practice:small")) == len(PRACTICE)
    two = load_problems("builtin:practice:cos:celu")
    assert {p.family for p in two} == {"cos", "celu"} and len(two) == 6
    # families by name work for breadth too
    assert {p.family for p in load_problems("builtin:breadth:sin:shapes1")} == {"sin"}
    sft_like = load_problems("builtin:breadth") + load_problems("builtin")
    assert not {p.family for p in sft_like} & set(practice_by_name())
    with pytest.raises(ProblemError, match="no practice family 'abs'"):
        load_problems("builtin:practice:abs")
    with pytest.raises(ProblemError, match="builtin:practice takes no split"):
        load_problems("builtin:practice:train")
    with pytest.raises(ProblemError, match="two specs"):
        load_problems("builtin:practice:breadth")


def test_a_practice_problem_is_a_builtin_problem_of_its_family():
    cos = practice_by_name()["cos"]
    problem = make_problem(cos, cos.shapes[0])
    assert problem.extra["origin"] and problem.family == "cos" and problem.tier == 0
