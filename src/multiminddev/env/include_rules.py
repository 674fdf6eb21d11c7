"""Static check of what the candidate's compilers would read (``cuda.include_policy``), on the
sources its kernel builders compile (``load_inline`` and ``compile_kernels`` arguments resolved
statically): the candidate is rejected before anything builds, with one finding per route and
the Python line of the string that holds it. The same policy runs again where each compiler
starts (``compiler.compile_cuda``, ``inline_build.source_refusals``), for sources computed at
run time."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from multiminddev.core.results import Finding, RejectReason
from multiminddev.cuda.include_policy import include_refusals


def native_source_findings(sources: Iterable[tuple[ast.AST, str]]) -> list[Finding]:
    """FILE_ACCESS findings for every refused include route in ``sources`` ((node, text)
    pairs; where the text is a string literal under the node, the finding has the line of the
    directive in the Python file, else the node's)."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for node, text in sources:
        if text in seen:
            continue
        seen.add(text)
        literal = next((n for n in ast.walk(node)
                        if isinstance(n, ast.Constant) and n.value == text), None)
        for refusal in include_refusals(text):
            line = (literal.lineno + refusal.line - 1 if literal is not None
                    else getattr(node, "lineno", None))
            # The finding's line is the Python file's; the message names the directive.
            message = refusal.message.removeprefix(f"line {refusal.line}: ")
            findings.append(Finding(rule=refusal.rule, reason=RejectReason.FILE_ACCESS,
                                    message=message, line=line))
    return findings
