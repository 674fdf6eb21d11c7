"""Where a ``load_inline`` build runs: a fresh process, isolated and limited like a worker.

nvcc and g++ compile candidate source, so they run under the boundary evaluation workers run
under (``isolation.isolate_worker``: user, mount and network namespaces, a read-only view of the
filesystem but for the build cache and a private directory), with an environment built from an
allowlist when the process is exec'd (nothing of the evaluator's environment is copied: a
compiler that read ``/proc/self/environ`` or its parent's would find only these values), and
with limits the kernel enforces on every compiler process: address space (``RLIMIT_AS``), CPU
time, file size, and a wall-clock limit after which the whole process group is killed.

``run_build_process`` is the trusted side (the evaluator's build pool); ``child_main`` runs in
the fresh process (``python -m multiminddev.env.inline_build_child``) and writes its JSON outcome
to a file in the private directory. Covered: what the compiler reads (with
``cuda.include_policy``, only the candidate's sources and the toolkit's, torch's and the C++
library's headers), what it can write, how long and how much memory it uses. Not covered: a
host where the kernel refuses unprivileged namespaces (the build then runs with the environment
and limits only, and says so in a warning, as workers do).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev.env import isolation
from multiminddev.env.config import Isolation

CHILD_MODULE = "multiminddev.env.inline_build_child"
OUTCOME_FILE = "outcome.json"
GIB = 1 << 30


@dataclass(kw_only=True, frozen=True)
class InlineBuildLimits:
    """Limits of one ``load_inline`` build process and every compiler it starts."""

    memory_bytes: int = 16 * GIB  # RLIMIT_AS of each process (nvcc's cicc, g++'s cc1plus, ...)
    cpu_seconds: int = 600  # RLIMIT_CPU of each process
    wall_seconds: float = 300.0  # then the build's whole process group is killed
    file_bytes: int = 4 * GIB  # RLIMIT_FSIZE: no file the build writes grows past this
    jobs: int = 2  # ninja's parallel compiler processes (MAX_JOBS)
    isolation: Isolation = Isolation.AUTO

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "cpu_seconds", "file_bytes", "jobs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"InlineBuildLimits.{name} must be a positive int, got {value!r}")
        if not self.wall_seconds > 0:
            raise ValueError(f"InlineBuildLimits.wall_seconds must be > 0, got "
                             f"{self.wall_seconds!r}")
        object.__setattr__(self, "isolation", Isolation(self.isolation))


def build_environment(private: Path, arch_list: str, cuda_home: str | None,
                      jobs: int) -> dict[str, str]:
    """The whole environment of a build process, built from scratch: tool locations derived
    from where the tools are, never copied from this process's environment."""
    tool_dirs = [str(Path(sys.executable).parent)]
    if cuda_home:
        tool_dirs.append(str(Path(cuda_home) / "bin"))
    env = {
        "PATH": os.pathsep.join([*dict.fromkeys(tool_dirs), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(private),
        "TMPDIR": str(private),
        "TORCH_EXTENSIONS_DIR": str(private / "torch_extensions"),
        "TORCH_CUDA_ARCH_LIST": arch_list,
        "MAX_JOBS": str(jobs),
        # Where this process imports code from, so the build runs the same code and torch
        "PYTHONPATH": os.pathsep.join(str(p) for p in isolation.code_paths()),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    if cuda_home:
        env["CUDA_HOME"] = str(cuda_home)
    return env


def run_build_process(build_args: dict[str, Any], env: dict[str, str], private: Path,
                      limits: InlineBuildLimits) -> dict[str, Any]:
    """Run one build in a fresh process (``child_main``) and return its JSON outcome; a build
    past ``limits.wall_seconds`` is killed with its compilers and is ``timeout``."""
    job = {"args": build_args, "limits": {
        "memory_bytes": limits.memory_bytes, "cpu_seconds": limits.cpu_seconds,
        "file_bytes": limits.file_bytes, "isolation": limits.isolation.value}}
    proc = subprocess.Popen(
        [sys.executable, "-m", CHILD_MODULE, str(private)], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(private),
        start_new_session=True, close_fds=True)
    try:
        _, stderr = proc.communicate(json.dumps(job).encode(), timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return {"status": "timeout", "seconds": limits.wall_seconds, "log": "",
                "error": f"load_inline build ran past {limits.wall_seconds:.0f} s"}
    finally:
        _kill_group(proc)  # a compiler left behind by a finished build dies with its group
    try:
        return json.loads((private / OUTCOME_FILE).read_text())
    except (OSError, ValueError):
        tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return {"status": "error", "seconds": 0.0, "log": "",
                "error": f"build process exited with status {proc.returncode} {tail[0][:300]}"}


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def private_build_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="mmd-inline-build-"))


def remove_private_build_dir(private: Path) -> None:
    shutil.rmtree(private, ignore_errors=True)


# ---------------------------------------------------------------- inside the build process


def child_main(build: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The build process: isolate (first, while single-threaded), lower the limits, build,
    write the outcome. ``build`` takes the job's ``args`` and returns a JSON-able outcome."""
    private = Path(sys.argv[1])
    job = json.loads(sys.stdin.read())
    limits = job["limits"]
    cache_root = Path(job["args"]["cache_root"])
    cache_root.mkdir(parents=True, exist_ok=True)
    report = isolation.isolate_worker(
        private, [cache_root], isolation.IsolationPolicy(mode=Isolation(limits["isolation"])),
        readable=isolation.code_paths())
    set_build_limits(limits["memory_bytes"], limits["cpu_seconds"], limits["file_bytes"])
    outcome = build(job["args"])
    outcome["isolation"] = report.status.value
    (private / OUTCOME_FILE).write_text(json.dumps(outcome))


def set_build_limits(memory_bytes: int, cpu_seconds: int, file_bytes: int) -> None:
    """Lower (never raise) this process's limits; the compilers it starts inherit them."""
    for which, value in ((resource.RLIMIT_AS, memory_bytes), (resource.RLIMIT_CPU, cpu_seconds),
                         (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_CORE, 0)):
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        if soft == resource.RLIM_INFINITY or value < soft:
            resource.setrlimit(which, (value, hard))
