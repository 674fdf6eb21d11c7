"""NVRTC compilation through NVIDIA's ``cuda.core``, with a disk cache and ptxas resource parsing.

Compiling needs no GPU: give ``arch`` ("sm_90") on a machine without one. Results are
``CompileResult`` dataclasses; a broken kernel is ``StageStatus.FAILED`` with diagnostics
carrying line numbers, never an exception.

The disk cache is authenticated (``cache_auth``): each entry's cubin and compile result hold an
HMAC made with the cache's secret, so a cubin planted under another source's key is rebuilt,
never loaded. Evaluation workers do not use the shared cache at all: they point
``$MULTIMINDDEV_CACHE`` at a private directory of their own before candidate code loads.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from multiminddev.core.results import (
    CompileResult,
    Diagnostic,
    Finding,
    KernelResources,
    RejectReason,
    StageStatus,
    _from_jsonable,
    _to_jsonable,
)
from multiminddev.cuda import cache_auth
from multiminddev.cuda.include_policy import include_refusals

DEFAULT_ARCH = "sm_90"
# Authenticated entries live apart from the unauthenticated ones of older versions ("nvrtc"),
# which are never read again.
CACHE_SUBDIR = "nvrtc-signed"
SHIM_INCLUDE_DIR = Path(__file__).parent / "include"
# A define is a name, or a name given a number ("TILE=32", "SCALE=0.5f", "EPS=1e-05"): one
# preprocessing number carries no code into the kernel, so a value computed in Python is safe
# once it is checked here, where it becomes a -D option.
DEFINE = re.compile(r"[A-Za-z_]\w*(=[-+]?(\d[\w.]*|\.\d\w*)([eE][-+]?\d+[fFlL]?)?)?")


def define_options(defines: Sequence[str] | Mapping[str, int | float | bool]) -> tuple[str, ...]:
    """``defines`` as -D options: ``("TILE=32", "FAST")`` or ``{"TILE": 32, "SCALE": 0.5}``.

    Raises ValueError naming the entry unless each is a plain ``str`` name or name=number, or a
    name mapped to a plain int/float/bool (subclasses refused: their text is theirs to choose);
    TypeError for a bare string.
    """
    if isinstance(defines, Mapping):
        entries = []
        for name, value in defines.items():
            if type(name) is not str or type(value) not in (int, float, bool):
                raise ValueError(f"defines entry of a {type(name).__name__} name and a "
                                 f"{type(value).__name__} value: names are str, values numbers "
                                 "(int, float or bool); write code in the kernel source")
            text = float.__repr__(value) if type(value) is float else int.__repr__(int(value))
            entries.append(f"{name}={text}")
    elif isinstance(defines, str):
        raise TypeError(f"defines={defines!r}: pass a list of defines, e.g. [\"TILE=32\"]")
    else:
        entries = list(defines)
    for entry in entries:
        if type(entry) is not str or not DEFINE.fullmatch(entry):
            shown = repr(entry) if type(entry) is str else f"of type {type(entry).__name__}"
            raise ValueError(f"define {shown}: defines are a name or name=number "
                             "(\"TILE=32\"); write code in the kernel source")
    return tuple(entries)


PROGRAM_NAME = "default_program"


@dataclass(kw_only=True, frozen=True)
class CompileOptions:
    arch: str | None = None  # None -> the current GPU's arch, else DEFAULT_ARCH
    std: str = "c++17"
    use_fast_math: bool = False
    # Directories under the shipped include directories (``cuda_include_paths``) only: a
    # compiler reads the candidate's source and the shipped headers, nothing else.
    extra_include_paths: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    cache_dir: str | None = None  # None -> $MULTIMINDDEV_CACHE or ~/.cache/multiminddev
    use_cache: bool = True

    def __post_init__(self) -> None:
        if self.arch is not None and not re.fullmatch(r"sm_\d+[a-z]?", self.arch):
            raise ValueError(f"arch must look like 'sm_90' or 'sm_90a', got {self.arch!r}")
        define_options(self.defines)


@dataclass(kw_only=True)
class CompiledModule:
    """A compiled cubin plus what the compiler said about it."""

    cubin: bytes
    result: CompileResult
    kernel_names: list[str] = field(default_factory=list)


def cache_root(options: CompileOptions | None = None) -> Path:
    if options is not None and options.cache_dir:
        return Path(options.cache_dir)
    env = os.environ.get("MULTIMINDDEV_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "multiminddev"


@functools.cache
def cuda_include_paths() -> tuple[str, ...]:
    """CUDA runtime and CCCL headers (cuda_fp16.h, cooperative_groups.h, cuda/std/...)."""
    paths = [str(SHIM_INCLUDE_DIR)]
    try:
        import cuda.pathfinder as pathfinder

        for lib in ("cudart", "cccl"):
            try:
                found = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001 - a missing header package is reported below
                found = None
            if found:
                paths.append(str(found))
    except ImportError:
        pass
    for guess in ("/usr/local/cuda/include", "/usr/local/cuda/include/cccl"):
        if Path(guess).is_dir() and guess not in paths:
            paths.append(guess)
    return tuple(paths)


@functools.cache
def current_device_arch() -> str | None:
    """The arch of GPU 0 ("sm_90"), or None on a machine without a usable GPU."""
    try:
        from cuda.core import Device

        dev = Device(0)
        major, minor = dev.compute_capability
        return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no driver / no device both mean "no GPU"
        return None


def resolve_arch(options: CompileOptions) -> str:
    return options.arch or current_device_arch() or DEFAULT_ARCH


def _cache_key(source: str, arch: str, options: CompileOptions) -> str:
    blob = json.dumps(
        [source, arch, options.std, options.use_fast_math, options.defines, _toolchain_version()]
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@functools.cache
def _toolchain_version() -> str:
    try:
        import cuda.core

        return f"cuda.core {cuda.core.__version__}"
    except ImportError:
        return "none"


_DIAG_RE = re.compile(r"^[^\s(]*\((\d+)\): (error|warning|catastrophic error)[^:]*: (.*)$")
_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_FUNC_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def _without_nul(log: str) -> str:
    """NVRTC's log is a C string: its terminating NUL (and any other) is no text to keep."""
    return log.replace("\x00", "")


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """NVRTC messages (``default_program(12): error: ...``) with their source line."""
    diagnostics = []
    for line in log.splitlines():
        match = _DIAG_RE.match(line.strip())
        if match:
            severity = "error" if "error" in match.group(2) else "warning"
            diagnostics.append(
                Diagnostic(severity=severity, message=match.group(3), line=int(match.group(1)))
            )
    return diagnostics


