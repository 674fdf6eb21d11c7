"""OS-level isolation of an evaluation worker: namespaces and a read-only view of the filesystem.

The in-process sandbox (``sandbox.py``: audit hook, scrubbed environment, rlimits) runs inside
the candidate's own interpreter, so native code (a ``load_inline`` library, a raw-memory write)
can switch it off. This module draws a boundary the kernel enforces, at the very start of the
worker process, before anything of the job runs:

1. a new **user namespace** that maps the worker's own uid/gid (root stays root inside, with no
   power over anything outside it: ptrace and ``/proc/<pid>/mem`` of the evaluator and other
   workers are refused, since those live in the outer user namespace);
2. a new **mount namespace** with private propagation where every mount is remounted
   **read-only**, except: the worker's private directory (bound at its real path, so the parent
   still reads the stack dump written there), the compile caches the worker must write
   (``EvalConfig.cache_dir``, the torch extensions dir), and fresh, size-capped tmpfs on
   ``/tmp`` and ``/dev/shm`` that no other process sees (torch.compile's, Triton's and CUDA's
   scratch files land there and die with the worker). The worker's own ``/proc/<pid>`` stays
   writable: the CUDA driver writes there, and a read-only one makes CUDA initialisation fail
   (error 304, "OS call failed"); other processes' entries, ``/proc/sys`` and the rest of
   ``/proc`` are read-only;
3. a new **network namespace** with no interface but a loopback that is left down;
4. every **capability dropped** (bounding set, ambient, effective, permitted) with
   ``no_new_privs``: without CAP_SYS_ADMIN the candidate cannot remount anything writable
   again, and a user namespace it creates itself gets the mounts locked read-only.

No **pid namespace**: ``unshare(CLONE_NEWPID)`` moves only later children, so the worker itself
would have to fork and live on as that child, while the pool knows the worker by the pid
multiprocessing started (it kills it on a timeout, asks it for its stack with SIGUSR1 and reads
its exit status). The user namespace already refuses ptrace and ``/proc/<pid>/mem`` of outer
processes; what stays possible is ``kill()`` of a process of the same uid (a denial of service,
never a forged result). Run the workers as a dedicated user, or in the Dockerfile's container,
to close that too.

Every step needs a single-threaded process (the kernel refuses CLONE_NEWUSER and CLONE_NEWNS in
a process whose threads share its filesystem context), so ``isolate_worker_process`` is the
first thing ``worker_main`` does: a child of the forkserver starts with one thread even though
the server imported torch. Where a step is refused, the worker carries on with what it has and
logs one warning per process that says what is missing and how to get it;
``EvalConfig.isolation = "namespaces"`` makes a worker that cannot isolate fail to start instead.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import enum
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multiminddev.env.config import EvalConfig, Isolation

_log = logging.getLogger(__name__)

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
# statvfs f_flag bits -> the mount flags a remount must repeat (the kernel refuses a remount
# that would clear a flag locked by a more privileged namespace).
_KEPT_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
               (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
               (os.ST_RELATIME, MS_RELATIME))
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
CAP_SYS_ADMIN = 21
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PRIVATE_DIR_PREFIX = "mmd-iso-"
# NVIDIA MPS clients find the daemon through sockets in this directory; it stays visible
# (read-only; connecting to a socket needs no write access to the mount) under the private /tmp.
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"
HOW_TO_ENABLE = (
    "to get it: allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
    "user.max_user_namespaces>0; on Ubuntu 24.04+ also "
    "kernel.apparmor_restrict_unprivileged_userns=0), or run the evaluator as root with "
    "CAP_SYS_ADMIN, or run the workers in the Dockerfile's image "
    "(docker run --gpus all --network none --read-only --tmpfs /tmp ...)"
)


class IsolationStatus(str, enum.Enum):
    ACTIVE = "active"  # namespaces, read-only filesystem view, capabilities dropped
    PARTIAL = "partial"  # some namespaces, but a step failed (see warnings)
    NONE = "none"  # no OS boundary: the in-process sandbox alone


@dataclass(frozen=True, kw_only=True)
class IsolationReport:
    """Which OS boundary a worker process runs behind, and what is missing from it."""

    status: IsolationStatus
    boundary: str  # "namespaces (user, mount, net), read-only filesystem" or "none: <why>"
    namespaces: tuple[str, ...] = ()
    read_only_filesystem: bool = False
    writable: tuple[str, ...] = ()  # real paths the worker may write (besides its tmpfs)
    capabilities_dropped: bool = False
    private_dir: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.status is IsolationStatus.ACTIVE

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


@dataclass(kw_only=True)
class IsolationPolicy:
    """What ``isolate_worker`` sets up. Defaults are the evaluation policy."""

    mode: Isolation = Isolation.AUTO
    network: bool = True  # a new network namespace (no interface but a loopback left down)
    private_tmp: bool = True  # fresh tmpfs on /tmp and /dev/shm
    tmpfs_mib: int = 2048

    def __post_init__(self) -> None:
        self.mode = Isolation(self.mode)
        if not isinstance(self.tmpfs_mib, int) or self.tmpfs_mib < 1:
            raise ValueError(f"IsolationPolicy.tmpfs_mib must be a positive int (MiB), got "
                             f"{self.tmpfs_mib!r}")


class IsolationError(RuntimeError):
    """Isolation was required (``Isolation.NAMESPACES``) and the kernel refused a step."""


_REPORT: IsolationReport | None = None
_WARNED = False


def active_report() -> IsolationReport | None:
    """This process's isolation report (None: ``isolate_worker`` never ran here)."""
    return _REPORT


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def isolate_worker_process(conn: Any, config: dict[str, Any]) -> IsolationReport:
    """The worker's first step: isolate per ``config`` (an ``EvalConfig.to_dict()``).

    Makes the private directory, points ``TMPDIR`` (and ``tempfile``) at it so the worker's
    temp files land where it may write, and isolates. Where isolation is required and refused,
    tells the parent (``startup_failed``) and exits, so the pool reports an infrastructure error
    that names the cause."""
    cfg = EvalConfig.from_dict(config)
    policy = IsolationPolicy(mode=cfg.isolation, tmpfs_mib=cfg.isolation_tmpfs_mib)
    if policy.mode is Isolation.NONE:
        return _finish(_none("switched off (EvalConfig.isolation='none')"))
    private = make_private_dir()
    with contextlib.suppress(OSError):  # shown read-only to the worker: it must exist now
        cfg.cache_path.mkdir(parents=True, exist_ok=True)
    try:
        return isolate_worker(private, [], policy, hidden=worker_hidden_paths(cfg),
                              readable=worker_readable_paths(cfg))
    except IsolationError as exc:
        with contextlib.suppress(Exception):
            conn.send(("startup_failed", {"message": f"IsolationError: {exc}"}))
        raise SystemExit(1) from None


