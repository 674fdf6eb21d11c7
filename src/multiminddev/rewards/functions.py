"""Rewards as pure functions of structured evaluation results.

``compute_reward(result, cfg, source)`` turns one :class:`EvalResult` (``None`` = the reply had no
usable candidate: a format failure) into a :class:`RewardBreakdown` whose ``components`` sum to
``total``, so every term can be logged. Four kinds (:class:`RewardKind`):

``GATED_SHAPED`` (default)
    Gate: compiled and every verification trial passed, else no shaped reward.
    Shaped: ``0.5*pass_rate + 0.4*speedup_norm - 0.05*reg_pressure - 0.05*smem_over
    - 0.1*timeout``, bonuses ``+0.05`` for warp shuffles (``__shfl`` in the source) and ``+0.05``
    for coalesced access (a source heuristic, see :func:`uses_coalesced_access`).
    Compile-only credit: a candidate that compiled but did not pass the gate gets
    ``compile_credit`` (0.1). This matters on a machine without a GPU, where every compiled
    candidate ends as ``no_gpu``: compiling is then the only signal, and it is the reward.
``WEIGHTED`` (a fixed weighting of speed, correctness, efficiency and compiling)
    ``0.4*min(speedup/target, cap) + 0.3*correct + 0.2*efficiency + 0.1*compiles``.
``ROOFLINE``
    ``0.3*correct + 0.6*roofline + 0.1*compiles`` with ``roofline = benchmark.fraction_of_peak``
    (achieved / peak memory bandwidth) when correct; problems without ``bytes_moved`` fall back to
    the normalised speedup scaled into [0, 1] (then the component is ``roofline_speedup_fallback``).
``KEVIN`` (Kevin-32B)
    ``0.3*correct + speedup*correct`` with the raw speedup capped at ``max_raw_speedup``; a
    compiled but incorrect candidate gets ``compile_credit`` as in the gated kind.

Explicit values for every failure, whatever the kind: format failure ->
``format_failure_reward``; rejected (a reward hack) -> ``rejected_reward`` (negative);
infrastructure error -> ``infra_error_reward`` (0, not the candidate's fault: the trainer may
drop such samples, the ``infra_error`` component says which); timeouts and runtime errors add
``-timeout_penalty`` / ``-runtime_error_penalty`` to what the compile stage earned.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from multiminddev.env.results import EvalResult, EvalStatus, StageStatus


class RewardKind(str, enum.Enum):
    GATED_SHAPED = "gated_shaped"
    WEIGHTED = "weighted"
    KEVIN = "kevin"
    ROOFLINE = "roofline"


# Weights of each kind's main terms (penalties and bonuses are separate config fields).
_DEFAULT_WEIGHTS: dict[RewardKind, dict[str, float]] = {
    RewardKind.GATED_SHAPED: {"pass_rate": 0.5, "speedup": 0.4},
    RewardKind.WEIGHTED: {"speedup": 0.4, "correct": 0.3, "efficiency": 0.2, "compiles": 0.1},
    RewardKind.ROOFLINE: {"correct": 0.3, "roofline": 0.6, "compiles": 0.1},
    RewardKind.KEVIN: {"correct": 0.3, "speedup": 1.0},
}


@dataclass(kw_only=True)
class RewardConfig:
    """How an :class:`EvalResult` becomes a scalar reward (see the module docstring)."""

    kind: RewardKind = RewardKind.GATED_SHAPED
    target_speedup: float = 2.0  # speedup_norm = min(speedup / target_speedup, speedup_cap)
    speedup_cap: float = 2.0
    max_raw_speedup: float = 10.0  # KEVIN uses the raw speedup: cap outliers
    weights: Mapping[str, float] | None = None  # overrides of the kind's main-term weights
    # Gated-shaped penalties and bonuses (positive magnitudes).
    reg_pressure_penalty: float = 0.05
    smem_over_penalty: float = 0.05
    shuffle_bonus: float = 0.05
    coalesced_bonus: float = 0.05
    register_threshold: int = 128  # > this many registers per thread, or any spill = pressure
    smem_threshold_bytes: int = 48 * 1024  # static shared memory per block without opt-in
    # Explicit values for failures (all kinds).
    compile_credit: float = 0.1
    timeout_penalty: float = 0.1
    runtime_error_penalty: float = 0.0
    format_failure_reward: float = -0.1
    rejected_reward: float = -0.5
    infra_error_reward: float = 0.0
    require_all_trials: bool = True  # gate: every trial passed (False: at least one)
    # Subtracted when a turn resubmits a kernel an earlier turn of its episode wrote. Without it
    # a copied correct kernel earns what writing it earned, so copying is the safe policy: with
    # repair pairs in its SFT data the Optimizer resubmitted its input in most turns
    # (docs/training.md, "Optimizer repair pairs"). Off by default: its effect on GRPO is
    # unmeasured.
    repeat_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, RewardKind):
            try:
                self.kind = RewardKind(self.kind)
            except ValueError:
                names = ", ".join(k.value for k in RewardKind)
                raise ValueError(f"RewardConfig.kind={self.kind!r} is unknown; use one of {names}")
        if self.target_speedup <= 0:
            raise ValueError(f"target_speedup must be > 0 (got {self.target_speedup}); 2.0 is usual")
        if self.speedup_cap <= 0 or self.max_raw_speedup <= 0:
            raise ValueError("speedup_cap and max_raw_speedup must be > 0; they bound the speed term")
        if self.weights is not None:
            unknown = set(self.weights) - set(_DEFAULT_WEIGHTS[self.kind])
            if unknown:
                raise ValueError(
                    f"weights {sorted(unknown)} are not terms of {self.kind.value}; "
                    f"its terms are {sorted(_DEFAULT_WEIGHTS[self.kind])}"
                )
            self.weights = {k: float(v) for k, v in self.weights.items()}
        for name in ("reg_pressure_penalty", "smem_over_penalty", "shuffle_bonus",
                     "coalesced_bonus", "compile_credit", "timeout_penalty",
                     "runtime_error_penalty", "repeat_penalty"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} is a magnitude and must be >= 0 (got {getattr(self, name)})")
        if self.rejected_reward > 0:
            raise ValueError(
                f"rejected_reward must be <= 0 (got {self.rejected_reward}): a reward hack must "
                "never earn more than an honest failure"
            )
        if self.register_threshold <= 0 or self.smem_threshold_bytes <= 0:
            raise ValueError("register_threshold and smem_threshold_bytes must be > 0")

    def resolved_weights(self) -> dict[str, float]:
        return {**_DEFAULT_WEIGHTS[self.kind], **(self.weights or {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RewardConfig:
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["kind"] = self.kind.value
        out["weights"] = dict(self.weights) if self.weights is not None else None
        return out


@dataclass(kw_only=True)
class RewardBreakdown:
    total: float
    components: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "components": dict(self.components)}


def compute_reward(
    result: EvalResult | None, cfg: RewardConfig, source: str | None = None, *,
    repeated: bool = False,
) -> RewardBreakdown:
    """Reward of one evaluated candidate; ``None`` means the reply had no usable candidate.

    ``source`` is the candidate's text, used only by the gated kind's source bonuses.
    ``repeated``: an earlier turn of the episode wrote the same kernel (``repeat_penalty``).
    """
    reward = _reward_of_result(result, cfg, source)
    if repeated and cfg.repeat_penalty > 0:
        return _breakdown({**reward.components, "repeat": -cfg.repeat_penalty})
    return reward


def _reward_of_result(
    result: EvalResult | None, cfg: RewardConfig, source: str | None
) -> RewardBreakdown:
    if result is None:
        return _breakdown({"format_failure": cfg.format_failure_reward})
    if result.status is EvalStatus.REJECTED:
        return _breakdown({"rejected": cfg.rejected_reward})
    if result.status is EvalStatus.INFRA_ERROR:
        return _breakdown({"infra_error": cfg.infra_error_reward})
    if cfg.kind is RewardKind.GATED_SHAPED:
        return _gated_shaped(result, cfg, source)
    if cfg.kind is RewardKind.WEIGHTED:
        return _weighted(result, cfg)
    if cfg.kind is RewardKind.ROOFLINE:
        return _roofline(result, cfg)
    return _kevin(result, cfg)


# --- kinds -----------------------------------------------------------------------------------


def _gated_shaped(result: EvalResult, cfg: RewardConfig, source: str | None) -> RewardBreakdown:
    w = cfg.resolved_weights()
    if not _gate_open(result, cfg):
        return _breakdown(_failure_terms(result, cfg))
    comps = {
        # Behind the default all-trials gate the pass rate is 1; it varies (partial credit for
        # some passing trials) only with require_all_trials=False.
        "pass_rate": w["pass_rate"] * result.verify.pass_rate,
        "speedup": w["speedup"] * speedup_norm(result, cfg),
        "reg_pressure": -cfg.reg_pressure_penalty * float(has_register_pressure(result, cfg)),
        "smem_over": -cfg.smem_over_penalty * float(has_smem_overuse(result, cfg)),
        "timeout": -cfg.timeout_penalty * float(_timed_out(result)),
    }
    if source is not None:
        comps["warp_shuffle"] = cfg.shuffle_bonus * float(uses_warp_shuffle(source))
        comps["coalesced"] = cfg.coalesced_bonus * float(uses_coalesced_access(source))
    return _breakdown(comps)


def _weighted(result: EvalResult, cfg: RewardConfig) -> RewardBreakdown:
    # Each term is scaled by its weight (0.4/0.3/0.2/0.1). Written inline as
    # `1.0 if all_tests_pass else 0.0 * 0.3`, Python would parse `1.0 if ... else (0.0 * 0.3)`:
    # a correct kernel would score 1.0, not 0.3, and the compile term likewise 1.0, not 0.1.
    w = cfg.resolved_weights()
    correct = result.correct
    comps = {
        "speedup": w["speedup"] * speedup_norm(result, cfg),
        "correct": w["correct"] * float(correct),
        "efficiency": w["efficiency"] * (efficiency(result, cfg) if correct else 0.0),
        "compiles": w["compiles"] * float(result.compiled),
    }
    comps.update(_status_penalties(result, cfg))
    return _breakdown(comps)


def _roofline(result: EvalResult, cfg: RewardConfig) -> RewardBreakdown:
    w = cfg.resolved_weights()
    correct = result.correct
    frac = result.benchmark.fraction_of_peak
    fallback = correct and (frac is None or not math.isfinite(frac))
    if not correct:
        roof = 0.0
    elif fallback:  # no bytes_moved for this problem: normalised speedup, scaled into [0, 1]
        roof = speedup_norm(result, cfg) / cfg.speedup_cap
    else:
        roof = min(max(frac, 0.0), 1.0)
    comps = {
        "correct": w["correct"] * float(correct),
        # The key says which measure filled the term, so logs show how often the fallback ran.
        "roofline_speedup_fallback" if fallback else "roofline": w["roofline"] * roof,
        "compiles": w["compiles"] * float(result.compiled),
    }
    comps.update(_status_penalties(result, cfg))
    return _breakdown(comps)


def _kevin(result: EvalResult, cfg: RewardConfig) -> RewardBreakdown:
    w = cfg.resolved_weights()
    if not result.correct:
        return _breakdown(_failure_terms(result, cfg))
    raw = min(max(result.benchmark.speedup_vs_eager, 0.0), cfg.max_raw_speedup)
    return _breakdown({"correct": w["correct"], "speedup": w["speedup"] * raw})


# --- terms -----------------------------------------------------------------------------------


def speedup_norm(result: EvalResult, cfg: RewardConfig) -> float:
    """``min(speedup / target, cap)`` for a correct, timed result, else 0."""
    s = result.speedup
    if not math.isfinite(s) or s <= 0:
        return 0.0
    return min(s / cfg.target_speedup, cfg.speedup_cap)


def has_register_pressure(result: EvalResult, cfg: RewardConfig) -> bool:
    """Any kernel above the register threshold or spilling to local memory."""
    return any(
        k.registers > cfg.register_threshold or k.spill_store_bytes > 0 or k.spill_load_bytes > 0
        for k in result.compile.kernels
    )


def has_smem_overuse(result: EvalResult, cfg: RewardConfig) -> bool:
    """Any kernel with more static shared memory than the threshold (48 KB without opt-in).

    Only static shared memory is known from the compiler; dynamic shared memory set at launch is
    not seen here.
    """
    return any(k.shared_mem_bytes > cfg.smem_threshold_bytes for k in result.compile.kernels)


def efficiency(result: EvalResult, cfg: RewardConfig) -> float:
    """``memory_efficiency * register_efficiency`` in [0, 1].

    memory efficiency = fraction of peak bandwidth when known, else 1 (the problem has no
    ``bytes_moved``, so the term measures register efficiency only); register efficiency =
    ``min(1, threshold / max registers)``, halved when any kernel spills.
    """
    frac = result.benchmark.fraction_of_peak
    mem = min(max(frac, 0.0), 1.0) if frac is not None and math.isfinite(frac) else 1.0
    kernels = result.compile.kernels
    max_regs = max((k.registers for k in kernels), default=0)
    reg = min(1.0, cfg.register_threshold / max_regs) if max_regs > 0 else 1.0
    if any(k.spill_store_bytes > 0 or k.spill_load_bytes > 0 for k in kernels):
        reg *= 0.5
    return mem * reg


def _gate_open(result: EvalResult, cfg: RewardConfig) -> bool:
    if not result.compiled or result.verify.status is StageStatus.SKIPPED:
        return False
    v = result.verify
    if cfg.require_all_trials:
        return result.correct
    return v.trials_passed > 0 and result.status in (EvalStatus.OK, EvalStatus.INCORRECT)


def _timed_out(result: EvalResult) -> bool:
    stages = (result.compile, result.verify, result.benchmark)
    return result.status is EvalStatus.TIMEOUT or any(s.status is StageStatus.TIMEOUT for s in stages)


def _status_penalties(result: EvalResult, cfg: RewardConfig) -> dict[str, float]:
    out: dict[str, float] = {}
    if _timed_out(result):
        out["timeout"] = -cfg.timeout_penalty
    if result.status is EvalStatus.RUNTIME_ERROR:
        out["runtime_error"] = -cfg.runtime_error_penalty
    return out


def _failure_terms(result: EvalResult, cfg: RewardConfig) -> dict[str, float]:
    """What a candidate that did not pass earns: compile credit, minus status penalties."""
    comps = {"compile_credit": cfg.compile_credit * float(result.compiled)}
    comps.update(_status_penalties(result, cfg))
    return comps


def _breakdown(components: dict[str, float]) -> RewardBreakdown:
    comps = {k: float(v) for k, v in components.items()}
    return RewardBreakdown(total=float(sum(comps.values())), components=comps)


# --- source heuristics -----------------------------------------------------------------------

# Warp shuffles: the intrinsics, sm_80 warp reductions, and cooperative-groups tile methods.
_SHFL = re.compile(
    r"\b__shfl(_xor|_up|_down)?(_sync)?\s*\(|\b__reduce_\w+_sync\s*\(|\.shfl(_xor|_up|_down)?\s*\("
)
_ASSIGN = re.compile(r"\b([A-Za-z_]\w*)\s*(?<![=!<>+\-*/%&|^])=(?!=)\s*([^;{}]+);")
_SUBSCRIPT = re.compile(r"\[([^\[\]]+)\]")
_CAST = re.compile(r"^\(\s*(?:unsigned\s+)?(?:long\s+long|long|int|size_t|int64_t)\s*\)\s*")


def uses_warp_shuffle(source: str) -> bool:
    """Whether the source uses warp shuffles: ``__shfl*_sync`` (or legacy ``__shfl``),
    ``__reduce_*_sync`` or a cooperative-groups tile's ``.shfl*()``."""
    return bool(_SHFL.search(_strip_comments(source)))