def parse_ptxas_resources(log: str) -> list[KernelResources]:
    """Per-kernel registers, shared memory, stack and spills from ``ptxas -v`` output."""
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in log.splitlines():
        if m := _ENTRY_RE.search(line):
            current = kernels.setdefault(m.group(1), KernelResources(name=m.group(1)))
        elif m := _FUNC_PROPS_RE.search(line):
            current = kernels.setdefault(m.group(1), KernelResources(name=m.group(1)))
        elif current is not None and (m := _STACK_RE.search(line)):
            current.stack_frame_bytes = int(m.group(1))
            current.spill_store_bytes = int(m.group(2))
            current.spill_load_bytes = int(m.group(3))
        elif current is not None and (m := _USED_RE.search(line)):
            current.registers = int(m.group(1))
            current.barriers = int(m.group(2) or 0)
            current.shared_mem_bytes = int(m.group(3) or 0)
    return list(kernels.values())


def compile_cuda(source: str, options: CompileOptions | None = None) -> CompiledModule:
    """Compile CUDA C++ to a cubin with NVRTC; never raises for a bad kernel.

    NVRTC reads only ``source`` and headers under ``cuda_include_paths()`` (the shipped shims
    and the CUDA toolkit's headers): a source that would open any other file (``include_policy``)
    or an include path outside those directories is FAILED with a finding before NVRTC runs,
    and NVRTC searches neither the working directory nor the system's."""
    options = options or CompileOptions()
    arch = resolve_arch(options)
    refused = refused_compile(source, options, arch)
    if refused is not None:
        return CompiledModule(cubin=b"", result=refused)
    key = _cache_key(source, arch, options)
    root = cache_root(options)
    cache_dir = root / CACHE_SUBDIR
    secret = cache_auth.load_or_create_key(root) if options.use_cache else None
    if secret is not None:
        hit = _read_cache(cache_dir, key, secret)
        if hit is not None:
            return hit
    start = time.perf_counter()
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError as exc:
        result = CompileResult(
            status=StageStatus.ERROR,
            arch=arch,
            error=f"cuda.core is not installed ({exc}); run: pip install cuda-core cuda-bindings "
            "'cuda-toolkit[nvrtc]'",
        )
        return CompiledModule(cubin=b"", result=result)
    program_options = ProgramOptions(
        arch=arch,
        std=options.std,
        ptxas_options=["-v"],
        include_path=[*cuda_include_paths(), *options.extra_include_paths],
        # NVRTC searches a quoted include first in the program's directory (the working
        # directory for an unnamed program): naming it inside the shipped shim directory keeps
        # that search within the shipped headers. The log is given back under the plain name.
        name=str(SHIM_INCLUDE_DIR / PROGRAM_NAME),
        use_fast_math=options.use_fast_math or None,
        define_macro=list(options.defines) or None,
    )
    log = io.StringIO()
    try:
        program = Program(source, "c++", options=program_options)
        obj = program.compile("cubin", logs=log)
        cubin = bytes(obj.code)
        status, error = StageStatus.OK, ""
    except Exception as exc:  # noqa: BLE001 - NVRTCError carries the log in its message
        cubin, status = b"", StageStatus.FAILED
        text = str(exc)
        error = _without_nul(text.split("compilation log:", 1)[-1]).strip() or _without_nul(text)
        if not log.getvalue():
            log.write(error)
    seconds = time.perf_counter() - start
    text = _without_nul(log.getvalue()).replace(str(SHIM_INCLUDE_DIR / PROGRAM_NAME), PROGRAM_NAME)
    error = error.replace(str(SHIM_INCLUDE_DIR / PROGRAM_NAME), PROGRAM_NAME)
    result = CompileResult(
        status=status,
        backend="nvrtc",
        arch=arch,
        seconds=seconds,
        log=text,
        diagnostics=parse_diagnostics(text),
        kernels=parse_ptxas_resources(text),
        error=error,
    )
    module = CompiledModule(cubin=cubin, result=result, kernel_names=[k.name for k in result.kernels])
    if secret is not None and status is StageStatus.OK:
        _write_cache(cache_dir, key, module, secret)
    return module


