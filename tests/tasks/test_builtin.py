"""The built-in corpus: families, problem rendering, and reference solutions (CPU side).

Each solution's CUDA is compiled with NVRTC for sm_90 (no GPU needed) by importing its source,
exactly as the evaluation worker does; every kernel launch in ``forward`` is checked against
the compiled kernel's signature (solution_checks.py, shared with test_breadth.py); the static
checks must find nothing. Kernel *results* are checked on the GPU machine by
test_gpu_solutions.py, and here on small shapes by running the kernels in a CPU emulator
(tests/tasks/cuda_cpu_emulator.py).
"""

from __future__ import annotations

import ast
import collections
import math

import pytest
import torch

from multiminddev.cuda import KernelArgumentError
from multiminddev.tasks.builtin import (
    FAMILIES,
    Variant,
    builtin_problems,
    get_family,
    make_problem,
    reference_solution,
)
from multiminddev.tasks.builtin.spec import Family
from multiminddev.tasks.problem import Problem, load_problem_source
from tests.tasks import cuda_cpu_emulator
from tests.tasks.solution_checks import (
    check_compiles_and_launches,
    check_matches_model_in_emulator,
    exec_source,
    small_shape,
)

FAMILY_IDS = [f.name for f in FAMILIES]
SOLUTIONS = [(f, v, dt) for f in FAMILIES for v in f.variants for dt in f.dtypes]
SOLUTION_IDS = [f"{f.name}-{v.value}-{dt}" for f, v, dt in SOLUTIONS]
GIB = 1 << 30


def test_at_least_40_families_in_all_four_tiers():
    tiers = collections.Counter(f.tier for f in FAMILIES)
    assert len(FAMILIES) >= 40
    assert sorted(tiers) == [0, 1, 2, 3]
    assert min(tiers.values()) >= 5


def test_family_names_are_unique():
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_at_least_20_families_have_a_fast_solution():
    assert sum(f.fast is not None for f in FAMILIES) >= 20


def test_some_families_have_float16_shapes():
    assert sum("float16" in f.dtypes for f in FAMILIES) >= 3


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_every_shape_renders_a_loadable_problem(family: Family):
    for s in family.shapes:
        source = family.render_problem(s)
        problem = load_problem_source(source, name="ignored")
        assert problem.name == family.problem_name(s)
        assert (problem.tier, problem.family, problem.dtype) == (family.tier, family.name, s.dtype)
        assert problem.bytes_moved == family.bytes_moved(s) > 0
        assert problem.extra["params"] == s.as_dict()


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_small_problem_runs_on_cpu_with_the_expected_output_shape(family: Family):
    for dtype in family.dtypes:
        s = small_shape(family, dtype)
        ns = exec_source(family.render_problem(s), family.name)
        torch.manual_seed(0)
        model = ns["Model"](*ns["get_init_inputs"]())
        out = model(*ns["get_inputs"]())
        assert tuple(out.shape) == family.output_shape(s)
        if family.name != "argmax_dim":
            assert out.dtype == getattr(torch, dtype)


def _input_bytes(ns: dict) -> int:
    """Bytes of the inputs and parameters, measured on the meta device (nothing allocated)."""
    with torch.device("meta"):
        inputs = ns["get_inputs"]()
        model = ns["Model"](*ns["get_init_inputs"]())
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)] + list(model.parameters())
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_full_shapes_are_big_enough_and_fit_in_one_gib(family: Family):
    for s in family.shapes:
        ns = exec_source(family.render_problem(s), family.name)
        assert _input_bytes(ns) <= GIB
        # >= ~20 us on an H100: >= 8 MB of traffic or >= 1 GFLOP
        assert family.bytes_moved(s) >= 8e6 or family.flops(s) >= 1e9, s


def test_builtin_problems_is_deterministic():
    first = builtin_problems(seed=3)
    second = builtin_problems(seed=3)
    assert [(p.name, p.source_hash, p.split) for p in first] == [
        (p.name, p.source_hash, p.split) for p in second
    ]


def test_builtin_problems_filters_by_tier_family_and_count():
    tier1 = builtin_problems(tiers=[1], shapes_per_family=None)
    assert {p.tier for p in tier1} == {1}
    assert len(tier1) == sum(len(f.shapes) for f in FAMILIES if f.tier == 1)
    one = builtin_problems(families=["softmax"], shapes_per_family=1)
    assert [p.family for p in one] == ["softmax"]
    assert all(len([p for p in builtin_problems() if p.family == f.name]) <= 2 for f in FAMILIES)


def test_builtin_problems_rejects_an_unknown_family():
    with pytest.raises(KeyError, match="no built-in family"):
        builtin_problems(families=["no_such_op"])