def uses_coalesced_access(source: str) -> bool:
    """Heuristic: memory is indexed with ``threadIdx.x`` as the fastest-varying (unscaled) term.

    A *lane* is ``threadIdx.x``, or a variable assigned an expression with a lane as an unscaled
    additive term (``i = blockIdx.x * blockDim.x + threadIdx.x``, ``c = lane``) or as
    ``lane % n`` / ``lane & m``. Access is called coalesced when some subscript has a lane as an
    unscaled additive term and no subscript or assignment multiplies a lane by a stride
    (``x[t * stride]``, ``row = x + (long)r * cols``: one thread per row). Division makes a
    warp-uniform index (``tid / 32``), which is neither. Not covered: lanes passed through
    function calls, and 2-D layouts whose innermost index is ``threadIdx.y``.
    """
    source = _strip_comments(source)
    assignments = _ASSIGN.findall(source)
    lanes = {"threadIdx.x"}
    for _ in range(3):  # lanes derived from lanes (j = i + offset)
        for name, expr in assignments:
            if any(_lane_term(expr, lane) for lane in lanes):
                lanes.add(name)
    subscripts = _SUBSCRIPT.findall(source)
    unscaled = any(_unscaled_term(s, lane) for s in subscripts for lane in lanes)
    exprs = subscripts + [expr for _, expr in assignments]
    scaled = any(_scaled_term(e, lane) for e in exprs for lane in lanes)
    return unscaled and not scaled


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _strip_comments(source: str) -> str:
    """C/C++ comments removed, so a comment mentioning an intrinsic earns nothing."""
    return _COMMENT.sub(" ", source)


