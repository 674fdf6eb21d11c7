"""Scale-out on Ray: the evaluation service (``ray_eval``), cluster connection (``cluster``) and
GRPO rollout workers (``rollout``, ``grpo``).

Ray is an optional extra (``pip install 'multiminddev[ray]'``): nothing here imports it until a
cluster is used, so importing this package costs nothing without it.

    from multiminddev.distributed import RayEvaluator, RayEvalConfig, make_evaluator
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "RayEvaluator": "multiminddev.distributed.ray_eval",
    "RayEvalConfig": "multiminddev.distributed.ray_eval",
    "make_evaluator": "multiminddev.distributed.ray_eval",
    "LocalClusterConfig": "multiminddev.distributed.cluster",
    "RayUnavailableError": "multiminddev.distributed.cluster",
    "connect": "multiminddev.distributed.cluster",
    "disconnect": "multiminddev.distributed.cluster",
    "RayRollouts": "multiminddev.distributed.rollout",
    "RayScaleOut": "multiminddev.distributed.grpo",
}

__all__ = ["LocalClusterConfig", "RayEvalConfig", "RayEvaluator", "RayRollouts", "RayScaleOut",
           "RayUnavailableError", "connect", "disconnect", "make_evaluator"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'multiminddev.distributed' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
