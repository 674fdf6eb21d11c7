"""pyast.parse: ast.parse serialised across threads (python/cpython#106905)."""

from __future__ import annotations

import ast
import threading

import pytest

from multiminddev import pyast


def test_parse_returns_the_same_tree_as_ast_parse():
    source = "def f(x):\n    return [y * 2 for y in x if y]\n"
    assert ast.dump(pyast.parse(source)) == ast.dump(ast.parse(source))
    with pytest.raises(SyntaxError):
        pyast.parse("def f(:\n")


def test_a_parse_waits_while_another_thread_parses():
    done = threading.Event()
    worker = threading.Thread(target=lambda: (pyast.parse("x = 1"), done.set()))
    with pyast._PARSE_LOCK:  # another parse in progress
        worker.start()
        assert not done.wait(0.2)
    assert done.wait(5.0)
    worker.join()
