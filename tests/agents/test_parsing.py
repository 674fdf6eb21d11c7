import pytest

from multiminddev.agents.parsing import (
    MAX_REPLY_CHARS,
    ParseFailure,
    find_code_blocks,
    parse_candidate,
)

MODULE = '''import torch
import torch.nn as nn
from multiminddev.cuda import compile_kernels

kernels = compile_kernels(r"""
extern "C" __global__ void k(float* y, long n) { long i = threadIdx.x; if (i < n) y[i] = 0; }
""")

class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''


def test_takes_the_python_block_defining_model_new():
    reply = f"Here you go:\n```python\n{MODULE}```\nDone."
    parsed = parse_candidate(reply)
    assert parsed.ok and parsed.failure is None and "class ModelNew" in parsed.source


def test_takes_the_last_block_defining_model_new():
    second = MODULE.replace("return x", "return x  # v2")
    reply = f"```python\n{MODULE}```\nbetter:\n```python\n{second}```"
    assert "# v2" in parse_candidate(reply).source


def test_ignores_helper_blocks_without_model_new():
    reply = f"```python\nprint('usage')\n```\n```python\n{MODULE}```\n```python\nx = 1\n```"
    assert "class ModelNew" in parse_candidate(reply).source


def test_unclosed_fence_is_accepted_with_a_note():
    parsed = parse_candidate(f"```python\n{MODULE}")
    assert parsed.ok and "unclosed" in parsed.detail


def test_unfenced_module_is_accepted():
    parsed = parse_candidate(MODULE)
    assert parsed.ok and "no code fence" in parsed.detail


def test_only_cuda_block_is_no_python_block():
    parsed = parse_candidate("```cuda\n__global__ void k() {}\n```")
    assert parsed.failure is ParseFailure.NO_PYTHON_BLOCK and parsed.source is None


def test_prose_is_no_code_block():
    assert parse_candidate("I would use shared memory.").failure is ParseFailure.NO_CODE_BLOCK


def test_python_without_model_new():
    parsed = parse_candidate("```python\nimport torch\nclass Model: pass\n```")
    assert parsed.failure is ParseFailure.NO_MODEL_NEW


def test_model_new_only_in_a_string_is_not_a_definition():
    parsed = parse_candidate('```python\nx = "class ModelNew"\n```')
    assert parsed.failure is ParseFailure.NO_MODEL_NEW


def test_syntax_error_reports_the_line():
    parsed = parse_candidate("```python\nclass ModelNew(nn.Module:\n    pass\n```")
    assert parsed.failure is ParseFailure.SYNTAX_ERROR and "line 1" in parsed.detail


@pytest.mark.parametrize("reply", ["", "   \n\t", "```python\n```", "```\n\n```"])
def test_empty_inputs(reply):
    assert parse_candidate(reply).failure is ParseFailure.EMPTY


def test_huge_reply_is_refused_cheaply():
    parsed = parse_candidate("a" * (MAX_REPLY_CHARS + 1))
    assert parsed.failure is ParseFailure.TOO_LONG


@pytest.mark.parametrize("reply", [
    "\x00\x01\x02```python\n\x00class ModelNew: pass\n```",
    "```python\n" + "(" * 5000 + "\n```",
    "```python\nclass ModelNew:\n    s = '日本語 ✓ \U0001F600'\n```",
    "`" * 10000,
    "```" * 3000,
    "```python\n" + "x = [" * 200 + "\nclass ModelNew: pass\n```",
    "\ud800 class ModelNew",
    b"bytes reply".decode(),
])
def test_never_raises_on_garbage(reply):
    parsed = parse_candidate(reply)
    assert parsed.ok != (parsed.failure is not None)


def test_unicode_module_parses():
    parsed = parse_candidate("```python\nclass ModelNew:\n    s = '日本語 ✓'\n```")
    assert parsed.ok and "日本語" in parsed.source


def test_find_code_blocks_reads_languages_and_closure():
    blocks = find_code_blocks("```cuda\na\n```\n~~~python\nb\n~~~\n```\nc")
    assert [(b.lang, b.code, b.closed) for b in blocks] == [
        ("cuda", "a", True), ("python", "b", True), ("", "c", False)]