def test_problem_names_are_unique():
    names = [p.name for p in builtin_problems(shapes_per_family=None)]
    assert len(names) == len(set(names))


def test_reference_solution_is_none_for_a_foreign_problem():
    foreign = Problem(name="x", source="", family="relu")  # not from the built-in corpus
    assert reference_solution(foreign) is None


def test_reference_solution_is_none_for_a_missing_fast_variant():
    naive_only = next(f for f in FAMILIES if f.fast is None)
    problem = make_problem(naive_only, naive_only.shapes[0])
    assert reference_solution(problem, "fast") is None
    assert reference_solution(problem, "naive") is not None


def test_reference_solution_follows_the_problem_dtype():
    relu = get_family("relu")
    half = next(s for s in relu.shapes if s.dtype == "float16")
    source = reference_solution(make_problem(relu, half), Variant.FAST)
    assert "__half" in source


def _init_signature(tree: ast.Module, cls: str) -> list[str]:
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [a.arg for a in init.args.args]


@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_mirrors_the_model_constructor(family: Family, variant: Variant, dtype: str):
    solution = ast.parse(family.render_solution(variant, dtype))
    problem = ast.parse(family.render_problem(family.shapes[0]))
    assert _init_signature(solution, "ModelNew") == _init_signature(problem, "Model")


@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_compiles_with_nvrtc_and_launches_match_signatures(family, variant, dtype):
    check_compiles_and_launches(family, variant, dtype)


@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_passes_the_static_checks(family, variant, dtype):
    static_checks = pytest.importorskip("multiminddev.env.static_checks")
    result = static_checks.run_static_checks(family.render_solution(variant, dtype),
                                             problem_dtype=dtype)
    assert [(f.rule, f.message) for f in result.findings] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-tensor launch error")
@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_forward_runs_up_to_its_first_launch(family, variant, dtype):
    """On CPU tensors, forward's Python (shapes, allocation, argument count) runs until the
    first launch refuses the CPU pointer: proof that the launch code itself is sound."""
    ns = exec_source(family.render_solution(variant, dtype), family.name)
    problem_ns = exec_source(family.render_problem(small_shape(family, dtype)), "problem")
    torch.manual_seed(0)
    model = ns["ModelNew"](*problem_ns["get_init_inputs"]())
    with pytest.raises(KernelArgumentError, match="the tensor is on cpu"):
        model(*problem_ns["get_inputs"]())


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILY_IDS)
def test_solution_holds_the_same_parameters_as_the_model(family: Family):
    s = family.small
    problem_ns = exec_source(family.render_problem(s), "problem")
    init = problem_ns["get_init_inputs"]()
    torch.manual_seed(1)
    model = problem_ns["Model"](*init)
    ns = exec_source(family.render_solution(Variant.NAIVE, "float32"), family.name)
    torch.manual_seed(1)
    new = ns["ModelNew"](*init)
    ref = dict(model.named_parameters())
    got = dict(new.named_parameters())
    assert ref.keys() == got.keys()
    for name, value in ref.items():
        assert torch.equal(value, got[name]), name


@pytest.mark.slow
@pytest.mark.skipif(not cuda_cpu_emulator.compiler_available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("family", "variant", "dtype"), SOLUTIONS, ids=SOLUTION_IDS)
def test_solution_matches_the_model_in_the_cpu_emulator(family, variant, dtype):
    """The kernels' results, on small shapes that still span several blocks, tiles and
    grid-stride steps, run by tests/tasks/cuda_cpu_emulator.py on CPU tensors."""
    check_matches_model_in_emulator(family, variant, dtype)


def test_corpus_doc_lists_every_family():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "corpus.md").read_text()
    missing = [f.name for f in FAMILIES if f"| `{f.name}` |" not in doc]
    assert not missing, f"docs/corpus.md lacks rows for {missing}"


def test_exported_problem_file_loads_and_keeps_its_solution(tmp_path):
    from multiminddev.tasks.problem import load_problem

    family = get_family("layernorm")
    path = tmp_path / "level2" / "1_layernorm.py"
    path.parent.mkdir()
    path.write_text(family.render_problem(family.shapes[0]))
    problem = load_problem(path)
    assert problem.name == family.problem_name(family.shapes[0])
    assert reference_solution(problem, "fast") == family.render_solution("fast")