def _terms(expr: str) -> list[str]:
    """Top-level additive terms of a C expression (split on + and - outside parentheses)."""
    terms, depth, cur = [], 0, []
    for ch in expr:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch in "+-" and depth == 0:
            terms.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur).strip())
    return [t for t in terms if t]


def _strip(term: str) -> str:
    term = _CAST.sub("", term.strip())
    while term.startswith("(") and term.endswith(")"):
        term = term[1:-1].strip()
    return term


def _unscaled_term(expr: str, lane: str) -> bool:
    return any(_strip(t) == lane for t in _terms(expr))


def _lane_term(expr: str, lane: str) -> bool:
    """A lane as an additive term, or reduced modulo a warp/tile (``lane % 32``, ``lane & 31``)."""
    mod = re.compile(rf"^{re.escape(lane)}\s*(%|&)\s*\w+$")
    return any(_strip(t) == lane or mod.match(_strip(t)) for t in _terms(expr))


def _scaled_term(expr: str, lane: str) -> bool:
    """A lane multiplied by something (``lane * stride``, ``stride * (long)lane``, ``lane << k``)."""
    name = re.escape(lane)
    pattern = rf"(?<![\w.]){name}\s*(\*|<<)|\*\s*(\([\w\s]*\)\s*)?{name}(?![\w.])"
    return re.search(pattern, expr) is not None
