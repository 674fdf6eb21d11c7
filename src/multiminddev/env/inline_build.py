"""Compat path for KernelBench / Sakana candidates that call ``torch.utils.cpp_extension.load_inline``.

``load_inline`` runs nvcc + ninja (~50 s per candidate on an H200), so:

1. The evaluator reads the call's arguments from the candidate's AST (string literals,
   module-level string constants, ``+`` of those; nothing is executed) and builds the extension
   in parallel CPU processes (``InlineBuilder``), in a cache directory keyed by the sources,
   flags, torch version and GPU arch. Each build runs in a fresh process isolated and limited
   like a worker, with an environment built at exec (``inline_build_process``), and its sources
   are refused before any compiler runs if they would read a file other than themselves and
   the toolkit's, torch's and the C++ library's headers (``source_refusals``). The build
   process never loads the built library.
2. In the worker, ``install_routing`` replaces ``load_inline`` with a function that computes
   the same key from the real arguments and loads the cached ``.so`` (no subprocess, no rebuild);
   on a cache miss (arguments computed at run time) it builds in the worker, in a private
   directory: the shared cache is written by the trusted builder only.
3. Built libraries are authenticated: the builder tags each with an HMAC over its SHA-256
   (``cache_auth``; the key never reaches a worker) and rebuilds one whose tag does not verify.
   The evaluator re-checks the tags before each job and sends the digests in the job
   (``job["inline_libraries"]``: key -> SHA-256); given them (``expect_libraries``), the worker
   loads only a private copy whose digest matches, so a library planted or swapped in the
   shared cache is never loaded.

Where torch has no CUDA build or nvcc is missing, candidates get a clear SKIPPED compile
result (status no_gpu / infra_error) instead of an exception.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import contextlib
import copy
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev import pyast
from multiminddev.cuda import cache_auth
from multiminddev.cuda.include_policy import include_refusals
from multiminddev.env import inline_build_process, native_symbols
from multiminddev.env.inline_build_process import InlineBuildLimits
from multiminddev.env.native_symbols import Toolchain
from multiminddev.env.results import (
    CompileResult,
    Diagnostic,
    Finding,
    KernelResources,
    RejectReason,
    StageStatus,
)

SPEC_ARGS = (
    "name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_ldflags", "extra_include_paths", "with_cuda", "with_pytorch_error_handling",
    "no_implicit_headers", "is_python_module",
)
CUDA_PRELUDE_LINES = 3  # load_inline prepends three #include lines to cuda.cu


class InlineBuildUnavailable(RuntimeError):
    """load_inline cannot build here (CPU-only torch or no nvcc); not the candidate's fault."""


class InlineBuildError(RuntimeError):
    """The candidate's load_inline sources did not build; ``.result`` has the diagnostics."""

    def __init__(self, result: CompileResult):
        self.result = result
        super().__init__(f"load_inline build failed: {result.error}")