@pytest.mark.skipif(not cuda_cpu_emulator.compiler_available(), reason="needs g++ (C++20)")
def test_emulator_catches_a_missing_bounds_check_and_a_wrong_reduction():
    """The harness itself: a kernel without its bounds check writes past the output (guards
    broken), and a block reduction that drops the other warps gives wrong sums."""
    relu = get_family("relu").render_solution(Variant.NAIVE)
    unchecked = relu.replace("if (i < n) y[i]", "y[i]")
    assert unchecked != relu
    ns = cuda_cpu_emulator.emulated_namespace(unchecked)
    ns["ModelNew"]()(torch.randn(5, 301))
    assert not ns["torch"].intact()

    sum_fast = get_family("sum_dim").render_solution(Variant.FAST)
    one_warp = sum_fast.replace("v = lane < warps ? smem[lane] : IDENTITY;",
                                "v = lane < 1 ? smem[lane] : IDENTITY;")
    assert one_warp != sum_fast
    ns = cuda_cpu_emulator.emulated_namespace(one_warp)
    x = torch.randn(6, 300)
    assert not torch.allclose(ns["ModelNew"]()(x), x.sum(dim=1), atol=1e-3)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="test_gpu_solutions.py covers the GPU")
def test_every_solution_clears_the_evaluator_up_to_the_gpu():
    """Through the real evaluation service on a machine without a GPU: static checks and
    compilation pass for every solution text, so each ends ``no_gpu``."""
    from multiminddev.env import EvalConfig, Evaluator

    pairs, labels = [], []
    for family, variant, dtype in SOLUTIONS:
        problem = make_problem(family, next(s for s in family.shapes if s.dtype == dtype))
        pairs.append((problem, family.render_solution(variant, dtype)))
        labels.append(f"{family.name}-{variant.value}-{dtype}")
    # Generous limits: this checks statuses, not speed, and CI machines can be loaded.
    config = EvalConfig(num_workers=2, max_jobs_per_worker=64, compile_baseline=False,
                        timeout_s=600.0, compile_timeout_s=300.0, setup_timeout_s=300.0)
    with Evaluator(config) as evaluator:
        results = evaluator.evaluate_many(pairs)
    bad = {label: (r.status.value, r.message) for label, r in zip(labels, results, strict=True)
           if r.status.value != "no_gpu"}
    assert not bad


# --------------------------------------------------------------------------- resized shapes

def _train_shapes(family: Family) -> list:
    from multiminddev.tasks.splits import Split, SplitConfig, assign_splits

    splits = assign_splits(FAMILIES, SplitConfig(seed=0))[family.name]
    return [s for s, sp in zip(family.shapes, splits, strict=True) if sp is Split.TRAIN]


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.tier <= 1], ids=lambda f: f.name)
def test_resized_shapes_are_new_distinct_and_no_larger_than_the_corpus(family: Family):
    from multiminddev.tasks.builtin.resize import resized_shapes

    bases = _train_shapes(family) or list(family.shapes)
    shapes = resized_shapes(family, bases, 5, seed=0)
    tags = [s.tag for s in shapes]
    assert len(shapes) == 5 * len({b.dtype for b in bases})
    assert len(set(tags)) == len(tags)
    assert not set(tags) & {s.tag for s in family.shapes}  # never a corpus (or held-out) shape
    largest = max(math.prod(v for _, v in s.sizes) for s in family.shapes)
    assert all(math.prod(v for _, v in s.sizes) <= largest for s in shapes)
    assert collections.Counter(s.dtype for s in shapes) == collections.Counter(
        {dt: 5 for dt in {b.dtype for b in bases}})
    assert resized_shapes(family, bases, 5, seed=0) == shapes  # deterministic
    assert resized_shapes(family, bases, 3, seed=0) == [  # the first N of more, per dtype
        s for dt in dict.fromkeys(b.dtype for b in bases)
        for s in [x for x in shapes if x.dtype == dt][:3]]
    later = resized_shapes(family, bases, 2, seed=0, start=3)  # the 2 after the first 3
    assert later == [s for dt in dict.fromkeys(b.dtype for b in bases)
                     for s in [x for x in shapes if x.dtype == dt][3:5]]
    assert not {s.tag for s in later} & {s.tag for s in resized_shapes(family, bases, 3, seed=0)}


def test_resized_problems_render_loadable_sources_with_the_familys_solution():
    plain = {p.name for p in builtin_problems(tiers=[0, 1], split="train", shapes_per_family=None)}
    problems = builtin_problems(tiers=[0, 1], split="train", shapes_per_family=None, resized=1)
    added = [p for p in problems if p.name not in plain]
    assert added
    for problem in added:
        family = get_family(problem.family)
        assert load_problem_source(problem.source, name=problem.name).name == problem.name
        assert reference_solution(problem) == family.render_solution("naive", problem.dtype)


def test_resized_problems_need_the_training_split():
    with pytest.raises(ValueError, match="split='train'"):
        builtin_problems(tiers=[0], split="heldout", resized=2)
    with pytest.raises(ValueError, match="split='train'"):
        builtin_problems(tiers=[0], resized=2)