def code_paths() -> list[Path]:
    """Where this process imports code from: the package's own source root (an editable
    install maps it through an import hook, not ``sys.path``) and every ``sys.path``
    directory. A checkout or virtual environment under /tmp would otherwise vanish under the
    worker's private /tmp, and the worker could import nothing it had not imported yet."""
    import multiminddev

    found = [Path(multiminddev.__file__).resolve().parent.parent]
    found += [Path(entry).resolve() for entry in sys.path if entry and Path(entry).is_dir()]
    return list(dict.fromkeys(found))


def worker_readable_paths(cfg: EvalConfig) -> list[Path]:
    """What a worker reads besides the system: the shared cache (prebuilt libraries) and its
    own code (``code_paths``)."""
    return [cfg.cache_path, *code_paths()]


def worker_hidden_paths(cfg: EvalConfig) -> list[Path]:
    """Files the worker must not read at all: the key that authenticates the shared caches
    (``cuda.cache_auth``). With it, native candidate code could sign a planted cubin or
    baseline for the evaluations after it. Workers write nothing shared: their compile caches
    live in their private directory (``worker.use_private_compile_caches``)."""
    from multiminddev.cache_layout import key_path

    return [key_path(cfg.cache_path)]


def make_private_dir() -> Path:
    """A fresh 0700 directory under the system temp dir for this worker, emptied at its exit;
    the worker's ``tempfile`` and ``TMPDIR`` point into it. What killed workers left (their pid
    is in the name), and the empty directory itself (a mount point inside the worker's
    namespace, so it cannot remove it), are removed by the next worker's call."""
    base = Path(tempfile.gettempdir())
    _remove_stale_private_dirs(base)
    private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_DIR_PREFIX}{os.getpid()}-", dir=base))
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = str(private)
    owner = os.getpid()

    def cleanup() -> None:
        if os.getpid() == owner:  # not in a forked child
            for child in list(private.iterdir()) if private.exists() else ():
                with contextlib.suppress(OSError):
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            with contextlib.suppress(OSError):
                private.rmdir()  # refused inside the namespace (a mount point); swept later

    atexit.register(cleanup)
    # multiprocessing's children leave through os._exit, past atexit, after its finalizers
    from multiprocessing import util

    util.Finalize(None, cleanup, exitpriority=0)
    return private


