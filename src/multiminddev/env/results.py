"""Result dataclasses for every evaluation stage, defined in ``core.results``.

They live on the floor because ``cuda`` reports its compile results (and caches them) with the
same types; this module keeps ``multiminddev.env.results`` the place to import them from.
"""

from multiminddev.core.results import (
    BenchmarkResult,
    CompileResult,
    Diagnostic,
    EvalResult,
    EvalStatus,
    Finding,
    KernelResources,
    RejectReason,
    StageStatus,
    StaticCheckResult,
    TimingStats,
    TrialMismatch,
    VerifyResult,
    _from_jsonable,
    _to_jsonable,
)

# The JSON codec is private to the result types; env's stages use it to cross the worker pipe.
__all__ = ["BenchmarkResult", "CompileResult", "Diagnostic", "EvalResult", "EvalStatus", "Finding",
           "KernelResources", "RejectReason", "StageStatus", "StaticCheckResult", "TimingStats",
           "TrialMismatch", "VerifyResult", "_from_jsonable", "_to_jsonable"]
