"""Curriculum over problem tiers: gated advancement, review sampling, checkpointable state.

The learner works on one *current* tier; a fraction of every batch reviews earlier tiers so
skills are not forgotten. Outcomes are recorded per tier (the tier of the problem, so review
episodes count for their own tier) into rolling windows. The current tier's gate opens when,
over its window and after a minimum number of episodes on it, the compile rate and pass rate
are above their thresholds (defaults: compile > 0.9, pass > 0.75, so a tier counts as learnt
only when nearly every kernel compiles and most are correct) and, optionally, the
geometric-mean speedup of correct kernels reaches a floor.

Within a tier, problems are drawn uniformly by default. With ``family_sampling="signal"`` a
family is drawn first, weighted by how much GRPO can learn from it: p(1-p) of its recent pass
rate p (the spread of a group's outcomes), never below ``family_floor``. Why: under uniform draws
the families GRPO's Generator already solved (add, relu, tanh, ...: pass rate
0.92-1.00) made up 28% of the rollouts and 10 of their 61 groups were mixed, while those it
half solved (p(1-p) near 0.25, 57 of 68 groups mixed) came up no more often. In 12 steps
it changed neither the share of mixed groups nor held-out reward (docs/training.md).

Everything here is plain Python: sampling takes an explicit ``random.Random``; state is a
JSON-serialisable dict so checkpoints restore it exactly.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from multiminddev.core.stats import geometric_mean
from multiminddev.tasks.problem import Problem

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(kw_only=True, frozen=True)
class TierGate:
    """When a tier is mastered. Rates are strict lower bounds: a rate equal to the threshold
    does not open the gate."""

    min_compile_rate: float = 0.9
    min_pass_rate: float = 0.75
    min_mean_speedup: float | None = None  # geometric mean over correct outcomes; None = ignore
    min_episodes: int = 32  # episodes on the tier since it became current

    def __post_init__(self) -> None:
        for name in ("min_compile_rate", "min_pass_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"TierGate.{name} must be in [0, 1) (a strict bound), got {value}")
        if self.min_mean_speedup is not None and self.min_mean_speedup <= 0:
            raise ValueError(
                f"TierGate.min_mean_speedup must be > 0 or None, got {self.min_mean_speedup}"
            )
        if self.min_episodes < 1:
            raise ValueError(f"TierGate.min_episodes must be >= 1, got {self.min_episodes}")


class FamilySampling(str, Enum):
    """How a tier's problems are drawn: every problem alike, or families by their signal."""

    UNIFORM = "uniform"
    SIGNAL = "signal"


@dataclass(kw_only=True)
class CurriculumConfig:
    """``tiers``: the order to progress through (None = every tier that has problems, sorted).
    ``gate`` applies to every tier unless ``tier_gates`` overrides it. ``review_fraction`` of
    each batch comes from earlier tiers. ``window``: outcomes per tier in the rolling stats."""

    tiers: list[int] | None = None
    gate: TierGate = field(default_factory=TierGate)
    tier_gates: dict[int, TierGate] = field(default_factory=dict)
    review_fraction: float = 0.2
    window: int = 64
    start_tier: int | None = None  # None = the first tier
    family_sampling: FamilySampling = FamilySampling.UNIFORM
    family_window: int = 32  # a family's latest outcomes that estimate its pass rate
    family_prior: float = 0.5  # Beta(prior, prior) pseudo-counts: an unseen family has p = 0.5
    family_floor: float = 0.02  # least weight, so solved families still come up (p(1-p) <= 0.25)

    def __post_init__(self) -> None:
        try:
            self.family_sampling = FamilySampling(self.family_sampling)
        except ValueError:
            raise ValueError(
                f"CurriculumConfig.family_sampling {self.family_sampling!r} is not one of "
                f"{[m.value for m in FamilySampling]}"
            ) from None
        if self.family_window < 1:
            raise ValueError(
                f"CurriculumConfig.family_window must be >= 1, got {self.family_window}"
            )
        if self.family_prior <= 0:
            raise ValueError(
                f"CurriculumConfig.family_prior must be > 0, got {self.family_prior}"
            )
        if not 0.0 < self.family_floor <= 0.25:
            raise ValueError(
                "CurriculumConfig.family_floor must be in (0, 0.25] (p(1-p) is at most 0.25), "
                f"got {self.family_floor}"
            )
        if self.tiers is not None:
            if not self.tiers:
                raise ValueError(
                    "CurriculumConfig.tiers is empty: list at least one tier or pass None"
                )
            if len(set(self.tiers)) != len(self.tiers):
                raise ValueError(f"CurriculumConfig.tiers has duplicates: {self.tiers}")
        if not 0.0 <= self.review_fraction < 1.0:
            raise ValueError(
                f"CurriculumConfig.review_fraction must be in [0, 1), got {self.review_fraction}"
            )
        if self.window < 1:
            raise ValueError(f"CurriculumConfig.window must be >= 1, got {self.window}")
        # configs read from JSON/YAML give dicts and string keys: accept them
        if isinstance(self.gate, Mapping):
            self.gate = TierGate(**self.gate)
        gates = {}
        for tier, gate in self.tier_gates.items():
            gate = TierGate(**gate) if isinstance(gate, Mapping) else gate
            if not isinstance(gate, TierGate):
                raise ValueError(f"CurriculumConfig.tier_gates[{tier}] must be a TierGate or dict")
            gates[int(tier)] = gate
        self.tier_gates = gates

    def gate_for(self, tier: int) -> TierGate:
        return self.tier_gates.get(tier, self.gate)


