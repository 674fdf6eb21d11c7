"""A/B rollout of agent checkpoints: arms, traffic weights, recorded outcomes and a verdict.

An *arm* is a named set of agent adapters (``{role: path}``; empty = the base model) with a
traffic weight. Every optimize request is given an arm by :func:`assign_arm`, a pure function of
the request id, so the same id always lands on the same arm while the weights stay put. Each
finished job is recorded as one :class:`Outcome` row in SQLite (WAL, synchronous=FULL, one
transaction per outcome), so a restart or a crash loses no recorded outcome, and several
processes (the server and ``multiminddev ab``) can share one file: nothing is cached in memory,
every call reads the file.

The figures (:func:`summarize_arm`): Wilson intervals for the compiled and correct rates,
percentile-bootstrap intervals for the geometric-mean speedup (over correct outcomes) and the
mean reward. The verdict (:func:`msprt`) compares each arm's correct rate with the control arm's
through a mixture sequential probability ratio test (normal mixture, Johari, Pekelis & Walsh,
"Always valid inference", 2017): its confidence interval on the rate difference holds at every
sample size at once, so the status may be read after every outcome, and acted on as soon as it
says better or worse, without inflating the error rate. Outcomes whose correctness is unknown
(compile-only: no GPU) count in the compiled rate but not in the correct rate or the verdict.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import sqlite3
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from multiminddev.core.results import EvalResult, EvalStatus

AB_DB_NAME = "ab.sqlite"
Z95 = 1.959963984540054  # two-sided 95% normal quantile


# --------------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class Arm:
    name: str
    adapters: dict[str, str] = field(default_factory=dict)  # role -> adapter path; {} = base
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_arm_name(self.name)
        check_weight(self.name, self.weight)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One finished optimize job on one arm."""

    arm: str
    problem_hash: str  # source_hash() of the submitted module: which problem, not its text
    compiled: bool
    correct: bool | None  # None: not run (compile-only, no GPU)
    speedup: float | None  # of the best verified kernel over eager PyTorch; None when unknown
    reward: float | None
    latency_s: float
    time: float = field(default_factory=time.time)  # unix seconds when the job finished
    job_id: str = ""

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency_s) or self.latency_s < 0:
            raise ValueError(f"latency_s must be a finite number >= 0 (got {self.latency_s})")
        if self.speedup is not None and not (math.isfinite(self.speedup) and self.speedup >= 0):
            raise ValueError(f"speedup must be a finite number >= 0 or None (got {self.speedup})")
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite or None (got {self.reward})")


class ArmExistsError(ValueError):
    """An arm of that name is already defined."""


def source_hash(source: str) -> str:
    """The problem's identity in the outcome table: sha256 of its text, 16 hex digits."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def check_arm_name(name: str) -> None:
    if not (isinstance(name, str) and 0 < len(name) <= 64
            and all(c.isalnum() or c in "-_." for c in name)):
        raise ValueError(f"arm name {name!r} must be 1-64 letters, digits, '-', '_' or '.'")


def check_weight(name: str, weight: float) -> None:
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
        raise ValueError(f"weight of arm {name!r} must be a finite number >= 0 (got {weight})")


# ----------------------------------------------------------------------------- assignment


def assign_arm(weights: Sequence[tuple[str, float]], request_id: str) -> str:
    """The arm that serves ``request_id``: a deterministic weighted choice.

    ``sha256(request_id)`` gives a uniform point in [0, 1); the arms, ordered by name, split
    [0, 1) in proportion to their weights, and the arm whose share holds the point serves the
    request. Arms of weight 0 never serve. The same id and weights always give the same arm.
    """
    live = sorted((name, float(w)) for name, w in weights if w > 0)
    if not live:
        raise ValueError("no arm has a traffic weight above 0; add an arm or set a weight")
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    point = int.from_bytes(digest[:8], "big") / 2.0**64
    total = sum(w for _, w in live)
    edge = 0.0
    for name, w in live:
        edge += w / total
        if point < edge:
            return name
    return live[-1][0]  # rounding left the last edge a hair below 1


# ------------------------------------------------------------------------------ statistics


def wilson_interval(successes: int, n: int, *, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate; (nan, nan) when ``n == 0``."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n (got {successes}, {n})")
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_interval(values: Sequence[float], *, resamples: int = 2000, seed: int = 0,
                            confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean; (nan, nan) when empty. Resampled in chunks
    so memory stays small for long tables."""
    import numpy as np  # only here: `multiminddev ab` and every CLI start import this module

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // x.size)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        means[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


