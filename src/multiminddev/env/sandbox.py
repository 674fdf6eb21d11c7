"""In-process sandbox for candidate code, installed in the GPU worker before the candidate loads.

``install_sandbox(workdir, policy)`` (idempotent) does, in order:

1. scrubs ``os.environ`` to an allow-list (PATH, CUDA_*, NVIDIA_*, LD_LIBRARY_PATH, the
   compile caches; HOME and TMPDIR point at ``workdir``) so tokens and keys in the parent's
   environment are not readable, and pins the compile-cache locations that depended on HOME;
   the environment block the process was exec'd with (``/proc/self/environ``, the stack) and
   ``posix.environ`` lose every entry not kept (``erase_exec_environment``);
2. ``chdir(workdir)`` (a private temp dir per worker);
3. sets rlimits CUDA tolerates: no core dumps, a file-size cap, an open-files cap and a CPU-time
   backstop. Not RLIMIT_NPROC by default: Linux counts *threads* of the whole user against it and
   the CUDA driver, NCCL and torch's pools start threads, so a tight cap breaks honest
   candidates (and other processes of the same user). Not RLIMIT_AS: CUDA reserves terabytes of
   virtual address space for unified addressing;
4. tries to move the process into a fresh network namespace (``unshare(CLONE_NEWNET)``: only
   with CAP_SYS_ADMIN; reported by ``sandbox_capabilities()``, which ``doctor`` prints). The
   worker does this, and the NVRTC preload, at start-up through ``prepare_sandbox()``, before
   any job: neither depends on the candidate, and namespace creation can be slow;
5. installs a ``sys.addaudithook`` hook that refuses, with ``SandboxViolation``: process
   creation (subprocess, os.system/exec*/spawn*/posix_spawn/fork/forkpty, killing other
   processes), sockets (non-AF_UNIX creation, connect, bind, DNS), ``ctypes`` loading of
   libraries other than the CUDA/NVRTC ones (even libc, already loaded), ``ctypes`` lookups of
   process/network/memory-protection functions, writes/removes/renames/chmods outside
   ``workdir`` and the compile caches, a second audit hook (CPython then silently skips adding
   it, so ours cannot be shadowed),
   ``sys.settrace``/``sys.setprofile``/``sys._current_frames`` (spying on the harness's frames),
   reading ``/proc/self/environ`` (the pre-scrub environment), ``/proc/self/mem`` or another
   process's ``/proc/<pid>``,
   ``gc.get_objects``/``get_referrers``/``get_referents`` (finding the reference model or the
   result pipe) and raising rlimits again. Every refusal is recorded (``violations()``) even if
   the candidate catches the exception, so the worker can still report SANDBOX_VIOLATION.

What this is NOT: a security boundary against a determined attacker. Audit hooks run inside the
same interpreter as the candidate; code that reaches raw memory (an already-loaded ``ctypes``
handle, a buffer overflow in a C extension, a CUDA kernel writing host-mapped memory, a
``load_inline`` library's own C++ code, which runs natively and fires no audit event) can
disable the hook or do anything the process may do. What covers that class: (a) the static checks
refuse the imports and calls that lead there (ctypes, os, sys, gc, importlib, subprocess, socket,
eval/exec) before anything runs; (b) each candidate runs in its own worker process that is
replaced after a fault, with reference outputs computed and sent to the parent before the
candidate is imported; (c) the parent verifies outputs it received as bytes, so a candidate cannot
fake a pass inside the worker. For hostile-by-design code, run workers in a container or VM
without network and with a read-only filesystem; see docs/evaluator.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.env.results import Finding, RejectReason

CLONE_NEWNET = 0x40000000

ENV_KEEP_EXACT = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "MULTIMINDDEV_CACHE", "TORCH_EXTENSIONS_DIR", "LANG", "LC_ALL",
     "TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "CUDA_PATH"}
)
ENV_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "PYTORCH_", "NCCL_")

# Libraries candidates' own toolchain may load after the sandbox is installed (NVRTC is loaded
# lazily by cuda.bindings on the first compile; libdl for cuda.pathfinder's dlinfo).
DEFAULT_LIBRARY_PATTERNS = (
    r"libcuda\.so", r"libcudart", r"libnvrtc", r"libnvJitLink", r"libnvfatbin", r"libnvptxcompiler",
    r"libnvidia-", r"libcublas", r"libcufft", r"libcurand", r"libcusparse", r"libcusolver",
    r"libcudnn", r"libnccl", r"libnvToolsExt", r"libcupti", r"libdl\.so", r"libc10", r"libtorch",
)
# ctypes symbol lookups that spawn, connect, patch memory protection or undo the sandbox.
DENIED_SYMBOLS = frozenset(
    {"system", "popen", "execl", "execle", "execlp", "execv", "execve", "execvp", "execvpe",
     "fexecve", "fork", "vfork", "clone", "clone3", "posix_spawn", "posix_spawnp", "socket",
     "connect", "bind", "ptrace", "kill", "syscall", "dlopen", "dlmopen", "mprotect",
     "setrlimit", "prlimit", "prlimit64", "unshare", "setns", "PySys_AddAuditHook"}
)
SPAWN_EVENTS = frozenset(
    {"os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
     "os.startfile", "subprocess.Popen", "pty.spawn"}
)
NETWORK_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
     "socket.gethostbyaddr", "socket.getnameinfo", "socket.sendto", "socket.sendmsg",
     "socket.sethostname"}
)
# Events whose first argument (or first two) are paths that get modified.
PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
    "os.rename": (0, 1), "os.link": (1,), "os.symlink": (1,), "os.truncate": (0,),
    "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.setxattr": (0,),
    "os.removexattr": (0,), "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}
INTROSPECTION_EVENTS = frozenset(
    {"sys.settrace", "sys.setprofile", "sys._current_frames", "gc.get_objects",
     "gc.get_referrers", "gc.get_referents", "resource.setrlimit", "resource.prlimit"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(PermissionError):
    """The sandbox refused an operation; the message names the audit event and its target."""


@dataclass(kw_only=True)
class SandboxPolicy:
    """What the candidate may do in the worker. Defaults are the evaluation policy."""

    extra_writable_paths: tuple[str | Path, ...] = ()  # besides workdir and the compile caches
    max_file_bytes: int | None = 2 << 30  # RLIMIT_FSIZE: larger writes fail with EFBIG
    max_open_files: int | None = 4096  # RLIMIT_NOFILE soft limit (never raised)
    max_cpu_seconds: int | None = 3600  # RLIMIT_CPU backstop, counted from install time
    max_processes: int | None = None  # RLIMIT_NPROC: off (counts the user's threads; CUDA needs them)
    block_network: bool = True
    block_subprocess: bool = True
    block_ctypes_load: bool = True
    block_introspection: bool = True  # settrace/setprofile/_current_frames, gc.get_objects & co
    network_namespace: bool = True  # try unshare(CLONE_NEWNET); skipped silently when not allowed
    allowed_executables: tuple[str, ...] = ()  # basenames subprocess may run (e.g. "ninja")
    allowed_library_patterns: tuple[str, ...] = DEFAULT_LIBRARY_PATTERNS
    # Environment variables kept besides ENV_KEEP_EXACT / ENV_KEEP_PREFIXES, by name prefix
    # (the profile harness keeps the ones Nsight Compute gives its injection library).
    keep_environment_prefixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_open_files", "max_cpu_seconds", "max_processes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"SandboxPolicy.{name} must be a positive int or None (no "
                                 f"limit), got {value!r}")
        self.extra_writable_paths = tuple(self.extra_writable_paths)
        self.keep_environment_prefixes = tuple(self.keep_environment_prefixes)
        for pattern in self.allowed_library_patterns:
            re.compile(pattern)  # fail early on a bad pattern


@dataclass
class _SandboxState:
    """Process-wide sandbox state: audit hooks are process-wide and cannot be removed."""

    installed: bool = False
    preloaded: bool = False
    workdir: Path | None = None
    policy: SandboxPolicy | None = None
    writable_roots: tuple[str, ...] = ()
    library_patterns: tuple[re.Pattern[str], ...] = ()
    violations: list[Finding] = field(default_factory=list)
    network_namespace: str = "not attempted"
    rlimits: dict[str, Any] = field(default_factory=dict)
    in_hook: threading.local = field(default_factory=threading.local)


_STATE = _SandboxState()


# ---------------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------------


def prepare_sandbox(policy: SandboxPolicy | None = None) -> None:
    """The parts of the sandbox that do not depend on the job, done ahead (at worker start-up,
    off the evaluation's clock): NVRTC loaded, and the network namespace, whose creation can
    take a kernel RCU grace period (tens of ms) on some hosts. Idempotent; install_sandbox
    does whatever was not done here."""
    policy = policy or SandboxPolicy()
    if not _STATE.preloaded:
        _preload_cuda_libraries()
        _STATE.preloaded = True
    if (policy.network_namespace and policy.block_network
            and _STATE.network_namespace == "not attempted"):
        _STATE.network_namespace = _unshare_network()


def install_sandbox(workdir: Path, policy: SandboxPolicy | None = None) -> None:
    """Scrub env, chdir, rlimits, network namespace, audit hook. Idempotent (first call wins)."""
    if _STATE.installed:
        return
    policy = policy or SandboxPolicy()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    caches = _cache_dirs()  # before HOME changes: the caches' real locations
    for cache in caches.values():
        # Created now: afterwards the hook would refuse creating their parents (~/.cache on
        # a fresh machine), and every compile would silently go uncached.
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
    prepare_sandbox(policy)
    _scrub_environment(workdir, caches, policy.keep_environment_prefixes)
    os.chdir(workdir)
    sys.dont_write_bytecode = True  # lazy imports would otherwise try to write .pyc files
    _STATE.rlimits = _set_rlimits(policy)
    roots = [workdir, *caches.values(), *(Path(p) for p in policy.extra_writable_paths)]
    _STATE.writable_roots = tuple(sorted({os.path.realpath(r) for r in roots}))
    _STATE.library_patterns = tuple(re.compile(p) for p in policy.allowed_library_patterns)
    _STATE.workdir, _STATE.policy = workdir, policy
    sys.addaudithook(_audit_hook)
    _STATE.installed = True


@contextlib.contextmanager
def harness_section() -> Iterator[None]:
    """The harness's own operations with the audit hook passing them, in this thread only
    (handing a descriptor to the evaluator takes ``sendmsg``, a network event the hook refuses).
    Candidate code never runs inside it; a thread the candidate started is not exempted, and
    the worker rejects candidates that start threads."""
    previous = getattr(_STATE.in_hook, "active", False)
    _STATE.in_hook.active = True
    try:
        yield
    finally:
        _STATE.in_hook.active = previous


def is_installed() -> bool:
    return _STATE.installed


def violations() -> list[Finding]:
    """Every refused operation so far (SANDBOX_VIOLATION findings), even ones the candidate caught."""
    return list(_STATE.violations)


def clear_violations() -> None:
    """Forget recorded violations (the worker calls this between jobs)."""
    _STATE.violations.clear()


def _cache_dirs() -> dict[str, Path]:
    """Compile caches the worker must keep writing: NVRTC cache and torch extensions dir."""
    from multiminddev.cuda.compiler import cache_root

    nvrtc = cache_root()
    torch_ext = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not torch_ext:
        try:
            from torch.utils.cpp_extension import get_default_build_root

            torch_ext = get_default_build_root()
        except Exception:  # noqa: BLE001 - torch absent or old: the default location
            torch_ext = str(Path.home() / ".cache" / "torch_extensions")
    return {"MULTIMINDDEV_CACHE": Path(nvrtc), "TORCH_EXTENSIONS_DIR": Path(torch_ext)}


def _scrub_environment(workdir: Path, caches: dict[str, Path],
                       extra_prefixes: tuple[str, ...] = ()) -> None:
    keep = {
        k: v for k, v in os.environ.items()
        if k in ENV_KEEP_EXACT or k.startswith(ENV_KEEP_PREFIXES + extra_prefixes)
    }
    keep.update({name: str(path) for name, path in caches.items()})
    keep.update({"HOME": str(workdir), "TMPDIR": str(workdir)})
    keep.setdefault("PATH", "/usr/bin:/bin")
    os.environ.clear()
    os.environ.update(keep)
    tempfile.tempdir = str(workdir)  # tempfile caches the old TMPDIR
    erase_exec_environment(keep)


def erase_exec_environment(keep: dict[str, str]) -> bool:
    """Overwrite every entry of the environment block this process was exec'd with (what
    ``/proc/self/environ`` and a raw read of the stack show; a forked worker holds its
    server's) that ``keep`` does not hold with the same value, with zeros, and make ``posix.environ`` (CPython's copy of it) ``keep``. Call
    after ``os.environ`` is rebuilt: the C ``environ`` then points at new strings only.
    Returns whether the block was found and erased (Linux with /proc)."""
    import posix

    posix.environ.clear()
    posix.environ.update({k.encode(): v.encode() for k, v in keep.items()})
    try:
        stat = Path("/proc/self/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5): 50, 51)
    except (OSError, ValueError, IndexError):
        return False
    if not 0 < start < end or end - start > (64 << 20):
        return False
    kept = {f"{k}={v}".encode() for k, v in keep.items()}
    offset = 0
    for entry in ctypes.string_at(start, end - start).split(b"\0"):
        # An entry kept with its value stays: a library may hold a pointer into it (the CUDA
        # driver's CUDA_VISIBLE_DEVICES); every other byte of the block is zeroed.
        if entry and entry not in kept:
            ctypes.memset(start + offset, 0, len(entry))
        offset += len(entry) + 1
    return True


def _preload_cuda_libraries() -> None:
    """Load NVRTC now (it is loaded lazily on the first compile) so later loads are rare."""
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - no NVRTC: compile_kernels will report it itself
        pass


def _set_rlimits(policy: SandboxPolicy) -> dict[str, Any]:
    """Lower (never raise) resource limits; returns what was set, for reporting."""
    import resource

    applied: dict[str, Any] = {}

    def lower(name: str, value: int) -> None:
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        if soft == resource.RLIM_INFINITY or value < soft:
            try:
                resource.setrlimit(which, (value, hard))
                applied[name] = value
            except (ValueError, OSError) as exc:
                applied[name] = f"not set: {exc}"

    lower("RLIMIT_CORE", 0)
    if policy.max_file_bytes is not None:
        lower("RLIMIT_FSIZE", policy.max_file_bytes)
    if policy.max_open_files is not None:
        lower("RLIMIT_NOFILE", policy.max_open_files)
    if policy.max_cpu_seconds is not None:
        used = resource.getrusage(resource.RUSAGE_SELF)
        lower("RLIMIT_CPU", int(used.ru_utime + used.ru_stime) + policy.max_cpu_seconds)
    if policy.max_processes is not None:
        lower("RLIMIT_NPROC", policy.max_processes)
    return applied


def _unshare_network() -> str:
    """Move this thread (and threads it starts later) into a new, empty network namespace."""
    try:
        if hasattr(os, "unshare"):  # Python 3.12+
            os.unshare(CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                return f"unavailable ({os.strerror(err)}; needs CAP_SYS_ADMIN)"
        return "isolated"
    except (OSError, AttributeError) as exc:
        return f"unavailable ({exc})"


# ---------------------------------------------------------------------------------------------
# The audit hook
# ---------------------------------------------------------------------------------------------


WATCHED_EVENTS = frozenset(
    {"sys.addaudithook", "open", "os.kill", "os.killpg", "socket.__new__", "ctypes.dlopen",
     "ctypes.dlsym", "ctypes.dlsym/handle"}
) | SPAWN_EVENTS | NETWORK_EVENTS | frozenset(PATH_EVENTS) | INTROSPECTION_EVENTS


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in WATCHED_EVENTS:
        return  # fast path: most events (id(), getattr on code objects, imports) are fine
    if getattr(_STATE.in_hook, "active", False):
        return  # our own os.path/realpath calls must not recurse
    _STATE.in_hook.active = True
    try:
        reason = _refusal(event, args)
    finally:
        _STATE.in_hook.active = False
    if reason is not None:
        message = f"sandbox refused {event}: {reason}"
        _STATE.violations.append(Finding(rule=f"sandbox:{event}",
                                         reason=RejectReason.SANDBOX_VIOLATION, message=message))
        raise SandboxViolation(message)


def _refusal(event: str, args: tuple[Any, ...]) -> str | None:
    """Why ``event`` is refused, or None when it is allowed."""
    policy = _STATE.policy
    assert policy is not None
    if event == "sys.addaudithook":
        return "a second audit hook could shadow the sandbox"
    if event == "open":
        return _open_refusal(args)
    if event in PATH_EVENTS:
        return _path_refusal(event, args)
    if policy.block_subprocess and event in SPAWN_EVENTS:
        return _spawn_refusal(event, args, policy)
    if policy.block_subprocess and event in {"os.kill", "os.killpg"} and args[0] != os.getpid():
        return f"signals to other processes (pid {args[0]})"
    if policy.block_network and (event in NETWORK_EVENTS or event == "socket.__new__"):
        return _network_refusal(event, args)
    if policy.block_ctypes_load and event == "ctypes.dlopen":
        return _dlopen_refusal(args[0])
    if policy.block_ctypes_load and event in {"ctypes.dlsym", "ctypes.dlsym/handle"}:
        name = args[1] if len(args) > 1 else None
        name = name.decode() if isinstance(name, bytes) else name
        return f"looking up {name!r} through ctypes" if name in DENIED_SYMBOLS else None
    if policy.block_introspection and event in INTROSPECTION_EVENTS:
        return "introspection or limit changes are not allowed in candidate code"
    return None


def _spawn_refusal(event: str, args: tuple[Any, ...], policy: SandboxPolicy) -> str | None:
    if event == "subprocess.Popen" and policy.allowed_executables:
        executable, argv = args[0], args[1]
        first = executable or (argv if isinstance(argv, (str, bytes)) else (argv or [None])[0])
        first = os.fsdecode(first) if first is not None else ""
        if os.path.basename(str(first)) in policy.allowed_executables:
            return None
    return "candidates may not start processes"


def _network_refusal(event: str, args: tuple[Any, ...]) -> str | None:
    if event == "socket.__new__":
        family = args[1] if len(args) > 1 else None
        import socket

        if family in (socket.AF_UNIX, -1, None):  # -1: from an existing fd (our result pipe)
            return None
        return f"creating a network socket (family {family})"
    return "candidates may not use the network"


def _dlopen_refusal(name: Any) -> str | None:
    if name is None:
        return "dlopen(NULL) exposes every symbol of the process"
    name = os.fsdecode(name)
    base = os.path.basename(name)
    # Not "anything already loaded": a ctypes handle on the already-loaded libc is exactly the
    # escape (libc.system); only the CUDA toolchain's libraries are needed after install.
    if any(p.search(base) for p in _STATE.library_patterns):
        return None
    return f"loading library {name!r} (only CUDA/NVRTC libraries may be loaded)"


def _proc_refusal(path: Any) -> str | None:
    """Reads of /proc that leak what the scrub removed or reach other processes.

    ``/proc/self/environ`` is the environment at exec time (``os.environ.clear()`` does not
    change it), ``mem`` is raw process memory, and ``/proc/<other pid>`` is another process
    (the evaluator parent, with its secrets).
    """
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None
    parts = real.split(os.sep)
    if len(parts) < 3 or parts[1] != "proc" or not parts[2].isdigit():
        return None
    if int(parts[2]) != os.getpid():
        return f"reading another process's {real!r}"
    if len(parts) > 3 and parts[3] in {"environ", "mem"}:
        return f"reading {real!r} (pre-scrub environment / raw memory)"
    return None


def _open_refusal(args: tuple[Any, ...]) -> str | None:
    path, mode, flags = (list(args) + [None, None, None])[:3]
    if isinstance(path, int):
        return None  # an already-open descriptor
    proc = _proc_refusal(path)
    if proc:
        return proc
    writing = False
    if isinstance(mode, str):
        writing = any(c in mode for c in "wax+")
    if isinstance(flags, int) and flags & _WRITE_FLAGS:
        writing = True
    if not writing:
        return None
    return _outside_roots(path, "writing")


def _path_refusal(event: str, args: tuple[Any, ...]) -> str | None:
    for index in PATH_EVENTS[event]:
        if index < len(args) and not isinstance(args[index], int):
            reason = _outside_roots(args[index], event.split(".", 1)[1])
            if reason:
                return reason
    return None


def _outside_roots(path: Any, action: str) -> str | None:
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return f"{action} an unrecognised path {path!r}"
    if real == os.devnull:
        return None
    for root in _STATE.writable_roots:
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return None
    return f"{action} {real!r} outside the worker's directory"


# ---------------------------------------------------------------------------------------------
# Capabilities (doctor)
# ---------------------------------------------------------------------------------------------


def sandbox_capabilities() -> dict[str, bool | str]:
    """What the sandbox can enforce on this machine (doctor prints it). Starts no sandbox here."""
    import resource

    caps: dict[str, bool | str] = {
        "audit_hooks": hasattr(sys, "addaudithook"),
        "env_scrub": True,
        "rlimits": all(hasattr(resource, n) for n in ("RLIMIT_CORE", "RLIMIT_FSIZE",
                                                      "RLIMIT_NOFILE", "RLIMIT_CPU")),
        "rlimit_nproc": "off by default (Linux counts the user's threads; CUDA starts threads)",
        "network_namespace": _probe_network_namespace(),
        "installed_here": _STATE.installed,
    }
    if _STATE.installed:
        caps["network_namespace_in_worker"] = _STATE.network_namespace
    caps["boundary"] = ("in-process layer: defence in depth, not a security boundary "
                        "(same-process audit hooks); the OS boundary around workers "
                        "(namespaces, read-only filesystem) is doctor's 'isolation' check")
    return caps


def _probe_network_namespace() -> str:
    """Try unshare(CLONE_NEWNET) in a throwaway child process (never in this process)."""
    code = (
        "import ctypes, ctypes.util, os, sys\n"
        "f = getattr(os, 'unshare', None)\n"
        "try:\n"
        "    f(0x40000000) if f else None\n"
        "    rc = 0 if f else ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6',"
        " use_errno=True).unshare(0x40000000)\n"
        "except OSError:\n"
        "    rc = 1\n"
        "print('ok' if rc == 0 else os.strerror(ctypes.get_errno() or 1))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    text = out.stdout.strip()
    return "available" if text == "ok" else f"unavailable ({text or 'probe failed'}; needs CAP_SYS_ADMIN)"


def describe() -> dict[str, Any]:
    """The installed sandbox's settings, for worker notes."""
    return {
        "installed": _STATE.installed,
        "workdir": str(_STATE.workdir) if _STATE.workdir else None,
        "writable_roots": list(_STATE.writable_roots),
        "rlimits": dict(_STATE.rlimits),
        "network_namespace": _network_namespace_description(),
        "policy": dataclasses.asdict(_STATE.policy) if _STATE.policy else None,
        "isolation": _isolation_report(),
    }


def _isolation_report() -> dict[str, Any] | None:
    """The OS-level isolation this process runs behind (env/isolation.py), if it ran here."""
    from multiminddev.env.isolation import active_report

    report = active_report()
    return report.to_dict() if report else None


def _network_namespace_description() -> str:
    """The sandbox's own unshare fails once isolation dropped every capability; the worker is
    then already in a fresh network namespace, which is what this reports."""
    report = _isolation_report()
    if report and "net" in report["namespaces"]:
        return "isolated (the worker's own network namespace)"
    return _STATE.network_namespace
