"""Benchmark metrics: geometric mean, fast_p, unbiased pass@k, summaries and per-turn curves.

Definitions (KernelBench / Codex conventions):

- ``geometric_mean(xs) = exp(mean(log x))`` over the *positive, finite* values only: a speedup of
  0 means "no timed correct kernel" and has no logarithm, so callers take the geometric mean over
  correct results and report the correctness rate beside it. Empty -> NaN.
- ``fast_p``: the fraction of *all* problems (samples) that are correct **and** faster than ``p``
  times the baseline; ``fast_0`` is the correctness rate.
- ``pass_at_k(n, c, k) = 1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021), computed in the stable
  product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``.

Every summary carries ``devices`` (what the timings were measured on) and the status counts, so a
compile-only run on a machine without a GPU (status ``no_gpu``) cannot pass for a measured one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multiminddev.core.stats import geometric_mean
from multiminddev.env.results import EvalResult, EvalStatus, RejectReason

FAST_P_THRESHOLDS = (0.0, 1.0, 1.2, 2.0)
# What a figure says where nothing was measured (no GPU: candidates compile but cannot run).
NOT_MEASURED = "not measured (no GPU: compile-only)"


def fast_p(correct: Sequence[bool], speedups: Sequence[float], p: float) -> float:
    """Fraction of problems that are correct and have ``speedup > p`` (KernelBench); NaN if empty."""
    if len(correct) != len(speedups):
        raise ValueError(f"correct has {len(correct)} entries but speedups {len(speedups)}")
    if not correct:
        return float("nan")
    hits = sum(1 for c, s in zip(correct, speedups) if c and s is not None and s > p)
    return hits / len(correct)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def bootstrap_ci(
    values: Sequence[Any],
    stat_fn: Callable[[Sequence[Any]], float],
    n: int = 1000,
    seed: int = 0,
    *,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat_fn`` over resamples of ``values`` (with replacement).

    Resamples whose statistic is NaN (e.g. a geometric mean of nothing) are dropped.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    values = list(values)
    if not values:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n):
        idx = rng.integers(0, len(values), size=len(values))
        s = stat_fn([values[i] for i in idx])
        if s is not None and math.isfinite(s):
            stats.append(s)
    if not stats:
        return float("nan"), float("nan")
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


# --- summaries -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoCandidate:
    """A sample whose reply held no usable candidate (a format failure): it counts in every
    denominator as a sample that neither compiled nor passed, with status ``format_failure``."""

    problem: str


Sample = EvalResult | NoCandidate
FORMAT_FAILURE = "format_failure"


def summarize_results(
    results: Sequence[Sample],
    *,
    tiers: Mapping[str, int] | None = None,
    ks: Sequence[int] = (1, 5, 10),
    thresholds: Sequence[float] = FAST_P_THRESHOLDS,
) -> dict[str, Any]:
    """KernelBench-style summary of results (one per sample; several samples per problem allowed).

    Rates and fast_p are over samples (format failures, :class:`NoCandidate`, included); pass@k
    groups samples by problem and averages the unbiased estimate over problems, for each k in
    ``ks`` no larger than every problem's sample count, and for that smallest count itself. Geometric means are over correct samples.
    ``tiers`` (problem name -> tier) adds a ``per_tier`` table. NaN figures (nothing to
    average) are written as ``None`` so the summary is valid JSON.
    """
    out = _rates(results, thresholds)
    out["pass_at_k"] = _pass_at_k_table(results, ks)
    if tiers:
        by_tier: dict[int, list[Sample]] = defaultdict(list)
        for r in results:
            if r.problem in tiers:
                by_tier[int(tiers[r.problem])].append(r)
        out["per_tier"] = {str(t): _rates(rs, thresholds) for t, rs in sorted(by_tier.items())}
    return out


def _is_correct(r: Sample) -> bool:
    return isinstance(r, EvalResult) and r.correct


def _rates(samples: Sequence[Sample], thresholds: Sequence[float]) -> dict[str, Any]:
    n = len(samples)
    results = [r for r in samples if isinstance(r, EvalResult)]
    status = Counter(r.status.value for r in results)
    if len(results) < n:
        status[FORMAT_FAILURE] = n - len(results)
    reasons = Counter(r.reject_reason.value for r in results
                      if r.status is EvalStatus.REJECTED and r.reject_reason is not None)
    bad_input = reasons.get(RejectReason.ENCODING.value, 0)  # not UTF-8: not a hack
    # A sample that could not run (no GPU) has no known correctness, so neither has a rate over
    # it: None ("not measured"), never a 0 that reads as "all wrong".
    measured = not status.get(EvalStatus.NO_GPU.value)
    correct = [_is_correct(r) for r in samples]
    speedups = [r.speedup if isinstance(r, EvalResult) else 0.0 for r in samples]
    vs_compile = [r.benchmark.speedup_vs_compile for r in results if r.correct]
    fracs = [r.benchmark.fraction_of_peak for r in results if r.correct]
    return {
        "n": n,
        "problems": len({r.problem for r in samples}),
        "compile_rate": _ratio(sum(r.compiled for r in results), n),
        "correct_rate": _ratio(sum(correct), n) if measured else None,
        "rejected_rate": _ratio(status.get(EvalStatus.REJECTED.value, 0) - bad_input, n),
        "bad_input_rate": _ratio(bad_input, n),
        "no_gpu_rate": _ratio(status.get(EvalStatus.NO_GPU.value, 0), n),
        "format_failure_rate": _ratio(status.get(FORMAT_FAILURE, 0), n),
        "status_counts": dict(sorted(status.items())),
        "reject_reasons": dict(sorted(reasons.items())),
        "fast_p": {_p_key(p): _finite(fast_p(correct, speedups, p)) if measured else None
                   for p in thresholds},
        "geomean_speedup_vs_eager": _finite(geometric_mean(s for s, c in zip(speedups, correct) if c)),
        "geomean_speedup_vs_compile": _finite(geometric_mean(s for s in vs_compile if s is not None)),
        "mean_fraction_of_peak": _finite(_mean([f for f in fracs if f is not None])),
        "devices": sorted({r.device for r in results if r.device}),
    }


def _pass_at_k_table(results: Sequence[Sample], ks: Sequence[int]) -> dict[str, float]:
    if any(isinstance(r, EvalResult) and r.status is EvalStatus.NO_GPU for r in results):
        return {}  # correctness not measured (no GPU): no pass@k to state
    per_problem: dict[str, list[bool]] = defaultdict(list)
    for r in results:
        per_problem[r.problem].append(_is_correct(r))
    if not per_problem:
        return {}
    min_n = min(len(v) for v in per_problem.values())
    table = {}
    for k in sorted(set(ks) | {min_n}):  # also the largest k every problem allows
        if k <= min_n:
            table[str(k)] = _mean([pass_at_k(len(v), sum(v), k) for v in per_problem.values()])
    return table


def _p_key(p: float) -> str:
    return f"{p:g}"


def _ratio(a: float, b: int) -> float | None:
    return a / b if b else None


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# --- episodes --------------------------------------------------------------------------------


def episode_attempts(episode: Mapping[str, Any]) -> list[dict[str, Any] | None]:
    """The EvalResult dicts of an episode's agent turns, in order (None: no candidate/result).

    Tolerant of the episode schema: uses only ``turns[*].role`` and ``turns[*].eval_result``.
    An attempt is a Generator/Optimizer turn; if results were recorded on Tester turns instead
    (no agent turn has one), each Tester turn's result stands for the attempt it checked.
    """
    turns = list(episode.get("turns") or [])
    agent = [t for t in turns if str(t.get("role", "")).lower() != "tester"]
    tester = [t for t in turns if str(t.get("role", "")).lower() == "tester"]
    if not any(t.get("eval_result") for t in agent) and any(t.get("eval_result") for t in tester):
        return [t.get("eval_result") or None for t in tester]
    return [t.get("eval_result") or None for t in agent]


def episode_best_result(episode: Mapping[str, Any]) -> EvalResult | None:
    """The episode's best attempt: its recorded ``best_result`` when present, else the fastest
    correct attempt, else the one that got furthest (compiled over not; a rejected hack last;
    later on ties). None when no attempt produced a candidate."""
    recorded = episode.get("best_result")
    if isinstance(recorded, Mapping) and recorded:
        return EvalResult.from_dict(dict(recorded))
    results = [EvalResult.from_dict(d) for d in episode_attempts(episode) if d]
    if not results:
        return None

    def rank(item: tuple[int, EvalResult]) -> tuple:
        i, r = item
        not_rejected = r.status is not EvalStatus.REJECTED
        return (r.correct, r.speedup, r.compiled and not_rejected, not_rejected, i)

    return max(enumerate(results), key=rank)[1]


def per_turn_curves(episodes: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """How correctness and speed improve with each attempt, over all episodes.

    For attempt k (1-based) and each episode, the state "so far" is its best over attempts 1..k
    (an episode that stopped early keeps its final state). Returns lists indexed by attempt:
    ``frac_correct`` (correct so far), ``fast_1`` (correct and > 1x eager so far),
    ``geomean_best_speedup`` (over episodes with a timed correct kernel so far; None when none),
    ``attempts_made`` (episodes that actually made attempt k).
    """
    per_episode = [[_attempt_state(d) for d in episode_attempts(ep)] for ep in episodes]
    horizon = max((len(a) for a in per_episode), default=0)
    curves: dict[str, list[Any]] = {
        "attempt": [], "frac_correct": [], "fast_1": [], "geomean_best_speedup": [], "attempts_made": []
    }
    for k in range(1, horizon + 1):
        correct = [any(c for c, _ in a[:k]) for a in per_episode]
        best = [max((s for c, s in a[:k] if c), default=0.0) for a in per_episode]
        curves["attempt"].append(k)
        curves["frac_correct"].append(_ratio(sum(correct), len(per_episode)))
        curves["fast_1"].append(_finite(fast_p(correct, best, 1.0)))
        curves["geomean_best_speedup"].append(_finite(geometric_mean(best)))
        curves["attempts_made"].append(sum(len(a) >= k for a in per_episode))
    return curves


def _attempt_state(result: Mapping[str, Any] | None) -> tuple[bool, float]:
    """(correct, speedup vs eager) of one attempt's EvalResult dict; speedup 0 when untimed."""
    if not result or result.get("status") != EvalStatus.OK.value:
        return False, 0.0
    speed = (result.get("benchmark") or {}).get("speedup_vs_eager") or 0.0
    return True, float(speed)
