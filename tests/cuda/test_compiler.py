"""NVRTC compilation: success, errors with line numbers, resources, cache, headers."""

from multiminddev.cuda.compiler import (
    CompileOptions,
    compile_cuda,
    parse_diagnostics,
    parse_ptxas_resources,
)
from multiminddev.env.results import StageStatus

RELU = r"""
extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
"""

SHARED = r"""
extern "C" __global__ void rev(const float* x, float* y) {
    __shared__ float s[256];
    s[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    y[blockIdx.x * 256 + threadIdx.x] = s[255 - threadIdx.x];
}
"""


def test_compiles_to_cubin_for_sm90_without_gpu():
    module = compile_cuda(RELU, CompileOptions(arch="sm_90"))
    assert module.result.status is StageStatus.OK
    assert module.cubin[:4] == b"\x7fELF"
    assert module.kernel_names == ["relu"]
    assert module.result.arch == "sm_90"


def test_resources_report_registers_and_shared_memory():
    module = compile_cuda(SHARED, CompileOptions(arch="sm_90"))
    (kernel,) = module.result.kernels
    assert kernel.name == "rev"
    assert kernel.shared_mem_bytes == 1024
    assert kernel.registers > 0
    assert kernel.barriers == 1


def test_error_has_line_number_and_does_not_raise():
    bad = RELU.replace("fmaxf(x[i], 0.f)", "fmaxf(x[i], undefined_thing)")
    module = compile_cuda(bad, CompileOptions(arch="sm_90"))
    assert module.result.status is StageStatus.FAILED
    (error,) = module.result.errors
    assert error.line == 4
    assert "undefined_thing" in error.message
    assert module.cubin == b""


def test_second_compile_is_a_cache_hit(tmp_path):
    options = CompileOptions(arch="sm_90", cache_dir=str(tmp_path))
    first = compile_cuda(RELU, options)
    second = compile_cuda(RELU, options)
    assert not first.result.cached
    assert second.result.cached
    assert second.cubin == first.cubin
    assert second.result.kernels == first.result.kernels


def test_cache_key_depends_on_arch(tmp_path):
    compile_cuda(RELU, CompileOptions(arch="sm_90", cache_dir=str(tmp_path)))
    other = compile_cuda(RELU, CompileOptions(arch="sm_80", cache_dir=str(tmp_path)))
    assert not other.result.cached
    assert other.result.arch == "sm_80"


def test_common_headers_resolve_without_include_paths():
    src = (
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cooperative_groups.h>\n"
        "#include <cstdint>\n#include <cuda_runtime.h>\n"
        'extern "C" __global__ void k(__half* x, int64_t n) {\n'
        "  namespace cg = cooperative_groups; cg::thread_block b = cg::this_thread_block();\n"
        "  if (b.thread_rank() < n) x[b.thread_rank()] = __float2half(1.f);\n}\n"
    )
    module = compile_cuda(src, CompileOptions(arch="sm_90"))
    assert module.result.status is StageStatus.OK, module.result.log


def test_invalid_arch_is_a_clear_error():
    try:
        CompileOptions(arch="hopper")
    except ValueError as exc:
        assert "sm_90" in str(exc)
    else:
        raise AssertionError("an invalid arch must be refused")


def test_parse_helpers_on_real_log_lines():
    log = (
        "default_program(7): error: identifier \"q\" is undefined\n"
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem\n"
    )
    (diag,) = parse_diagnostics(log)
    assert (diag.line, diag.severity) == (7, "error")
    (res,) = parse_ptxas_resources(log)
    assert (res.registers, res.shared_mem_bytes, res.spill_store_bytes, res.stack_frame_bytes) == (
        255,
        2048,
        4,
        8,
    )


NEGATE = RELU.replace("fmaxf(x[i], 0.f)", "-x[i]").replace("relu", "neg")


def _entry(root, source, options):
    from multiminddev.cuda.compiler import CACHE_SUBDIR, _cache_key, resolve_arch

    key = _cache_key(source, resolve_arch(options), options)
    return root / CACHE_SUBDIR / f"{key}.json", root / CACHE_SUBDIR / f"{key}.cubin"


def test_a_cubin_planted_under_another_sources_key_is_rebuilt(tmp_path):
    options = CompileOptions(arch="sm_90", cache_dir=str(tmp_path))
    honest = compile_cuda(RELU, options).cubin
    hostile = compile_cuda(NEGATE, options)
    meta, cubin = _entry(tmp_path, RELU, options)
    other_meta, other_cubin = _entry(tmp_path, NEGATE, options)
    cubin.write_bytes(other_cubin.read_bytes())  # the poisoned kernel under relu's key
    meta.write_text(other_meta.read_text())
    again = compile_cuda(RELU, options)
    assert not again.result.cached
    assert again.cubin == honest and again.cubin != hostile.cubin
    assert again.kernel_names == ["relu"]


def test_an_edited_cubin_with_its_old_tag_is_rebuilt(tmp_path):
    options = CompileOptions(arch="sm_90", cache_dir=str(tmp_path))
    honest = compile_cuda(RELU, options).cubin
    _, cubin = _entry(tmp_path, RELU, options)
    cubin.write_bytes(honest[:-16] + b"\0" * 16)
    again = compile_cuda(RELU, options)
    assert not again.result.cached and again.cubin == honest


