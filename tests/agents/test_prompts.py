import dataclasses

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.prompts import (
    element_type_line,
    generator_messages,
    load_template,
    optimizer_messages,
    render,
)
from multiminddev.policy import encode_chat, render_chat
from multiminddev.tasks.problem import load_problem_source
from tests.policy.helpers import gguf_tokenizer
from tests.problems import RELU_1024

PROBLEM = load_problem_source(RELU_1024, name="relu")


def test_generator_prompt_holds_problem_and_format():
    system, user = generator_messages(PROBLEM)
    assert system["role"] == "system" and user["role"] == "user"
    assert "compile_kernels" in system["content"] and "ModelNew" in system["content"]
    assert "torch.relu(x)" in user["content"] and "relu" in user["content"]


def test_the_one_shot_example_is_a_valid_candidate():
    example = load_template("candidate_format").template
    parsed = parse_candidate(example.split("Example for", 1)[1])
    assert parsed.ok, parsed.detail


def test_optimizer_prompt_holds_kernel_feedback_and_history():
    _, user = optimizer_messages(PROBLEM, "class ModelNew: KERNEL", "REPORT", ["turn 1: tried X"],
                                 omitted=2)
    text = user["content"]
    assert "KERNEL" in text and "REPORT" in text and "tried X" in text
    assert "2 earlier attempt(s) omitted" in text


def test_optimizer_prompt_without_kernel_asks_for_one():
    _, user = optimizer_messages(PROBLEM, None, "format failure", [])
    assert "no working kernel yet" in user["content"]


def test_prompts_render_with_the_chat_template_within_budget():
    tok = gguf_tokenizer()
    messages = generator_messages(PROBLEM)
    text = render_chat(tok, messages)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    ids = encode_chat(tok, messages)
    assert 300 < len(ids) < 1000  # leaves most of SmolLM2's 8k window for the reply
    assert tok.decode(ids) == text


def _fp16(problem):
    return dataclasses.replace(problem, name=f"{problem.name}_fp16", dtype="float16",
                               atol=None, rtol=None)


def test_the_element_type_line_names_the_pointer_type_last_before_the_reply():
    _, user = generator_messages(_fp16(PROBLEM), element_type=True)
    assert user["content"].rstrip().endswith(element_type_line(_fp16(PROBLEM)))
    assert "`__half*`" in element_type_line(_fp16(PROBLEM))
    assert "`float*`" in element_type_line(PROBLEM)
    _, user = optimizer_messages(PROBLEM, "KERNEL", "REPORT", [], element_type=True)
    assert user["content"].rstrip().endswith("(no `__half`).")


def test_without_the_element_type_line_the_prompts_are_unchanged_byte_for_byte():
    # agents trained before the option see the prompts they were trained on
    for problem in (PROBLEM, _fp16(PROBLEM)):
        plain = render("generator_user", name=problem.name, dtype=problem.dtype,
                       atol=f"{problem.tolerances[0]:g}", rtol=f"{problem.tolerances[1]:g}",
                       problem_source=problem.source.strip())
        assert generator_messages(problem)[1]["content"] == plain
        with_line = generator_messages(problem, element_type=True)[1]["content"]
        assert with_line == f"{plain}\n{element_type_line(problem)}\n"
    bf16 = dataclasses.replace(PROBLEM, dtype="bfloat16", atol=None, rtol=None)
    assert element_type_line(bf16) == ""  # no line rather than a wrong one
    assert generator_messages(bf16, element_type=True) == generator_messages(bf16)