class InlineLibraryRefused(RuntimeError):
    """A library the candidate built imports refused symbols (``native_symbols``); the
    candidate is rejected with ``.findings`` before the library is loaded."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__(findings[0].message if findings else "built library refused")


def refused_symbols(library: Path, toolchain: Toolchain | None = None,
                    objects: list[Path] | None = None) -> list[dict[str, Any]]:
    """``native_symbols.library_findings`` of a built library (and the candidate's compiled
    objects beside it), as JSON-able dicts."""
    return [{"rule": f.rule, "reason": f.reason.value, "message": f.message}
            for f in native_symbols.library_findings(library, toolchain or Toolchain(),
                                                     objects or ())]


def _findings(outcome: dict[str, Any]) -> list[Finding]:
    return [Finding(rule=f["rule"], reason=RejectReason(f["reason"]), message=f["message"])
            for f in outcome.get("findings") or ()]


@dataclass(kw_only=True, frozen=True)
class InlineSpec:
    """The arguments of one ``load_inline`` call that determine the built library."""

    args: dict[str, Any]

    @classmethod
    def from_call(cls, bound: dict[str, Any]) -> InlineSpec:
        norm: dict[str, Any] = {}
        for key in SPEC_ARGS:
            value = bound.get(key)
            if key in ("cpp_sources", "cuda_sources") and isinstance(value, str):
                value = [value]
            if isinstance(value, tuple):
                value = list(value)
            norm[key] = value
        for key, default in (("with_pytorch_error_handling", True), ("no_implicit_headers", False),
                             ("is_python_module", True)):
            if norm[key] is None:
                norm[key] = default
        return cls(args=norm)

    def key(self, arch: str, torch_version: str) -> str:
        # The symbol rules too: a cached build was checked under the rules of its key.
        blob = json.dumps([self.args, arch, torch_version, native_symbols.rules_digest()],
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def module_name(self, key: str) -> str:
        base = re.sub(r"\W", "_", str(self.args.get("name") or "ext"))[:40]
        return f"{base}_mmd_{key[:12]}"


_GLOBAL_RE = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)")


def kernel_names(cuda_sources: list[str]) -> list[str]:
    """``__global__`` function names in load_inline CUDA sources (for kernel-time coverage)."""
    return sorted({m.group(1) for src in cuda_sources for m in _GLOBAL_RE.finditer(src)})


def torch_can_build_cuda() -> str | None:
    """None when this torch can build CUDA extensions, else the reason it cannot."""
    import torch

    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build; load_inline candidates build only "
                "on a machine with a CUDA build of torch and nvcc")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return "nvcc not found (CUDA_HOME unset); install the CUDA toolkit to build load_inline candidates"
    return None


def inline_arch(config_arch: str | None) -> str:
    from multiminddev.cuda.compiler import DEFAULT_ARCH, current_device_arch

    return config_arch or current_device_arch() or DEFAULT_ARCH


def _torch_version() -> str:
    import torch

    return torch.__version__


def _arch_list(arch: str) -> str:
    digits = re.sub(r"\D", "", arch)
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 else "9.0"


# ---------------------------------------------------------------- static argument extraction


def extract_inline_specs(source: str) -> list[InlineSpec] | None:
    """Specs of every ``load_inline(...)`` call whose arguments are static; None if any is not."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return None
    consts = _module_constants(tree)
    specs = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _callee_name(node.func) == "load_inline"):
            continue
        bound = _bind_static(node, consts)
        if bound is None:
            return None
        specs.append(InlineSpec.from_call(bound))
    return specs


def _callee_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                value = _static_value(node.value, consts)
                if value is not _UNKNOWN:
                    consts[target.id] = value
    return consts


_UNKNOWN = object()


def _static_value(node: ast.expr, consts: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id, _UNKNOWN)
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_static_value(e, consts) for e in node.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if isinstance(node, ast.Dict):
        keys = [_static_value(k, consts) if k is not None else _UNKNOWN for k in node.keys]
        vals = [_static_value(v, consts) for v in node.values]
        if any(x is _UNKNOWN for x in keys + vals):
            return _UNKNOWN
        return dict(zip(keys, vals, strict=True))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _static_value(node.left, consts), _static_value(node.right, consts)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        try:
            return left + right
        except TypeError:
            return _UNKNOWN
    return _UNKNOWN


def _bind_static(call: ast.Call, consts: dict[str, Any]) -> dict[str, Any] | None:
    from torch.utils.cpp_extension import load_inline

    params = list(inspect.signature(load_inline).parameters)
    bound: dict[str, Any] = {}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for name, arg in zip(params, call.args, strict=False):
        bound[name] = _static_value(arg, consts)
    for kw in call.keywords:
        bound[kw.arg] = _static_value(kw.value, consts)
    if any(bound.get(k, None) is _UNKNOWN for k in SPEC_ARGS):
        return None
    return bound


# ---------------------------------------------------------------- building (CPU process pool)


def build_dir_for(cache_root: Path, key: str) -> Path:
    return cache_root / "inline" / key


def library_path(build_dir: Path, module_name: str) -> Path:
    return build_dir / f"{module_name}.so"


def library_digest(library: Path) -> str:
    return hashlib.sha256(library.read_bytes()).hexdigest()


def _tag_path(library: Path) -> Path:
    return library.with_name(library.name + ".tag")


def authentic_digest(library: Path, key: str, secret: bytes | None) -> str | None:
    """The library's SHA-256 when its tag (written by the trusted builder) verifies; None for a
    missing, untagged, planted or altered library."""
    if secret is None:
        return None
    try:
        digest = library_digest(library)
        tag = _tag_path(library).read_text().strip()
    except OSError:
        return None
    return digest if cache_auth.tag_matches(secret, tag, key.encode(), digest.encode()) else None


