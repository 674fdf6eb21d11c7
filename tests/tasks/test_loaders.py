"""Loaders on small files written in each real schema (no hub: nothing is downloaded)."""

from __future__ import annotations

import ast
import collections
import json
import os
import subprocess
import sys
import types

import pytest

from multiminddev.tasks.loaders import (
    SakanaRecord,
    load_jsonl,
    load_kernelbench,
    load_problems,
    load_sakana_archive,
    problem_solution,
    reverify,
    sakana_candidate_source,
    sakana_problems,
    save_jsonl,
)
from multiminddev.tasks.problem import Problem, ProblemError
from tests.tasks.kb_fixtures import (
    KERNELBENCH_PROBLEMS,
    SAKANA_CUDA_CORRECT,
    SAKANA_FUNCTIONAL,
    SAKANA_MODULE,
    sakana_rows,
    write_kernelbench_checkout,
    write_kernelbench_parquet,
    write_sakana_parquet,
)

ALL_KB_NAMES = {name for problems in KERNELBENCH_PROBLEMS.values() for name in problems}


# --------------------------------------------------------------------------- KernelBench


def test_kernelbench_checkout_loads_every_level_with_tier_from_folder(tmp_path):
    problems = load_kernelbench(write_kernelbench_checkout(tmp_path))
    assert {p.name for p in problems} == ALL_KB_NAMES
    for p in problems:
        assert p.source == KERNELBENCH_PROBLEMS[p.tier][p.name]
        assert p.extra["source"] == "kernelbench" and p.extra["level"] == p.tier


def test_kernelbench_checkout_orders_by_problem_id_and_filters_levels(tmp_path):
    problems = load_kernelbench(write_kernelbench_checkout(tmp_path), levels=[1])
    assert [p.name for p in problems] == ["1_Square_matrix_multiplication_", "19_ReLU"]
    assert [p.extra["problem_id"] for p in problems] == [1, 19]


def test_kernelbench_checkout_accepts_the_inner_kernelbench_folder(tmp_path):
    inner = write_kernelbench_checkout(tmp_path) / "KernelBench"
    assert {p.name for p in load_kernelbench(inner, levels=2)} == set(KERNELBENCH_PROBLEMS[2])


def test_kernelbench_parquet_dump_matches_the_checkout(tmp_path):
    from_parquet = load_kernelbench(write_kernelbench_parquet(tmp_path / "hub"))
    from_checkout = load_kernelbench(write_kernelbench_checkout(tmp_path / "git"))
    key = lambda p: (p.tier, p.name)  # noqa: E731
    assert [(p.name, p.tier, p.source) for p in sorted(from_parquet, key=key)] == [
        (p.name, p.tier, p.source) for p in sorted(from_checkout, key=key)
    ]


def test_kernelbench_parquet_level_filter(tmp_path):
    problems = load_kernelbench(write_kernelbench_parquet(tmp_path), levels=[2, 3])
    assert {p.tier for p in problems} == {2, 3}


def test_kernelbench_save_to_disk_folder_loads(tmp_path):
    import datasets

    from tests.tasks.kb_fixtures import kernelbench_rows

    dd = datasets.DatasetDict({"level_1": datasets.Dataset.from_dict(kernelbench_rows(1))})
    dd.save_to_disk(str(tmp_path / "saved"))
    assert {p.name for p in load_kernelbench(tmp_path / "saved")} == set(KERNELBENCH_PROBLEMS[1])


def test_kernelbench_wrong_schema_names_missing_columns(tmp_path):
    import datasets

    path = tmp_path / "level_1-00000-of-00001.parquet"
    datasets.Dataset.from_dict({"code": ["x"], "name": ["a"]}).to_parquet(str(path))
    with pytest.raises(ProblemError, match=r"lacks column\(s\) \['level', 'problem_id'\]"):
        load_kernelbench(path)


