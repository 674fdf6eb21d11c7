"""Optimizer repair pairs: a broken kernel and the Tester's real report on it -> a correct kernel.

Why: the Optimizer's SFT pairs (``sft_data.optimizer_examples``) all start from a correct kernel.
In held-out episodes after SFT the Optimizer never repaired a
failed Generator kernel: it resubmitted the same defect turn after turn (an undefined ``absf``,
a ``float*`` kernel for float16 tensors). These pairs show it defects, the Tester's report on
them, and the fix.

Every report is the one the Tester really writes: each broken kernel goes through the caller's
evaluator, and a variant the Tester did not fail (the mutation still compiled, or nothing could
run it) is dropped, so no report is invented. Defects:

- ``misspelt_math``: a CUDA math function renamed to one that does not exist (NVRTC error);
- ``undeclared_variable``: a local used under a name never declared (NVRTC error);
- ``float16_kernel``: the family's float16 kernel submitted for a float32 problem (static
  rejection);
- ``float32_kernel``: the family's float32 kernel submitted for a float16 problem. It compiles
  and passes the static checks, so only an evaluator with a GPU reports it (the launcher
  refuses float16 tensors for ``float*`` parameters); on a CPU machine it is dropped;
- ``wrong_operation``: another family's kernel with the same interface (a memorised operation
  in place of the asked one, the Generator's most common held-out miss). Only a GPU run reports
  its wrong outputs; on a CPU machine it is dropped.

The first two are one-token edits: trained on alone, with ``float16_kernel``, they taught the
Optimizer to resubmit its input unchanged (docs/training.md, "Optimizer repair pairs").

The reply is the problem's correct naive kernel: correct first. With ``reply=FAST`` it is the
problem's fast kernel where the corpus has one (else the naive one), the same target the
Optimizer's naive -> fast pairs train on: a wrong Generator kernel is then answered with the
problem's fast kernel, written from the reference ``Model``. Why: fast_1 on the held-out problems
comes only from ``cumsum`` and ``transpose``, and only when the Generator's kernel was correct;
where the Generator wrote another operation (an identity copy for ``transpose``) the Optimizer
never fixed it.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Callable, Iterable

from multiminddev.agents.pitfalls import candidate_strategies, extract_cuda_sources
from multiminddev.agents.tester import tester_feedback
from multiminddev.core.roles import AgentRole
from multiminddev.cuda.signature import KernelSignature, parse_kernel_signatures
from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.episode.runner import EpisodeConfig, optimizer_context, record_turn
from multiminddev.episode.state import Episode, Turn
from multiminddev.tasks.problem import Problem
from multiminddev.train.sft_data import (
    FAST,
    NAIVE,
    OptimizerPrompt,
    SFTExample,
    SolutionFn,
    _builtin_solution,
    _conversation,
    _default_optimizer_prompt,
    _origin,
    strip_comment_lines,
)

log = logging.getLogger(__name__)

# Real CUDA math functions and names a small model writes for them (``absf`` was seen on the GPU).
MISSPELLINGS = (
    ("fabsf", "absf"), ("expf", "exp_f"), ("fmaxf", "maxf"), ("fminf", "minf"),
    ("tanhf", "tanh_f"), ("log1pf", "log1p_f"), ("expm1f", "expm1_f"), ("sqrtf", "sqrt_f"),
    ("rsqrtf", "rsqrt_f"), ("erff", "erf_f"), ("sinf", "sin_f"), ("atanf", "atan_f"),
    ("__half2float", "half2float"), ("__float2half", "float2half"),
    ("__shfl_down_sync", "shfl_down_sync"), ("__shfl_xor_sync", "shfl_xor_sync"),
)
# Names used for a variable that the kernel never declared (``ssum``, ``vec``, ``cols`` were seen).
UNDECLARED_NAMES = ("ssum", "acc", "val", "total", "vec", "cols", "rows", "idx", "sum")
_DECLARATION = re.compile(
    r"\b(?:float|double|int|long|unsigned|size_t|int64_t)\s+([A-Za-z_]\w*)\s*(?:=|;)"
)
REPAIRABLE = (EvalStatus.COMPILE_ERROR, EvalStatus.REJECTED, EvalStatus.RUNTIME_ERROR,
              EvalStatus.INCORRECT)

Evaluate = Callable[[Problem, str], EvalResult]


def _mutate_cuda(source: str, mutate: Callable[[str], str | None]) -> str | None:
    """``source`` with its first CUDA string that ``mutate`` changes replaced, or None."""
    for cuda in extract_cuda_sources(source):
        broken = mutate(cuda)
        if broken is not None and cuda in source:  # a raw string: its text is its value
            return source.replace(cuda, broken, 1)
    return None


def _misspell(cuda: str) -> str | None:
    hits = [(m.start(), real, wrong) for real, wrong in MISSPELLINGS
            if (m := re.search(rf"\b{re.escape(real)}\s*\(", cuda))]
    if not hits:
        return None
    at, real, wrong = min(hits)
    return cuda[:at] + wrong + cuda[at + len(real):]


def _undeclare(cuda: str) -> str | None:
    for decl in _DECLARATION.finditer(cuda):
        name = decl.group(1)
        uses = [m.start() for m in re.finditer(rf"\b{re.escape(name)}\b", cuda)
                if m.start() > decl.end()]
        wrong = next((w for w in UNDECLARED_NAMES
                      if w != name and not re.search(rf"\b{w}\b", cuda)), None)
        if uses and wrong is not None:
            return cuda[:uses[-1]] + wrong + cuda[uses[-1] + len(name):]
    return None


def misspelt_math(source: str) -> str | None:
    """The first CUDA math call renamed to a function that does not exist, or None."""
    return _mutate_cuda(source, _misspell)


def undeclared_variable(source: str) -> str | None:
    """The last use of the kernel's first declared local renamed to a name never declared."""
    return _mutate_cuda(source, _undeclare)