def _remove_stale_private_dirs(base: Path) -> None:
    with contextlib.suppress(OSError):
        for entry in base.glob(f"{PRIVATE_DIR_PREFIX}*-*"):
            pid = entry.name[len(PRIVATE_DIR_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def isolate_worker(workdir: Path, writable: Sequence[Path],
                   policy: IsolationPolicy | Isolation | str = Isolation.AUTO, *,
                   hidden: Sequence[Path] = (), readable: Sequence[Path] = ()) -> IsolationReport:
    """Put this process behind namespaces with a read-only filesystem view; ``workdir`` and
    ``writable`` stay writable, ``readable`` directories stay visible (read-only) even under
    the private /tmp, existing files in ``hidden`` read as empty. Call once, in a single-threaded process. Returns (and keeps, for
    ``active_report``) what was achieved; raises IsolationError only when ``policy.mode`` is
    NAMESPACES and the boundary is not complete."""
    global _REPORT
    if _REPORT is not None:
        return _REPORT
    if not isinstance(policy, IsolationPolicy):
        policy = IsolationPolicy(mode=Isolation(policy))
    if policy.mode is Isolation.NONE:
        return _finish(_none("switched off (EvalConfig.isolation='none')"))
    workdir = Path(workdir).resolve()
    report = _isolate(workdir, [Path(p).resolve() for p in writable], policy,
                      [Path(p) for p in hidden], [Path(p).resolve() for p in readable])
    if policy.mode is Isolation.NAMESPACES and not report.active:
        _REPORT = report
        raise IsolationError(f"isolation required (EvalConfig.isolation='namespaces') but "
                             f"{report.boundary}; {'; '.join(report.warnings)}")
    return _finish(report)


def _finish(report: IsolationReport) -> IsolationReport:
    global _REPORT, _WARNED
    _REPORT = report
    if report.warnings and not _WARNED:
        _WARNED = True
        _log.warning("evaluation worker isolation is %s: %s", report.boundary,
                     "; ".join(report.warnings))
    return report


def _none(why: str, warnings: Sequence[str] = ()) -> IsolationReport:
    return IsolationReport(status=IsolationStatus.NONE, boundary=f"none: {why}",
                           warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------


class _Libc:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                   ctypes.c_ulong, ctypes.c_char_p]
        self.lib.unshare.argtypes = [ctypes.c_int]
        self.lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                   ctypes.c_ulong]

    def call(self, what: str, rc: int) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self.call("unshare", self.lib.unshare(flags))

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int,
              data: str | None = None) -> None:
        enc = (lambda s: None if s is None else os.fsencode(s))
        self.call(f"mount {target}", self.lib.mount(enc(source), enc(target), enc(fstype),
                                                    flags, enc(data)))

    def prctl(self, option: int, arg: int = 0, arg3: int = 0) -> None:
        self.call(f"prctl({option})", self.lib.prctl(option, arg, arg3, 0, 0))


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _isolate(workdir: Path, writable: list[Path], policy: IsolationPolicy,
             hidden: list[Path], readable: list[Path]) -> IsolationReport:
    if not sys.platform.startswith("linux"):
        return _none(f"namespaces are Linux-only (this is {sys.platform})",
                     [f"no OS-level isolation on {sys.platform}; {HOW_TO_ENABLE}"])
    threads = _thread_count()
    if threads > 1:
        return _none(f"the worker already runs {threads} threads",
                     [(f"namespaces need a single-threaded process and this worker runs {threads} "
                       "threads when isolation starts (with start_method='spawn', the parent's "
                       "main module or an import started them); use start_method='forkserver' "
                       "(the default)")])
    try:
        libc = _Libc()
    except OSError as exc:
        return _none(f"libc not loadable ({exc})", [f"no OS-level isolation: {exc}"])
    warnings: list[str] = []
    namespaces = _enter_namespaces(libc, policy, warnings)
    if not namespaces:
        return _none("the kernel refused new namespaces", warnings)
    writable_now: list[str] = []
    read_only = False
    if "mount" in namespaces:
        read_only = _read_only_view(libc, workdir, writable, policy, writable_now, warnings,
                                    readable)
        read_only = _hide_files(libc, hidden, warnings) and read_only
    with contextlib.suppress(OSError):
        os.chdir(workdir)  # the old cwd may sit on a mount now hidden under the private /tmp
    dropped = _drop_capabilities(libc, warnings)
    complete = read_only and dropped and ("net" in namespaces or not policy.network)
    names = ", ".join(namespaces)
    boundary = f"namespaces ({names})" + (", read-only filesystem" if read_only else
                                           ", filesystem NOT read-only")
    return IsolationReport(
        status=IsolationStatus.ACTIVE if complete else IsolationStatus.PARTIAL,
        boundary=boundary, namespaces=tuple(namespaces), read_only_filesystem=read_only,
        writable=tuple(writable_now), capabilities_dropped=dropped, private_dir=str(workdir),
        warnings=tuple(warnings))