def test_kernelbench_missing_path_says_what_to_pass(tmp_path):
    with pytest.raises(ProblemError, match="does not exist.*hub dataset id"):
        load_kernelbench(tmp_path / "nowhere")


def test_a_missing_local_file_is_not_mistaken_for_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for spec in ("data/level_1.parquet", "dumps/level_2.parquet", "data/nothing"):
        with pytest.raises(ProblemError, match="does not exist"):
            load_sakana_archive(spec)


def test_kernelbench_hub_without_network_says_how_to_get_a_local_copy():
    code = (
        "from multiminddev.tasks.loaders import load_kernelbench\n"
        "try:\n    load_kernelbench('ScalingIntelligence/KernelBench', levels=[1])\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.startswith("ProblemError could not load KernelBench")
    assert "save_to_disk" in out.stdout


def test_kernelbench_skips_a_malformed_file_but_keeps_the_rest(tmp_path):
    root = write_kernelbench_checkout(tmp_path)
    (root / "KernelBench" / "level1" / "99_Broken.py").write_text("import torch\nx = 1\n")
    names = {p.name for p in load_kernelbench(root, levels=[1])}
    assert names == set(KERNELBENCH_PROBLEMS[1])


# --------------------------------------------------------------------------- Sakana


def test_sakana_correct_only_keeps_the_correct_row(tmp_path):
    records = load_sakana_archive(write_sakana_parquet(tmp_path))
    assert [r.kernel_name for r in records] == ["linear_relu_scale_base"]
    record = records[0]
    assert isinstance(record, SakanaRecord)
    assert (record.op_name, record.level, record.task_id, record.correct) == (
        "76_Gemm_ReLU_Scale",
        2,
        76,
        True,
    )
    assert record.cuda_runtime == pytest.approx(0.021)
    assert record.speedup_native == pytest.approx(1.619)
    assert record.index == 1203


def test_sakana_all_rows_keep_flags_and_error(tmp_path):
    records = load_sakana_archive(write_sakana_parquet(tmp_path), correct_only=False)
    wrong = next(r for r in records if not r.correct)
    assert wrong.error.startswith("Output mismatch")
    assert wrong.max_diff == pytest.approx(0.875)
    assert wrong.cuda_runtime is None and wrong.speedup_native is None


def test_sakana_rows_of_one_task_share_one_problem(tmp_path):
    records = load_sakana_archive(write_sakana_parquet(tmp_path), correct_only=False)
    assert records[0].problem is records[1].problem
    (problem,) = sakana_problems(records)
    assert (
        problem.source == SAKANA_MODULE
        and problem.tier == 2
        and problem.name == "76_Gemm_ReLU_Scale"
    )
    assert problem.extra["task_id"] == 76


def test_sakana_limit_and_level_filter(tmp_path):
    path = write_sakana_parquet(tmp_path)
    assert len(load_sakana_archive(path, correct_only=False, limit=1)) == 1
    assert load_sakana_archive(path, levels=[1]) == []


def test_sakana_wrong_schema_names_missing_columns(tmp_path):
    rows = sakana_rows()
    del rows["CUDA_Code"], rows["Correct"]
    with pytest.raises(ProblemError, match=r"lacks column\(s\) \['CUDA_Code', 'Correct'\]"):
        load_sakana_archive(write_sakana_parquet(tmp_path, rows))


def test_sakana_row_without_functional_code_has_no_candidate_and_says_why(tmp_path):
    rows = sakana_rows()
    del rows["PyTorch_Code_Functional"]
    (record,) = load_sakana_archive(write_sakana_parquet(tmp_path, rows))
    assert record.candidate_source is None
    assert "PyTorch_Code_Functional" in record.candidate_error


def test_sakana_candidate_is_a_load_inline_model_new_module(tmp_path):
    (record,) = load_sakana_archive(write_sakana_parquet(tmp_path))
    source = record.candidate_source
    tree = ast.parse(source)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert classes == {"ModelNew"} and "module_fn" not in functions
    assert "load_inline(" in source and "functions=None" in source and "cpp_sources=''" in source
    assert "_ext.forward(x, self.weight, self.bias, scale)" in source
    literal = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "CUDA_SOURCE"
    )
    assert ast.literal_eval(literal) == SAKANA_CUDA_CORRECT