def _interface(source: str) -> tuple[tuple[KernelSignature, ...], str]:
    """Kernel signatures and ``forward``'s parameters: two solutions with the same interface
    differ only in what they compute."""
    kernels = tuple(sig for cuda in extract_cuda_sources(source)
                    for sig in parse_kernel_signatures(cuda).values())
    forward = re.search(r"def forward\(([^)]*)\)", source)
    return kernels, forward.group(1).replace(" ", "") if forward else ""


def _arity(source: str) -> tuple[int, int]:
    """How many parameters ``__init__`` and ``forward`` take, ``self`` left out."""
    def count(name: str) -> int:
        m = re.search(rf"def {name}\(([^)]*)\)", source)
        params = [a for a in (m.group(1).split(",") if m else []) if a.strip()]
        return len([a for a in params if a.strip() != "self"])
    return count("__init__"), count("forward")


def wrong_operation(problem: Problem, source: str, problems: Iterable[Problem],
                    solution: SolutionFn) -> str | None:
    """Another family's naive kernel with this one's interface and dtype (the Generator's common
    held-out miss: a memorised operation's body), chosen by the problem's name; or None.

    A family whose kernels no other family shares (``cumsum``, ``transpose``, ``matvec``,
    ``argmax_dim``, ``embedding``) gets another family's whole naive module instead, one whose
    ``__init__`` and ``forward`` take as many arguments: it runs on the problem's inputs and
    computes the wrong thing, as the Generator's element-wise copy for ``transpose`` did."""
    interface, arity = _interface(source), _arity(source)
    same_kernels: dict[str, str] = {}
    same_arity: dict[str, str] = {}
    for p in problems:
        if p.family == problem.family or p.dtype != problem.dtype:
            continue
        other = solution(p, NAIVE)
        if other is None or other == source:
            continue
        if interface[0] and _interface(other) == interface:
            same_kernels.setdefault(p.family, other)
        elif _arity(other) == arity:
            same_arity.setdefault(p.family, other)
    others = same_kernels or same_arity
    if not others:
        return None
    pick = sorted(others)[zlib.crc32(problem.name.encode()) % len(others)]
    return others[pick]


KINDS = ("misspelt_math", "undeclared_variable", "float16_kernel", "float32_kernel",
         "wrong_operation")


def broken_variants(problem: Problem, source: str, problems: Iterable[Problem],
                    solution: SolutionFn,
                    kinds: Iterable[str] = KINDS) -> list[tuple[str, str]]:
    """(defect, broken source) pairs for one problem's correct ``source``, of the given kinds."""
    problems, kinds = list(problems), set(kinds)
    if unknown := kinds - set(KINDS):
        raise ValueError(f"unknown repair kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    out = [("misspelt_math", misspelt_math(source)),
           ("undeclared_variable", undeclared_variable(source))]
    # the same family's kernel for the other precision
    other = {"float32": "float16", "float16": "float32"}.get(problem.dtype)
    twin = next((p for p in problems if p.family == problem.family and p.dtype == other), None)
    if twin is not None:
        out.append((f"{other}_kernel", solution(twin, NAIVE)))
    if "wrong_operation" in kinds:
        out.append(("wrong_operation", wrong_operation(problem, source, problems, solution)))
    return [(kind, broken) for kind, broken in out
            if kind in kinds and broken is not None and broken != source]