def _enter_namespaces(libc: _Libc, policy: IsolationPolicy, warnings: list[str]) -> list[str]:
    """New user+mount(+net) namespaces; as a fallback, mount(+net) alone where this process has
    CAP_SYS_ADMIN but user namespaces are refused (a privileged container). [] when refused."""
    uid, gid = os.geteuid(), os.getegid()
    net = CLONE_NEWNET if policy.network else 0
    try:
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | net)
    except OSError as exc:
        user_error = exc
    else:
        try:
            _write_id_maps(uid, gid)
        except OSError as exc:
            warnings.append(f"user namespace entered but its uid/gid map was refused ({exc}); "
                            "files created now belong to no mapped user")
        return ["user", "mount"] + (["net"] if net else [])
    if _has_capability(CAP_SYS_ADMIN):
        try:
            libc.unshare(CLONE_NEWNS | net)
        except OSError as exc:
            warnings.append(f"new user namespace refused ({user_error.strerror}) and mount/net "
                            f"namespaces too ({exc.strerror}); {HOW_TO_ENABLE}")
            return []
        warnings.append(f"new user namespace refused ({user_error.strerror}); isolated with "
                        "mount/net namespaces and dropped capabilities instead (same kernel "
                        "boundary, but the worker shares the evaluator's user namespace)")
        return ["mount"] + (["net"] if net else [])
    why = ("the worker process is not single-threaded" if user_error.errno == errno.EINVAL
           else f"unprivileged user namespaces are disabled ({user_error.strerror})")
    if _in_container():
        warnings.append(f"no per-worker namespaces: {why}, as usual inside a container, whose "
                        "own boundary (see the Dockerfile's run line: --network none "
                        "--read-only) and the in-process sandbox apply")
    else:
        warnings.append(f"no OS-level isolation: {why}; {HOW_TO_ENABLE}")
    return []