def tag_library(library: Path, key: str, secret: bytes) -> str:
    """Tag a library the trusted builder just built; returns its SHA-256."""
    digest = library_digest(library)
    _tag_path(library).write_text(cache_auth.entry_tag(secret, key.encode(), digest.encode()))
    return digest


# A minimal honest extension of each kind: what the toolchain (pybind11, torch, the CUDA
# runtime) imports into every build, whatever its versions. The symbol check never refuses these.
_TOOLCHAIN_CPP = "torch::Tensor mmd_toolchain(torch::Tensor x);"
_TOOLCHAIN_CUDA = r"""
#include <torch/extension.h>
__global__ void mmd_toolchain_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor mmd_toolchain(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty_like(x);
    long n = x.numel();
    mmd_toolchain_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_TOOLCHAIN_CPU = r"""
#include <torch/extension.h>
torch::Tensor mmd_toolchain(torch::Tensor x) {
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    return x.clone();
}
"""


def toolchain_spec(cuda: bool) -> InlineSpec:
    if cuda:
        call = {"name": "mmd_toolchain", "cpp_sources": _TOOLCHAIN_CPP,
                "cuda_sources": _TOOLCHAIN_CUDA, "functions": ["mmd_toolchain"]}
    else:
        call = {"name": "mmd_toolchain", "cpp_sources": _TOOLCHAIN_CPU,
                "functions": ["mmd_toolchain"], "with_cuda": False}
    return InlineSpec.from_call(call)


def _builds_cuda(spec_args: dict[str, Any]) -> bool:
    return bool(spec_args.get("cuda_sources")) and spec_args.get("with_cuda") is not False


def toolchain_imports(cache_root: str, arch: str, cuda: bool) -> Toolchain:
    """``native_symbols.Toolchain`` of the minimal extension (``toolchain_spec``) built by this
    toolchain into the shared cache (once; later calls read its tagged record). Empty when the
    cache has no usable key (nothing could vouch for the record) or the build failed: the fixed
    refusal list alone then applies."""
    memo = (cache_root, arch, cuda)
    if memo in _toolchain_memo:  # this trusted process read it already
        return _toolchain_memo[memo]
    # One build at a time across the pool's processes: another would find the reference built
    # but not yet tagged, take it for a planted one and delete it mid-tagging.
    lock_path = Path(cache_root) / "inline" / "toolchain.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        toolchain = _read_toolchain(cache_root, arch, cuda)
    if toolchain is not None:
        _toolchain_memo[memo] = toolchain
    return toolchain or Toolchain()


def _read_toolchain(cache_root: str, arch: str, cuda: bool) -> Toolchain | None:
    """The reference's symbols, from its tagged record, else from a fresh build (recorded and
    tagged then); None when nothing can be vouched for. The record is what is trusted, not the
    objects left beside the library, which a worker could replace."""
    secret = cache_auth.load_or_create_key(Path(cache_root))
    if secret is None:
        return None
    spec = toolchain_spec(cuda)
    key = spec.key(arch, _torch_version())
    record = build_dir_for(Path(cache_root), key) / "toolchain.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(record.read_text())
        blob = json.dumps([saved["library"], saved["objects"]]).encode()
        if cache_auth.tag_matches(secret, saved["tag"], key.encode(), blob):
            return Toolchain(library=frozenset(saved["library"]),
                             objects=frozenset(saved["objects"]))
    # No valid record: build from scratch (a cached library's objects are not trusted).
    shutil.rmtree(build_dir_for(Path(cache_root), key), ignore_errors=True)
    outcome = _build(spec.args, cache_root, arch, None)
    if outcome["status"] != "ok" or outcome["sha256"] is None:
        return None
    library = Path(outcome["library"])
    objects: set[str] = set()
    for obj in _objects(library.parent):
        objects.update(native_symbols.undefined_symbols(obj, dynamic=False))
    if not objects:
        return None
    library_symbols = sorted(native_symbols.undefined_symbols(library))
    blob = json.dumps([library_symbols, sorted(objects)]).encode()
    record.write_text(json.dumps({"library": library_symbols, "objects": sorted(objects),
                                  "tag": cache_auth.entry_tag(secret, key.encode(), blob)}))
    return Toolchain(library=frozenset(library_symbols), objects=frozenset(objects))


_toolchain_memo: dict[tuple[str, str, bool], Toolchain] = {}


def _objects(build_dir: Path) -> list[Path]:
    return sorted(build_dir.glob("*.o"))


# Compiler flags that make nvcc or g++ read a file or a directory other than the sources
# (-include, -imacros, -I, -isystem, response files, flags handed on to another tool).
_FILE_READING_FLAG = re.compile(
    r"(-I|-i(nclude|macros|system|quote|dirafter|prefix|withprefix)|--include-path|"
    r"--pre-include|--system-include|-Wp,|-Xcompiler|--compiler-options|-Xpreprocessor|"
    r"--options-file|-optf|-specs|--sysroot|-B|@)", re.IGNORECASE)


def source_refusals(spec_args: dict[str, Any]) -> list[dict[str, Any]]:
    """Findings (JSON-able) for every route by which the build's compilers would read a file
    other than the candidate's sources and the toolkit's, torch's and the C++ library's headers
    (``include_policy``, include paths, file-reading flags); empty: it may build."""
    found = []
    for arg in ("cpp_sources", "cuda_sources"):
        for text in spec_args.get(arg) or ():
            found += [{"rule": r.rule, "reason": RejectReason.FILE_ACCESS.value,
                       "message": f"{arg}: {r.message}"} for r in include_refusals(str(text))]
    for path in spec_args.get("extra_include_paths") or ():
        found.append({"rule": "include_path_refused", "reason": RejectReason.FILE_ACCESS.value,
                      "message": f"extra_include_paths {path!r} is refused: a build reads only "
                      "torch's and CUDA's headers; leave it out"})
    for arg in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags"):
        for flag in spec_args.get(arg) or ():
            if _FILE_READING_FLAG.match(str(flag).strip()):
                found.append({"rule": "include_flag_refused",
                              "reason": RejectReason.FILE_ACCESS.value,
                              "message": f"{arg} {flag!r} is refused: it makes the compiler "
                              "read a file other than your sources; leave it out"})
    return found


def build_extension(spec_args: dict[str, Any], cache_root: str, arch: str) -> dict[str, Any]:
    """Build one extension without loading it (runs in a build process). JSON-able outcome,
    with the library's SHA-256 when it built and passed the symbol check (or an authentic build
    was already there), and the check's findings."""
    refused = source_refusals(spec_args)
    if refused:  # before anything reads the cache or starts a compiler
        return {"status": "rejected", "cached": False, "seconds": 0.0, "log": "",
                "sha256": None, "findings": refused}
    toolchain = toolchain_imports(cache_root, arch, _builds_cuda(spec_args))
    outcome = _build(spec_args, cache_root, arch, toolchain)
    outcome.pop("library", None)
    return outcome