def _exec_candidate_with_python_extension(source: str, monkeypatch) -> types.ModuleType:
    """Run the wrapper for real, with the compiled extension replaced by the functional
    reference's module_fn (the function the CUDA code implements), so the argument mapping
    and weight initialisation can be checked on a CPU."""
    import torch.utils.cpp_extension as cpp_extension

    reference = types.ModuleType("functional_reference")
    exec(compile(SAKANA_FUNCTIONAL, "functional", "exec"), reference.__dict__)
    calls = []

    def fake_load_inline(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(forward=reference.module_fn)

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    module = types.ModuleType("candidate")
    exec(compile(source, "candidate", "exec"), module.__dict__)
    assert (
        calls and calls[0]["cuda_sources"] == SAKANA_CUDA_CORRECT and calls[0]["functions"] is None
    )
    return module


def test_sakana_candidate_maps_arguments_and_weights_like_the_module_reference(monkeypatch):
    import torch

    source = sakana_candidate_source(SAKANA_CUDA_CORRECT, SAKANA_FUNCTIONAL, name="t")
    candidate = _exec_candidate_with_python_extension(source, monkeypatch)
    problem = types.ModuleType("problem")
    exec(compile(SAKANA_MODULE, "problem", "exec"), problem.__dict__)
    init = problem.get_init_inputs()
    torch.manual_seed(0)
    ref = problem.Model(*init)
    torch.manual_seed(0)
    new = candidate.ModelNew(*init)  # same seed -> same weights (same parameter creation order)
    x = torch.randn(4, init[0])
    torch.testing.assert_close(new(x), ref(x))


def test_sakana_candidate_passes_static_checks_and_its_build_is_statically_known():
    static = pytest.importorskip("multiminddev.env.static_checks")
    inline = pytest.importorskip("multiminddev.env.inline_build")
    source = sakana_candidate_source(SAKANA_CUDA_CORRECT, SAKANA_FUNCTIONAL, name="t")
    result = static.run_static_checks(source)
    assert result.findings == [] and result.candidate_kind == "load_inline"
    specs = inline.extract_inline_specs(source)  # the cached parallel build path can take it
    assert specs is not None and len(specs) == 1


def test_sakana_candidate_rejects_code_without_pybind_or_fn():
    with pytest.raises(ProblemError, match="PYBIND11_MODULE"):
        sakana_candidate_source("__global__ void k() {}", SAKANA_FUNCTIONAL, name="t")
    with pytest.raises(ProblemError, match="fn=module_fn"):
        sakana_candidate_source(SAKANA_CUDA_CORRECT, SAKANA_MODULE, name="t")


def test_reverify_sends_candidates_to_evaluate_many(tmp_path):
    from multiminddev.env.results import EvalResult, EvalStatus

    class RecordingEvaluator:  # the evaluator's batched API; evaluation itself is env/'s job
        def __init__(self):
            self.batches = []

        def evaluate_many(self, items):
            self.batches.append(items)
            return [EvalResult(status=EvalStatus.NO_GPU, problem=p.name) for p, _ in items]

    records = load_sakana_archive(write_sakana_parquet(tmp_path), correct_only=False)
    evaluator = RecordingEvaluator()
    pairs = reverify(records, evaluator)
    assert [r.kernel_name for r, _ in pairs] == [r.kernel_name for r in records]
    assert evaluator.batches[0][0] == (records[0].problem, records[0].candidate_source)
    assert all(res.problem == "76_Gemm_ReLU_Scale" for _, res in pairs)


@pytest.mark.gpu
@pytest.mark.slow
def test_sakana_candidate_builds_and_matches_reference_on_gpu(tmp_path):
    """load_inline builds the archive kernel for real (~1 min) and matches the module reference."""
    import torch

    # A GPU image may lack `datasets` (an optional dependency): a skip that says so, rather
    # than an error.
    pytest.importorskip("datasets", reason="the Sakana loader needs `datasets`: pip install datasets")
    (record,) = load_sakana_archive(write_sakana_parquet(tmp_path))
    candidate = types.ModuleType("candidate")
    exec(compile(record.candidate_source, "candidate", "exec"), candidate.__dict__)
    problem = types.ModuleType("problem")
    exec(compile(record.problem.source, "problem", "exec"), problem.__dict__)
    init = problem.get_init_inputs()
    torch.manual_seed(0)
    ref = problem.Model(*init).cuda()
    torch.manual_seed(0)
    new = candidate.ModelNew(*init).cuda()
    x = torch.randn(problem.batch_size, init[0], device="cuda")
    torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- JSONL


def _problem(name: str, **kw) -> Problem:
    return Problem(name=name, source=KERNELBENCH_PROBLEMS[1]["19_ReLU"], **kw)


def test_jsonl_round_trip_keeps_metadata_and_solution(tmp_path):
    problems = [
        _problem("relu_a", tier=0, family="relu", atol=1e-5, bytes_moved=1024, split="train"),
        _problem("relu_b", tier=1, dtype="float16", flops=7, extra={"shape": [4, 8]}),
    ]
    path = save_jsonl(problems, tmp_path / "p.jsonl", solutions={"relu_a": "class ModelNew: ..."})
    loaded = load_jsonl(path)
    assert [p.name for p in loaded] == ["relu_a", "relu_b"]
    assert problem_solution(loaded[0]) == "class ModelNew: ..."
    assert problem_solution(loaded[1]) is None
    a, b = loaded
    assert (a.tier, a.family, a.atol, a.bytes_moved, a.split) == (0, "relu", 1e-5, 1024, "train")
    assert (b.tier, b.dtype, b.flops, b.extra) == (1, "float16", 7, {"shape": [4, 8]})


def test_jsonl_minimal_line_and_unknown_keys_go_to_extra(tmp_path):
    path = tmp_path / "p.jsonl"
    row = {"name": "r", "source": KERNELBENCH_PROBLEMS[1]["19_ReLU"], "origin": "handwritten"}
    path.write_text(json.dumps(row) + "\n\n")
    (problem,) = load_jsonl(path)
    assert problem.name == "r" and problem.tier == 0 and problem.extra == {"origin": "handwritten"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"p.jsonl:1: not valid JSON"),
        ('{"name": "x"}', r"p.jsonl:1: .*lacks \['source'\]"),
        ('{"name": "x", "source": "import torch"}', r"p.jsonl:1: .*lacks Model"),
        ("[1, 2]", r"expected a JSON object"),
    ],
)
def test_jsonl_errors_name_the_line_and_the_fix(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ProblemError, match=message):
        load_jsonl(path)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(ProblemError, match="does not exist"):
        load_jsonl(tmp_path / "none.jsonl")


