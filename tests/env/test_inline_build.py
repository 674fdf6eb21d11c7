"""load_inline compat path: static argument extraction, cache keys, diagnostics, CPU behaviour."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multiminddev.core.results import _to_jsonable
from multiminddev.env import inline_build as ib
from multiminddev.env import inline_build_process
from multiminddev.env.results import StageStatus
from tests.env._fixtures import FIXTURES


def _fixture_source() -> str:
    return (FIXTURES / "honest" / "relu_load_inline.py").read_text()


def test_static_arguments_resolve_module_constants():
    (spec,) = ib.extract_inline_specs(_fixture_source())
    assert spec.args["name"] == "relu_ext"
    assert spec.args["functions"] == ["relu_cuda"]
    assert spec.args["cpp_sources"] == ["torch::Tensor relu_cuda(torch::Tensor x);"]
    assert "relu_kernel" in spec.args["cuda_sources"][0]


def test_runtime_computed_arguments_are_not_static():
    src = "from torch.utils.cpp_extension import load_inline\nsrc = open('k.cu').read()\n" \
          "m = load_inline(name='x', cpp_sources='', cuda_sources=src)\n"
    assert ib.extract_inline_specs(src) is None


def test_string_concatenation_is_resolved():
    src = "from torch.utils.cpp_extension import load_inline\nA = 'int f();'\nB = A + '\\n'\n" \
          "m = load_inline('x', B, functions='f')\n"
    (spec,) = ib.extract_inline_specs(src)
    assert spec.args["cpp_sources"] == ["int f();\n"] and spec.args["functions"] == "f"


def test_key_depends_on_sources_arch_and_torch_version():
    (spec,) = ib.extract_inline_specs(_fixture_source())
    key = spec.key("sm_90", "2.11")
    assert key == spec.key("sm_90", "2.11")
    assert key != spec.key("sm_80", "2.11") != spec.key("sm_90", "2.12")
    assert spec.module_name(key).startswith("relu_ext_mmd_")


def test_worker_side_spec_equals_static_spec():
    import inspect

    from torch.utils.cpp_extension import load_inline

    (static,) = ib.extract_inline_specs(_fixture_source())
    bound = inspect.signature(load_inline).bind(
        name="relu_ext", cpp_sources=static.args["cpp_sources"][0],
        cuda_sources=static.args["cuda_sources"][0], functions=["relu_cuda"], verbose=False,
        extra_cflags=["-O3"], extra_ldflags=[""])
    bound.apply_defaults()
    assert ib.InlineSpec.from_call(dict(bound.arguments)).key("sm_90", "t") == static.key("sm_90", "t")


def test_nvcc_and_gcc_diagnostics_map_to_user_lines():
    log = ("/c/cuda.cu(12): error: identifier \"zero\" is undefined\n"
           "/c/main.cpp:4:10: error: expected ';' before '}' token\n")
    diags = ib.parse_build_diagnostics(log)
    assert [(d.line, d.severity) for d in diags] == [(12 - ib.CUDA_PRELUDE_LINES, "error"), (4, "error")]


def test_cpu_torch_reports_skipped_build(tmp_path):
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch can build CUDA extensions")
    builder = ib.InlineBuilder(tmp_path, "sm_90")
    result = builder.build(ib.extract_inline_specs(_fixture_source()), timeout_s=10)
    assert result.status is StageStatus.SKIPPED and "CPU build" in result.error


# ---------------------------------------------------------------- authenticated libraries


def _planted_library(root, spec, arch="sm_90"):
    """A file where the builder would put ``spec``'s library (what a hostile process could
    write into the shared cache)."""
    import torch

    key = spec.key(arch, torch.__version__)
    library = ib.library_path(ib.build_dir_for(root, key), spec.module_name(key))
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF planted")
    return key, library


def test_a_tagged_library_is_authentic_and_any_change_is_not(tmp_path):
    from multiminddev.cuda import cache_auth

    secret = cache_auth.load_or_create_key(tmp_path)
    library = tmp_path / "x.so"
    library.write_bytes(b"\x7fELF built")
    digest = ib.tag_library(library, "k", secret)
    assert ib.authentic_digest(library, "k", secret) == digest
    assert ib.authentic_digest(library, "other-key", secret) is None
    library.write_bytes(b"\x7fELF swapped")
    assert ib.authentic_digest(library, "k", secret) is None


def test_an_untagged_library_is_not_authentic(tmp_path):
    from multiminddev.cuda import cache_auth

    library = tmp_path / "x.so"
    library.write_bytes(b"\x7fELF planted")
    assert ib.authentic_digest(library, "k", cache_auth.load_or_create_key(tmp_path)) is None


def test_the_evaluator_sends_no_digest_for_a_planted_library(tmp_path):
    (spec,) = ib.extract_inline_specs(_fixture_source())
    _planted_library(tmp_path, spec)
    builder = ib.InlineBuilder(tmp_path, "sm_90")
    assert builder.verified_digests([spec]) == {}


def test_the_evaluator_sends_the_digest_of_an_authentic_library(tmp_path):
    from multiminddev.cuda import cache_auth

    (spec,) = ib.extract_inline_specs(_fixture_source())
    key, library = _planted_library(tmp_path, spec)
    digest = ib.tag_library(library, key, cache_auth.load_or_create_key(tmp_path))
    assert ib.InlineBuilder(tmp_path, "sm_90").verified_digests([spec]) == {key: digest}


def test_the_worker_refuses_a_library_whose_digest_changed(tmp_path):
    (spec,) = ib.extract_inline_specs(_fixture_source())
    key, library = _planted_library(tmp_path, spec)
    with pytest.raises(ib.InlineBuildUnavailable, match="changed after the evaluator verified"):
        ib.load_verified_copy(library.parent, spec.module_name(key), "0" * 64, True)


# ---------------------------------------------------------------- what a build may read, where it runs

HONEST_SPEC = {
    "name": "add", "cpp_sources": [("#include <cstdint>\nint64_t add(int64_t a, int64_t b) "
                                    "{ return a + b; }")],
    "cuda_sources": [("#include <cuda_fp16.h>\n#include <mma.h>\n__global__ void k(float* x) "
                      "{ x[0] = 1.f; }")],
    "functions": ["add"], "extra_cflags": ["-O3"], "extra_cuda_cflags": ["-O3", "-lineinfo"],
    "extra_ldflags": None, "extra_include_paths": None, "with_cuda": True,
    "with_pytorch_error_handling": True, "no_implicit_headers": False, "is_python_module": True,
}


@pytest.mark.parametrize(("arg", "value", "rule"), [
    ("cuda_sources", ['#include "/proc/self/environ"\n'], "include_absolute_path"),
    ("cpp_sources", ["#define F </proc/self/mountinfo>\n#include F\n"], "include_computed"),
    ("cuda_sources", ["#if __has_include(</etc/shadow>)\n#endif\n"], "include_probe"),
    ("extra_include_paths", ["/proc/self"], "include_path_refused"),
    ("extra_cflags", ["-include", "/proc/self/environ"], "include_flag_refused"),
    ("extra_cuda_cflags", ["@/proc/self/environ"], "include_flag_refused"),
    ("extra_cflags", ["-isystem/proc/self"], "include_flag_refused"),
])
def test_a_source_or_flag_that_reads_a_file_is_refused_before_building(arg, value, rule):
    refused = ib.source_refusals({**HONEST_SPEC, arg: value})
    assert refused and refused[0]["rule"] == rule and "\n" not in refused[0]["message"]


def test_honest_sources_and_flags_are_not_refused():
    assert ib.source_refusals(HONEST_SPEC) == []


def test_the_build_environment_is_built_from_an_allowlist(tmp_path, monkeypatch):
    canary = secrets.token_hex(16)
    monkeypatch.setenv(f"MMD_CANARY_{secrets.token_hex(4).upper()}", canary)
    monkeypatch.setenv("LD_PRELOAD", f"/tmp/{canary}.so")
    env = inline_build_process.build_environment(tmp_path, "9.0", "/usr/local/cuda", 2)
    assert set(env) == {"PATH", "HOME", "TMPDIR", "TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST",
                        "MAX_JOBS", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL",
                        "CUDA_HOME"}
    assert canary not in json.dumps(env)
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)


def test_invalid_build_limits_are_refused():
    with pytest.raises(ValueError, match="memory_bytes"):
        inline_build_process.InlineBuildLimits(memory_bytes=0)
    with pytest.raises(ValueError, match="wall_seconds"):
        inline_build_process.InlineBuildLimits(wall_seconds=0)


def test_a_build_past_its_wall_limit_is_killed_with_its_group():
    limits = inline_build_process.InlineBuildLimits(wall_seconds=0.5)
    start = time.monotonic()
    outcome = ib.build_in_process(HONEST_SPEC, "/tmp/mmd-unused-cache", "sm_90", limits)
    assert outcome["status"] == "timeout" and "ran past" in outcome["error"]
    assert time.monotonic() - start < 30


def test_a_refused_build_in_its_process_carries_no_environment_value(tmp_path, monkeypatch):
    """The whole route: a build process started from an evaluator whose environment holds a
    canary; its sources include /proc/self/environ; the outcome is a refusal without it."""
    canary = secrets.token_hex(16)
    monkeypatch.setenv(f"MMD_CANARY_{secrets.token_hex(4).upper()}", canary)
    spec = {**HONEST_SPEC, "cuda_sources": [('#include "/proc/self/environ"\n'
                                             "__global__ void k() {}")]}
    outcome = ib.build_in_process(spec, str(tmp_path), "sm_90",
                                            inline_build_process.InlineBuildLimits())
    assert outcome["status"] == "rejected", outcome
    assert outcome["findings"][0]["rule"] == "include_absolute_path"
    assert canary not in json.dumps(outcome)
    result = ib.outcome_to_compile_result(outcome, "sm_90")
    assert result.status is StageStatus.FAILED and canary not in json.dumps(_to_jsonable(result))


CANARY_EVALUATION = r"""
import json, sys
from multiminddev.env import EvalConfig, Evaluator
from tests.env._fixtures import problem_named
cases = json.loads(sys.argv[1])
cfg = EvalConfig(num_workers=1, compile_baseline=False, bench_budget_s=0.5)
with Evaluator(cfg) as ev:
    out = {name: ev.evaluate(problem_named(problem), source).to_dict()
           for name, (problem, source) in cases.items()}
