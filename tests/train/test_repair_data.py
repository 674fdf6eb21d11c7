"""Optimizer repair pairs: real defects, the Tester's real report through the evaluator, the fix."""

from __future__ import annotations

import pytest
import torch

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.roles import AgentRole
from multiminddev.tasks.loaders import load_problems
from multiminddev.train.repair_data import (
    _arity,
    broken_variants,
    misspelt_math,
    optimizer_repair_examples,
    repair_kinds,
    undeclared_variable,
    wrong_operation,
)
from multiminddev.train.sft_data import NAIVE, _builtin_solution

MODULE = '''import torch
kernels = compile_kernels(r"""
extern "C" __global__ void k(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    float v = x[i];
    if (i < n) y[i] = fmaxf(expf(v), 0.0f) + v;
}
""")
'''


def test_misspelt_math_renames_the_first_math_call_inside_the_cuda_source_only():
    broken = misspelt_math(MODULE)
    assert broken is not None and "fmaxf(exp_f(v)" not in broken
    assert "maxf(expf(v), 0.0f)" in broken and "fmaxf" not in broken
    assert broken.replace("maxf(", "fmaxf(") == MODULE
    assert misspelt_math("import torch\nx = torch.expf(1)\n") is None  # no CUDA block


def test_undeclared_variable_renames_only_the_last_use_of_the_first_local():
    broken = undeclared_variable(MODULE)
    assert broken is not None
    # ``i``'s last use (``y[i]``) becomes a name the kernel never declared
    assert "if (i < n) y[ssum]" in broken
    assert broken.count("ssum") == 1 and broken.replace("y[ssum]", "y[i]") == MODULE


def test_broken_variants_pair_each_precision_with_its_twin_kernel():
    problems = load_problems("builtin:tier0:train:allshapes")
    fp32 = next(p for p in problems if p.name == "add_4096x4096")
    fp16 = next(p for p in problems if p.name == "add_8192x4096_fp16")
    kinds32 = dict(broken_variants(fp32, _builtin_solution(fp32, NAIVE), problems,
                                   _builtin_solution))
    kinds16 = dict(broken_variants(fp16, _builtin_solution(fp16, NAIVE), problems,
                                   _builtin_solution))
    assert kinds32["float16_kernel"] == _builtin_solution(fp16, NAIVE)
    assert kinds16["float32_kernel"] == _builtin_solution(fp32, NAIVE)
    assert {"misspelt_math", "undeclared_variable"} <= set(kinds16)


def test_wrong_operation_is_another_familys_kernel_with_the_same_interface():
    problems = load_problems("builtin:tier0:train:allshapes")
    relu = next(p for p in problems if p.name == "relu_4096x4096")
    wrong = wrong_operation(relu, _builtin_solution(relu, NAIVE), problems, _builtin_solution)
    donors = {p.family: _builtin_solution(p, NAIVE) for p in problems
              if p.family != "relu" and p.dtype == "float32"}
    assert wrong in donors.values() and "__global__ void unary_naive" in wrong
    again = wrong_operation(relu, _builtin_solution(relu, NAIVE), problems, _builtin_solution)
    assert again == wrong  # chosen by the problem's name, not at random
    # no other family with the interface: nothing to offer
    assert wrong_operation(relu, _builtin_solution(relu, NAIVE), [relu], _builtin_solution) is None


def test_a_family_no_other_shares_kernels_with_gets_a_module_of_the_same_arity():
    """transpose's and matvec's kernels are their own: the wrong operation is another family's
    whole naive module whose __init__ and forward take as many arguments."""
    problems = load_problems("builtin:tier0,tier1:train")
    for name, arity in (("transpose_8192x2048", (0, 1)), ("matvec_8192x4096", (0, 2))):
        problem = next(p for p in problems if p.name == name)
        wrong = wrong_operation(problem, _builtin_solution(problem, NAIVE), problems,
                                _builtin_solution)
        donors = {p.family: _builtin_solution(p, NAIVE) for p in problems
                  if p.family != problem.family and p.dtype == problem.dtype}
        assert wrong in donors.values() and f"{problem.family}_naive" not in wrong
        assert _arity(wrong) == _arity(_builtin_solution(problem, NAIVE)) == arity
    scale = next(p for p in load_problems("builtin:tier0:heldout") if p.family == "scale")
    assert _arity(_builtin_solution(scale, NAIVE)) == (1, 1)  # __init__(self, scale)


