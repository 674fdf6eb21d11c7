"""Summary statistics shared by every layer that reports figures."""

from __future__ import annotations

import math
from collections.abc import Iterable


def geometric_mean(xs: Iterable[float]) -> float:
    """``exp(mean(log x))`` over positive finite values (others ignored); NaN when none are."""
    logs = [math.log(x) for x in xs if x is not None and math.isfinite(x) and x > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")