# --------------------------------------------------------------------------- resolver


def test_resolver_kinds_and_paths(tmp_path):
    checkout = write_kernelbench_checkout(tmp_path / "kb")
    sakana = write_sakana_parquet(tmp_path / "sakana")
    jsonl = save_jsonl([_problem("j")], tmp_path / "p.jsonl")
    assert {p.name for p in load_problems(f"kernelbench:{checkout}")} == ALL_KB_NAMES
    assert {p.name for p in load_problems(str(checkout))} == ALL_KB_NAMES
    assert [p.name for p in load_problems(f"sakana:{sakana}")] == ["76_Gemm_ReLU_Scale"]
    assert [p.name for p in load_problems(str(sakana))] == ["76_Gemm_ReLU_Scale"]
    assert [p.name for p in load_problems(f"jsonl:{jsonl}")] == ["j"]
    assert [p.name for p in load_problems(str(jsonl))] == ["j"]
    one = checkout / "KernelBench" / "level1" / "19_ReLU.py"
    assert [p.name for p in load_problems(str(one))] == ["19_ReLU"]
    assert {p.name for p in load_problems(str(one.parent))} == set(KERNELBENCH_PROBLEMS[1])


def test_resolver_tells_kernelbench_and_sakana_parquet_apart(tmp_path):
    data = write_kernelbench_parquet(tmp_path / "kb")
    assert {p.name for p in load_problems(str(data))} == ALL_KB_NAMES


