"""load_inline compat path: static argument extraction, cache keys, diagnostics, CPU behaviour."""

from __future__ import annotations

import pytest

from multiminddev.env import inline_build as ib
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
