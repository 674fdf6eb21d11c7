"""SFT data: chat conversations that teach the Generator and the Optimizer their turn.

- Generator pairs: the Generator's prompt for a problem -> a correct candidate.
- Optimizer pairs: the Optimizer's prompt for a problem, a slower correct kernel and a Tester
  report -> a faster correct kernel.

Prompts are rendered by the agents' own functions (``agents.prompts.generator_messages`` /
``optimizer_messages``) so training sees exactly what inference sees; both are parameters for
experiments. The assistant reply is one ```python block with the full candidate module, which
``agents.parsing.parse_candidate`` reads back unchanged (examples whose reply would not parse
back are dropped with a warning).

Sources:
- the built-in corpus: ``reference_solution(problem, "naive" | "fast")``;
- JSONL problems carrying a ``solution`` (``loaders.problem_solution``);
- optionally, SakanaAI archive records (correct kernels; Optimizer pairs from two correct
  kernels of the same task, slower -> faster). Those are ``load_inline`` modules, while the
  agents' prompt asks for ``compile_kernels``: they are off unless passed explicitly.

Optimizer feedback: with no real Tester run at hand, the report is written from facts known
when the data is built (the kernel is a verified reference solution, so it compiles and is
correct; no timing is known) and says plainly that no timing was measured. For Sakana pairs
the report quotes the archive's own timings and says where they come from. Pass ``feedback``
to use real Tester reports instead.
"""

from __future__ import annotations

import ast
import logging
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from multiminddev import pyast
from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.pitfalls import extract_cuda_sources, find_pitfalls
from multiminddev.agents.prompts import generator_messages, optimizer_messages
from multiminddev.core.roles import AgentRole
from multiminddev.tasks.loaders import SakanaRecord, problem_solution
from multiminddev.tasks.problem import Problem

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
GeneratorPrompt = Callable[[Problem], Messages]
OptimizerPrompt = Callable[[Problem, str, str, list[str]], Messages]
SolutionFn = Callable[[Problem, str], "str | None"]
FeedbackFn = Callable[[Problem, str], str]

NAIVE, FAST = "naive", "fast"

# Written from what is known without a GPU run: the slow kernel is a reference solution that
# the corpus's integrity test verifies; nothing was timed. No figure is invented. The layout
# follows the Tester's reports (agents/tester.py: status line, then detail, then hints).
UNTIMED_CORRECT_FEEDBACK = (
    "Status: correct, not timed. The kernel compiled and its outputs matched the reference "
    "within tolerance.\n"
    "Timing was not measured for this kernel, so no speedup figure is available. "
    "Make it faster while keeping it correct."
)


def _pitfall_hints(source: str, max_hints: int = 4) -> str:
    """The Tester's static pitfall hints for the kernel (real analysis of its CUDA source)."""
    hints = [h for cuda in extract_cuda_sources(source) for h in find_pitfalls(cuda)][:max_hints]
    if not hints:
        return ""
    return "\nPossible issues in the CUDA source:\n" + "\n".join(f"- {h.render()}" for h in hints)


@dataclass(kw_only=True, frozen=True)
class SFTExample:
    """One conversation plus where it came from (kept as dataset columns)."""

    role: AgentRole
    messages: Messages
    problem: str
    origin: str  # "builtin" | "jsonl" | "sakana"
    variant: str  # "naive", "fast", "naive->fast", "solution", or the archive's kernel names


def assistant_reply(candidate_source: str) -> str:
    """The reply format the agents are trained to produce: one fenced Python block."""
    return f"```python\n{candidate_source.strip()}\n```"


def untimed_feedback(problem: Problem, current_source: str) -> str:
    """Feedback for a verified but untimed kernel, plus the Tester's static pitfall hints."""
    return UNTIMED_CORRECT_FEEDBACK + _pitfall_hints(current_source)


def _default_generator_prompt() -> GeneratorPrompt:
    return generator_messages


def _default_optimizer_prompt() -> OptimizerPrompt:
    return optimizer_messages


def _builtin_solution(problem: Problem, variant: str) -> str | None:
    """The built-in corpus's reference solution, or a JSONL row's ``solution`` for "naive"."""
    if variant == NAIVE and (solution := problem_solution(problem)) is not None:
        return solution
    if problem.extra.get("source") in ("kernelbench", "sakana"):
        return None  # not a built-in problem: the corpus has no solution for it
    try:
        from multiminddev.tasks.builtin import reference_solution
    except ImportError:  # corpus not installed in this checkout
        return None
    try:
        return reference_solution(problem, variant=variant)
    except (KeyError, ValueError, LookupError):  # not one of the corpus's problems
        return None