def test_broken_variants_keep_the_asked_kinds_and_refuse_unknown_ones():
    problems = load_problems("builtin:tier0:train:allshapes")
    add = next(p for p in problems if p.name == "add_4096x4096")
    source = _builtin_solution(add, NAIVE)
    assert set(dict(broken_variants(add, source, problems, _builtin_solution))) == {
        "undeclared_variable", "float16_kernel", "wrong_operation"}  # add calls no math function
    only = broken_variants(add, source, problems, _builtin_solution, kinds=["wrong_operation"])
    assert [k for k, _ in only] == ["wrong_operation"]
    with pytest.raises(ValueError, match="unknown repair kinds"):
        broken_variants(add, source, problems, _builtin_solution, kinds=["typo"])


@pytest.fixture(scope="module")
def repair_pairs():
    """Built through the real evaluation service (NVRTC compiles, static checks)."""
    from multiminddev.env import EvalConfig, Evaluator

    problems = load_problems("builtin:tier0:train:allshapes")
    problems = [p for p in problems if p.family in ("add", "relu", "gelu_tanh")]
    config = EvalConfig(num_workers=2, compile_baseline=False, timeout_s=600.0,
                        compile_timeout_s=300.0, setup_timeout_s=300.0)
    with Evaluator(config) as evaluator:
        return problems, optimizer_repair_examples(problems, evaluator.evaluate)


def test_every_pair_shows_the_testers_real_report_and_replies_with_the_correct_kernel(
        repair_pairs):
    problems, pairs = repair_pairs
    by_name = {p.name: p for p in problems}
    kinds = repair_kinds(pairs)
    assert kinds["misspelt_math"] >= 3 and kinds["undeclared_variable"] >= 3
    assert kinds["float16_kernel"] >= 3  # add, relu, gelu_tanh fp32 problems
    for pair in pairs:
        assert pair.role is AgentRole.OPTIMIZER
        user, reply = pair.messages[-2]["content"], pair.messages[-1]["content"]
        problem = by_name[pair.problem]
        assert parse_candidate(reply).source == _builtin_solution(problem, NAIVE)
        assert "Tester report:" in user and "turn 1 (generator)" in user
        if pair.variant == "repair:misspelt_math":
            assert "Status: compile_error" in user and "is undefined" in user
        elif pair.variant == "repair:undeclared_variable":
            assert "Status: compile_error" in user and 'identifier "ssum" is undefined' in user
        elif pair.variant == "repair:float16_kernel":
            assert "Status: rejected" in user and "low_precision_kernel" in user
        elif pair.variant == "repair:float32_kernel":
            assert "Status: runtime_error" in user and torch.cuda.is_available()
        else:
            assert pair.variant == "repair:wrong_operation" and torch.cuda.is_available()
            assert "Status: incorrect" in user


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs these kernels")
def test_defects_the_tester_cannot_report_without_a_gpu_are_left_out(repair_pairs):
    problems, pairs = repair_pairs
    fp16 = {p.name for p in problems if p.dtype == "float16"}
    assert fp16  # the float32 twin compiles and passes static checks: no report on a CPU
    assert not [p for p in pairs if p.variant in ("repair:float32_kernel",
                                                  "repair:wrong_operation")]
    assert {p.problem for p in pairs} & fp16  # their compile errors still count


