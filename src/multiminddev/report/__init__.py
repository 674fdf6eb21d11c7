"""Benchmark metrics, plots and static HTML reports."""

from multiminddev.report.metrics import (
    bootstrap_ci,
    fast_p,
    geometric_mean,
    pass_at_k,
    per_turn_curves,
    summarize_results,
)

__all__ = ["bootstrap_ci", "fast_p", "geometric_mean", "pass_at_k", "per_turn_curves", "summarize_results"]
