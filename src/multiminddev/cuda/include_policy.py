"""What a compiler may read: the candidate's source and the headers the evaluator ships.

A C/C++/CUDA compiler opens whatever file a directive names, so a kernel source can read the
worker's files through its compile log (``#include "/proc/self/environ"`` prints the
environment as "errors"), probe the filesystem (``__has_include``) or make the compiler read
without bound (``/proc/self/pagemap``). ``include_refusals`` reads the source as the
preprocessor does (line splices, comments, string and raw-string literals, ``%:`` digraphs)
and refuses, before any compiler runs:

- ``#include``/``#import`` of an absolute path, of a path with a ``..`` component or a
  backslash, or of a name with characters outside ``[A-Za-z0-9_.+/-]``;
- computed includes (``#include MACRO``): a macro-assembled path cannot be checked here;
- ``#include_next``, ``#embed``, ``#line`` with a file name;
- ``__has_include``/``__has_include_next``/``__has_embed`` anywhere (filesystem probes), and
  any identifier starting with ``__has`` (so a macro cannot assemble one);
- ``#pragma`` and ``_Pragma`` other than the allowlisted ones (``GCC dependency`` reads a
  file), and ``_Pragma`` whose argument is not a string literal;
- trigraphs (``??=include`` is ``#include`` in the C++ modes before C++17);
- in a source that pastes tokens (``##``), any identifier that begins ``_Pragma`` or
  ``__has_include`` without being it (``_Pra``, ``__has_``, ``_``): the first piece of a pasted
  name is such a prefix, so neither can be assembled.

The allowed include *names* then resolve only on the include path the compiler is given: for
NVRTC the shipped ``cuda/include`` shims and the CUDA toolkit's headers, with the source's own
directory and the system directories off (``compiler.compile_cuda``); for ``load_inline``
torch's, pybind's, CUDA's and the C++ library's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# The rule names findings carry (``Finding.rule``), one per route to a file.
RULE_ABSOLUTE = "include_absolute_path"
RULE_ESCAPING = "include_escaping_path"
RULE_COMPUTED = "include_computed"
RULE_PROBE = "include_probe"
RULE_DIRECTIVE = "include_directive_refused"
RULE_PRAGMA = "include_pragma_refused"
RULE_PASTE = "include_token_paste"

SAFE_INCLUDE_NAME = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_.+/-]*")
# Pragmas that tune code generation or diagnostics and open no file.
SAFE_PRAGMAS = frozenset({
    "unroll", "nounroll", "once", "pack", "push_macro", "pop_macro", "region", "endregion",
    "nv_diag_suppress", "nv_diag_default", "nv_diag_warning", "nv_diag_error", "nv_diag_once",
    "nv_diagnostic", "diag_suppress", "diag_default", "diag_warning", "diag_error", "diag_once",
    "nv_exec_check_disable", "hd_warning_disable", "omp", "STDC", "message", "warning",
})
SAFE_GCC_PRAGMAS = frozenset({"diagnostic", "unroll", "ivdep", "optimize", "push_options",
                              "pop_options", "system_header"})
_DIRECTIVE = re.compile(r"\s*(?:#|%:)\s*([A-Za-z_]\w*)?(.*)", re.DOTALL)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_PRAGMA_OPERATOR = re.compile(r"\b_Pragma\s*\(\s*(L?\"(?:[^\"\\]|\\.)*\")?")
_SAFE_PROBE = re.compile(r"__has_include\s*\(\s*<([^<>\n]*)>\s*\)")
_BLANKED_LITERAL = re.compile(r"\"_*\"|'_*'")
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>-]")
# Names a macro could assemble by pasting (``_Pra ## gma``): every piece that starts one is
# refused where the source pastes tokens.
ASSEMBLED_NAMES = ("_Pragma", "__has_include", "__has_include_next", "__has_embed")
_FIX = ("include only the headers the evaluator ships (<cuda_fp16.h>, <cuda_bf16.h>, "
        "<cooperative_groups.h>, <mma.h>, <cstdint>, <torch/extension.h>, ...) by name")


@dataclass(kw_only=True, frozen=True)
class IncludeRefusal:
    """One directive or operator that would make the compiler read or probe a file."""

    rule: str
    line: int  # 1-based line of the source given to the compiler
    text: str  # the offending directive or operator, as written (one line, shortened)
    message: str


def include_refusals(source: str) -> list[IncludeRefusal]:
    """Every refused include route in ``source`` (empty: the compiler may read it)."""
    chars, lines = _preprocessor_view(source)
    text = "".join(chars)
    refusals: list[IncludeRefusal] = []
    if trigraph := _TRIGRAPH.search(source):
        line = source.count("\n", 0, trigraph.start()) + 1
        refusals.append(_refusal(RULE_DIRECTIVE, line, trigraph.group(),
                                 "is refused: trigraphs (??=, ??/, ...) can spell directives"))
    start = 0
    for logical in text.split("\n"):
        line = lines[start] if start < len(lines) else 1
        refusals += _directive_refusals(logical, line)
        refusals += _operator_refusals(logical, line, "##" in text or "%:%:" in text)
        start += len(logical) + 1
    return refusals


def first_refusal_message(source: str) -> str | None:
    """The one-line message of the first refusal, or None when the source may compile."""
    refusals = include_refusals(source)
    return refusals[0].message if refusals else None


# ---------------------------------------------------------------- lexing as translation phases 1-3


def _preprocessor_view(source: str) -> tuple[list[str], list[int]]:
    """The source after line splicing, with comments replaced by one space and the contents of
    string/char literals replaced by ``_`` (delimiters kept, so ``"name"`` stays a quoted
    include), and the original line of every kept character. Newlines inside a block comment
    vanish, as they do for the preprocessor (a directive continues past such a comment)."""
    spliced, origin = _splice(source)
    out: list[str] = []
    where: list[int] = []
    i, n = 0, len(spliced)
    while i < n:
        c = spliced[i]
        if spliced.startswith("//", i):
            while i < n and spliced[i] != "\n":
                i += 1
            continue
        if spliced.startswith("/*", i):
            end = spliced.find("*/", i + 2)
            out.append(" ")
            where.append(origin[i])
            i = n if end < 0 else end + 2
            continue
        raw = re.match(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(', spliced[i:i + 24])
        if raw and (i == 0 or not (spliced[i - 1].isalnum() or spliced[i - 1] == "_")):
            close = spliced.find(")" + raw.group(1) + '"', i + raw.end())
            end = n if close < 0 else close + len(raw.group(1)) + 2
            for j in range(i, end):
                out.append('"' if j in (i + raw.end() - 1, end - 1) else
                           ("\n" if spliced[j] == "\n" else "_"))
                where.append(origin[j])
            i = end
            continue
        if c == "'" and _in_number(out):  # a digit separator (1'000), not a character literal
            out.append(c)
            where.append(origin[i])
            i += 1
            continue
        if c in "\"'" and not _keeps_literal(out):
            j = i + 1
            while j < n and spliced[j] != c and spliced[j] != "\n":
                j += 2 if spliced[j] == "\\" else 1
            end = min(j + 1, n)
            for k in range(i, end):
                out.append(spliced[k] if k in (i, end - 1) else "_")
                where.append(origin[k])
            i = end
            continue
        out.append(c)
        where.append(origin[i])
        i += 1
    return out, where


def _splice(source: str) -> tuple[str, list[int]]:
    """Backslash-newline removed (translation phase 2), with each kept character's line."""
    chars: list[str] = []
    origin: list[int] = []
    line, i, n = 1, 0, len(source)
    text = source.replace("\r\n", "\n")
    n = len(text)
    while i < n:
        if text[i] == "\\":
            j = i + 1
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "\n":
                line += 1
                i = j + 1
                continue
        chars.append(text[i])
        origin.append(line)
        if text[i] == "\n":
            line += 1
        i += 1
    return "".join(chars), origin


