"""The scripts under benchmarks/ are no package: tests load them by path."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module registered under ``name`` (dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def eval_result(status, speedup=0.0, problem="relu"):
    """An EvalResult of ``status`` in the real schema: verified and timed when OK, failed to
    compile when COMPILE_ERROR, compiled but failing verification otherwise."""
    from multiminddev.env.results import (
        BenchmarkResult,
        CompileResult,
        EvalResult,
        EvalStatus,
        StageStatus,
        VerifyResult,
    )

    ok = status is EvalStatus.OK
    compiled = status is not EvalStatus.COMPILE_ERROR
    return EvalResult(
        status=status, problem=problem,
        compile=CompileResult(status=StageStatus.OK if compiled else StageStatus.FAILED,
                              arch="sm_90"),
        verify=VerifyResult(status=StageStatus.OK if ok else StageStatus.FAILED, trials_run=3,
                            trials_passed=3 if ok else 0),
        benchmark=BenchmarkResult(status=StageStatus.OK if ok else StageStatus.SKIPPED,
                                  speedup_vs_eager=speedup))