@pytest.mark.parametrize("spec", ["", "nowhere/at/all.txt", "jsonl:"])
def test_resolver_errors_list_valid_specs(spec):
    with pytest.raises(ProblemError, match="jsonl"):
        load_problems(spec)


def test_resolver_builtin_specs():
    builtin = pytest.importorskip("multiminddev.tasks.builtin", reason="corpus not written yet")
    if not hasattr(builtin, "builtin_problems"):
        pytest.skip("corpus not written yet")
    everything = builtin.builtin_problems()
    tier1 = load_problems("builtin:tier1")
    assert tier1 and {p.tier for p in tier1} == {1}
    assert len(load_problems("builtin")) == len(everything)
    heldout = load_problems("builtin:heldout")
    assert heldout and {p.split for p in heldout} == {"heldout"}
    train_t0 = load_problems("builtin:tier0:train")
    assert train_t0 and {(p.tier, p.split) for p in train_t0} == {(0, "train")}
    preset = load_problems("builtin:tier0,tier1:train")  # the quickstart preset's spec
    assert {p.tier for p in preset} == {0, 1} and {p.split for p in preset} == {"train"}
    family = everything[0].family
    assert {p.family for p in load_problems(f"builtin:{family}")} == {family}
    small = load_problems("builtin:small:tier0")
    assert len(small) == len({p.family for p in small})  # one tiny problem per family
    with pytest.raises(ProblemError, match="no built-in family 'no_such_op'.*valid specs"):
        load_problems("builtin:no_such_op")


_FP16_FAMILIES = {"relu", "gelu_tanh", "sigmoid", "silu", "add", "mul"}


def test_a_dtype_part_keeps_the_problems_of_that_dtype():
    both = load_problems("builtin:tier0:train:resized8from4")
    half = load_problems("builtin:tier0:train:resized8from4:fp16")
    single = load_problems("builtin:tier0:train:resized8from4:float32")
    assert half and all(p.dtype == "float16" for p in half)
    assert {p.family for p in half} == _FP16_FAMILIES
    assert single and all(p.dtype == "float32" for p in single)
    assert sorted(p.name for p in both) == sorted(p.name for p in half + single)
    assert {p.name for p in load_problems("builtin:tier0:train:resized8from4:FP16")} == {
        p.name for p in half}
    with pytest.raises(ProblemError, match="selects no problem"):
        load_problems("builtin:tier1:train:fp16")  # no tier-1 family has float16 shapes
    with pytest.raises(ProblemError, match="takes no dtype"):
        load_problems("builtin:breadth:fp16")