def _build(spec_args: dict[str, Any], cache_root: str, arch: str, toolchain: Toolchain | None
           ) -> dict[str, Any]:
    """One build into the shared cache. ``toolchain`` None: the trusted reference build (no
    check, always tagged). Otherwise only a library that passes the symbol check is tagged, so
    an authentic cached library passed it under the rules of its key at build time; its
    dynamic imports are read again on each use."""
    import torch
    from torch.utils import cpp_extension

    spec = InlineSpec(args=spec_args)
    key = spec.key(arch, torch.__version__)
    name = spec.module_name(key)
    build_dir = build_dir_for(Path(cache_root), key)
    refused = source_refusals(spec_args)
    if refused:  # before anything reads the cache or starts a compiler
        return {"status": "rejected", "cached": False, "seconds": 0.0, "log": "", "key": key,
                "sha256": None, "findings": refused, "library": ""}
    secret = cache_auth.load_or_create_key(Path(cache_root))
    start = time.perf_counter()
    library = library_path(build_dir, name)
    if library.exists():
        digest = authentic_digest(library, key, secret)
        if digest is not None:
            refused = refused_symbols(library, toolchain)
            return {"status": "rejected" if refused else "ok", "cached": True, "seconds": 0.0,
                    "log": "", "key": key, "sha256": digest, "findings": refused,
                    "library": str(library)}
        # Planted, altered or untagged: build from scratch (ninja would call a newer planted
        # library up to date).
        shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_CUDA_ARCH_LIST"] = _arch_list(arch)
    # Build only: the untrusted library is loaded later, inside the sandboxed worker.
    cpp_extension._import_module_from_library = lambda *a, **k: None
    # torch skips a build whose name and sources this process built before, even when the
    # directory was wiped since (a planted or altered library): forget it, so ninja runs.
    with contextlib.suppress(AttributeError):
        cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)
    # Copies: load_inline inserts its headers and bindings into the source lists in place.
    kwargs = {k: copy.deepcopy(v) for k, v in spec_args.items() if k != "name" and v is not None}
    digest, refused = None, []
    try:
        cpp_extension.load_inline(name=name, build_directory=str(build_dir), verbose=False, **kwargs)
        log = ""
        # What the library and the candidate's objects reference, under their real names
        # (macros and renames cannot hide them).
        if toolchain is not None:
            refused = refused_symbols(library, toolchain, _objects(build_dir))
        status = "rejected" if refused else "ok"
        if secret is not None and not refused:
            digest = tag_library(library, key, secret)
    except Exception as exc:  # noqa: BLE001 - the compiler's output is in the message
        status, log = "failed", str(exc)
    return {"status": status, "cached": False, "seconds": time.perf_counter() - start,
            "log": log[-20000:], "key": key, "sha256": digest, "findings": refused,
            "library": str(library)}