def strip_comment_lines(source: str) -> str:
    """A candidate module without its whole-line comments: Python ``#`` lines, and ``//`` lines
    inside its (multi-line) CUDA strings. Code, docstrings, ``#define``/``#include``/``#pragma``
    lines (inside strings) and comments after code stay.

    Why: in held-out episodes after SFT, 12 of the 20 Optimizer turns that broke
    a correct kernel went astray on a comment line of the fast solution (cumsum's "// One warp
    per row: 32-wide chunks, ..."): a 135M model continues such prose with more prose and never
    gets back to code. As SFT targets, the comments cost tokens and teach nothing it can use
    (docs/training.md, "Comment-free Optimizer targets").
    A source that does not tokenize is returned unchanged."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return source
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()  # 0-based line numbers
    for tok in tokens:
        (row, col), (end_row, _) = tok.start, tok.end
        if tok.type == tokenize.COMMENT and not lines[row - 1][:col].strip():
            drop.add(row - 1)
        elif tok.type == tokenize.STRING and end_row > row:  # lines wholly inside the string
            drop.update(r - 1 for r in range(row + 1, end_row)
                        if lines[r - 1].lstrip().startswith("//"))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _parses_back(source: str) -> bool:
    parsed = parse_candidate(assistant_reply(source))
    return parsed.source is not None and parsed.source.strip() == source.strip()


def _conversation(prompt: Messages, candidate: str) -> Messages | None:
    if not _parses_back(candidate):
        return None
    return [dict(m) for m in prompt] + [
        {"role": "assistant", "content": assistant_reply(candidate)}
    ]


def _origin(problem: Problem) -> str:
    return "jsonl" if problem_solution(problem) is not None else "builtin"


# --------------------------------------------------------------------------- operation line

# The first line of a reply's CUDA source restates what the problem computes, copied from its
# Model.forward (``operation_line``). Why: the token after ``CUDA_SRC =
# r'''`` picks the kernel's template -- ``#define`` for the element-wise one, ``extern`` for
# the others -- and that context is the same for every family. GRPO's updates on element-wise
# rollouts raised ``#define`` there for every prompt: the Generator wrote the element-wise
# kernel for cumsum, matvec, embedding and transpose while its docstring still named them.
# With the operation just above, the choice follows ``torch.cumsum(...)`` or ``torch.relu(...)``
# instead of the same four tokens, and the ``op()`` body of a new element-wise operation is
# written a few lines below its torch expression rather than after the whole module header.
# Measured effect: docs/training.md, "Operation line".
OPERATION_LINE_PREFIX = "// computes: "
_OPERATION_MAX_CHARS = 160
_CUDA_STRING_OPEN = re.compile(r"^[A-Za-z_]\w*\s*=\s*[rR]?(?:'''|\"\"\")[ \t]*\n", re.MULTILINE)


def operation_expression(problem_source: str) -> str | None:
    """What ``Model.forward`` returns, as ``ast.unparse`` writes it (``torch.abs(x)``). When it
    returns a bare name, the whole body instead (``y = ...; return y``), so the operation is
    still there. At most 160 characters; None without a parsable ``Model.forward``."""
    try:
        tree = pyast.parse(problem_source)
    except SyntaxError:
        return None
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    forward = next((n for n in (model.body if model else [])
                    if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        return None
    body = [n for n in forward.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]  # docstring
    returns = [n for n in body if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return None
    if isinstance(returns[-1].value, ast.Name) and len(body) > 1:
        text = "; ".join(ast.unparse(n) for n in body)
    else:
        text = ast.unparse(returns[-1].value)
    text = " ".join(text.split())
    return text if len(text) <= _OPERATION_MAX_CHARS else text[: _OPERATION_MAX_CHARS - 3] + "..."


def with_operation_line(candidate_source: str, problem: Problem) -> str:
    """``candidate_source`` with ``// computes: <operation_expression>`` as the first line of
    its first multi-line CUDA string (``CUDA_SRC = r'''``); unchanged when it has none or the
    problem's forward cannot be read."""
    expression = operation_expression(problem.source)
    match = _CUDA_STRING_OPEN.search(candidate_source)
    if expression is None or match is None:
        return candidate_source
    line = f"{OPERATION_LINE_PREFIX}{expression}\n"
    return candidate_source[: match.end()] + line + candidate_source[match.end():]


# --------------------------------------------------------------------------- Generator


def generator_examples(
    problems: Iterable[Problem],
    *,
    variants: Sequence[str] = (NAIVE, FAST),
    solution: SolutionFn | None = None,
    prompt: GeneratorPrompt | None = None,
    operation_line: bool = False,
) -> list[SFTExample]:
    """One example per problem and available solution variant. ``operation_line``: each reply's
    CUDA source starts with the problem's operation (``with_operation_line``)."""
    solution = solution or _builtin_solution
    prompt = prompt or _default_generator_prompt()
    out, dropped = [], []
    for problem in problems:
        for variant in variants:
            source = solution(problem, variant)
            if source is None:
                continue
            if operation_line:
                source = with_operation_line(source, problem)
            messages = _conversation(prompt(problem), source)
            if messages is None:
                dropped.append(f"{problem.name}/{variant}")
                continue
            variant_name = "solution" if _origin(problem) == "jsonl" else variant
            out.append(
                SFTExample(
                    role=AgentRole.GENERATOR,
                    messages=messages,
                    problem=problem.name,
                    origin=_origin(problem),
                    variant=variant_name,
                )
            )
    _warn_dropped(dropped)
    return out


def generator_sft_examples(problems: Iterable[Problem], **kwargs: Any) -> list[Messages]:
    """Generator conversations (``[{"role", "content"}, ...]``); see ``generator_examples``."""
    return [e.messages for e in generator_examples(problems, **kwargs)]


# --------------------------------------------------------------------------- Optimizer


def optimizer_examples(
    problems: Iterable[Problem],
    *,
    solution: SolutionFn | None = None,
    prompt: OptimizerPrompt | None = None,
    feedback: FeedbackFn | None = None,
    strip_comments: bool = False,
    operation_line: bool = False,
) -> list[SFTExample]:
    """naive -> fast pairs for problems that have both solutions. ``strip_comments``: the fast
    solution (the reply trained on) loses its whole-line comments (``strip_comment_lines``);
    the naive one in the prompt keeps them. ``operation_line``: both start their CUDA source
    with the problem's operation, as a Generator trained with it writes its kernels (after the
    stripping: the line is a comment)."""
    solution = solution or _builtin_solution
    prompt = prompt or _default_optimizer_prompt()
    feedback = feedback or untimed_feedback
    out, dropped = [], []
    for problem in problems:
        slow, fast = solution(problem, NAIVE), solution(problem, FAST)
        if slow is None or fast is None or slow.strip() == fast.strip():
            continue
        if strip_comments:
            fast = strip_comment_lines(fast)
        if operation_line:
            slow, fast = (with_operation_line(src, problem) for src in (slow, fast))
        messages = _conversation(prompt(problem, slow, feedback(problem, slow), []), fast)
        if messages is None:
            dropped.append(f"{problem.name}/naive->fast")
            continue
        out.append(
            SFTExample(
                role=AgentRole.OPTIMIZER,
                messages=messages,
                problem=problem.name,
                origin=_origin(problem),
                variant=f"{NAIVE}->{FAST}",
            )
        )
    _warn_dropped(dropped)
    return out


def optimizer_sft_examples(problems: Iterable[Problem], **kwargs: Any) -> list[Messages]:
    """Optimizer conversations (``[{"role", "content"}, ...]``); see ``optimizer_examples``."""
    return [e.messages for e in optimizer_examples(problems, **kwargs)]


# --------------------------------------------------------------------------- Sakana archive


def _usable(records: Iterable[SakanaRecord]) -> list[SakanaRecord]:
    return [r for r in records if r.correct and r.candidate_source is not None]


def sakana_generator_examples(
    records: Iterable[SakanaRecord], *, prompt: GeneratorPrompt | None = None
) -> list[SFTExample]:
    """Problem -> the archive's correct kernel (wrapped as a ``load_inline`` candidate)."""
    prompt = prompt or _default_generator_prompt()
    out = []
    for record in _usable(records):
        messages = _conversation(prompt(record.problem), record.candidate_source or "")
        if messages is not None:
            out.append(
                SFTExample(
                    role=AgentRole.GENERATOR,
                    messages=messages,
                    problem=record.problem.name,
                    origin="sakana",
                    variant=record.kernel_name,
                )
            )
    return out


def archive_feedback(record: SakanaRecord) -> str:
    """A Tester-style report built only from the archive's own figures, labelled as such."""
    lines = ["Status: correct (as recorded by the AI CUDA Engineer archive)."]
    if record.speedup_native is not None and record.cuda_runtime is not None:
        eager = record.torch_native_runtime
        lines.append(
            f"Time {record.cuda_runtime:.4g}"
            + (f" vs eager PyTorch {eager:.4g}" if eager is not None else "")
            + f": {record.speedup_native:.2f}x (figures reported by the archive, measured on "
            "its GPU in its units, not here)."
        )
    else:
        lines.append("Timing: not available for this kernel.")
    lines.append("Make it faster while keeping it correct.")
    return "\n".join(lines) + _pitfall_hints(record.candidate_source or "")


def sakana_optimizer_examples(
    records: Iterable[SakanaRecord],
    *,
    prompt: OptimizerPrompt | None = None,
    min_gain: float = 0.1,
    max_pairs_per_task: int = 4,
) -> list[SFTExample]:
    """Slower -> fastest correct kernel of the same task, when the archive's speedups differ by
    at least ``min_gain`` (relative). The slowest kernels are paired first."""
    prompt = prompt or _default_optimizer_prompt()
    by_task: dict[tuple[int, int], list[SakanaRecord]] = {}
    for record in _usable(records):
        if record.speedup_native is not None:
            by_task.setdefault((record.level, record.task_id), []).append(record)
    out = []
    for key in sorted(by_task):
        ranked = sorted(by_task[key], key=lambda r: (r.speedup_native, r.kernel_name))
        best = ranked[-1]
        for slow in ranked[:-1][:max_pairs_per_task]:
            if best.speedup_native < slow.speedup_native * (1 + min_gain):  # type: ignore[operator]
                continue
            current = slow.candidate_source or ""
            messages = _conversation(
                prompt(slow.problem, current, archive_feedback(slow), []),
                best.candidate_source or "",
            )
            if messages is not None:
                out.append(
                    SFTExample(
                        role=AgentRole.OPTIMIZER,
                        messages=messages,
                        problem=slow.problem.name,
                        origin="sakana",
                        variant=f"{slow.kernel_name}->{best.kernel_name}",
                    )
                )
    return out


# --------------------------------------------------------------------------- datasets


def _warn_dropped(dropped: list[str]) -> None:
    if dropped:
        log.warning(
            "sft data: dropped %d example(s) whose reply would not parse back (a ``` fence or "
            "no ModelNew in the solution?): %s",
            len(dropped),
            ", ".join(dropped[:5]),
        )


def sft_examples(
    role: AgentRole | str,
    problems: Iterable[Problem],
    *,
    sakana_records: Iterable[SakanaRecord] | None = None,
    **kwargs: Any,
) -> list[SFTExample]:
    """All examples for one role from the problems (and the archive records, if given)."""
    role = AgentRole(role)
    problems = list(problems)
    records = list(sakana_records or [])
    if role is AgentRole.GENERATOR:
        gen_prompt = kwargs.pop("prompt", None)
        examples = generator_examples(problems, prompt=gen_prompt, **kwargs)
        return examples + sakana_generator_examples(records, prompt=gen_prompt)
    if role is AgentRole.OPTIMIZER:
        opt_prompt = kwargs.pop("prompt", None)
        examples = optimizer_examples(problems, prompt=opt_prompt, **kwargs)
        return examples + sakana_optimizer_examples(records, prompt=opt_prompt)
    raise ValueError(
        f"role {role.value!r} is rule-based and never trained: use generator or optimizer"
    )


def build_sft_dataset(
    role: AgentRole | str,
    problems: Iterable[Problem],
    *,
    seed: int = 0,
    sakana_records: Iterable[SakanaRecord] | None = None,
    extra_examples: Iterable[SFTExample] = (),
    **kwargs: Any,
) -> datasets.Dataset:
    """A ``datasets.Dataset`` with a ``messages`` column (chat SFT format) and provenance
    columns ``role``, ``problem``, ``origin``, ``variant``; shuffled deterministically by seed.

    ``kwargs`` go to ``generator_examples`` / ``optimizer_examples`` (``variants``,
    ``solution``, ``prompt``, ``feedback``). ``extra_examples`` (e.g. the Optimizer's repair
    pairs, ``tasks.repair_data``) join them before the shuffle."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets ships with the train extra
        raise ImportError(
            "build_sft_dataset needs `datasets`: pip install 'multiminddev[train]'"
        ) from exc
    examples = sft_examples(role, problems, sakana_records=sakana_records, **kwargs)
    extra = list(extra_examples)
    if any(e.role is not AgentRole(role) for e in extra):
        raise ValueError(f"extra_examples for another role than {AgentRole(role).value}")
    examples += extra
    if not examples:
        raise ValueError(
            f"no {AgentRole(role).value} SFT example: none of the problems has a solution "
            "(built-in reference solutions, a JSONL `solution`, or correct Sakana records"
            + (
                ", and Optimizer pairs need both a naive and a fast solution)"
                if AgentRole(role) is AgentRole.OPTIMIZER
                else ")"
            )
        )
    rows = [
        {
            "messages": e.messages,
            "role": e.role.value,
            "problem": e.problem,
            "origin": e.origin,
            "variant": e.variant,
        }
        for e in examples
    ]
    random.Random(seed).shuffle(rows)
    return datasets.Dataset.from_list(rows)