def test_an_entry_tagged_with_another_key_is_not_trusted(tmp_path):
    from multiminddev.cuda import cache_auth

    options = CompileOptions(arch="sm_90", cache_dir=str(tmp_path))
    compile_cuda(RELU, options)
    cache_auth.key_path(tmp_path).unlink()  # a new secret: every old tag is now unverifiable
    assert not compile_cuda(RELU, options).result.cached
    assert compile_cuda(RELU, options).result.cached


def test_no_cache_is_written_without_use_cache(tmp_path):
    from multiminddev.cuda import cache_auth

    compile_cuda(RELU, CompileOptions(arch="sm_90", cache_dir=str(tmp_path), use_cache=False))
    assert not any(tmp_path.iterdir()) and not cache_auth.key_path(tmp_path).exists()


def test_an_arch_nvrtc_refuses_leaves_no_nul_in_the_log():
    """NVRTC's log is a C string; its terminating NUL must not reach the result (it would land
    in the printed log and as \\u0000 in every JSON the result is written to)."""
    module = compile_cuda(RELU, CompileOptions(arch="sm_999", use_cache=False))
    result = module.result
    assert result.status is StageStatus.FAILED and "gpu-architecture" in result.error
    assert "\x00" not in result.log and "\x00" not in result.error


def test_mma_pipeline_and_quoted_shipped_headers_compile():
    src = (
        '#include <mma.h>\n#include <cuda/pipeline>\n#include "cuda_fp16.h"\n'
        '#pragma nv_diag_suppress 177\n'
        'extern "C" __global__ void k(float* x) {\n'
        "  #pragma unroll\n  for (int i = 0; i < 4; ++i) x[i] = 1.f;\n}\n"
    )
    module = compile_cuda(src, CompileOptions(arch="sm_90", use_cache=False))
    assert module.result.status is StageStatus.OK, module.result.log


def test_a_refused_include_fails_before_nvrtc_with_a_finding(tmp_path):
    src = '#include "/proc/self/mountinfo"\n' + RELU
    module = compile_cuda(src, CompileOptions(arch="sm_90", cache_dir=str(tmp_path)))
    result = module.result
    assert result.status is StageStatus.FAILED and module.cubin == b""
    assert result.findings[0].rule == "include_absolute_path" and result.findings[0].line == 1
    assert result.log == "" and "\n" not in result.error
    assert result.error == result.findings[0].message


def test_an_include_path_outside_the_shipped_headers_is_refused(tmp_path):
    (tmp_path / "planted.h").write_text("#define PLANTED 1\n")
    options = CompileOptions(arch="sm_90", use_cache=False, extra_include_paths=(str(tmp_path),))
    module = compile_cuda('#include "planted.h"\n' + RELU, options)
    assert module.result.status is StageStatus.FAILED
    assert module.result.findings[0].rule == "include_path_refused"


# Each runs in a process started with a random canary in its environment, from the filesystem
# root (where a quoted "proc/self/environ" would resolve against the working directory).
CANARY_ROUTES = {
    "absolute": '#include "/proc/self/environ"\n',
    "relative_to_cwd": '#include "proc/self/environ"\n',
    "escaping": '#include "../../../../../../../../proc/self/environ"\n',
    "computed": '#define F "/proc/self/environ"\n#include F\n',
    "has_include": "#if __has_include(</proc/self/environ>)\n#error present\n#endif\n",
    "pragma": '_Pragma("GCC dependency \\"/proc/self/environ\\"")\n',
    "line": '#line 1 "/proc/self/environ"\n#error where\n',
    "include_path": '#include "environ"\n',
}

CANARY_SCRIPT = r"""
import json, sys
from multiminddev.core.results import _to_jsonable
from multiminddev.cuda.compiler import CompileOptions, compile_cuda
routes = json.loads(sys.argv[1])
out = {}
for name, source in routes.items():
    paths = ("/proc/self",) if name == "include_path" else ()
    module = compile_cuda(source + sys.argv[2], CompileOptions(
        arch="sm_90", use_cache=False, extra_include_paths=paths))
    out[name] = _to_jsonable(module.result)
print(json.dumps(out))
"""


def test_no_compile_route_puts_the_environment_into_a_result():
    import json
    import os
    import secrets
    import subprocess
    import sys
    from pathlib import Path

    canary = secrets.token_hex(16)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, f"MMD_CANARY_{secrets.token_hex(4).upper()}": canary,
           "PYTHONPATH": src}
    run = subprocess.run([sys.executable, "-c", CANARY_SCRIPT, json.dumps(CANARY_ROUTES), RELU],
                         capture_output=True, text=True, env=env, cwd="/", timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert canary not in run.stdout + run.stderr
    results = json.loads(run.stdout)
    assert sorted(results) == sorted(CANARY_ROUTES)
    for name, result in results.items():
        assert result["status"] == "failed", (name, result)
        assert result["findings"] or "cannot open source file" in result["log"], (name, result)


def test_a_quoted_include_does_not_resolve_against_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "planted.h").write_text("#error PLANTED_FROM_THE_WORKING_DIRECTORY\n")
    monkeypatch.chdir(tmp_path)
    module = compile_cuda('#include "planted.h"\n' + RELU,
                          CompileOptions(arch="sm_90", use_cache=False))
    assert module.result.status is StageStatus.FAILED
    assert "PLANTED" not in module.result.log and 'cannot open source file "planted.h"' in (
        module.result.log)
    assert module.result.diagnostics[0].line == 1
    assert str(tmp_path) not in module.result.log and "/include/" not in module.result.log
