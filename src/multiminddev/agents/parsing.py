"""Pull the candidate module out of a model reply.

Rules, in order: among fenced code blocks, take the last Python (or unlabelled) block that
defines ``class ModelNew``; if none defines it, the biggest Python block is judged (and fails
with ``no_model_new``). An unclosed final fence counts as a block to the end of the reply
(small models often run out of tokens before the closing fence). A reply with no fence at all
is parsed whole when it looks like a module. A reply with only CUDA/C++ blocks fails with
``no_python_block``: the candidate must be the Python module that compiles the kernels.

``parse_candidate`` never raises: every input (empty, huge, binary, unicode) gives a
``ParsedCandidate`` with either a source or a failure reason.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass

from multiminddev import pyast

MAX_REPLY_CHARS = 200_000  # beyond this a reply is not a kernel module; refuse cheaply
_PYTHON_LANGS = {"python", "py", "python3", "", "pytorch"}
_CUDA_LANGS = {"cuda", "cpp", "c++", "c", "cu", "cxx", "h", "hpp"}


class ParseFailure(str, enum.Enum):
    EMPTY = "empty"  # nothing but whitespace
    TOO_LONG = "too_long"
    NO_CODE_BLOCK = "no_code_block"  # no fence and no module-looking text
    NO_PYTHON_BLOCK = "no_python_block"  # only CUDA/C++ blocks, no Python module
    NO_MODEL_NEW = "no_model_new"  # Python, but no top-level class ModelNew
    SYNTAX_ERROR = "syntax_error"


@dataclass(kw_only=True)
class ParsedCandidate:
    source: str | None
    failure: ParseFailure | None = None
    detail: str = ""  # what was found / why it failed, for the Tester's feedback

    @property
    def ok(self) -> bool:
        return self.source is not None

    @property
    def failure_reason(self) -> ParseFailure | None:
        return self.failure


@dataclass(frozen=True)
class CodeBlock:
    lang: str
    code: str
    closed: bool


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Fenced blocks (``` or ~~~), scanned line by line: linear time, no regex backtracking."""
    blocks: list[CodeBlock] = []
    lang, fence, body = "", "", None
    for line in text.splitlines():
        stripped = line.strip()
        if body is None:
            if stripped.startswith(("```", "~~~")):
                fence = stripped[:3]
                lang = stripped[3:].strip().lower().split(" ")[0] if len(stripped) > 3 else ""
                body = []
        elif stripped.startswith(fence) and stripped.strip(fence[0]) == "":
            blocks.append(CodeBlock(lang, "\n".join(body), True))
            body = None
        else:
            body.append(line)
    if body is not None:
        blocks.append(CodeBlock(lang, "\n".join(body), False))
    return blocks


def _defines_model_new(code: str) -> bool:
    return "class ModelNew" in code


def _looks_like_module(text: str) -> bool:
    return "class ModelNew" in text or ("import torch" in text and "def forward" in text)


def _select(blocks: list[CodeBlock]) -> tuple[str | None, ParseFailure | None, str]:
    python = [b for b in blocks if b.lang in _PYTHON_LANGS or _defines_model_new(b.code)]
    if not python:
        langs = sorted({b.lang for b in blocks})
        if blocks and all(b.lang in _CUDA_LANGS for b in blocks):
            return None, ParseFailure.NO_PYTHON_BLOCK, (
                f"only {', '.join(langs)} blocks: reply with one ```python block holding the "
                "whole module (ModelNew + compile_kernels)"
            )
        return None, ParseFailure.NO_PYTHON_BLOCK, f"no python block (found: {', '.join(langs)})"
    with_model = [b for b in python if _defines_model_new(b.code)]
    chosen = with_model[-1] if with_model else max(python, key=lambda b: len(b.code))
    note = "" if chosen.closed else "unclosed code fence; used the text to the end of the reply"
    return chosen.code, None, note


def _validate(code: str, note: str) -> ParsedCandidate:
    if not code.strip():
        return ParsedCandidate(source=None, failure=ParseFailure.EMPTY, detail="empty code block")
    try:
        tree = pyast.parse(code)
    except SyntaxError as exc:
        line = (exc.text or "").strip()[:120]
        return ParsedCandidate(
            source=None,
            failure=ParseFailure.SYNTAX_ERROR,
            detail=f"line {exc.lineno}: {exc.msg}" + (f": {line}" if line else ""),
        )
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return ParsedCandidate(
            source=None, failure=ParseFailure.SYNTAX_ERROR, detail=type(exc).__name__
        )
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return ParsedCandidate(
            source=None,
            failure=ParseFailure.NO_MODEL_NEW,
            detail="the code defines no top-level `class ModelNew(nn.Module)`",
        )
    return ParsedCandidate(source=code.strip("\n") + "\n", detail=note)


def parse_candidate(reply: str) -> ParsedCandidate:
    """The candidate module in ``reply``, or the reason there is none. Never raises."""
    try:
        if not isinstance(reply, str):
            reply = str(reply)
        if not reply.strip():
            return ParsedCandidate(source=None, failure=ParseFailure.EMPTY, detail="empty reply")
        if len(reply) > MAX_REPLY_CHARS:
            return ParsedCandidate(
                source=None,
                failure=ParseFailure.TOO_LONG,
                detail=f"reply has {len(reply)} characters (limit {MAX_REPLY_CHARS})",
            )
        blocks = find_code_blocks(reply)
        if not blocks:
            if _looks_like_module(reply):
                return _validate(reply, "no code fence; parsed the whole reply")
            return ParsedCandidate(
                source=None,
                failure=ParseFailure.NO_CODE_BLOCK,
                detail="no ```python code block in the reply",
            )
        code, failure, note = _select(blocks)
        if failure is not None or code is None:
            return ParsedCandidate(source=None, failure=failure, detail=note)
        return _validate(code, note)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
        return ParsedCandidate(
            source=None, failure=ParseFailure.SYNTAX_ERROR, detail=f"unparseable: {exc!r}"[:200]
        )
