"""The symbol check of built libraries, on real shared libraries built here with g++ (no mocks).

Each library hides its call the way the red team hid it from the source rules (macro, alias,
``__asm__`` rename, ``std::thread``, ``dlsym``, an inline ``syscall`` instruction); the linker
records the real name all the same."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from multiminddev.env import inline_build, native_symbols
from multiminddev.env.native_symbols import (
    Toolchain,
    library_findings,
    symbol_class,
    undefined_symbols,
)
from multiminddev.env.results import RejectReason

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None,
                                reason="needs g++ and nm (binutils)")

HONEST = r"""
#include <cmath>
#include <cstring>
#include <vector>
extern "C" float work(const float* x, float* y, long n) {
    std::vector<float> tmp(x, x + n);
    std::memcpy(y, tmp.data(), n * sizeof(float));
    float s = 0;
    for (long i = 0; i < n; ++i) s += std::sqrt(std::fabs(y[i])) + std::exp(y[i]);
    return s;
}
"""
WRITE_MACRO = r"""
#include <unistd.h>
#define W(a, b) wr##ite(a, b, 1)
extern "C" void work() { W(5, "x"); }
"""
WRITE_ALIAS = r"""
#include <cstddef>
extern "C" long harmless(int, const void*, size_t) __asm__("write");
extern "C" void work() { auto f = &harmless; f(5, "x", 1); }
"""
THREAD = r"""
#include <thread>
extern "C" void work() { std::thread t([] {}); t.detach(); }
"""
DLSYM = r"""
#include <dlfcn.h>
extern "C" void* work(const char* n) { return dlsym(RTLD_DEFAULT, n); }
"""
RAW_SYSCALL = r"""
extern "C" long work(long fd) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(1L), "D"(fd), "S"("x"), "d"(1L)
                     : "rcx", "r11", "memory");
    return ret;
}
"""


def build(tmp_path: Path, name: str, source: str) -> Path:
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    lib = tmp_path / f"lib{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O2", "-std=c++17", "-o", str(lib), str(src),
                    "-pthread"], check=True, capture_output=True)
    return lib


def test_honest_library_has_no_finding(tmp_path):
    lib = build(tmp_path, "honest", HONEST)
    assert {"expf", "exp"} & set(undefined_symbols(lib))  # it does import libc/libm
    assert library_findings(lib) == []


@pytest.mark.parametrize("name,source", [("macro", WRITE_MACRO), ("alias", WRITE_ALIAS)])
def test_write_through_macro_or_asm_rename_is_found(tmp_path, name, source):
    findings = library_findings(build(tmp_path, name, source))
    assert [f.reason for f in findings] == [RejectReason.FORBIDDEN_IMPORT]
    assert "`write`" in findings[0].message and findings[0].rule == "native_symbol"


FILE_STREAM = r"""
#include <fstream>
#include <string>
extern "C" long work() {
    std::ifstream in("/proc/self/environ");
    std::string s;
    in >> s;
    return (long)s.size();
}
"""
FILESYSTEM = r"""
#include <filesystem>
extern "C" long work() { return (long)std::filesystem::file_size("/etc/hostname"); }
"""


DESCRIPTOR_STREAM = r"""
#include <ext/stdio_filebuf.h>
#include <ostream>
extern "C" void work(int fd) {
    __gnu_cxx::stdio_filebuf<char> buf(fd, std::ios::out);
    std::ostream out(&buf);
    out << "frame";
}
"""


@pytest.mark.parametrize("source", [FILE_STREAM, FILESYSTEM, DESCRIPTOR_STREAM],
                         ids=["fstream", "filesystem", "stdio_filebuf"])
def test_cxx_file_access_is_found(tmp_path, source):
    """Files opened through libstdc++ import no libc `open` of the candidate's own."""
    findings = library_findings(build(tmp_path, "files", source))
    assert [f.reason for f in findings] == [RejectReason.FORBIDDEN_IMPORT]
    assert "file streams" in findings[0].message


def test_std_thread_is_concurrency(tmp_path):
    findings = library_findings(build(tmp_path, "thread", THREAD))
    assert RejectReason.CONCURRENCY in {f.reason for f in findings}
    assert any("thread creation" in f.message for f in findings)


def test_dlsym_is_found(tmp_path):
    findings = library_findings(build(tmp_path, "dlsym", DLSYM))
    assert any("`dlsym`" in f.message and f.reason is RejectReason.FORBIDDEN_IMPORT
               for f in findings)


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="x86-64 inline asm and objdump")
def test_inline_syscall_instruction_is_found(tmp_path):
    findings = library_findings(build(tmp_path, "raw", RAW_SYSCALL))
    assert [f.rule for f in findings] == ["native_syscall_instruction"]
    assert "work" in findings[0].message