class Verdict(str, enum.Enum):
    CONTROL = "control"  # this arm is the one the others are compared with
    INSUFFICIENT_DATA = "insufficient_data"  # fewer than min_samples known outcomes on a side
    CONTINUE = "continue"  # the interval still holds 0: keep collecting
    BETTER = "better"  # correct rate above the control's, at the test's level
    WORSE = "worse"


@dataclass(frozen=True, kw_only=True)
class SequentialTest:
    """mSPRT of one arm's rate against the control's: ``difference`` = arm - control."""

    verdict: Verdict
    difference: float | None = None
    interval: tuple[float, float] | None = None  # always-valid interval on the difference
    likelihood_ratio: float | None = None  # mixture LR for difference = 0; rejects at >= 1/alpha
    alpha: float = 0.05


def msprt(control: tuple[int, int], arm: tuple[int, int], *, alpha: float = 0.05,
          tau: float = 0.1, min_samples: int = 20) -> SequentialTest:
    """Mixture SPRT on the difference of two rates, ``(successes, n)`` per side.

    The difference estimate ``d = p_arm - p_control`` is taken as normal with variance
    ``V = p~_a (1-p~_a)/n_a + p~_c (1-p~_c)/n_c`` (``p~ = (s + 1/2) / (n + 1)``, so a rate of
    0 or 1 does not give V = 0). Mixing the likelihood ratio over a prior ``N(0, tau^2)`` on the
    true difference gives the closed form

        LR = sqrt(V / (V + tau^2)) * exp(tau^2 d^2 / (2 V (V + tau^2)))

    and inverting ``LR(d - theta) < 1/alpha`` gives the always-valid interval
    ``d +- sqrt(2 V (V + tau^2) / tau^2 * (log(1/alpha) + log((V + tau^2) / V) / 2))``.
    ``tau`` is the size of difference the test is tuned to find fastest.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {alpha})")
    if not tau > 0:
        raise ValueError(f"tau must be > 0 (got {tau})")
    (sc, nc), (sa, na) = control, arm
    if min(nc, na) < max(1, min_samples):
        return SequentialTest(verdict=Verdict.INSUFFICIENT_DATA, alpha=alpha)
    pc, pa = sc / nc, sa / na
    tc, ta = (sc + 0.5) / (nc + 1), (sa + 0.5) / (na + 1)
    v = ta * (1 - ta) / na + tc * (1 - tc) / nc
    d = pa - pc
    t2 = tau * tau
    log_lr = 0.5 * math.log(v / (v + t2)) + t2 * d * d / (2 * v * (v + t2))
    radius = math.sqrt(2 * v * (v + t2) / t2 * (math.log(1 / alpha) + 0.5 * math.log((v + t2) / v)))
    lo, hi = d - radius, d + radius
    verdict = Verdict.BETTER if lo > 0 else Verdict.WORSE if hi < 0 else Verdict.CONTINUE
    return SequentialTest(verdict=verdict, difference=d, interval=(lo, hi),
                          likelihood_ratio=math.exp(min(log_lr, 700.0)), alpha=alpha)


@dataclass(frozen=True, kw_only=True)
class ArmSummary:
    name: str
    weight: float
    share: float  # weight / sum of weights: the fraction of new requests it gets
    adapters: dict[str, str]
    control: bool
    n: int  # outcomes recorded
    compiled: int
    compiled_rate: float | None
    compiled_ci: tuple[float, float] | None
    n_known: int  # outcomes whose correctness was measured (a GPU ran them)
    correct: int
    correct_rate: float | None
    correct_ci: tuple[float, float] | None
    speedup_geomean: float | None  # over correct outcomes with a speedup
    speedup_ci: tuple[float, float] | None
    reward_mean: float | None
    reward_ci: tuple[float, float] | None
    latency_s_mean: float | None
    test: SequentialTest

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["test"]["verdict"] = self.test.verdict.value
        return _finite(data)


def summarize_arm(arm: Arm, outcomes: Sequence[Outcome], *, share: float, control: bool,
                  test: SequentialTest) -> ArmSummary:
    """Per-arm figures with 95% intervals (see the module docstring for which interval)."""
    n = len(outcomes)
    compiled = sum(o.compiled for o in outcomes)
    known = [o.correct for o in outcomes if o.correct is not None]
    correct = sum(known)
    log_speedups = [math.log(o.speedup) for o in outcomes
                    if o.correct and o.speedup is not None and o.speedup > 0]
    rewards = [o.reward for o in outcomes if o.reward is not None]
    speedup_ci = None
    if log_speedups:
        lo, hi = bootstrap_mean_interval(log_speedups)
        speedup_ci = (math.exp(lo), math.exp(hi))
    return ArmSummary(
        name=arm.name, weight=arm.weight, share=share, adapters=dict(arm.adapters),
        control=control, n=n, compiled=compiled,
        compiled_rate=compiled / n if n else None,
        compiled_ci=wilson_interval(compiled, n) if n else None,
        n_known=len(known), correct=correct,
        correct_rate=correct / len(known) if known else None,
        correct_ci=wilson_interval(correct, len(known)) if known else None,
        speedup_geomean=math.exp(statistics.fmean(log_speedups)) if log_speedups else None,
        speedup_ci=speedup_ci,
        reward_mean=statistics.fmean(rewards) if rewards else None,
        reward_ci=bootstrap_mean_interval(rewards) if rewards else None,
        latency_s_mean=statistics.fmean(o.latency_s for o in outcomes) if n else None,
        test=test,
    )


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------------------------- store


@dataclass(frozen=True, kw_only=True)
class ABConfig:
    alpha: float = 0.05  # the sequential test's error rate (always valid)
    tau: float = 0.1  # mixture prior's scale: the correct-rate difference it finds fastest
    min_samples: int = 20  # known outcomes per side before the test gives a verdict

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), e.g. 0.05 (got {self.alpha})")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, e.g. 0.1 (got {self.tau})")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1 (got {self.min_samples})")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS arms (
    name TEXT PRIMARY KEY, adapters TEXT NOT NULL, weight REAL NOT NULL,
    position INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outcomes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, arm TEXT NOT NULL,
    problem_hash TEXT NOT NULL, compiled INTEGER NOT NULL, correct INTEGER,
    speedup REAL, reward REAL, latency_s REAL NOT NULL, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS outcomes_arm ON outcomes (arm);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL,
    detail TEXT NOT NULL);
"""


