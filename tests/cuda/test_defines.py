"""compile_kernels(defines=...): names and numbers reach the compiler, text never does."""

from __future__ import annotations

import pytest

from multiminddev.cuda.compiler import CompileOptions, define_options


@pytest.mark.parametrize("defines, options", [
    (("TILE=32", "SCALE=0.5f", "FAST"), ("TILE=32", "SCALE=0.5f", "FAST")),
    ({"TILE": 32, "SCALE": 0.5, "FAST": True, "EPS": 1e-5},
     ("TILE=32", "SCALE=0.5", "FAST=1", "EPS=1e-05")),
    ([f"UNROLL={max(1, 8 // 2)}"], ("UNROLL=4",)),
])
def test_names_and_numbers_become_options(defines, options):
    assert define_options(defines) == options


class TextInt(int):
    """An int whose text is an #include line, however it is formatted."""

    def __str__(self) -> str:
        return "1\n#include </proc/self/environ>"

    def __repr__(self) -> str:
        return str(self)

    def __format__(self, spec: str) -> str:
        return str(self)


@pytest.mark.parametrize("defines", [
    ["CVT=__float2half_rn"],
    {"CVT": "__float2half_rn"},
    {"TILE": TextInt(32)},
    [f"TILE={TextInt(32)}"],
    ["TILE=32\n#include </etc/passwd>"],
    {"A;B": 1},
    {"SCALE": float("nan")},
    "TILE=32",
    [b"TILE=32"],
])
def test_text_is_refused_with_a_one_line_error(defines):
    with pytest.raises((ValueError, TypeError)) as info:
        define_options(defines)
    assert "\n" not in str(info.value).replace("\\n", "")
    assert len(str(info.value).splitlines()) == 1


def test_compile_options_check_their_defines():
    with pytest.raises(ValueError, match="name or name=number"):
        CompileOptions(arch="sm_90", defines=("HT=__half",))