def enter_private_network() -> list[str]:
    """Move this process into a new network namespace whose only interface is a loopback that
    is up: its children can talk to each other over 127.0.0.1 and reach nothing else. With
    CAP_SYS_ADMIN the user namespace stays the same (a profiler started next keeps the rights
    the GPU's performance counters may need); without it, a new user namespace comes first.
    Returns the namespaces entered; raises OSError where the kernel refuses."""
    if _thread_count() > 1:
        raise OSError(errno.EINVAL, "a new network namespace needs a single-threaded process")
    libc = _Libc()
    if _has_capability(CAP_SYS_ADMIN):
        libc.unshare(CLONE_NEWNET)
        entered = ["net"]
    else:
        uid, gid = os.geteuid(), os.getegid()
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)
        _write_id_maps(uid, gid)
        entered = ["user", "net"]
    _loopback_up()
    return entered


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)  # struct ifreq: name, flags, padding
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def network_interfaces() -> list[str]:
    """The network interfaces this process's network namespace has (``/proc/net/dev``)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines if ":" in line]


def _in_container() -> bool:
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def _write_id_maps(uid: int, gid: int) -> None:
    """Map this process's own uid/gid to the same ids inside (root stays root inside)."""
    with contextlib.suppress(FileNotFoundError):
        Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _mountinfo() -> list[tuple[int, str]]:
    """(mount id, mount point) of every mount this process sees, in the kernel's order."""
    entries = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040
        entries.append((int(fields[0]), point))
    return entries


def _mount_id(path: str) -> int | None:
    found = None
    for mount_id, point in _mountinfo():
        if point == path:
            found = mount_id  # the last one listed is the topmost
    return found


def _read_only_view(libc: _Libc, workdir: Path, writable: list[Path], policy: IsolationPolicy,
                    writable_now: list[str], warnings: list[str],
                    readable: Sequence[Path] = ()) -> bool:
    """Private propagation, writable binds and tmpfs first, then every other mount read-only.
    Returns whether the whole view is read-only (apart from what was meant to stay writable)."""
    try:
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        warnings.append(f"filesystem stays writable: private mount propagation refused ({exc})")
        return False
    keep: set[int] = set()
    # Every writable directory is opened before /tmp is covered (it may lie under /tmp) and
    # bound back at its real path from that descriptor.
    opened: list[tuple[str, int]] = []
    try:
        for path in dict.fromkeys([workdir, *writable]):
            try:
                opened.append((str(path), os.open(path, os.O_RDONLY | os.O_DIRECTORY)))
            except OSError as exc:
                if path == workdir:
                    raise
                warnings.append(f"{path} is read-only for the worker ({exc})")
        shown: list[tuple[str, int]] = []  # bound back like the writable ones, left read-only
        for path in outermost(readable):
            with contextlib.suppress(OSError):
                shown.append((str(path), os.open(path, os.O_RDONLY | os.O_DIRECTORY)))
        opened += shown
        mps = _open_mps_pipe_dir() if policy.private_tmp else None
        if mps is not None:
            opened.append(mps)
        if policy.private_tmp:
            for target in ("/tmp", "/dev/shm"):
                if os.path.isdir(target):
                    _tmpfs(libc, target, policy.tmpfs_mib, keep)
        if mps is not None:  # read-only like the rest: not added to keep
            with contextlib.suppress(OSError):
                _bind_fd(libc, mps[1], mps[0], 0)
        for path, fd in shown:  # under the private /tmp only: elsewhere they never went away
            if policy.private_tmp and _under(path, ("/tmp", "/dev/shm")):
                with contextlib.suppress(OSError):
                    _bind_fd(libc, fd, path, MS_REC)
        for path, fd in opened:
            if (mps is not None and fd == mps[1]) or (path, fd) in shown:
                continue
            try:
                _bind_fd(libc, fd, path, MS_REC)
            except OSError as exc:
                if path == str(workdir):
                    raise
                warnings.append(f"{path} is read-only for the worker ({exc})")
                continue
            keep.add(_mount_id(path) or -1)
            writable_now.append(path)
    except OSError as exc:
        warnings.append(f"filesystem stays writable: could not set up the private directory "
                        f"({exc})")
        return False
    finally:
        for _, fd in opened:
            os.close(fd)
    _scratch_environment(workdir, policy)
    # The CUDA driver writes to the process's own /proc entries (a read-only /proc makes
    # cudaGetDeviceCount fail with error 304, "OS call failed"): /proc/<pid> stays writable,
    # the rest of /proc (sysrq-trigger, sys, other processes' entries) does not.
    own = f"/proc/{os.getpid()}"
    try:
        libc.mount(own, own, None, MS_BIND | MS_REC)
        keep.add(_mount_id(own) or -1)
    except OSError as exc:
        keep.update(mount_id for mount_id, point in _mountinfo() if point == "/proc")
        warnings.append(f"/proc stays writable: its own entries could not be kept writable "
                        f"apart ({exc}) and CUDA needs them")
    failed = []
    # A remount acts on the topmost mount at a path; the writable mounts made above are the
    # topmost at theirs, so their paths are skipped, whatever lies under them.
    kept_points = {point for mount_id, point in _mountinfo() if mount_id in keep}
    for point in dict.fromkeys(point for _, point in _mountinfo()):
        if point in kept_points:
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # hidden under another mount or unreachable: nothing to reach it by
        if flags & os.ST_RDONLY:
            continue
        kept = sum(ms for st, ms in _KEPT_FLAGS if flags & st)
        try:
            libc.mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
        except OSError as exc:
            failed.append(f"{point} ({exc.strerror})")
    if failed:
        warnings.append("these mounts stay writable: " + ", ".join(failed))
    return not failed