def outcome_to_compile_result(outcome: dict[str, Any], arch: str) -> CompileResult:
    ok = outcome.get("status") == "ok"
    log = outcome.get("log", "")
    findings = _findings(outcome)
    if findings:  # built, but imports refused symbols: FAILED with the findings (a rejection)
        return CompileResult(status=StageStatus.FAILED, backend="load_inline", arch=arch,
                             seconds=float(outcome.get("seconds", 0.0)),
                             cached=bool(outcome.get("cached", False)), findings=findings,
                             error=findings[0].message)
    return CompileResult(
        status=StageStatus.OK if ok else StageStatus.FAILED,
        backend="load_inline",
        arch=arch,
        seconds=float(outcome.get("seconds", 0.0)),
        cached=bool(outcome.get("cached", False)),
        log=log,
        diagnostics=parse_build_diagnostics(log),
        error="" if ok else _first_error(log),
    )


_NVCC_DIAG = re.compile(r"cuda\.cu\((\d+)\): (error|warning)[^:]*: (.*)")
_GCC_DIAG = re.compile(r"main\.cpp:(\d+):\d+: (error|warning): (.*)")


def parse_build_diagnostics(log: str) -> list[Diagnostic]:
    """nvcc / g++ messages; cuda.cu line numbers are mapped back to the user's cuda_sources."""
    found = []
    for line in log.splitlines():
        if m := _NVCC_DIAG.search(line):
            found.append(Diagnostic(severity=m.group(2), message=f"cuda_sources: {m.group(3)}",
                                    line=max(1, int(m.group(1)) - CUDA_PRELUDE_LINES)))
        elif m := _GCC_DIAG.search(line):
            found.append(Diagnostic(severity=m.group(2), message=f"main.cpp: {m.group(3)}",
                                    line=int(m.group(1))))
    return found


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:500]
    return log.strip()[-500:] or "load_inline build failed"


def build_in_process(spec_args: dict[str, Any], cache_root: str, arch: str,
                     limits: InlineBuildLimits) -> dict[str, Any]:
    """``build_extension`` in a fresh, isolated and limited process whose environment is built
    at exec (``inline_build_process``); its JSON outcome."""
    from torch.utils import cpp_extension

    private = inline_build_process.private_build_dir()
    try:
        env = inline_build_process.build_environment(private, _arch_list(arch),
                                                     cpp_extension.CUDA_HOME, limits.jobs)
        return inline_build_process.run_build_process(
            {"spec": spec_args, "cache_root": cache_root, "arch": arch}, env, private, limits)
    finally:
        inline_build_process.remove_private_build_dir(private)