@dataclass(kw_only=True, frozen=True)
class Outcome:
    """What the curriculum needs from one episode (or one evaluated candidate)."""

    compiled: bool
    correct: bool
    speedup: float = 0.0  # vs eager PyTorch; only meaningful when correct

    @classmethod
    def of(cls, result: Any) -> Outcome:
        """From an ``Outcome``, an ``EvalResult`` (or anything with ``compiled``, ``correct``,
        ``speedup``), or a mapping with those keys."""
        if isinstance(result, Outcome):
            return result
        if isinstance(result, Mapping):
            get = result.get
        else:

            def get(key: str, default: Any = None) -> Any:
                return getattr(result, key, default)

        correct = bool(get("correct", False))
        return cls(
            compiled=bool(get("compiled", False)) or correct,  # correct implies it compiled
            correct=correct,
            speedup=float(get("speedup", 0.0) or 0.0) if correct else 0.0,
        )


@dataclass(kw_only=True, frozen=True)
class TierStats:
    episodes: int  # on this tier since it became current (review episodes included)
    window: int  # outcomes in the rolling window
    compile_rate: float
    pass_rate: float
    mean_speedup: float  # geometric mean over correct outcomes in the window, 0 if none


def tier_stats(outcomes: Sequence[Outcome], episodes: int) -> TierStats:
    """Rolling statistics of a window of outcomes (pure)."""
    n = len(outcomes)
    speedups = [o.speedup for o in outcomes if o.correct and o.speedup > 0]
    return TierStats(
        episodes=episodes,
        window=n,
        compile_rate=sum(o.compiled for o in outcomes) / n if n else 0.0,
        pass_rate=sum(o.correct for o in outcomes) / n if n else 0.0,
        mean_speedup=geometric_mean(speedups) if speedups else 0.0,
    )


def gate_failures(stats: TierStats, gate: TierGate) -> list[str]:
    """Why a tier's gate is closed; empty when it is open (pure)."""
    failures = []
    if stats.episodes < gate.min_episodes:
        failures.append(f"episodes {stats.episodes} < {gate.min_episodes}")
    if not stats.compile_rate > gate.min_compile_rate:
        failures.append(f"compile rate {stats.compile_rate:.2f} <= {gate.min_compile_rate:.2f}")
    if not stats.pass_rate > gate.min_pass_rate:
        failures.append(f"pass rate {stats.pass_rate:.2f} <= {gate.min_pass_rate:.2f}")
    if gate.min_mean_speedup is not None and stats.mean_speedup < gate.min_mean_speedup:
        failures.append(f"mean speedup {stats.mean_speedup:.2f} < {gate.min_mean_speedup:.2f}")
    return failures


def family_of(problem: Problem) -> str:
    """A problem's family; a problem without one is a family of its own."""
    return problem.family or problem.name