def test_allshapes_trains_on_fp16_and_leaves_the_heldout_set_alone():
    """``:allshapes`` keeps every training shape, so the float16 shapes (listed after the
    float32 ones) reach the training set; the held-out set is the one earlier runs used."""
    from multiminddev.tasks.builtin import builtin_problems

    train = load_problems("builtin:tier0,tier1:train")
    every = load_problems("builtin:tier0,tier1:train:allshapes")
    heldout = load_problems("builtin:tier0,tier1:heldout")
    assert not any(p.dtype == "float16" for p in train)  # why allshapes exists
    half = {p.family for p in every if p.dtype == "float16"}
    assert half == _FP16_FAMILIES
    assert {p.split for p in every} == {"train"} and {p.name for p in train} < {
        p.name for p in every}
    assert len(every) == len(builtin_problems(tiers=[0, 1], split="train",
                                              shapes_per_family=None))
    assert len(heldout) == 39
    assert [p.name for p in heldout] == [
        p.name for p in builtin_problems(tiers=[0, 1], split="heldout")]
    assert not {p.name for p in every} & {p.name for p in heldout}


def test_breadth_spec_loads_the_sft_only_families_outside_every_split():
    from multiminddev.tasks.builtin import FAMILY_BY_NAME, breadth_by_name

    breadth = load_problems("builtin:breadth")
    assert {p.family for p in breadth} == set(breadth_by_name())
    assert all(p.extra["breadth"] is True and p.split == "" for p in breadth)
    assert not {p.family for p in breadth} & set(FAMILY_BY_NAME)
    assert len(breadth) == sum(len(f.shapes) for f in breadth_by_name().values())
    small = load_problems("builtin:breadth:small")
    assert len(small) == len(breadth_by_name())
    with pytest.raises(ProblemError, match="builtin:breadth takes no split"):
        load_problems("builtin:breadth:train")
    with pytest.raises(ProblemError, match="takes no tiers"):
        load_problems("builtin:breadth:tier0")
    corpus = {p.name for p in load_problems("builtin")}
    assert not corpus & {p.name for p in breadth}  # the corpus specs never give breadth ones


def test_plus_joins_specs_in_order_and_refuses_overlaps(tmp_path):
    joined = load_problems("builtin:tier0,tier1:train:allshapes+builtin:breadth")
    parts = load_problems("builtin:tier0,tier1:train:allshapes") + load_problems(
        "builtin:breadth")
    assert [p.name for p in joined] == [p.name for p in parts]
    assert [p.name for p in load_problems(" builtin:relu + builtin:add ")] == [
        p.name for p in load_problems("builtin:relu") + load_problems("builtin:add")]
    with pytest.raises(ProblemError, match="'relu_4096x4096' comes from both"):
        load_problems("builtin:relu+builtin:tier0")
    with pytest.raises(ProblemError, match="empty part"):
        load_problems("builtin:relu+")
    # a path that exists is one spec, '+' in its name or not
    odd = tmp_path / "a+b.jsonl"
    save_jsonl(load_problems("builtin:relu"), odd)
    assert [p.name for p in load_problems(str(odd))] == [
        p.name for p in load_problems("builtin:relu")]


def test_star_n_weighs_a_part_by_repeating_it():
    """``A*N`` is the explicit way to weigh problems (overlapping parts stay an error)."""
    tier1 = load_problems("builtin:tier1:train")
    mix = load_problems("builtin:tier0:train+builtin:tier1:train*2+builtin:breadth:shapes1")
    tier0, breadth = load_problems("builtin:tier0:train"), load_problems("builtin:breadth:shapes1")
    assert [p.name for p in mix] == [p.name for p in tier0 + tier1 + tier1 + breadth]
    assert [p.name for p in load_problems(" builtin:relu * 3 ")] == [
        p.name for p in load_problems("builtin:relu")] * 3
    assert [p.name for p in load_problems("builtin:relu*1")] == [
        p.name for p in load_problems("builtin:relu")]
    with pytest.raises(ProblemError, match="must be >= 1"):
        load_problems("builtin:relu*0")
    with pytest.raises(ProblemError, match="no spec before"):
        load_problems("*2")
    with pytest.raises(ProblemError, match="weigh a part with"):
        load_problems("builtin:relu*2+builtin:tier0")