def _keeps_literal(out: list[str]) -> bool:
    """Whether the quote about to be read opens text the rules read: the name of an
    ``#include``-like directive (a file name, not a string literal) or a ``_Pragma`` operand."""
    tail = "".join(out[-200:]).rsplit("\n", 1)[-1]
    return bool(re.fullmatch(r"\s*(?:#|%:)\s*(include|import|include_next|embed|line)\b.*",
                             tail, re.DOTALL) or re.search(r"\b_Pragma\s*\(\s*L?$", tail))


def _in_number(out: list[str]) -> bool:
    """Whether the text before a ``'`` ends in a pp-number (``1'000``: a digit separator)."""
    j = len(out)
    while j > 0 and (out[j - 1].isalnum() or out[j - 1] in "_.'"):
        j -= 1
    return j < len(out) and (out[j].isdigit() or (out[j] == "." and j + 1 < len(out)
                                                  and out[j + 1].isdigit()))


# ---------------------------------------------------------------- the rules


def _refusal(rule: str, line: int, text: str, why: str) -> IncludeRefusal:
    shown = " ".join(text.split())[:120]
    return IncludeRefusal(rule=rule, line=line, text=shown,
                          message=f"line {line}: `{shown}` {why}; {_FIX}")


def _directive_refusals(logical: str, line: int) -> list[IncludeRefusal]:
    match = _DIRECTIVE.fullmatch(logical)
    if match is None:
        return []
    name, rest = match.group(1) or "", match.group(2).strip()
    if name in ("include", "import"):
        return _include_refusals(logical, rest, line)
    if name in ("include_next", "embed"):
        return [_refusal(RULE_DIRECTIVE, line, logical,
                         f"is refused: #{name} reads files outside the shipped headers")]
    if name == "line" and '"' in rest:
        return [_refusal(RULE_DIRECTIVE, line, logical,
                         "is refused: #line may give a line number only, no file name")]
    if name == "pragma" and not _safe_pragma(rest):
        return [_refusal(RULE_PRAGMA, line, logical,
                         "is refused: only pragmas that tune code generation or diagnostics "
                         "(unroll, once, pack, nv_diag_*, GCC diagnostic, ...) are allowed")]
    return []