def optimizer_repair_examples(
    problems: Iterable[Problem],
    evaluate: Evaluate,
    *,
    solution: SolutionFn | None = None,
    prompt: OptimizerPrompt | None = None,
    feedback_chars: int = 1500,
    kinds: Iterable[str] = KINDS,
    reply: str = NAIVE,
    strip_comments: bool = False,
    per_family: int = 0,
) -> list[SFTExample]:
    """Broken kernel + the Tester's report -> a correct kernel, for every problem with a naive
    solution and every defect the Tester caught (see the module docstring). ``reply``: NAIVE
    (the naive kernel) or FAST (the fast kernel where there is one); ``strip_comments``: the
    reply loses its whole-line comments, as ``optimizer_examples(strip_comments=True)``.
    ``per_family`` > 0: at most that many pairs per family and defect, in problem order; the
    rest are not evaluated. Why: every evaluation is a GPU run, and one pair per shape of a
    family would outnumber the Optimizer's naive -> fast pairs."""
    if reply not in (NAIVE, FAST):
        raise ValueError(f"reply must be {NAIVE!r} or {FAST!r}, got {reply!r}")
    if per_family < 0:
        raise ValueError(f"per_family must be >= 0 (0: no cap), got {per_family}")

    render = solution or _builtin_solution
    rendered: dict[tuple[str, str], str | None] = {}

    def solution(p: Problem, variant: str) -> str | None:  # each rendered once, not per pair
        if (p.name, variant) not in rendered:
            rendered[p.name, variant] = render(p, variant)
        return rendered[p.name, variant]

    prompt = prompt or _default_optimizer_prompt()
    problems = list(problems)
    out: list[SFTExample] = []
    kept: dict[str, int] = {}
    family_kept: dict[tuple[str, str], int] = {}
    results: dict[tuple[str, str], EvalResult] = {}  # a weighted spec repeats problems
    for problem in problems:
        correct = solution(problem, NAIVE)
        if correct is None:
            continue
        target = (reply == FAST and solution(problem, FAST)) or correct
        if strip_comments:
            target = strip_comment_lines(target)
        for kind, broken in broken_variants(problem, correct, problems, solution, kinds):
            if per_family and family_kept.get((problem.family, kind), 0) >= per_family:
                continue
            if (problem.name, broken) not in results:
                results[problem.name, broken] = evaluate(problem, broken)
            result = results[problem.name, broken]
            if result.status not in REPAIRABLE:
                continue
            # The state after a failed Generator turn, through the runner's own bookkeeping, so
            # the prompt is the one the Optimizer sees in an episode.
            episode = Episode(problem=problem)
            turn = Turn(index=0, role=AgentRole.GENERATOR, candidate_source=broken,
                        eval_result=result,
                        feedback=tester_feedback(result, broken, max_chars=feedback_chars),
                        strategies=[s.value for s in candidate_strategies(broken)])
            record_turn(episode, turn, EpisodeConfig())
            history, tail = optimizer_context(episode)
            messages = _conversation(prompt(problem, episode.current_source or broken,
                                            episode.current_feedback, history + tail), target)
            if messages is None:
                continue
            out.append(SFTExample(role=AgentRole.OPTIMIZER, messages=messages,
                                  problem=problem.name, origin=_origin(problem),
                                  variant=f"repair:{kind}"))
            kept[kind] = kept.get(kind, 0) + 1
            family_kept[problem.family, kind] = family_kept.get((problem.family, kind), 0) + 1
    log.info("optimizer repair pairs: %s", kept or "none")
    return out


def repair_kinds(examples: Iterable[SFTExample]) -> dict[str, int]:
    """How many pairs of each defect (for logs and records)."""
    counts: dict[str, int] = {}
    for e in examples:
        kind = e.variant.removeprefix("repair:")
        counts[kind] = counts.get(kind, 0) + 1
    return counts


__all__ = [
    "KINDS",
    "MISSPELLINGS",
    "broken_variants",
    "misspelt_math",
    "optimizer_repair_examples",
    "repair_kinds",
    "undeclared_variable",
    "wrong_operation",
]