def outermost(paths: Sequence[Path]) -> list[str]:
    """``paths`` without those inside another of them, in order. A folder bound back after its
    own parent would lie hidden under the parent's bind, where no remount reaches it (EINVAL),
    and the view would stay writable there."""
    unique = list(dict.fromkeys(str(p) for p in paths))
    return [p for p in unique if not any(p != q and _under(p, (q,)) for q in unique)]


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _hide_files(libc: _Libc, paths: list[Path], warnings: list[str]) -> bool:
    """Bind /dev/null over each existing file of ``paths`` (in this mount namespace only), so
    the worker reads it as empty. Returns False when one could not be hidden."""
    ok = True
    for path in paths:
        if not path.is_file():
            continue
        try:
            libc.mount("/dev/null", str(path), None, MS_BIND)
        except OSError as exc:
            ok = False
            warnings.append(f"{path} stays readable for the worker ({exc})")
    return ok


def _scratch_environment(workdir: Path, policy: IsolationPolicy) -> None:
    """Caches that default to HOME (read-only now) go to the private scratch space: Triton's
    (torch.compile in the trusted baseline; it fails on a read-only ~/.triton) and the CUDA
    driver's PTX JIT cache. Settings the user made are kept."""
    scratch = Path("/tmp/mmd-scratch") if policy.private_tmp else workdir / "scratch"
    for name, sub in (("TRITON_HOME", "triton-home"), ("TRITON_CACHE_DIR", "triton-cache"),
                      ("CUDA_CACHE_PATH", "cuda-jit-cache")):
        if name not in os.environ:
            with contextlib.suppress(OSError):
                (scratch / sub).mkdir(parents=True, exist_ok=True)
                os.environ[name] = str(scratch / sub)


def _tmpfs(libc: _Libc, target: str, size_mib: int, keep: set[int]) -> None:
    libc.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_mib}m,mode=1777")
    keep.add(_mount_id(target) or -1)


def _open_mps_pipe_dir() -> tuple[str, int] | None:
    """The NVIDIA MPS daemon's pipe directory (path, descriptor) if it lies under /tmp: it is
    bound back, read-only, under the private /tmp (connecting to its sockets needs no write
    access to the mount)."""
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT
    if not pipe_dir.startswith("/tmp/") or not os.path.isdir(pipe_dir):
        return None
    try:
        return pipe_dir, os.open(pipe_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def _bind_fd(libc: _Libc, fd: int, target: str, flags: int) -> None:
    """Bind the directory open as ``fd`` (opened before its path was covered) at ``target``."""
    os.makedirs(target, exist_ok=True)
    libc.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | flags)