def family_weights(
    correct_by_family: Mapping[str, Sequence[bool]], families: Sequence[str],
    prior: float, floor: float,
) -> dict[str, float]:
    """Each family's sampling weight, max(p(1-p), floor), where p is its posterior mean pass
    rate under a Beta(prior, prior) prior (pure). p(1-p) is the variance of one episode's
    outcome, so it is largest where a GRPO group is most likely to be mixed."""
    weights = {}
    for family in families:
        outcomes = correct_by_family.get(family, ())
        p = (sum(outcomes) + prior) / (len(outcomes) + 2 * prior)
        weights[family] = max(p * (1 - p), floor)
    return weights


def spread_outcomes(passes: int, episodes: int, length: int) -> list[bool]:
    """``min(episodes, length)`` outcomes at the pass rate ``passes / episodes``, the passes
    spread evenly (pure): a window started from them keeps that rate while newer outcomes push
    the oldest out, until the newer ones change it."""
    if not 0 <= passes <= episodes:
        raise ValueError(f"family counts need 0 <= passes <= episodes, got {passes} of {episodes}")
    m = min(episodes, length)
    k = round(m * passes / episodes) if episodes else 0
    return [(i + 1) * k // m > i * k // m for i in range(m)]


def load_family_counts(path: str | Path) -> dict[str, tuple[int, int]]:
    """An earlier run's ``{"families": {family: [correct, episodes]}}`` (``analyze_rollouts.py
    --family-counts-out``) as {family: (correct, episodes)}, for ``warm_family_windows``. A file
    of another shape raises ``ValueError`` saying what it needs."""
    need = ('it needs {"families": {FAMILY: [CORRECT, EPISODES], ...}}, as '
            "benchmarks/analyze_rollouts.py --family-counts-out writes")
    try:
        families = json.loads(Path(path).read_text())["families"]
        counts = {str(f): (int(c), int(n)) for f, (c, n) in families.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"family counts {path}: {type(e).__name__}: {e}; {need}") from None
    bad = {f: c for f, c in counts.items() if not 0 <= c[0] <= c[1]}
    if bad:
        raise ValueError(f"family counts {path}: need 0 <= correct <= episodes, got {bad}")
    return counts


def _draw(pool: Sequence[Problem], k: int, rng: random.Random) -> list[Problem]:
    """k problems from pool: successive shuffled passes, so a batch repeats none until all
    have been drawn once."""
    out: list[Problem] = []
    while len(out) < k:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order[: k - len(out)])
    return out