print("RESULTS " + json.dumps(out))
"""


def _evaluate_with_canary(cases: dict[str, tuple[str, str]]) -> dict[str, dict]:
    """Evaluate ``cases`` (name -> (problem, candidate source)) in a full Evaluator started in a
    process with a random canary in its environment at exec; asserts the canary is in no
    result, log or message and returns the results as JSON dicts."""
    canary = secrets.token_hex(16)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, f"MMD_CANARY_{secrets.token_hex(4).upper()}": canary,
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    run = subprocess.run([sys.executable, "-c", CANARY_EVALUATION, json.dumps(cases)], cwd=root,
                         env=env, capture_output=True, text=True, timeout=540, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert canary not in run.stdout and canary not in run.stderr
    return json.loads(run.stdout.split("RESULTS ", 1)[1])


def _nvrtc_cases(fixtures_dir: Path) -> dict[str, tuple[str, str]]:
    relu = (fixtures_dir / "honest" / "relu_basic.py").read_text()
    kernel = 'extern "C" __global__'
    return {
        "nvrtc_honest": ("1_relu", relu),
        "nvrtc_environ": ("1_relu", relu.replace(kernel, '#include "/proc/self/environ"\n'
                                                 + kernel, 1)),
        "nvrtc_has_include": ("1_relu", relu.replace(
            kernel, "#if __has_include(</proc/self/environ>)\n#endif\n" + kernel, 1)),
        "nvrtc_computed": ("1_relu", relu.replace(
            kernel, '#define F "/proc/self/environ"\n#include F\n' + kernel, 1)),
    }


def _assert_refused_and_honest(results: dict[str, dict], honest_statuses: tuple[str, ...]):
    for name, result in results.items():
        if name.endswith("_honest"):
            assert result["status"] in honest_statuses, (name, result["message"])
        else:
            assert result["status"] == "rejected", (name, result["message"])
            assert "is refused" in result["message"], (name, result["message"])


def test_no_nvrtc_route_puts_the_evaluators_environment_into_a_result(fixtures_dir):
    """Full Evaluator (on a machine without a GPU the honest twin compiles and is no_gpu)."""
    results = _evaluate_with_canary(_nvrtc_cases(fixtures_dir))
    _assert_refused_and_honest(results, ("ok", "no_gpu"))


@pytest.mark.gpu
def test_no_evaluation_route_puts_the_evaluators_environment_into_a_result(fixtures_dir):
    """Full Evaluator on a GPU: candidates that include /proc/self/environ through NVRTC and
    through load_inline, probe it with __has_include, or include it through a macro, are
    refused; their honest twins are ok; the canary is in no result."""
    softmax = (fixtures_dir / "honest" / "softmax_load_inline_dispatch.py").read_text()
    torch_header = "#include <torch/extension.h>"
    cases = {
        **_nvrtc_cases(fixtures_dir),
        "inline_honest": ("3_softmax", softmax),
        "inline_environ": ("3_softmax", softmax.replace(
            torch_header, torch_header + '\n#include "/proc/self/environ"', 1)),
    }
    _assert_refused_and_honest(_evaluate_with_canary(cases), ("ok",))


def test_the_evaluators_build_pool_takes_the_workers_isolation_and_time_limit(tmp_path):
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.env.config import Isolation
    config = EvalConfig(cache_dir=str(tmp_path), isolation="none", inline_build_timeout_s=42.0)
    with Evaluator(config) as evaluator:
        limits = evaluator.inline_builder().limits
    assert limits.isolation is Isolation.NONE and limits.wall_seconds == 42.0