def _include_refusals(logical: str, rest: str, line: int) -> list[IncludeRefusal]:
    quoted = re.fullmatch(r'<([^<>\n]*)>|"([^"\n]*)"', rest)
    if quoted is None:
        return [_refusal(RULE_COMPUTED, line, logical,
                         "is refused: an include must name a header as <name> or \"name\", "
                         "never through a macro")]
    header = quoted.group(1) if quoted.group(1) is not None else quoted.group(2)
    if header.startswith(("/", "~")) or re.match(r"[A-Za-z]:", header):
        return [_refusal(RULE_ABSOLUTE, line, logical,
                         "is refused: an absolute path reads a file outside the shipped headers")]
    if ".." in header.split("/") or "\\" in header:
        return [_refusal(RULE_ESCAPING, line, logical,
                         "is refused: `..` or `\\` in an include escapes the include directories")]
    if not SAFE_INCLUDE_NAME.fullmatch(header):
        return [_refusal(RULE_ESCAPING, line, logical,
                         "is refused: a header name uses letters, digits and _ . + - / only")]
    return []


def _safe_pragma(text: str) -> bool:
    words = text.replace("(", " ").split()
    if not words:
        return True
    if words[0] in ("GCC", "clang", "nv"):
        return len(words) > 1 and words[1] in SAFE_GCC_PRAGMAS
    return words[0] in SAFE_PRAGMAS


def _operator_refusals(logical: str, line: int, pasting: bool) -> Iterator[IncludeRefusal]:
    for ident in _IDENT.finditer(logical):
        if not ident.group().startswith("__has"):
            continue
        # ``__has_include(<name>)`` of a header name an #include may take probes only the
        # shipped and toolkit headers, so it is honest; any other form (a quoted or computed
        # name, __has_include_next, __has_embed) could probe the filesystem.
        probe = _SAFE_PROBE.match(logical, ident.start())
        if probe is None or _include_refusals(logical, f"<{probe.group(1)}>", line):
            yield _refusal(RULE_PROBE, line, ident.group(),
                           "is refused: the compiler may not probe the filesystem (only "
                           "__has_include(<header>) of a header an #include may name)")
    for op in _PRAGMA_OPERATOR.finditer(logical):
        literal = op.group(1)
        if literal is None or not _safe_pragma(_unescape(literal)):
            yield _refusal(RULE_PRAGMA, line, logical[op.start():op.end() + 40],
                           "is refused: _Pragma takes a string literal naming an allowed pragma")
    if pasting:
        # Literals are blanked to underscores between their quotes; a literal is no piece of a
        # pasted name, so it is left out here.
        for ident in _IDENT.finditer(_BLANKED_LITERAL.sub('""', logical)):
            if any(len(ident.group()) < len(name) and name.startswith(ident.group())
                   for name in ASSEMBLED_NAMES):
                yield _refusal(RULE_PASTE, line, ident.group(),
                               "is refused in a source that pastes tokens (##): it could "
                               "assemble _Pragma or __has_include")


def _unescape(literal: str) -> str:
    return literal.lstrip("L")[1:-1].replace('\\"', '"').replace("\\\\", "\\")