class Curriculum:
    """Tiered problem sampling with gated advancement. See the module docstring."""

    def __init__(
        self,
        problems_by_tier: Mapping[int, Sequence[Problem]],
        config: CurriculumConfig | None = None,
    ):
        self.config = config or CurriculumConfig()
        self.problems = {int(t): list(ps) for t, ps in problems_by_tier.items() if ps}
        configured = self.config.tiers
        self.tiers = list(configured) if configured is not None else sorted(self.problems)
        empty = [t for t in self.tiers if t not in self.problems]
        if empty or not self.tiers:
            raise ValueError(
                f"curriculum tiers {empty or self.tiers} have no problems (tiers with problems: "
                f"{sorted(self.problems)}); pass problems for them or leave them out of "
                "config.tiers"
            )
        self._tier_of = {p.name: t for t, ps in self.problems.items() for p in ps}
        start = self.config.start_tier if self.config.start_tier is not None else self.tiers[0]
        if start not in self.tiers:
            raise ValueError(
                f"CurriculumConfig.start_tier {start} is not one of the tiers {self.tiers}"
            )
        self.index = self.tiers.index(start)
        self._windows = {t: deque(maxlen=self.config.window) for t in self.tiers}
        self._episodes = {t: 0 for t in self.tiers}
        self.history: list[dict[str, Any]] = []  # one entry per advancement
        self._family_of = {p.name: family_of(p) for ps in self.problems.values() for p in ps}
        self._families: dict[int, dict[str, list[Problem]]] = {}
        for t, ps in self.problems.items():
            for p in ps:
                self._families.setdefault(t, {}).setdefault(family_of(p), []).append(p)
        self._family_windows: dict[str, deque[bool]] = {}

    @classmethod
    def from_problems(
        cls, problems: Iterable[Problem], config: CurriculumConfig | None = None
    ) -> Curriculum:
        by_tier: dict[int, list[Problem]] = {}
        for problem in problems:
            by_tier.setdefault(problem.tier, []).append(problem)
        return cls(by_tier, config)

    # ------------------------------------------------------------------ sampling

    @property
    def current_tier(self) -> int:
        return self.tiers[self.index]

    @property
    def is_last_tier(self) -> bool:
        return self.index == len(self.tiers) - 1

    def sample(self, n: int, rng: random.Random | int | None = None) -> list[Problem]:
        """n problems: each is a review of an earlier tier with probability
        ``review_fraction`` (when there is one; the tier picked uniformly), else from the
        current tier. Returned in draw order, which is random. With ``family_sampling="signal"``
        each draw picks a family by its weight (with replacement), then one of its problems; a
        family drawn more often in a batch than it has problems repeats some."""
        if n < 0:
            raise ValueError(f"sample size must be >= 0, got {n}")
        rng = rng if isinstance(rng, random.Random) else random.Random(rng)
        earlier = self.tiers[: self.index]
        drawn = [self._pick_tier(earlier, rng) for _ in range(n)]
        if self.config.family_sampling is FamilySampling.SIGNAL:
            drawn = [(t, self._pick_family(t, rng)) for t in drawn]
            pools = {key: iter(_draw(self._families[key[0]][key[1]], c, rng))
                     for key, c in sorted(Counter(drawn).items())}
        else:
            pools = {t: iter(_draw(self.problems[t], c, rng))
                     for t, c in sorted(Counter(drawn).items())}
        return [next(pools[key]) for key in drawn]

    def problems_in_draw_order(self) -> list[Problem]:
        """Every problem once, those ``sample`` draws soonest first: the current tier's, then
        the later tiers' in order (advancement reaches them next), then the earlier ones'
        (drawn only as reviews)."""
        tiers = self.tiers[self.index :] + self.tiers[: self.index]
        return [p for t in tiers for p in self.problems[t]]

    def family_weights(self, tier: int) -> dict[str, float]:
        """The sampling weight of each of the tier's families (``family_sampling="signal"``)."""
        return family_weights(self._family_windows, sorted(self._families[tier]),
                              self.config.family_prior, self.config.family_floor)

    def warm_family_windows(self, counts: Mapping[str, tuple[int, int]]) -> None:
        """Starts each family's window from ``(passes, episodes)`` measured elsewhere (an
        earlier run's rollouts), so ``family_sampling="signal"`` weighs the families from its
        first draw. From empty windows every family starts at 0.25: in a 12-step run each
        family saw about 10 episodes, and the solved families' share of the draws
        fell only from 28% to 25%. Families without counts start empty; a checkpoint's state,
        loaded after this, replaces all of it."""
        for family, (passes, episodes) in counts.items():
            self._family_windows[family] = deque(
                spread_outcomes(int(passes), int(episodes), self.config.family_window),
                maxlen=self.config.family_window)

    def _pick_family(self, tier: int, rng: random.Random) -> str:
        weights = self.family_weights(tier)
        return rng.choices(list(weights), weights=list(weights.values()))[0]

    def _pick_tier(self, earlier: list[int], rng: random.Random) -> int:
        if earlier and rng.random() < self.config.review_fraction:
            return rng.choice(earlier)
        return self.current_tier

    # ------------------------------------------------------------------ recording

    def tier_of(self, problem: Problem | str) -> int:
        name = problem if isinstance(problem, str) else problem.name
        if name in self._tier_of:
            return self._tier_of[name]
        if isinstance(problem, Problem):
            return problem.tier
        raise KeyError(f"problem {name!r} is not in the curriculum")

    def record(self, problem: Problem | str, result: Any) -> None:
        """Record one outcome (``EvalResult``, ``Outcome`` or mapping) for the problem's tier."""
        tier = self.tier_of(problem)
        if tier not in self._windows:  # a problem outside the curriculum's tiers: not gated
            return
        outcome = Outcome.of(result)
        self._windows[tier].append(outcome)
        self._episodes[tier] += 1
        name = problem if isinstance(problem, str) else problem.name
        family = self._family_of.get(name) or family_of(problem)
        self._family_windows.setdefault(
            family, deque(maxlen=self.config.family_window)).append(outcome.correct)

    def update(self, outcomes: Iterable[tuple[Problem | str, Any]]) -> bool:
        """Record a batch of (problem, result) pairs, then try to advance; True if it did."""
        for problem, result in outcomes:
            self.record(problem, result)
        return self.maybe_advance()

    def stats(self, tier: int | None = None) -> TierStats:
        tier = self.current_tier if tier is None else tier
        return tier_stats(list(self._windows[tier]), self._episodes[tier])

    def maybe_advance(self) -> bool:
        """Move to the next tier when the current one's gate is open; logs why or why not."""
        if self.is_last_tier:
            return False
        tier = self.current_tier
        stats = self.stats(tier)
        failures = gate_failures(stats, self.config.gate_for(tier))
        if failures:
            log.debug("curriculum: staying on tier %d (%s)", tier, "; ".join(failures))
            return False
        self.index += 1
        nxt = self.current_tier
        self._episodes[nxt] = 0  # episodes are counted from when a tier becomes current
        self.history.append({"from": tier, "to": nxt, **asdict(stats)})
        log.info(
            "curriculum: tier %d mastered (compile %.2f, pass %.2f, speedup %.2fx over %d "
            "episodes); advancing to tier %d",
            tier, stats.compile_rate, stats.pass_rate, stats.mean_speedup, stats.episodes, nxt,
        )  # fmt: skip
        return True

    # ------------------------------------------------------------------ state and logging

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (tier keys are strings, as JSON requires)."""
        return {
            "version": STATE_VERSION,
            "tiers": list(self.tiers),
            "current_tier": self.current_tier,
            "episodes": {str(t): n for t, n in self._episodes.items()},
            "windows": {
                str(t): [[o.compiled, o.correct, o.speedup] for o in w]
                for t, w in self._windows.items()
            },
            "history": [dict(h) for h in self.history],
            "families": {f: list(w) for f, w in sorted(self._family_windows.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"curriculum state version {state.get('version')} != {STATE_VERSION}")
        if [int(t) for t in state["tiers"]] != self.tiers:
            raise ValueError(
                f"checkpoint curriculum tiers {state['tiers']} differ from this run's "
                f"{self.tiers}; "
                "resume with the same problems and CurriculumConfig.tiers"
            )
        self.index = self.tiers.index(int(state["current_tier"]))
        self._episodes = {t: int(state["episodes"].get(str(t), 0)) for t in self.tiers}
        self._windows = {t: deque(maxlen=self.config.window) for t in self.tiers}
        for t in self.tiers:
            for compiled, correct, speedup in state["windows"].get(str(t), []):
                self._windows[t].append(
                    Outcome(compiled=bool(compiled), correct=bool(correct), speedup=float(speedup))
                )
        self.history = [dict(h) for h in state.get("history", [])]
        # checkpoints from before family sampling have no "families": their windows start empty
        self._family_windows = {
            f: deque((bool(c) for c in w), maxlen=self.config.family_window)
            for f, w in state.get("families", {}).items()
        }

    def summary(self) -> dict[str, float]:
        """Flat scalars for the metrics logger (``curriculum/...``)."""
        out: dict[str, float] = {
            "curriculum/tier": float(self.current_tier),
            "curriculum/tier_index": float(self.index),
            "curriculum/advancements": float(len(self.history)),
        }
        for tier in self.tiers[: self.index + 1]:
            stats = self.stats(tier)
            prefix = f"curriculum/tier{tier}"
            out[f"{prefix}/compile_rate"] = stats.compile_rate
            out[f"{prefix}/pass_rate"] = stats.pass_rate
            out[f"{prefix}/mean_speedup"] = stats.mean_speedup
            out[f"{prefix}/episodes"] = float(stats.episodes)
        if self.config.family_sampling is FamilySampling.SIGNAL:
            for tier in self.tiers[: self.index + 1]:
                for family, weight in self.family_weights(tier).items():
                    out[f"curriculum/family_weight/{family}"] = weight
        return out