CUDA_LAUNCH = r"""
#include <cuda_runtime.h>
__global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" void launch(float* x, float a, int n, cudaStream_t stream) {
    scale<<<(n + 255) / 256, 256, 0, stream>>>(x, a, n);
    SIDE_STREAM
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("side_stream", [False, True])
def test_an_nvcc_built_launcher_is_refused_only_for_its_own_stream(tmp_path, side_stream):
    """nvcc's own runtime registration and launch symbols (__cudaRegisterFatBinary,
    __cudaPushCallConfiguration, cudaLaunchKernel) pass; creating a stream does not."""
    source = tmp_path / "launch.cu"
    source.write_text(CUDA_LAUNCH.replace("SIDE_STREAM", "cudaStream_t s; cudaStreamCreate(&s);"
                                          if side_stream else ""))
    library = tmp_path / "launch.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
                    "-gencode=arch=compute_90,code=sm_90", str(source), "-o", str(library)],
                   check=True, capture_output=True, timeout=300)
    findings = library_findings(library)
    if side_stream:
        assert [f.reason for f in findings] == [RejectReason.CONCURRENCY]
        assert "cudaStreamCreate" in findings[0].message
    else:
        assert findings == []


@pytest.mark.parametrize("name,expected", [
    ("write", RejectReason.FORBIDDEN_IMPORT), ("fcntl64", RejectReason.FORBIDDEN_IMPORT),
    ("cublasSgemm_v2", RejectReason.FORBIDDEN_IMPORT), ("cudaStreamCreateWithFlags",
                                                         RejectReason.CONCURRENCY),
    ("cudaLaunchHostFunc", RejectReason.CONCURRENCY), ("PyRun_StringFlags",
                                                       RejectReason.FORBIDDEN_IMPORT),
    ("PyEval_GetFrame", RejectReason.FORBIDDEN_IMPORT),
    ("cudaGetDriverEntryPoint", RejectReason.FORBIDDEN_IMPORT),
    ("memcpy", None), ("cudaLaunchKernel", None), ("PyFrame_GetBack", None),
    ("PyEval_GetBuiltins", None), ("__cudaRegisterFunction", None),
])
def test_symbol_classes(name, expected):
    cls = symbol_class(name)
    assert (cls[1] if cls else None) is expected


def test_builder_outcome_with_findings_is_a_rejection():
    outcome = {"status": "rejected", "seconds": 1.0, "findings": [
        {"rule": "native_symbol", "reason": "concurrency", "message": "imports `pthread_create`"}]}
    result = inline_build.outcome_to_compile_result(outcome, "sm_90")
    assert result.findings[0].reason is RejectReason.CONCURRENCY
    assert "pthread_create" in result.error


@pytest.mark.slow
def test_real_torch_extension_has_no_finding(tmp_path, monkeypatch):
    """A real pybind11 + torch extension (CPU only, ~25 s): none of what it imports is refused."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "_import_module_from_library", lambda *a, **k: None)
    src = r"""
#include <torch/extension.h>
#include <cmath>
torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    auto y = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (long i = 0; i < x.numel(); ++i) b[i] = std::fmax(a[i], 0.f);
    return y;
}
"""
    cpp_extension.load_inline(name="mmd_symbols_honest", cpp_sources=[src], functions=["relu"],
                              with_cuda=False, build_directory=str(tmp_path), verbose=False)
    assert library_findings(tmp_path / "mmd_symbols_honest.so") == []


@pytest.mark.slow
def test_trusted_builder_rejects_a_disguised_write(tmp_path):
    """build_extension (the trusted build pool's job), CPU-only spec: the library builds, its
    symbols are read, the outcome is a rejection naming `write`; the evaluator's result for it
    is REJECTED before any worker runs."""
    from multiminddev.env.evaluator import _inline_failure
    from multiminddev.env.results import EvalStatus, StageStatus, StaticCheckResult

    src = r"""
#include <torch/extension.h>
#include <unistd.h>
#define EMIT(fd) wr##ite(fd, "x", 1)
torch::Tensor f(torch::Tensor x) { EMIT(5); return x; }
"""
    spec = inline_build.InlineSpec.from_call({"name": "mmd_sym_bad", "cpp_sources": src,
                                              "functions": ["f"], "with_cuda": False})
    outcome = inline_build.build_extension(spec.args, str(tmp_path), "sm_90")
    assert outcome["status"] == "rejected", outcome.get("log")
    result = inline_build.outcome_to_compile_result(outcome, "sm_90")
    assert result.status is StageStatus.FAILED and "`write`" in result.error

    class Problem:
        name = "p"

    evaluation = _inline_failure(Problem(), "candidate", StaticCheckResult(status=StageStatus.OK),
                                 result)
    assert evaluation.status is EvalStatus.REJECTED
    assert evaluation.reject_reason is RejectReason.FORBIDDEN_IMPORT
    assert "write" in evaluation.message
    # A refused library is never tagged: never reused, never loaded.
    assert outcome["sha256"] is None
    again = inline_build.build_extension(spec.args, str(tmp_path), "sm_90")
    assert not again["cached"] and again["status"] == "rejected"
    # The toolchain's own minimal build was made first, tagged, and read: pybind11's imports.
    toolchain = inline_build.toolchain_imports(str(tmp_path), "sm_90", cuda=False)
    assert {"PyModuleDef_Init", "PyFrame_GetBack"} <= toolchain.library
    assert "write" not in toolchain.library | toolchain.objects
    assert "PyModuleDef_Init" in toolchain.objects  # pybind11 is header code: in the objects