class ABStore:
    """Arms, weights and outcomes in one SQLite file; safe to share between threads and
    processes. The control arm is the first arm added until :meth:`promote` names another."""

    def __init__(self, path: str | Path, config: ABConfig | None = None):
        self.path = Path(path)
        self.config = config or ABConfig()
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a directory; give the A/B database file "
                             f"(e.g. {self.path / AB_DB_NAME})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed outcome survives a crash
        self._db.executescript(_SCHEMA)

    @classmethod
    def in_state_dir(cls, state_dir: str | Path, config: ABConfig | None = None) -> ABStore:
        return cls(Path(state_dir) / AB_DB_NAME, config)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- arms ---------------------------------------------------------------------------

    def arms(self) -> list[Arm]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, adapters, weight FROM arms ORDER BY position").fetchall()
        return [Arm(name=n, adapters=json.loads(a), weight=w) for n, a, w in rows]

    def arm(self, name: str) -> Arm:
        for arm in self.arms():
            if arm.name == name:
                return arm
        raise KeyError(f"no arm named {name!r}; known arms: {self._names() or 'none'}")

    def add_arm(self, name: str, adapters: Mapping[str, str] | None = None, *,
                weight: float = 1.0) -> Arm:
        arm = Arm(name=name, adapters={str(k): str(v) for k, v in (adapters or {}).items()},
                  weight=weight)
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM arms WHERE name = ?", (name,)).fetchone():
                raise ArmExistsError(f"an arm named {name!r} exists; pick another name, or "
                                     "change its weight (`multiminddev ab weights NAME=W`)")
            position = db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM arms").fetchone()[0]
            db.execute("INSERT INTO arms VALUES (?, ?, ?, ?, ?)",
                       (name, json.dumps(arm.adapters), float(weight), position, time.time()))
            if position == 0:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('control', ?)", (name,))
            self._event(db, "add_arm", {"arm": name, "adapters": arm.adapters, "weight": weight})
        return arm

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Change the named arms' weights (others keep theirs); at least one must stay > 0."""
        for name, w in weights.items():
            check_weight(name, w)
        with self._transaction() as db:
            current = dict(db.execute("SELECT name, weight FROM arms").fetchall())
            unknown = sorted(set(weights) - set(current))
            if unknown:
                raise KeyError(f"no arm named {', '.join(map(repr, unknown))}; known arms: "
                               f"{', '.join(sorted(current)) or 'none'}")
            if not any(w > 0 for w in {**current, **weights}.values()):
                raise ValueError("these weights would leave no arm with traffic; keep one > 0")
            db.executemany("UPDATE arms SET weight = ? WHERE name = ?",
                           [(float(w), n) for n, w in weights.items()])
            self._event(db, "set_weights", dict(weights))

    def promote(self, name: str) -> None:
        """Move all traffic to ``name`` (weight 1, every other arm 0); it becomes the control."""
        with self._transaction() as db:
            if not db.execute("SELECT 1 FROM arms WHERE name = ?", (name,)).fetchone():
                raise KeyError(f"no arm named {name!r}; known arms: {self._names(db) or 'none'}")
            db.execute("UPDATE arms SET weight = CASE WHEN name = ? THEN 1.0 ELSE 0.0 END",
                       (name,))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('control', ?)", (name,))
            self._event(db, "promote", {"arm": name})

    def control(self) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'control'").fetchone()
        return row[0] if row else None

    def assign(self, request_id: str) -> Arm:
        """The arm that serves this request (:func:`assign_arm` over the current weights)."""
        arms = self.arms()
        if not arms:
            raise ValueError("no A/B arms are defined; add one with `multiminddev ab add-arm`")
        chosen = assign_arm([(a.name, a.weight) for a in arms], request_id)
        return next(a for a in arms if a.name == chosen)

    # -- outcomes -------------------------------------------------------------------------

    def record(self, outcome: Outcome) -> int:
        """Store one outcome (one committed transaction); returns its row id."""
        with self._transaction() as db:
            if not db.execute("SELECT 1 FROM arms WHERE name = ?", (outcome.arm,)).fetchone():
                raise KeyError(f"no arm named {outcome.arm!r}; an outcome needs a known arm")
            cursor = db.execute(
                "INSERT INTO outcomes (job_id, arm, problem_hash, compiled, correct, speedup, "
                "reward, latency_s, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (outcome.job_id, outcome.arm, outcome.problem_hash, int(outcome.compiled),
                 None if outcome.correct is None else int(outcome.correct), outcome.speedup,
                 outcome.reward, outcome.latency_s, outcome.time))
            return int(cursor.lastrowid)

    def outcomes(self, arm: str | None = None) -> list[Outcome]:
        query = ("SELECT arm, problem_hash, compiled, correct, speedup, reward, latency_s, time, "
                 "job_id FROM outcomes")
        args: tuple[Any, ...] = ()
        if arm is not None:
            query, args = query + " WHERE arm = ?", (arm,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY id", args).fetchall()
        return [Outcome(arm=a, problem_hash=h, compiled=bool(c),
                        correct=None if k is None else bool(k), speedup=s, reward=r,
                        latency_s=lat, time=t, job_id=j)
                for a, h, c, k, s, r, lat, t, j in rows]

    def counts(self) -> dict[str, dict[str, int]]:
        """Per arm: outcomes recorded, compiled, measured and correct (for /metrics)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT arm, COUNT(*), SUM(compiled), COUNT(correct), COALESCE(SUM(correct), 0) "
                "FROM outcomes GROUP BY arm").fetchall()
        return {a: {"outcomes": n, "compiled": c or 0, "measured": m, "correct": k}
                for a, n, c, m, k in rows}

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT time, kind, detail FROM events ORDER BY id").fetchall()
        return [{"time": t, "kind": k, "detail": json.loads(d)} for t, k, d in rows]

    # -- summary ----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Every arm's figures and its verdict against the control arm, JSON-ready."""
        arms = self.arms()
        control = self.control()
        by_arm: dict[str, list[Outcome]] = {a.name: [] for a in arms}
        for o in self.outcomes():
            by_arm.setdefault(o.arm, []).append(o)
        total = sum(a.weight for a in arms)
        cfg = self.config

        def known(name: str) -> tuple[int, int]:
            vals = [o.correct for o in by_arm.get(name, []) if o.correct is not None]
            return sum(vals), len(vals)

        rows = []
        for a in arms:
            test = (SequentialTest(verdict=Verdict.CONTROL, alpha=cfg.alpha) if a.name == control
                    else msprt(known(control), known(a.name), alpha=cfg.alpha, tau=cfg.tau,
                               min_samples=cfg.min_samples))
            rows.append(summarize_arm(a, by_arm[a.name], share=a.weight / total if total else 0.0,
                                      control=a.name == control, test=test).to_dict())
        return {"control": control, "alpha": cfg.alpha, "tau": cfg.tau,
                "min_samples": cfg.min_samples, "metric": "correct_rate", "arms": rows,
                "outcomes": sum(len(v) for v in by_arm.values())}

    # -- internals ----------------------------------------------------------------------

    def _names(self, db: sqlite3.Connection | None = None) -> str:
        if db is None:
            return ", ".join(a.name for a in self.arms())
        return ", ".join(r[0] for r in db.execute("SELECT name FROM arms ORDER BY position"))

    def _transaction(self) -> _Transaction:
        return _Transaction(self)

    @staticmethod
    def _event(db: sqlite3.Connection, kind: str, detail: Mapping[str, Any]) -> None:
        db.execute("INSERT INTO events (time, kind, detail) VALUES (?, ?, ?)",
                   (time.time(), kind, json.dumps(detail)))


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or ``ROLLBACK`` on error) under the store's lock:
    a write either lands whole or not at all, and two processes never interleave one."""

    def __init__(self, store: ABStore):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store._lock.release()
            raise
        return self.store._db

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            self.store._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
        finally:
            self.store._lock.release()


def outcome_from_result(*, arm: str, source: str, result: EvalResult | None,
                        reward: float | None, latency_s: float, job_id: str = "") -> Outcome:
    """The outcome of a job whose best kernel got ``result`` (None: no kernel at all).

    Correctness is unknown (None) where nothing could run it (no GPU) or the evaluator itself
    failed; a job without a kernel counts as neither compiled nor correct.
    """
    if result is None:
        compiled, correct, speedup = False, False, None
    else:
        unknown = result.status in (EvalStatus.NO_GPU, EvalStatus.INFRA_ERROR)
        compiled = result.compiled
        correct = None if unknown else result.correct
        speedup = result.speedup if result.correct else None
    return Outcome(arm=arm, problem_hash=source_hash(source), compiled=compiled,
                   correct=correct, speedup=speedup, reward=reward, latency_s=latency_s,
                   job_id=job_id)


def record_job(store: ABStore, job: Any) -> Outcome | None:
    """A job manager's ``on_finished`` callback: record a finished job on its arm.

    Reads ``job.arm``, ``job.source``, ``job.status``, ``job.episode`` (its ``best_result`` and
    turns' rewards), ``job.latency_s`` and ``job.id``. Jobs without an arm are not part of the
    test; a job that failed to run (model or evaluator down) says nothing about its agents and
    is left out too. The reward is the episode's return (the sum of its turns' rewards).
    """
    if job.arm is None or str(getattr(job.status, "value", job.status)) != "succeeded":
        return None
    episode = job.episode
    rewards = [t.reward for t in (episode.turns if episode is not None else [])
               if t.reward is not None]
    outcome = outcome_from_result(
        arm=job.arm, source=job.source,
        result=episode.best_result if episode is not None else None,
        reward=float(sum(rewards)) if rewards else None,
        latency_s=float(job.latency_s or 0.0), job_id=str(job.id))
    store.record(outcome)
    return outcome
