"""Chat prompts for the trainable agents, rendered from data files in ``prompt_templates/``.

Templates use ``string.Template`` (``$name``) because CUDA and Python code are full of braces.
Prompts are kept short (system prompt with a compact one-shot example is ~450 tokens with the
SmolLM2 tokenizer) so small models with an 8k window have room for the problem and reply.
"""

from __future__ import annotations

import functools
import importlib.resources
import string
from typing import Any

from multiminddev.tasks.problem import Problem

Messages = list[dict[str, str]]


@functools.cache
def load_template(name: str) -> string.Template:
    """``prompt_templates/<name>.md`` as a Template (cached; templates are package data)."""
    text = importlib.resources.files("multiminddev.agents").joinpath(
        f"prompt_templates/{name}.md"
    ).read_text(encoding="utf-8")
    return string.Template(text)


def render(template: str, /, **values: Any) -> str:
    return load_template(template).substitute(**values).strip() + "\n"


def _problem_values(problem: Problem) -> dict[str, Any]:
    atol, rtol = problem.tolerances
    return {
        "name": problem.name,
        "dtype": problem.dtype,
        "atol": f"{atol:g}",
        "rtol": f"{rtol:g}",
        "problem_source": problem.source.strip(),
    }


# The C type of a problem's tensors, named where the reply starts (``element_type_line``).
# Why: the header gives the dtype as one word near the top ("relu_..._fp16, float16, ..."), and
# a 135M Generator wrote `float*` kernels for float16 problems after SFT and after GRPO on
# mostly float32 problems, and `__half` kernels for float32 ones: a line with the exact pointer
# type, last before the reply, gives it a token to copy (docs/training.md, "Element-type line").
# Index tensors (embedding's, argmax's output) keep their own types: the line names the
# floating-point ones only.
ELEMENT_TYPE_LINES = {
    "float32": "Element type: float32. Floating-point tensors are `float*` in kernels (no `__half`).",
    "float16": ("Element type: float16. Floating-point tensors are `__half*` in kernels "
                "(#include <cuda_fp16.h>); convert with __half2float / __float2half to compute "
                "in float."),
}


def element_type_line(problem: Problem) -> str:
    """The line naming ``problem``'s pointer type; "" for a dtype without one here."""
    return ELEMENT_TYPE_LINES.get(problem.dtype, "")


def _with_element_type(user: str, problem: Problem, on: bool) -> str:
    """``user`` with the element-type line appended when ``on`` (off: unchanged, byte for byte,
    so agents trained without the line see the prompts they were trained on)."""
    line = element_type_line(problem) if on else ""
    return f"{user}\n{line}\n" if line else user


def generator_messages(problem: Problem, *, element_type: bool = False) -> Messages:
    """System + user messages asking for a first ModelNew; ``element_type`` appends the line
    naming the kernels' pointer type (``element_type_line``)."""
    fmt = render("candidate_format")
    user = render("generator_user", **_problem_values(problem))
    return [
        {"role": "system", "content": render("generator_system", candidate_format=fmt)},
        {"role": "user", "content": _with_element_type(user, problem, element_type)},
    ]


def history_section(history: list[str], omitted: int = 0) -> str:
    if not history and not omitted:
        return ""
    lines = ["Earlier attempts (oldest first):"]
    if omitted:
        lines.append(f"- ({omitted} earlier attempt(s) omitted to fit the context window)")
    lines += [f"- {h}" for h in history]
    return "\n".join(lines) + "\n"


def current_section(current_source: str | None) -> str:
    if not current_source:
        return ("There is no working kernel yet: write a complete ModelNew from scratch "
                "(the report below says what went wrong last time).")
    return f"Current kernel:\n```python\n{current_source.strip()}\n```"


def optimizer_messages(
    problem: Problem,
    current_source: str | None,
    feedback: str,
    history: list[str],
    *,
    omitted: int = 0,
    element_type: bool = False,
) -> Messages:
    """System + user messages asking to fix or speed up ``current_source``.

    ``history`` holds one line per earlier attempt (strategy tags and outcome); ``omitted``
    says how many older lines were dropped to fit the window (the prompt says so);
    ``element_type`` appends the line naming the kernels' pointer type.
    """
    fmt = render("candidate_format")
    user = render(
        "optimizer_user",
        **_problem_values(problem),
        current_section=current_section(current_source),
        feedback=feedback.strip() or "(no report)",
        history_section=history_section(history, omitted),
    )
    return [
        {"role": "system", "content": render("optimizer_system", candidate_format=fmt)},
        {"role": "user", "content": _with_element_type(user, problem, element_type)},
    ]