def test_toolchain_library_imports_are_not_refused(tmp_path):
    """What the toolchain's own minimal library imports cannot tell honest from hostile."""
    lib = build(tmp_path, "dlsym", DLSYM)
    assert library_findings(lib) != []
    assert library_findings(lib, Toolchain(library=frozenset({"dlsym"}))) == []


def test_candidate_objects_are_checked_beyond_the_toolchain_library(tmp_path):
    """A toolchain whose static archives import `syscall` into every library (libstdc++) does
    not let the candidate's own code call it: its object references it, the reference's do not."""
    src = tmp_path / "raw.cpp"
    src.write_text('#include <unistd.h>\nextern "C" long work() { return syscall(1, 5, "x", 1); }\n')
    obj = tmp_path / "raw.o"
    subprocess.run(["g++", "-c", "-fPIC", "-O2", "-o", str(obj), str(src)], check=True,
                   capture_output=True)
    lib = tmp_path / "libraw.so"
    subprocess.run(["g++", "-shared", "-o", str(lib), str(obj)], check=True, capture_output=True)
    toolchain = Toolchain(library=frozenset({"syscall"}), objects=frozenset())
    assert library_findings(lib, toolchain) == []  # the library alone cannot tell
    findings = library_findings(lib, toolchain, [obj])
    assert [f.reason for f in findings] == [RejectReason.FORBIDDEN_IMPORT]
    assert "`syscall`" in findings[0].message
    assert library_findings(lib, Toolchain(library=frozenset({"syscall"}),
                                           objects=frozenset({"syscall"})), [obj]) == []


def test_rules_are_part_of_the_cache_key():
    spec = inline_build.InlineSpec.from_call({"name": "x", "cpp_sources": "int f();"})
    blob_key = spec.key("sm_90", "2.13.0")
    assert len(blob_key) == 24 and len(native_symbols.rules_digest()) == 16


@pytest.mark.slow
def test_untagged_toolchain_reference_exempts_nothing(tmp_path, monkeypatch):
    """A cache without a usable key cannot vouch for the reference library (it could have been
    planted there): no exemption beyond the fixed list."""
    from multiminddev.cuda import cache_auth

    monkeypatch.setattr(cache_auth, "load_or_create_key", lambda root: None)
    assert inline_build.toolchain_imports(str(tmp_path), "sm_90", cuda=False) == Toolchain()


@pytest.mark.slow
def test_concurrent_first_uses_share_one_toolchain_reference(tmp_path):
    """The build pool's processes asking for the reference at once on a cold cache each get
    the full reference (one builds under the lock, the others read the tagged library)."""
    import concurrent.futures as cf
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        results = list(pool.map(inline_build.toolchain_imports, [str(tmp_path)] * 2,
                                ["sm_90"] * 2, [False] * 2))
    assert results[0] == results[1] and "PyModuleDef_Init" in results[0].library


@pytest.mark.slow
def test_a_tampered_toolchain_record_is_rebuilt(tmp_path):
    """The reference's record is trusted only with its tag: a record widened to exempt `write`
    is thrown away and the reference built again."""
    import json

    first = inline_build.toolchain_imports(str(tmp_path), "sm_90", cuda=False)
    inline_build._toolchain_memo.clear()  # as a fresh build process would
    [record] = (tmp_path / "inline").glob("*/toolchain.json")
    saved = json.loads(record.read_text())
    saved["objects"].append("write")
    record.write_text(json.dumps(saved))
    again = inline_build.toolchain_imports(str(tmp_path), "sm_90", cuda=False)
    assert "write" not in again.objects and again == first