@pytest.mark.gpu
def test_on_a_gpu_wrong_operations_and_precisions_get_the_testers_run_reports(repair_pairs):
    kinds = repair_kinds(repair_pairs[1])
    assert kinds.get("wrong_operation", 0) >= 3 and kinds.get("float32_kernel", 0) >= 1


def test_a_fast_reply_is_the_problems_fast_kernel_where_the_corpus_has_one():
    """reply=FAST answers a broken kernel with the fast solution (comment-free on request); a
    family with no fast solution (tanh) keeps the naive one. Real NVRTC compile errors."""
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.train.sft_data import FAST, strip_comment_lines

    by_name = {p.name: p for p in load_problems("builtin:tier0:train")}
    relu, tanh = by_name["relu_4096x4096"], by_name["tanh_4096x4096"]
    problems = [relu, tanh]
    assert _builtin_solution(tanh, FAST) is None  # the corpus has no fast tanh
    config = EvalConfig(num_workers=1, compile_baseline=False, compile_timeout_s=300.0)
    with Evaluator(config) as evaluator:
        pairs = optimizer_repair_examples(problems, evaluator.evaluate, kinds=["misspelt_math"],
                                          reply=FAST, strip_comments=True)
    replies = {p.problem: parse_candidate(p.messages[-1]["content"]).source for p in pairs}
    fast = strip_comment_lines(_builtin_solution(relu, FAST))
    assert fast != _builtin_solution(relu, NAIVE)
    assert replies == {relu.name: fast,
                       tanh.name: strip_comment_lines(_builtin_solution(tanh, NAIVE))}
    assert "Status: compile_error" in pairs[0].messages[-2]["content"]
    with pytest.raises(ValueError, match="reply must be"):
        optimizer_repair_examples(problems, evaluator.evaluate, reply="fastest")


def test_per_family_caps_the_pairs_of_each_family_and_defect():
    from multiminddev.env import EvalConfig, Evaluator

    relus = [p for p in load_problems("builtin:tier0:train:allshapes") if p.family == "relu"]
    assert len(relus) >= 3
    seen: list[str] = []

    config = EvalConfig(num_workers=1, compile_baseline=False, compile_timeout_s=300.0)
    with Evaluator(config) as evaluator:
        def evaluate(problem, source):
            seen.append(problem.name)
            return evaluator.evaluate(problem, source)

        capped = optimizer_repair_examples(relus, evaluate, kinds=["misspelt_math"],
                                           per_family=2)
        assert repair_kinds(capped) == {"misspelt_math": 2}
        assert seen == [p.name for p in relus[:2]]  # the rest are never evaluated
        with pytest.raises(ValueError, match="per_family"):
            optimizer_repair_examples(relus, evaluate, per_family=-1)


@pytest.mark.gpu
def test_on_a_gpu_transpose_and_matvec_get_a_wrong_module_and_a_fast_reply():
    """The same-arity fallback on the GPU: another family's module runs on transpose's and
    matvec's inputs and the Tester reports what went wrong; the reply is the fast kernel."""
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.train.sft_data import FAST

    problems = load_problems("builtin:tier0,tier1:train")
    asked = [p for p in problems if p.name in ("transpose_8192x2048", "matvec_8192x4096")]
    config = EvalConfig(num_workers=2, compile_baseline=False, timeout_s=600.0,
                        compile_timeout_s=300.0, setup_timeout_s=300.0)
    with Evaluator(config) as evaluator:
        pairs = optimizer_repair_examples(asked + [p for p in problems if p not in asked],
                                          evaluator.evaluate, kinds=["wrong_operation"],
                                          reply=FAST, per_family=1)
    by_problem = {p.problem: p for p in pairs}
    for problem in asked:
        pair = by_problem[problem.name]
        user, reply = pair.messages[-2]["content"], pair.messages[-1]["content"]
        assert "Status: incorrect" in user or "Status: runtime_error" in user
        assert parse_candidate(reply).source == _builtin_solution(problem, FAST)
