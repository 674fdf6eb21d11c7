"""``include_policy``: every route by which a compiler could open a file other than the
candidate's source or a shipped header is refused before any compiler runs; honest includes
pass."""

import pytest

from multiminddev.cuda.include_policy import (
    RULE_ABSOLUTE,
    RULE_COMPUTED,
    RULE_DIRECTIVE,
    RULE_ESCAPING,
    RULE_PASTE,
    RULE_PRAGMA,
    RULE_PROBE,
    include_refusals,
)

KERNEL = "__global__ void k(float* x) { x[0] = 1.0f; }\n"

REFUSED = {
    "absolute": ('#include "/proc/self/environ"\n', RULE_ABSOLUTE),
    "absolute_angle": ("#include </proc/self/mountinfo>\n", RULE_ABSOLUTE),
    "home": ('#include "~/.bashrc"\n', RULE_ABSOLUTE),
    "escaping": ('#include "../../../../proc/self/environ"\n', RULE_ESCAPING),
    "escaping_angle": ("#include <cuda/../../../../../proc/self/pagemap>\n", RULE_ESCAPING),
    "backslash": ('#include "a\\\\b.h"\n', RULE_ESCAPING),
    "computed": ('#define P "/proc/self/environ"\n#include P\n', RULE_COMPUTED),
    "computed_stringized": ("#define S(x) #x\n#define T(x) S(x)\n#include T(/proc/self/environ)\n",
                            RULE_COMPUTED),
    "computed_angle": ("#define D </proc/self/environ>\n#include D\n", RULE_COMPUTED),
    "spliced": ('#inc\\\nlude "/proc/self/\\\nenviron"\n', RULE_ABSOLUTE),
    "comment_splits": ('#include /*\n*/ "/proc/self/environ"\n', RULE_ABSOLUTE),
    "digraph": ('%:include "/proc/self/environ"\n', RULE_ABSOLUTE),
    "trigraph": ('??=include "/proc/self/environ"\n', RULE_DIRECTIVE),
    "import": ('#import "/proc/self/environ"\n', RULE_ABSOLUTE),
    "include_next": ("#include_next <cuda_fp16.h>\n", RULE_DIRECTIVE),
    "embed": ('#embed "/proc/self/environ"\n', RULE_DIRECTIVE),
    "line_file": ('#line 1 "/proc/self/environ"\n', RULE_DIRECTIVE),
    "has_include": ("#if __has_include(</etc/passwd>)\n#endif\n", RULE_PROBE),
    "has_include_next": ("#if __has_include_next(<x.h>)\n#endif\n", RULE_PROBE),
    "has_include_quoted": ('#if __has_include("/etc/passwd")\n#endif\n', RULE_PROBE),
    "has_include_escaping": ("#if __has_include(<../../etc/passwd>)\n#endif\n", RULE_PROBE),
    "has_include_in_macro": ("#define H __has_include\n#if H(</etc/passwd>)\n#endif\n",
                             RULE_PROBE),
    "has_include_pasted": ("#define J(a, b) a##b\n#if J(__ha, s_include)(</x>)\n#endif\n",
                           RULE_PASTE),
    "pragma_dependency": ('#pragma GCC dependency "/proc/self/environ"\n', RULE_PRAGMA),
    "pragma_operator": ('_Pragma("GCC dependency \\"/proc/self/environ\\"")\n', RULE_PRAGMA),
    "pragma_operator_macro": ("#define P(x) _Pragma(#x)\nP(GCC dependency \"/etc/passwd\")\n",
                              RULE_PRAGMA),
    "pragma_pasted": ("#define J(a, b) a##b\nJ(_Pra, gma)(\"x\")\n", RULE_PASTE),
    "has_include_after_digit_separator": (
        "#if 1'0 || __has_include(</etc/passwd>) || 0'0\n#endif\n", RULE_PROBE),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_route_to_a_file_is_refused_with_its_rule(name):
    source, rule = REFUSED[name]
    refusals = include_refusals(source + KERNEL)
    assert refusals, name
    assert refusals[0].rule == rule
    message = refusals[0].message
    assert "\n" not in message and "refused" in message and "include only the headers" in message


HONEST = {
    "fp16": "#include <cuda_fp16.h>\n",
    "bf16": "#include <cuda_bf16.h>\n",
    "cooperative_groups": "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n",
    "cstdint": "#include <cstdint>\n",
    "mma": "#include <mma.h>\n",
    "pipeline": "#include <cuda/pipeline>\n",
    "torch": "#include <torch/extension.h>\n#include <c10/cuda/CUDAGuard.h>\n",
    "quoted": '#include "cuda_fp16.h"\n',
    "pragmas": "#pragma once\n#pragma unroll 4\n#pragma nv_diag_suppress 177\n"
               "#pragma GCC diagnostic ignored \"-Wunused\"\n_Pragma(\"unroll\")\n",
    "strings_and_comments": ('// #include "/proc/self/environ"\n/* __has_include */\n'
                             'const char* s = "#include </etc/passwd> __has_include ../";\n'
                             'const char* r = R"x(#include "/proc/self/environ")x";\n'),
    "digit_separators_and_chars": "const int n = 1'000'000; const char c = '#';\n",
    "paste": "#define CAT(a, b) a##b\n#define K(n) CAT(kernel_, n)\n",
    "probe_of_a_header_name": "#if __has_include(<cuda_bf16.h>)\n#include <cuda_bf16.h>\n#endif\n",
    "paste_beside_extern_c": '#define KERNEL(name) extern "C" __global__ void name##_f32\n',
    "line_number": "#line 40\n",
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_includes_and_directives_pass(name):
    assert include_refusals(HONEST[name] + KERNEL) == []


def test_the_refusal_names_the_line_of_the_directive():
    source = "// header\n\n#include <cuda_fp16.h>\n#include \"/proc/self/environ\"\n" + KERNEL
    (refusal,) = include_refusals(source)
    assert refusal.line == 4 and refusal.message.startswith("line 4: `#include \"/proc/self/environ\"`")
