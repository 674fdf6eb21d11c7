"""Kernel evaluation environment: static checks -> compile -> verify -> benchmark -> EvalResult.

``from multiminddev.env import Evaluator, EvalConfig`` stays light (no torch import until the
evaluator is built); see ``evaluator.py`` for the service and ``worker.py`` for isolation.
"""

from __future__ import annotations

from typing import Any

from multiminddev.env.config import EvalConfig, StartMethod
from multiminddev.env.results import EvalResult, EvalStatus, RejectReason, StageStatus

__all__ = ["EvalConfig", "EvalResult", "EvalStatus", "Evaluator", "RejectReason", "StageStatus",
           "StartMethod", "verify_outputs"]


def __getattr__(name: str) -> Any:
    if name == "Evaluator":
        from multiminddev.env.evaluator import Evaluator

        return Evaluator
    if name == "verify_outputs":
        from multiminddev.env.verify import verify_outputs

        return verify_outputs
    raise AttributeError(f"module 'multiminddev.env' has no attribute {name!r}")