class InlineBuilder:
    """Parallel, deduplicated ``load_inline`` builds, each in its own isolated, limited process
    (``inline_build_process``)."""

    def __init__(self, cache_root: Path, arch: str | None, workers: int = 2, *,
                 limits: InlineBuildLimits | None = None):
        self.cache_root = cache_root
        self.arch = inline_arch(arch)
        self.limits = limits or InlineBuildLimits()
        self._workers = workers
        self._pool: cf.ThreadPoolExecutor | None = None
        self._futures: dict[str, cf.Future] = {}
        self._lock = threading.Lock()

    def submit(self, spec: InlineSpec) -> tuple[cf.Future, bool]:
        """The build's future, and whether this call started it (False: an earlier
        evaluation in this process already asked for the same library)."""
        import torch

        key = spec.key(self.arch, torch.__version__)
        with self._lock:
            fresh = key not in self._futures
            if fresh:
                if self._pool is None:
                    # Threads that each wait on one build process (``inline_build_process``).
                    self._pool = cf.ThreadPoolExecutor(self._workers,
                                                       thread_name_prefix="mmd-inline-build")
                self._futures[key] = self._pool.submit(
                    build_in_process, spec.args, str(self.cache_root), self.arch, self.limits)
            return self._futures[key], fresh

    def build(self, specs: list[InlineSpec], timeout_s: float) -> CompileResult:
        """Build all of a candidate's extensions; one merged CompileResult."""
        reason = torch_can_build_cuda()
        if reason is not None:
            return CompileResult(status=StageStatus.SKIPPED, backend="load_inline",
                                 arch=self.arch, error=reason)
        submitted = [self.submit(s) for s in specs]
        try:
            outcomes = [dict(f.result(timeout=timeout_s)) for f, _ in submitted]
        except cf.TimeoutError:
            return CompileResult(status=StageStatus.TIMEOUT, backend="load_inline", arch=self.arch,
                                 error=f"load_inline build ran past {timeout_s:.0f} s")
        except Exception as exc:  # noqa: BLE001 - a crashed build process is infrastructure
            return CompileResult(status=StageStatus.ERROR, backend="load_inline", arch=self.arch,
                                 error=f"build process failed: {exc}")
        for outcome, (future, fresh) in zip(outcomes, submitted, strict=True):
            if outcome.get("status") in ("timeout", "error"):  # not the candidate's sources
                with self._lock:  # the next evaluation of these sources builds again
                    self._futures = {k: f for k, f in self._futures.items() if f is not future}
                status = StageStatus.TIMEOUT if outcome["status"] == "timeout" else StageStatus.ERROR
                return CompileResult(status=status, backend="load_inline", arch=self.arch,
                                     seconds=float(outcome.get("seconds", 0.0)),
                                     error=str(outcome.get("error", "")))
            if not fresh and outcome.get("status") == "ok":  # built for an earlier evaluation
                outcome.update(cached=True, seconds=0.0)
        results = [outcome_to_compile_result(o, self.arch) for o in outcomes]
        failed = [r for r in results if r.status is not StageStatus.OK]
        merged = failed[0] if failed else results[0] if results else CompileResult(
            status=StageStatus.SKIPPED, backend="load_inline", arch=self.arch)
        merged.seconds = sum(r.seconds for r in results)
        merged.cached = all(r.cached for r in results)
        return merged

    def verified_digests(self, specs: list[InlineSpec]) -> dict[str, str] | None:
        """Key -> SHA-256 of each built library of ``specs`` whose tag verifies now (what the
        evaluator sends in the job). A library that no longer verifies is left out and
        forgotten, so the next ``build`` makes it again. None when this cache has no usable
        key (then nothing can be verified; see ``cache_auth``)."""
        import torch

        secret = cache_auth.load_or_create_key(self.cache_root)
        if secret is None:
            return None
        digests: dict[str, str] = {}
        for spec in specs:
            key = spec.key(self.arch, torch.__version__)
            library = library_path(build_dir_for(self.cache_root, key), spec.module_name(key))
            digest = authentic_digest(library, key, secret)
            if digest is not None:
                digests[key] = digest
            else:
                with self._lock:
                    self._futures.pop(key, None)
        return digests

    def build_verified(self, specs: list[InlineSpec], timeout_s: float
                       ) -> tuple[CompileResult, dict[str, str] | None]:
        """``build``, then the verified digests; a library that fails its check (written by
        someone else since it was built) is built once more."""
        result = self.build(specs, timeout_s)
        if result.status is not StageStatus.OK:
            return result, {}
        digests = self.verified_digests(specs)
        if digests is not None and len(digests) < len({s.key(self.arch, _torch_version())
                                                       for s in specs}):
            result = self.build(specs, timeout_s)
            digests = self.verified_digests(specs) if result.status is StageStatus.OK else {}
        return result, digests

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


# ---------------------------------------------------------------- routing inside the worker

inline_log: list[CompileResult] = []
# Key -> SHA-256 of the prebuilt libraries this job may load (the evaluator verified them);
# None: no expectations were given, prebuilt libraries load as they are.
_expected_libraries: dict[str, str] | None = None