def refused_compile(source: str, options: CompileOptions, arch: str) -> CompileResult | None:
    """A FAILED result naming the first include route the source or options would open to a
    file that is neither the source nor a shipped header; None when it may compile."""
    shipped = [Path(p).resolve() for p in cuda_include_paths()]
    outside = [p for p in options.extra_include_paths
               if not any(Path(p).resolve().is_relative_to(root) for root in shipped)]
    findings = [Finding(rule=r.rule, reason=RejectReason.FILE_ACCESS, message=r.message,
                        line=r.line) for r in include_refusals(source)]
    findings += [Finding(rule="include_path_refused", reason=RejectReason.FILE_ACCESS,
                         message=f"include path {p!r} is refused: NVRTC reads the shipped "
                         "headers only; include them by name and pass no include path")
                 for p in outside]
    if not findings:
        return None
    return CompileResult(status=StageStatus.FAILED, backend="nvrtc", arch=arch,
                         findings=findings, error=findings[0].message,
                         diagnostics=[Diagnostic(severity="error", message=f.message,
                                                 line=f.line) for f in findings])


def _read_cache(cache_dir: Path, key: str, secret: bytes) -> CompiledModule | None:
    """The entry under ``key`` if its tag verifies; a missing, partial, planted or edited
    entry is a miss (the caller compiles and overwrites it)."""
    meta_path, cubin_path = cache_dir / f"{key}.json", cache_dir / f"{key}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
        result_text = meta["result"]
        if not cache_auth.tag_matches(secret, meta.get("tag"), key.encode(), cubin,
                                      result_text.encode()):
            return None
        result = _from_jsonable(CompileResult, json.loads(result_text))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    result.cached = True
    return CompiledModule(cubin=cubin, result=result, kernel_names=[k.name for k in result.kernels])


def _write_cache(cache_dir: Path, key: str, module: CompiledModule, secret: bytes) -> None:
    """Cubin first, then the tagged metadata: a reader sees a whole entry or a miss."""
    result_text = json.dumps(_to_jsonable(module.result))
    tag = cache_auth.entry_tag(secret, key.encode(), module.cubin, result_text.encode())
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f"{key}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        tmp.write_bytes(module.cubin)
        tmp.replace(cache_dir / f"{key}.cubin")
        tmp.write_text(json.dumps({"result": result_text, "tag": tag}))
        tmp.replace(cache_dir / f"{key}.json")
    except OSError:
        pass  # a read-only or full cache disk only costs speed
