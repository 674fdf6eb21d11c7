"""SFT builders: conversations carry the agents' real prompts and a parseable fenced candidate."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.prompts import generator_messages, optimizer_messages
from multiminddev.tasks.loaders import load_jsonl, load_sakana_archive, save_jsonl
from multiminddev.tasks.problem import Problem
from multiminddev.train.sft_data import (
    UNTIMED_CORRECT_FEEDBACK,
    archive_feedback,
    assistant_reply,
    build_sft_dataset,
    generator_examples,
    generator_sft_examples,
    operation_expression,
    optimizer_examples,
    optimizer_sft_examples,
    sakana_generator_examples,
    sakana_optimizer_examples,
    strip_comment_lines,
    untimed_feedback,
    with_operation_line,
)
from tests.episode.helpers import RELU_KERNEL
from tests.tasks.kb_fixtures import KERNELBENCH_PROBLEMS, sakana_rows, write_sakana_parquet

RELU = KERNELBENCH_PROBLEMS[1]["19_ReLU"]

# The same honest relu candidate the episode tests use.
NAIVE_RELU = RELU_KERNEL

FAST_RELU = '''import torch
import torch.nn as nn
from multiminddev.cuda import compile_kernels

kernels = compile_kernels(r"""
extern "C" __global__ void relu4(const float4* __restrict__ x, float4* __restrict__ y,
                                 const float* __restrict__ xs, float* __restrict__ ys, long n) {
    long n4 = n / 4;
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.0f); v.y = fmaxf(v.y, 0.0f);
        v.z = fmaxf(v.z, 0.0f); v.w = fmaxf(v.w, 0.0f);
        y[i] = v;
    }
    for (long i = n4 * 4 + blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
        ys[i] = fmaxf(xs[i], 0.0f);
    }
}
""")

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        blocks = min((n // 4 + 255) // 256 + 1, 4096)
        kernels.relu4(grid=(blocks,), block=(256,), args=(x, y, x, y, n))
        return y
'''

SOLUTIONS = {
    ("relu", "naive"): NAIVE_RELU,
    ("relu", "fast"): FAST_RELU,
    ("relu_naive_only", "naive"): NAIVE_RELU,
}


def solution(problem: Problem, variant: str) -> str | None:
    return SOLUTIONS.get((problem.name, variant))


PROBLEMS = [
    Problem(name="relu", source=RELU, tier=0, family="relu"),
    Problem(name="relu_naive_only", source=RELU, tier=0, family="relu"),
    Problem(name="no_solution", source=RELU, tier=0),
]


def assert_well_formed(messages: list[dict[str, str]]) -> None:
    roles = [m["role"] for m in messages]
    assert set(messages[0]) == {"role", "content"}
    assert roles[-1] == "assistant" and roles[0] in ("system", "user")
    body = roles[1:] if roles[0] == "system" else roles
    assert body == ["user", "assistant"] * (len(body) // 2), roles  # strictly alternating


# --------------------------------------------------------------------------- Generator


def test_generator_pairs_use_the_agents_prompt_and_a_fenced_candidate():
    examples = generator_examples(PROBLEMS, solution=solution)
    assert [(e.problem, e.variant) for e in examples] == [
        ("relu", "naive"),
        ("relu", "fast"),
        ("relu_naive_only", "naive"),
    ]
    first = examples[0].messages
    assert_well_formed(first)
    assert first[:-1] == generator_messages(PROBLEMS[0])  # the inference prompt, unchanged
    assert RELU.strip() in first[-2]["content"]
    reply = first[-1]["content"]
    assert reply.startswith("```python\n") and reply.endswith("\n```") and reply.count("```") == 2
    assert parse_candidate(reply).source == NAIVE_RELU


def test_generator_variants_can_be_restricted():
    examples = generator_examples(PROBLEMS, solution=solution, variants=("fast",))
    assert [(e.problem, e.variant) for e in examples] == [("relu", "fast")]


def test_generator_sft_examples_returns_plain_message_lists():
    conversations = generator_sft_examples(PROBLEMS, solution=solution)
    assert len(conversations) == 3 and all(isinstance(c, list) for c in conversations)


def test_generator_prompt_is_a_parameter():
    def prompt(problem):
        return [{"role": "user", "content": f"kernel for {problem.name}:\n{problem.source}"}]

    (example, *_) = generator_examples(PROBLEMS, solution=solution, prompt=prompt)
    assert example.messages[0]["content"].startswith("kernel for relu")
    assert_well_formed(example.messages)


def test_a_solution_that_would_not_parse_back_is_dropped(caplog):
    def broken(problem, variant):
        return NAIVE_RELU + '\nDOC = """\n```\n"""\n' if variant == "naive" else None

    with caplog.at_level(logging.WARNING):
        assert generator_examples(PROBLEMS[:1], solution=broken) == []
    assert "would not parse back" in caplog.text


def test_jsonl_solutions_are_used_by_default(tmp_path):
    path = save_jsonl(
        [Problem(name="relu_jsonl", source=RELU)],
        tmp_path / "p.jsonl",
        solutions={"relu_jsonl": NAIVE_RELU},
    )
    (example,) = generator_examples(load_jsonl(path))
    assert (example.origin, example.variant) == ("jsonl", "solution")
    assert parse_candidate(example.messages[-1]["content"]).source == NAIVE_RELU


# --------------------------------------------------------------------------- Optimizer


def test_optimizer_pairs_slow_kernel_and_feedback_to_fast_kernel():
    (example,) = optimizer_examples(PROBLEMS, solution=solution)
    assert (example.problem, example.variant) == ("relu", "naive->fast")
    messages = example.messages
    assert_well_formed(messages)
    assert messages[:-1] == optimizer_messages(
        PROBLEMS[0], NAIVE_RELU, untimed_feedback(PROBLEMS[0], NAIVE_RELU), []
    )
    user = messages[-2]["content"]
    assert RELU.strip() in user and NAIVE_RELU.strip() in user and UNTIMED_CORRECT_FEEDBACK in user
    assert parse_candidate(messages[-1]["content"]).source == FAST_RELU


def test_synthetic_feedback_states_facts_and_invents_no_numbers():
    assert "not measured" in UNTIMED_CORRECT_FEEDBACK and "correct" in UNTIMED_CORRECT_FEEDBACK
    assert not re.search(r"\d", UNTIMED_CORRECT_FEEDBACK)


def test_synthetic_feedback_adds_the_testers_pitfall_hints():
    unchecked = NAIVE_RELU.replace("if (i < n) y[i]", "y[i]")
    assert "Possible issues" in untimed_feedback(PROBLEMS[0], unchecked)
    assert untimed_feedback(PROBLEMS[0], NAIVE_RELU) == UNTIMED_CORRECT_FEEDBACK


def test_optimizer_feedback_is_a_parameter():
    (example,) = optimizer_examples(
        PROBLEMS, solution=solution, feedback=lambda p, s: "REAL TESTER REPORT"
    )
    assert "REAL TESTER REPORT" in example.messages[-2]["content"]


def test_optimizer_sft_examples_returns_plain_message_lists():
    assert len(optimizer_sft_examples(PROBLEMS, solution=solution)) == 1


# --------------------------------------------------------------------------- Sakana


def sakana_records(tmp_path, second_correct: bool = True, second_speedup: float = 1.2):
    rows = sakana_rows()
    rows["Correct"][1] = second_correct
    rows["CUDA_Speedup_Native"][1] = second_speedup
    rows["CUDA_Runtime"][1] = 0.028
    # the second row's kernel differs (not the no-bias bug this time): a fresh valid kernel
    rows["CUDA_Code"][1] = rows["CUDA_Code"][0].replace("dim3 block(128);", "dim3 block(64);")
    return load_sakana_archive(write_sakana_parquet(tmp_path, rows), correct_only=False)


def test_sakana_generator_uses_correct_records_only(tmp_path):
    records = sakana_records(tmp_path, second_correct=False)
    (example,) = sakana_generator_examples(records)
    assert (example.origin, example.variant) == ("sakana", "linear_relu_scale_base")
    assert_well_formed(example.messages)
    assert (
        parse_candidate(example.messages[-1]["content"]).source.strip()
        == records[0].candidate_source.strip()
    )


def test_sakana_optimizer_pairs_slower_to_faster_with_the_archive_timings(tmp_path):
    records = sakana_records(tmp_path)
    (example,) = sakana_optimizer_examples(records)
    slow, fast = records[1], records[0]  # 1.2x -> 1.619x
    assert example.variant == f"{slow.kernel_name}->{fast.kernel_name}"
    user = example.messages[-2]["content"]
    assert slow.candidate_source.strip() in user
    assert "reported by the archive" in user and "1.20x" in user
    assert (
        parse_candidate(example.messages[-1]["content"]).source.strip()
        == fast.candidate_source.strip()
    )


def test_sakana_optimizer_skips_pairs_below_min_gain(tmp_path):
    records = sakana_records(tmp_path, second_speedup=1.55)
    assert sakana_optimizer_examples(records, min_gain=0.1) == []


def test_archive_feedback_without_timing_says_so(tmp_path):
    records = load_sakana_archive(write_sakana_parquet(tmp_path), correct_only=False)
    assert records[1].cuda_runtime is None
    assert "not available" in archive_feedback(records[1])
    assert "1.62x" in archive_feedback(records[0])


# --------------------------------------------------------------------------- datasets


def test_build_sft_dataset_has_messages_and_provenance_columns():
    ds = build_sft_dataset("generator", PROBLEMS, solution=solution)
    assert set(ds.column_names) == {"messages", "role", "problem", "origin", "variant"}
    assert len(ds) == 3 and set(ds["role"]) == {"generator"}
    for messages in ds["messages"]:
        assert_well_formed(messages)


def test_build_sft_dataset_takes_extra_examples_of_its_own_role_only():
    gen = generator_examples(PROBLEMS, solution=solution)
    extra = [dataclasses.replace(gen[0], variant="repair:test")]
    ds = build_sft_dataset("generator", PROBLEMS, solution=solution, extra_examples=extra)
    assert len(ds) == len(gen) + 1 and ds["variant"].count("repair:test") == 1
    with pytest.raises(ValueError, match="another role"):
        build_sft_dataset("optimizer", PROBLEMS, solution=solution, extra_examples=extra)


def test_build_sft_dataset_shuffles_deterministically():
    a = build_sft_dataset("generator", PROBLEMS, solution=solution, seed=3)
    b = build_sft_dataset("generator", PROBLEMS, solution=solution, seed=3)
    assert a["variant"] == b["variant"] and a["problem"] == b["problem"]

    def order(seed):
        ds = build_sft_dataset("generator", PROBLEMS, solution=solution, seed=seed)
        return tuple(zip(ds["problem"], ds["variant"], strict=True))

    orders = {order(s) for s in range(6)}
    assert len(orders) > 1


def test_build_sft_dataset_mixes_in_sakana_records(tmp_path):
    ds = build_sft_dataset(
        "optimizer", PROBLEMS, solution=solution, sakana_records=sakana_records(tmp_path)
    )
    assert sorted(ds["origin"]) == ["builtin", "sakana"] and set(ds["role"]) == {"optimizer"}


def test_build_sft_dataset_refuses_the_tester_and_empty_data():
    with pytest.raises(ValueError, match="never trained"):
        build_sft_dataset("tester", PROBLEMS, solution=solution)
    with pytest.raises(ValueError, match="naive and a fast"):
        build_sft_dataset("optimizer", PROBLEMS[1:], solution=solution)


def test_assistant_reply_is_one_fenced_python_block():
    assert assistant_reply("\n\nx = 1\n\n") == "```python\nx = 1\n```"


def test_builtin_corpus_gives_examples_for_both_roles():
    builtin = pytest.importorskip("multiminddev.tasks.builtin", reason="corpus not written yet")
    if not hasattr(builtin, "builtin_problems"):
        pytest.skip("corpus not written yet")
    problems = builtin.builtin_problems(tiers=[0])
    generator = generator_examples(problems)
    assert len(generator) >= len(problems)  # every family has a naive solution
    for example in generator:
        assert_well_formed(example.messages)
    assert optimizer_examples(builtin.builtin_problems())  # >= 20 families have a fast one


COMMENTED = '''"""A docstring stays."""

import torch  # a comment after code stays

# a whole-line Python comment goes
CUDA_SRC = r"""
#include <cuda_fp16.h>
#define FULL_MASK 0xffffffffu
// a whole-line CUDA comment goes
    // indented, it goes too
extern "C" __global__ void k(float* y) {  // after code: stays
#pragma unroll
    y[0] = 1.f;
}
"""
    # indented Python comment goes
x = "// inside a one-line string stays"
'''

STRIPPED = '''"""A docstring stays."""

import torch  # a comment after code stays

CUDA_SRC = r"""
#include <cuda_fp16.h>
#define FULL_MASK 0xffffffffu
extern "C" __global__ void k(float* y) {  // after code: stays
#pragma unroll
    y[0] = 1.f;
}
"""
x = "// inside a one-line string stays"
'''


def test_strip_comment_lines_drops_whole_line_comments_only():
    assert strip_comment_lines(COMMENTED) == STRIPPED
    assert strip_comment_lines(STRIPPED) == STRIPPED
    broken = 'x = """never closed\n// a comment'
    assert strip_comment_lines(broken) == broken  # does not tokenize: unchanged


def test_optimizer_pairs_can_train_on_fast_solutions_without_comments():
    commented_fast = FAST_RELU.replace("import torch\n", "import torch\n# a comment\n", 1)

    def with_comment(problem, variant):
        fast = solution(problem, variant) if variant == "fast" else None
        return commented_fast if fast is not None else solution(problem, variant)

    (plain,) = optimizer_examples(PROBLEMS, solution=with_comment)
    (stripped,) = optimizer_examples(PROBLEMS, solution=with_comment, strip_comments=True)
    assert parse_candidate(plain.messages[-1]["content"]).source == commented_fast
    assert parse_candidate(stripped.messages[-1]["content"]).source == FAST_RELU
    assert stripped.messages[:-1] == plain.messages[:-1]  # the prompt keeps its naive kernel


def _fast_solutions():
    from multiminddev.tasks.builtin import FAMILIES
    from multiminddev.tasks.builtin.spec import Variant

    return [f for f in FAMILIES if Variant.FAST in f.variants]


@pytest.mark.parametrize("family", _fast_solutions(), ids=lambda f: f.name)
def test_every_fast_solution_without_comments_still_compiles_and_computes_the_model(family):
    # the corpus's fast solutions as --sft-strip-comments trains on them: same kernels, same results
    from multiminddev.tasks.builtin.spec import Variant
    from tests.tasks import cuda_cpu_emulator
    from tests.tasks.solution_checks import (
        check_compiles_and_launches,
        check_matches_model_in_emulator,
    )

    source = family.render_solution(Variant.FAST, "float32")
    stripped = strip_comment_lines(source)
    assert not re.search(r"^\s*//", stripped, re.MULTILINE)
    assert strip_comment_lines(stripped) == stripped  # no whole-line comment is left
    check_compiles_and_launches(family, Variant.FAST, "float32", source=stripped)
    if cuda_cpu_emulator.compiler_available():
        check_matches_model_in_emulator(family, Variant.FAST, "float32", source=stripped)


_FORWARD_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        \"\"\"A docstring is not the operation.\"\"\"
        return torch.cumsum(x,  dim=1)
"""


def test_operation_expression_is_what_forward_returns():
    assert operation_expression(_FORWARD_PROBLEM) == "torch.cumsum(x, dim=1)"
    several = _FORWARD_PROBLEM.replace("return torch.cumsum(x,  dim=1)",
                                       "y = torch.relu(x)\n        return y")
    assert operation_expression(several) == "y = torch.relu(x); return y"
    long = _FORWARD_PROBLEM.replace("dim=1", "dim=1" + " + x" * 80)
    assert len(operation_expression(long)) == 160 and operation_expression(long).endswith("...")
    assert operation_expression("class Model: pass") is None
    assert operation_expression("def (") is None


def test_with_operation_line_puts_the_operation_first_in_the_cuda_string():
    from multiminddev.tasks.builtin import reference_solution
    from multiminddev.tasks.loaders import load_problems

    (cumsum,) = load_problems("builtin:cumsum:shapes1")
    naive = reference_solution(cumsum, "naive")
    lined = with_operation_line(naive, cumsum)
    assert lined.replace("// computes: torch.cumsum(x, dim=1)\n", "", 1) == naive
    assert "CUDA_SRC = r'''\n// computes: torch.cumsum(x, dim=1)\nextern" in lined
    assert parse_candidate(assistant_reply(lined)).source.strip() == lined.strip()
    # no CUDA string, or a problem without a readable forward: unchanged
    assert with_operation_line("import torch\n", cumsum) == "import torch\n"
    broken = dataclasses.replace(cumsum, source="not python (")
    assert with_operation_line(naive, broken) == naive


def test_operation_line_reaches_the_generators_replies_and_both_optimizer_kernels():
    from multiminddev.tasks.loaders import load_problems

    problems = load_problems("builtin:tier0,tier1:train")
    plain = generator_examples(problems, variants=("naive",))
    lined = generator_examples(problems, variants=("naive",), operation_line=True)
    assert len(lined) == len(plain) and all(
        e.messages[-1]["content"].count("// computes: ") == 1 for e in lined)
    assert [e.messages[:-1] for e in lined] == [e.messages[:-1] for e in plain]  # same prompts
    assert not any("// computes: " in e.messages[-1]["content"] for e in plain)
    optimizer = optimizer_examples(problems, strip_comments=True, operation_line=True)
    assert optimizer and all(
        "// computes: " in e.messages[-1]["content"]  # the comment survives the stripping
        and "// computes: " in e.messages[-2]["content"] for e in optimizer)