def test_a_spec_longer_than_a_file_name_still_loads_and_still_errs_clearly():
    """A family list can pass the 255 bytes a file name may have; checking whether the spec is a
    path raised ENAMETOOLONG instead of loading it."""
    families = ["relu", "add", "tanh", "exp", "square", "sigmoid", "mul", "silu"]
    names = ":".join(families * 5)  # repeated names select the same families
    spec = f"builtin:tier0:train:{names}*2+builtin:tier0:train:hardtanh"
    assert len(spec) > 255
    expected = load_problems(f"builtin:tier0:train:{':'.join(families)}")
    assert [p.name for p in load_problems(spec)] == (
        [p.name for p in expected] * 2 + [p.name for p in load_problems("builtin:tier0:train:hardtanh")])
    with pytest.raises(ProblemError, match="neither a known kind nor an existing path"):
        load_problems("x" * 300)


def test_shapes_n_keeps_the_first_n_shapes_of_each_family():
    """``:shapesN`` sizes an SFT mix (e.g. one shape per breadth family, so the breadth
    families do not crowd out tier 1); the held-out spec is untouched by it."""
    one = load_problems("builtin:breadth:shapes1")
    every = load_problems("builtin:breadth")
    assert len({p.family for p in one}) == len(one) == len({p.family for p in every})
    assert {p.name for p in one} < {p.name for p in every}
    train1 = load_problems("builtin:tier0,tier1:train:shapes1")
    assert len({p.family for p in train1}) == len(train1)
    assert len(load_problems("builtin:tier0,tier1:train:shapes2")) == len(
        load_problems("builtin:tier0,tier1:train"))
    with pytest.raises(ProblemError, match="one of allshapes / shapesN"):
        load_problems("builtin:tier0:train:allshapes:shapes1")
    with pytest.raises(ProblemError, match="shapes0"):
        load_problems("builtin:breadth:shapes0")


def test_resized_n_adds_new_sizes_of_training_families_only():
    """``:resizedN`` (with ``:train``) adds N new sizes per training family and dtype; the
    held-out set is untouched and shares no problem with it."""
    plain = load_problems("builtin:tier0,tier1:train:allshapes")
    resized = load_problems("builtin:tier0,tier1:train:allshapes:resized2")
    heldout = load_problems("builtin:tier0,tier1:heldout:allshapes")
    assert {p.name for p in plain} < {p.name for p in resized}
    added = [p for p in resized if p.name not in {q.name for q in plain}]
    per_family_dtype = collections.Counter((p.family, p.dtype) for p in added)
    assert set(per_family_dtype.values()) == {2}
    assert set(per_family_dtype) == {(p.family, p.dtype) for p in plain}
    assert not {p.name for p in resized} & {p.name for p in heldout}
    assert not {p.source for p in resized} & {p.source for p in heldout}
    assert {p.split for p in added} == {"train"}
    with pytest.raises(ProblemError, match="add :train"):
        load_problems("builtin:tier0:resized2")
    with pytest.raises(ProblemError, match="add :train"):
        load_problems("builtin:tier0:heldout:resized2")


def test_resized_n_from_k_gives_sizes_resized_k_never_had():
    """``:resized3from2`` is the 3 sizes that follow the 2 of ``:resized2`` (GRPO on sizes SFT
    never showed); together they are ``:resized5``."""
    names = {spec: {p.name for p in load_problems(f"builtin:tier0,tier1:train:{spec}")}
             for spec in ("allshapes", "allshapes:resized2", "allshapes:resized3from2",
                          "allshapes:resized5")}
    plain = names["allshapes"]
    first, later = names["allshapes:resized2"] - plain, names["allshapes:resized3from2"] - plain
    assert len(later) == 3 * len(first) // 2 and not first & later
    assert names["allshapes:resized5"] == plain | first | later
    assert {p.name for p in load_problems("builtin:tier0,tier1:train:allshapes:Resized3From2")} \
        == names["allshapes:resized3from2"]  # parts are case-insensitive, as resizedN is