def _has_capability(cap: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError):
        pass
    return False


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc: _Libc, warnings: list[str]) -> bool:
    """No capabilities from here on, and none regained by exec: the candidate cannot remount,
    unmount or re-map anything."""
    try:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        for cap in range(64):
            if libc.lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                if ctypes.get_errno() == errno.EINVAL:
                    break  # past the last capability this kernel knows
                raise OSError(ctypes.get_errno(), f"dropping capability {cap} from the bounding set")
        with contextlib.suppress(OSError):  # kernels before 4.3 have no ambient set
            libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        libc.call("capset", libc.lib.capset(ctypes.byref(header), data))
    except OSError as exc:
        warnings.append(f"capabilities not dropped ({exc}): the candidate could remount the "
                        "filesystem writable")
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Probe (doctor)
# ---------------------------------------------------------------------------------------------

PROBE = r'''
import errno, json, os, pathlib, sys, tempfile
from multiminddev.env.config import EvalConfig
from multiminddev.env import isolation
cfg = EvalConfig(isolation=sys.argv[1])
private = isolation.make_private_dir()
report = isolation.isolate_worker(private, [], isolation.IsolationPolicy(mode=cfg.isolation),
                                  hidden=isolation.worker_hidden_paths(cfg),
                                  readable=isolation.worker_readable_paths(cfg))
key = isolation.worker_hidden_paths(cfg)[0]
checks = {}
checks["cache_key"] = ("hidden" if not key.is_file() or key.stat().st_size == 0
                       or not os.access(key, os.R_OK) else "readable")
def attempt(name, path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        checks[name] = "writable"
    except OSError as exc:
        checks[name] = errno.errorcode.get(exc.errno, str(exc.errno))
attempt("write_private_dir", os.path.join(private, "probe"))
def attempt_proc(name, path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
        checks[name] = "writable"
    except OSError as exc:
        checks[name] = errno.errorcode.get(exc.errno, str(exc.errno))
if report.read_only_filesystem:
    attempt_proc("write_parent_proc", f"/proc/{os.getppid()}/oom_score_adj", "0")
attempt_proc("write_own_proc", "/proc/thread-self/comm", "mmd-probe")
if report.read_only_filesystem:  # never write into the real package dir otherwise
    attempt("write_outside", os.path.join(sys.argv[2], "mmd-isolation-probe"))
import ctypes, socket
checks["interfaces"] = sorted(name for _, name in socket.if_nameindex())
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]
if "mount" in report.namespaces:  # a remount outside a namespace would change the host's
    rc = libc.mount(None, b"/", None, isolation.MS_REMOUNT | isolation.MS_BIND, None)
    checks["remount_root_writable"] = ("allowed" if rc == 0
                                       else errno.errorcode[ctypes.get_errno()])
try:
    open(f"/proc/{os.getppid()}/mem", "rb").close()
    checks["parent_memory"] = "readable"
except OSError as exc:
    checks["parent_memory"] = errno.errorcode.get(exc.errno, str(exc.errno))
print("ISOLATION " + json.dumps({"report": report.to_dict(), "checks": checks}))
'''


def probe_worker_isolation(mode: Isolation | str = Isolation.AUTO,
                           timeout_s: float = 60.0) -> dict[str, Any]:
    """Isolate a throwaway child process the way a worker is and report what it got: the
    report, whether a write outside its private dir failed (EROFS) and which network
    interfaces it sees. Never touches this process."""
    import subprocess

    mode = Isolation(mode)
    outside = Path(__file__).resolve().parent  # a directory of the installed package
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, mode.value, str(outside)],
                             capture_output=True, text=True, timeout=timeout_s, env=env,
                             check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"ok": False, "boundary": f"unknown: probe failed ({exc})"}
    line = next((x for x in out.stdout.splitlines() if x.startswith("ISOLATION ")), None)
    if line is None:
        return {"ok": False, "boundary": f"unknown: probe failed (rc={out.returncode}): "
                                         f"{out.stderr.strip()[-400:]}"}
    data = __import__("json").loads(line.removeprefix("ISOLATION "))
    report = data["report"]
    return {"ok": report["status"] == IsolationStatus.ACTIVE.value, "status": report["status"],
            "boundary": report["boundary"], "warnings": report["warnings"],
            "writable": report["writable"], "checks": data["checks"]}
