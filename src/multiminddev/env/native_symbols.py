"""What a built load_inline library imports: the check that no source-level trick defeats.

``check_native_code`` reads the C++/CUDA text, which macros, token pasting, ``(write)(...)``,
``&::write``, ``__asm__("write")`` renaming or digraphs can disguise. The linker cannot be
fooled the same way: whatever the source calls outside the library is an *undefined dynamic
symbol* of the built ``.so`` under its real name, and a direct system call is a ``syscall``
instruction in its code. ``library_findings(path)`` lists both (``nm -D --undefined-only``,
``objdump -d``; pure: it reads the file, never loads it) and returns one ``Finding`` per
refused symbol class.

Refused, by exact name (versions such as ``@GLIBC_2.2.5`` stripped): libc entry points a
kernel wrapper never needs (descriptor I/O, files, processes, signals, dynamic loading, the
environment, sockets, memory protection), thread creation, CUDA streams / events / graphs /
host callbacks, vendor libraries (cuBLAS, cuDNN, ...: kernels that are not the candidate's) and
the CPython entry points that reach frames, run code or import modules. Honest extensions
(pybind11 + torch, nvcc) import none of these beyond what the toolchain itself puts in every
build: the trusted builder builds a minimal extension first and never refuses what it imports
(``Toolchain``), so a pybind11 or torch version that needs one more CPython entry point, or a
statically linked libstdc++ that imports ``open`` and ``syscall``, does not reject every honest
candidate. The candidate's own compiled objects are checked too, against the reference's
objects: what the candidate's code references cannot hide behind the toolchain's imports.
``tests/env/test_native_symbols.py`` builds real ones.
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multiminddev.env.results import Finding, RejectReason

_LIBC_EXACT = frozenset({
    # descriptor I/O (a descriptor the wrapper holds may be the evaluator's pipe)
    "write", "writev", "pwrite", "pwrite64", "pwritev", "pwritev2", "pwritev64", "pwritev64v2",
    "send", "sendmsg", "sendmmsg", "sendto", "sendfile", "sendfile64", "splice", "tee",
    "vmsplice", "read", "readv", "pread", "pread64", "preadv", "preadv2", "recv", "recvfrom",
    "recvmsg", "recvmmsg",
    # files
    "open", "open64", "openat", "openat64", "openat2", "creat", "creat64", "fopen", "fopen64",
    "fdopen", "freopen", "freopen64", "opendir", "fdopendir", "unlink", "unlinkat", "rename",
    "renameat", "renameat2", "truncate", "ftruncate", "truncate64", "ftruncate64", "chmod",
    "fchmod", "chdir", "fchdir", "symlink", "link", "mkdir", "rmdir",
    "dup", "dup2", "dup3", "ioctl", "memfd_create", "pipe", "pipe2",
    # memory mapping / protection
    "mmap", "mmap64", "mprotect", "mremap", "pkey_mprotect", "madvise",
    # processes, signals, tracing
    "kill", "tgkill", "tkill", "killpg", "raise", "sigqueue", "prctl", "syscall", "ptrace",
    "process_vm_readv", "process_vm_writev", "system", "popen", "fork", "vfork", "_Fork",
    "execl", "execle", "execlp", "execv", "execve", "execvp", "execvpe", "fexecve", "execveat",
    "posix_spawn", "posix_spawnp", "clone", "clone3", "__clone", "__clone2", "unshare", "setns",
    "signal", "sigaction", "setrlimit", "prlimit", "prlimit64", "seccomp", "chroot",
    # dynamic loading
    "dlopen", "dlmopen", "dlsym", "dlvsym", "__libc_dlopen_mode", "__libc_dlsym",
    # the environment
    "getenv", "secure_getenv", "setenv", "putenv", "unsetenv", "clearenv",
    # sockets
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
})
_LIBC_PREFIXES = ("fcntl", "posix_spawn", "process_vm_", "exec", "clone", "openat", "__open",
                  "__fcntl", "__write", "__send", "__mmap", "__dlsym", "__dlopen", "__libc_system")
_THREAD_EXACT = frozenset({"pthread_create", "thrd_create", "std::thread", "pthread_kill",
                           "pthread_sigqueue"})
_THREAD_PREFIXES = ("_ZNSt6thread15_M_start_thread", "_ZNSt6thread20_M_start_thread",
                    "_ZNSt7jthread", "__pthread_create",
                    # torch's inter-op pool (at::launch) and c10::ThreadPool
                    "_ZN2at6launch", "_ZN2at22launch_no_thread_state", "_ZN3c1010ThreadPool",
                    "_ZN2at15get_thread_pool", "_ZN2at16get_thread_pool")
_STREAM_PREFIXES = ("cudaStreamCreate", "cudaEventCreate", "cudaGraph", "cudaStreamAddCallback",
                    "cudaLaunchHostFunc", "cudaStreamBeginCapture", "cudaStreamAttachMemAsync",
                    "cuStreamCreate", "cuEventCreate", "cuGraph", "cuLaunchHostFunc",
                    "cuStreamAddCallback", "cuStreamBeginCapture",
                    # torch's side-stream pool (mangled c10::cuda::getStreamFromPool / External)
                    "_ZN3c104cuda17getStreamFromPool", "_ZN3c104cuda21getStreamFromExternal")
# Function pointers to any driver / runtime entry point by name: every other rule, bypassed.
_LOOKUP_PREFIXES = ("cudaGetDriverEntryPoint", "cuGetProcAddress", "cudaGetExportTable",
                    "cuGetExportTable")
_VENDOR = re.compile(r"^(cublas|cublasLt|cudnn|cufft|curand|cusparse|cusolver|cutensor|nvjpeg|"
                     r"npp)\w*|.*(getCurrentCUDABlasHandle|getCurrentCUDASolverDnHandle|"
                     r"getCurrentCUDASparseHandle|getCudnnHandle).*")
# libstdc++'s file streams, its descriptor-backed stream buffers (``__gnu_cxx::stdio_filebuf``
# over any descriptor: the evaluator's pipe) and std::filesystem (mangled): files and
# descriptors reached through the C++ library import no libc symbol of the candidate's own.
_CXX_FILES = re.compile(r"_Z.*(basic_[io]?fstream|basic_filebuf|__basic_file|stdio_filebuf|"
                        r"stdio_sync_filebuf|10filesystem)")
_PYTHON_PREFIXES = ("PyEval_GetFrame", "PyEval_GetGlobals", "PyEval_GetLocals",
                    "PyEval_GetBuiltins", "PyEval_EvalCode", "PyEval_EvalFrame", "PyFrame_",
                    "PyThreadState_GetFrame", "PyRun_", "PyImport_", "Py_CompileString",
                    "PySys_", "PyCode_", "PyGen_", "PyTraceBack_",
                    "_PyEval_", "_PyFrame_", "_PyImport_", "_PyRun_", "_PySys_",
                    "PyMarshal_", "Py_RunMain", "PyOS_")
# Imported by every pybind11 extension (error reporting, ``get_internals``); refusing them would
# refuse every honest candidate. Without an entry frame (PyEval_GetFrame*, PyThreadState_GetFrame
# are refused) PyFrame_GetBack has nothing to walk from. Attribute and ``__dict__`` setters
# (PyObject_SetAttr*, PyObject_GenericSetDict: pybind11's ``dynamic_attr`` classes) are not
# refused either: docs/evaluator.md names that limit.
PYBIND11_NEEDS = frozenset({"PyEval_GetBuiltins", "PyFrame_GetBack", "PyFrame_GetCode",
                            "PyFrame_GetLineNumber"})
# pybind11's ``module_::import`` goes through PyImport_ImportModule; its ``exec``/``eval`` through
# PyRun_String; ``inspect.currentframe`` analogues through PyEval_GetFrame: all caught above.

_SYSCALL_MNEMONIC = re.compile(r"\t(syscall|sysenter|int\s+\$0x80)\b")


def symbol_class(name: str) -> tuple[str, RejectReason] | None:
    """(class, reason) for a refused undefined symbol (version suffix already stripped)."""
    if name in _THREAD_EXACT or name.startswith(_THREAD_PREFIXES):
        return "thread creation", RejectReason.CONCURRENCY
    if name.startswith(_STREAM_PREFIXES):
        return "CUDA stream/event/graph/host-callback creation", RejectReason.CONCURRENCY
    if name.startswith(_LOOKUP_PREFIXES):
        return "driver entry-point lookup", RejectReason.FORBIDDEN_IMPORT
    if _VENDOR.match(name):
        return "vendor library (its kernels are not yours)", RejectReason.FORBIDDEN_IMPORT
    if name.startswith(_PYTHON_PREFIXES) and name not in PYBIND11_NEEDS:
        return "CPython frame/code/import access", RejectReason.FORBIDDEN_IMPORT
    if _CXX_FILES.match(name):
        return "C++ file streams / filesystem", RejectReason.FORBIDDEN_IMPORT
    if name in _LIBC_EXACT or name.startswith(_LIBC_PREFIXES):
        return "libc system entry point", RejectReason.FORBIDDEN_IMPORT
    return None


@functools.cache
def tools_available() -> bool:
    """True when ``nm`` is on PATH (``objdump`` is optional)."""
    return shutil.which("nm") is not None


@dataclass(frozen=True)
class Toolchain:
    """What a minimal honest extension built by this toolchain references: ``library``, the
    linked library's undefined dynamic symbols (pybind11, torch, and whatever the linker pulls
    in from static archives: a statically linked libstdc++ brings ``open``, ``ioctl``,
    ``syscall``); ``objects``, the undefined symbols of its own compiled objects (header code
    only). A candidate's library is never refused for the first, its objects never for the
    second: neither can tell honest from hostile."""

    library: frozenset[str] = frozenset()
    objects: frozenset[str] = frozenset()


@functools.cache
def rules_digest() -> str:
    """SHA-256 of this module's source: a build checked under other rules is not reused."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def undefined_symbols(path: Path | str, dynamic: bool = True) -> list[str]:
    """Undefined symbols of a shared library (``dynamic``, its dynamic symbol table) or of a
    compiled object (names only, ``@version`` stripped)."""
    command = ["nm", "-D", "--undefined-only"] if dynamic else ["nm", "--undefined-only"]
    out = subprocess.run([*command, str(path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    names = []
    for line in out.splitlines():
        parts = line.split()
        if parts:
            names.append(parts[-1].split("@", 1)[0])
    return sorted(set(names))


def syscall_instructions(library: Path | str) -> list[str]:
    """``syscall``-class instructions in the library's own code (empty without objdump)."""
    if shutil.which("objdump") is None:
        return []
    proc = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)],
                          capture_output=True, text=True, timeout=120, check=False)
    hits, function = [], "?"
    for line in proc.stdout.splitlines():
        if line.endswith(">:"):
            function = line.split("<", 1)[-1].rstrip(">:")
        elif m := _SYSCALL_MNEMONIC.search(line):
            hits.append(f"{m.group(1)} in {function}")
    return hits


