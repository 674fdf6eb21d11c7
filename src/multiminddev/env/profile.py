"""Nsight Compute figures for one candidate kernel, measured inside the evaluation sandbox.

``profile_kernel(problem, source, cfg)`` runs ``ncu`` in a network namespace of its own (a
loopback alone) on a fresh child process (``python -m multiminddev.env.profile_harness``) that
applies the same boundary as an evaluation worker before the candidate's code loads: the
worker's namespaces and read-only filesystem view (``isolation.isolate_worker``, per
``cfg.isolation``), its private compile caches and the sandbox (``sandbox.install_sandbox``).
``ncu`` itself is trusted; the candidate never runs outside that boundary. The candidate's forward pass runs once, inside an NVTX range, and only
kernels launched in that range are profiled (``--nvtx-include``), so the reference's input
setup is not. Where the boundary cannot be set up (isolation required and refused, say) the
harness exits before the candidate loads and the profile is ``FAILED`` with the reason.

Profile only candidates that already passed an evaluation (static checks included): this adds
figures for a kernel known to be correct, it is no check of its own. No ``ncu`` on PATH, or no
GPU: ``SKIPPED``, never an exception.
"""

from __future__ import annotations

import csv
import enum
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiminddev.env import profile_harness as harness
from multiminddev.env.config import EvalConfig

NVTX_RANGE = harness.NVTX_RANGE
# One profile at a time: Nsight Compute takes the GPU's performance counters for the run, and
# concurrent episodes would otherwise start several.
_PROFILE_LOCK = threading.Lock()
# The figures the Tester reports: achieved occupancy, memory throughput (the larger of the
# memory units' and DRAM's, % of peak), threads active per warp instruction (of 32: warp
# execution efficiency), time, and the warp stall reasons (cycles a warp spent stalled per
# issued instruction, by reason).
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
THREADS_PER_WARP_INSTRUCTION = "smsp__thread_inst_executed_per_inst_executed.ratio"
DURATION = "gpu__time_duration.sum"
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
# the stall reasons by pattern: the set of reasons differs between Nsight Compute versions
NCU_METRICS = (OCCUPANCY, MEMORY_THROUGHPUT, DRAM_THROUGHPUT, THREADS_PER_WARP_INSTRUCTION,
               DURATION, f"regex:{STALL_PREFIX}.*{STALL_SUFFIX.replace('.', '[.]')}")


_TO_NANOSECONDS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


class ProfileStatus(str, enum.Enum):
    OK = "ok"
    SKIPPED = "skipped"  # no ncu, or no GPU: nothing ran
    FAILED = "failed"  # ncu or the harness failed, or no kernel was profiled


@dataclass(frozen=True, kw_only=True)
class KernelFigures:
    """One profiled kernel launch: its name and metric values (metric name -> number)."""

    kernel: str
    metrics: Mapping[str, float]


@dataclass(frozen=True, kw_only=True)
class KernelProfile:
    status: ProfileStatus
    kernels: tuple[KernelFigures, ...] = ()
    message: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message, "seconds": self.seconds,
                "kernels": [{"kernel": k.kernel, "metrics": dict(k.metrics)}
                            for k in self.kernels]}


def ncu_path() -> str | None:
    """Where ``ncu`` is, or None."""
    return shutil.which("ncu")


def parse_ncu_csv(text: str) -> list[KernelFigures]:
    """The kernel launches in ``ncu --csv`` output (its details page: one row per launch and
    metric, the header from ``"ID"`` on), in launch order. Lines that are not the CSV table
    (``==PROF==`` progress, the program's own output) are skipped; values lose their thousands
    separators and times are in nanoseconds (ncu picks the unit per value); a value that is
    not a number (``n/a``) is left out."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    launches: dict[str, tuple[str, dict[str, float]]] = {}
    for row in csv.DictReader(lines[start:]):
        launch = row.get("ID") or ""
        name, value = row.get("Metric Name") or "", (row.get("Metric Value") or "").strip()
        if not name:
            continue
        _, metrics = launches.setdefault(launch, (row.get("Kernel Name") or "", {}))
        try:
            number = float(value.replace(",", ""))
        except ValueError:
            continue
        metrics[name] = number * _TO_NANOSECONDS.get((row.get("Metric Unit") or "").strip(), 1.0)
    return [KernelFigures(kernel=kernel, metrics=metrics) for kernel, metrics in launches.values()]


def launch_command(ncu: str, config_path: Path, harness_args: list[str]) -> list[str]:
    """``ncu_command`` started by the harness's launcher, in a network namespace of its own
    (env/profile_harness.py says why)."""
    return [sys.executable, "-m", "multiminddev.env.profile_harness", "launch", str(config_path),
            "--", *ncu_command(ncu, harness_args)]


def ncu_command(ncu: str, harness_args: list[str]) -> list[str]:
    """The ``ncu`` command line around the harness: the metrics above, only kernels launched
    in the candidate's NVTX range, CSV on stdout."""
    return [ncu, "--csv", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
            "--metrics", ",".join(NCU_METRICS), "--target-processes", "all",
            sys.executable, "-m", "multiminddev.env.profile_harness", *harness_args]


def profile_kernel(problem: Any, source: str, cfg: EvalConfig | None = None, *,
                   timeout_s: float = 180.0) -> KernelProfile:
    """Nsight Compute figures of ``source``'s kernels for one forward pass on ``problem``'s
    inputs, the candidate inside the evaluation sandbox (module docstring)."""
    import time

    ncu = ncu_path()
    if ncu is None:
        return KernelProfile(status=ProfileStatus.SKIPPED,
                             message="ncu (Nsight Compute) is not on PATH")
    cfg = cfg or EvalConfig()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mmd-profile-") as tmp:
        d = Path(tmp)
        (d / "problem.py").write_text(problem.source)
        (d / "candidate.py").write_text(source)
        (d / "config.json").write_text(json.dumps(cfg.to_dict()))
        args = [str(d / "problem.py"), str(d / "candidate.py"), str(d / "config.json"),
                problem.name]
        try:
            with _PROFILE_LOCK:
                proc = subprocess.run(launch_command(ncu, d / "config.json", args),
                                      capture_output=True, text=True,
                                      timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return KernelProfile(status=ProfileStatus.FAILED,
                                 message=f"ncu timed out after {timeout_s:.0f} s",
                                 seconds=time.perf_counter() - start)
        except OSError as exc:
            return KernelProfile(status=ProfileStatus.FAILED, message=f"could not run ncu: {exc}")
    return profile_from_output(proc.returncode, proc.stdout, proc.stderr,
                               seconds=time.perf_counter() - start)


def profile_from_output(returncode: int, stdout: str, stderr: str, *,
                        seconds: float = 0.0) -> KernelProfile:
    """The profile an ``ncu`` run gave: its kernels, or why there are none."""
    if returncode == harness.NO_GPU_EXIT:
        return KernelProfile(status=ProfileStatus.SKIPPED, message="no CUDA GPU", seconds=seconds)
    kernels = parse_ncu_csv(stdout)
    if returncode != 0 or not kernels:
        tail = " ".join((stderr or stdout).strip().splitlines()[-3:])[-400:]
        why = (harness.EXIT_REASONS.get(returncode, f"exit status {returncode}")
               if returncode else "no kernel was launched in the candidate's forward pass")
        return KernelProfile(status=ProfileStatus.FAILED, message=f"{why}: {tail}".strip(": "),
                             seconds=seconds)
    return KernelProfile(status=ProfileStatus.OK, kernels=tuple(kernels), seconds=seconds)
