"""``ast.parse`` that is safe to call from several threads at once.

CPython before 3.11.8 / 3.12.1 keeps the recursion depth of its C-to-Python AST conversion in
state shared by all threads, so two threads parsing at the same time can fail with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). Seen here: the
evaluator runs static checks in its executor threads, and one honest candidate in a batch came
back as an infra_error. Every parse in this package goes through one lock; parsing a candidate
takes about a millisecond, so the lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_PARSE_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec", **kwargs: Any
          ) -> ast.AST:
    with _PARSE_LOCK:
        return ast.parse(source, filename, mode, **kwargs)