def library_findings(library: Path | str, toolchain: Toolchain = Toolchain(),
                     objects: Sequence[Path] = ()) -> list[Finding]:
    """Findings for one built library: every refused undefined symbol, grouped by class, and
    raw system-call instructions. ``objects``: the candidate's own compiled objects, whose
    references show what its code calls even where the toolchain's static archives make the
    library import the same symbol anyway (``toolchain``, see ``Toolchain``). A library or
    object the tools cannot read is refused (a hole would be worse than a false alarm); callers
    check ``tools_available()`` first."""
    try:
        names = {n for n in undefined_symbols(library) if n not in toolchain.library}
        for obj in objects:
            names.update(n for n in undefined_symbols(obj, dynamic=False)
                         if n not in toolchain.objects)
    except (OSError, subprocess.SubprocessError) as exc:
        return [Finding(rule="native_symbols_unreadable", reason=RejectReason.OTHER,
                        message=f"could not list the built library's symbols ({exc})")]
    grouped: dict[tuple[str, RejectReason], list[str]] = {}
    for name in sorted(names):
        cls = symbol_class(name)
        if cls is not None:
            grouped.setdefault(cls, []).append(name)
    findings = [
        Finding(rule="native_symbol", reason=reason,
                message=f"the built library imports {', '.join(f'`{s}`' for s in syms[:8])} "
                        f"({what}); a kernel wrapper only allocates tensors and launches its "
                        "kernels")
        for (what, reason), syms in grouped.items()]
    syscalls = syscall_instructions(library)
    if syscalls:
        findings.append(Finding(
            rule="native_syscall_instruction", reason=RejectReason.FORBIDDEN_IMPORT,
            message=f"the built library makes raw system calls ({'; '.join(syscalls[:4])}); "
                    "a kernel wrapper makes none"))
    return findings