def expect_libraries(digests: dict[str, str] | None) -> None:
    """The worker's per-job list of verified prebuilt libraries (``job["inline_libraries"]``);
    call before the candidate loads. With a list, a prebuilt library loads only from a private
    copy whose digest matches; one not on the list is a cache miss."""
    global _expected_libraries
    _expected_libraries = dict(digests) if digests is not None else None


def load_verified_copy(build_dir: Path, name: str, expected: str, is_python_module: bool) -> Any:
    """Copy the library into a private directory, check its SHA-256, load the copy (so a swap
    in the shared cache after the check cannot take effect)."""
    from torch.utils import cpp_extension

    data = library_path(build_dir, name).read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise InlineBuildUnavailable(
            "the prebuilt load_inline library changed after the evaluator verified it (another "
            "process wrote the shared cache); evaluate again: the evaluator rebuilds it")
    private = Path(tempfile.mkdtemp(prefix=f"mmd-inline-{name[-12:]}-"))
    library_path(private, name).write_bytes(data)
    return cpp_extension._import_module_from_library(name, str(private), is_python_module)


def install_routing(cache_root: Path, arch: str) -> None:
    """Route ``load_inline`` to the build cache (in the worker, before candidate import)."""
    import torch
    from torch.utils import cpp_extension

    real = cpp_extension.load_inline
    if getattr(real, "_mmd_routed", False):
        return
    signature = inspect.signature(real)

    def routed_load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = dict(bound.arguments)
        reason = torch_can_build_cuda()
        if reason is not None:
            raise InlineBuildUnavailable(reason)
        spec = InlineSpec.from_call(call)
        refused = source_refusals(spec.args)
        if refused:  # before any compiler reads the sources
            result = outcome_to_compile_result({"status": "rejected", "findings": refused}, arch)
            inline_log.append(result)
            raise InlineLibraryRefused(result.findings)
        key = spec.key(arch, torch.__version__)
        name = spec.module_name(key)
        build_dir = build_dir_for(cache_root, key)
        start = time.perf_counter()
        prebuilt = library_path(build_dir, name).exists()
        expected = None if _expected_libraries is None else _expected_libraries.get(key)
        if prebuilt and _expected_libraries is not None and expected is None:
            prebuilt = False  # not verified for this job: build privately, never load it
        if prebuilt and expected is not None:
            module = load_verified_copy(build_dir, name, expected,
                                        bool(spec.args["is_python_module"]))
        elif prebuilt:
            module = cpp_extension._import_module_from_library(
                name, str(build_dir), bool(spec.args["is_python_module"]))
        else:
            # Built by candidate-controlled code: never into the shared cache, where a later
            # evaluation would load it as prebuilt. A fresh directory of this process instead.
            build_dir = Path(tempfile.mkdtemp(prefix=f"mmd-inline-{key[:12]}-"))
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _arch_list(arch))
            rest = {k: v for k, v in call.items() if k not in ("name", "build_directory")}
            load = cpp_extension._import_module_from_library
            cpp_extension._import_module_from_library = lambda *a, **k: None  # build only
            try:
                real(name=name, build_directory=str(build_dir), **rest)
            except Exception as exc:  # noqa: BLE001 - nvcc/g++ output is in the message
                outcome = {"status": "failed", "seconds": time.perf_counter() - start,
                           "log": str(exc)[-20000:]}
                result = outcome_to_compile_result(outcome, arch)
                inline_log.append(result)
                raise InlineBuildError(result) from None
            finally:
                cpp_extension._import_module_from_library = load
            # The symbol check of the trusted builder, before this library is ever loaded (the
            # fixed list alone: this path is for run-time arguments, which the static checks
            # already refuse).
            outcome = {"status": "ok", "seconds": time.perf_counter() - start,
                       "findings": refused_symbols(library_path(build_dir, name),
                                                  objects=_objects(build_dir))}
            if outcome["findings"]:
                result = outcome_to_compile_result(outcome, arch)
                inline_log.append(result)
                raise InlineLibraryRefused(result.findings)
            module = load(name, str(build_dir), bool(spec.args["is_python_module"]))
        inline_log.append(CompileResult(
            status=StageStatus.OK, backend="load_inline", arch=arch,
            seconds=time.perf_counter() - start, cached=prebuilt,
            kernels=[KernelResources(name=n) for n in kernel_names(spec.args["cuda_sources"] or [])]))
        return module

    routed_load_inline._mmd_routed = True  # type: ignore[attr-defined]
    cpp_extension.load_inline = routed_load_inline
