"""Multi-turn episode state: turns with tokens, logprobs and loss masks; the best kernel;
the performance trajectory; failed attempts and strategies tried; JSONL (de)serialisation.

A ``Turn`` is one agent (Generator or Optimizer) reply followed by the automatic Tester step
(its feedback is stored on the turn). Loss-mask semantics: in ``turn.input_ids`` (prompt +
response) the response tokens are the agent's (mask 1) and the prompt tokens — system prompt,
problem, earlier feedback — are not (mask 0); see ``Turn.loss_mask``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.agents.parsing import ParseFailure
from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.policy.generation import FinishReason
from multiminddev.tasks.problem import Problem


class EpisodeStatus(str, enum.Enum):
    RUNNING = "running"
    TARGET_REACHED = "target_reached"  # a verified kernel reached the target speedup
    NO_IMPROVEMENT = "no_improvement"  # the best kernel did not improve for `patience` turns
    MAX_TURNS = "max_turns"
    FORMAT_FAILURES = "format_failures"  # too many consecutive replies without a candidate
    ERROR = "error"  # infrastructure failure or a prompt that cannot fit the window


@dataclass(kw_only=True)
class Turn:
    index: int
    role: AgentRole
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # one per response token
    text: str = ""
    finish_reason: FinishReason = FinishReason.EOS
    messages: list[dict[str, str]] = field(default_factory=list)  # the prompt as chat messages
    candidate_source: str | None = None
    parse_failure: ParseFailure | None = None
    parse_detail: str = ""
    eval_result: EvalResult | None = None  # None: nothing to evaluate (format failure)
    cached: bool = False  # eval_result reused from the episode's compile cache
    repeat_of: int | None = None  # index of an earlier turn of this episode with the same kernel
    feedback: str = ""  # the Tester's report on this turn's candidate
    # the kernel's Nsight Compute figures (env.profile.KernelProfile.to_dict()), where
    # EpisodeConfig.profiler_feedback measured them; None: not measured
    profile: dict[str, Any] | None = None
    reward: float | None = None
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    strategies: list[str] = field(default_factory=list)
    improved: bool = False  # this turn's candidate became the new best
    history_omitted: int = 0  # earlier attempts left out of the prompt to fit the window
    generate_seconds: float = 0.0
    eval_seconds: float = 0.0

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def loss_mask(self) -> list[int]:
        """Aligned with ``input_ids``: 1 for the agent's own tokens, 0 for the prompt."""
        return [0] * len(self.prompt_ids) + [1] * len(self.response_ids)

    @property
    def format_failed(self) -> bool:
        return self.parse_failure is not None

    @property
    def speedup(self) -> float:
        return self.eval_result.speedup if self.eval_result is not None else 0.0


@dataclass(kw_only=True)
class FailedAttempt:
    turn: int
    role: AgentRole
    outcome: str  # eval status or "format:<reason>"
    summary: str  # one line for the next prompt
    strategies: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Episode:
    problem: Problem
    episode_id: str = ""
    group: int = 0  # episodes sampled for the same problem in one GRPO group share this
    turns: list[Turn] = field(default_factory=list)
    status: EpisodeStatus = EpisodeStatus.RUNNING
    best_turn: int | None = None
    best_source: str | None = None
    best_result: EvalResult | None = None
    current_source: str | None = None  # what the next Optimizer turn starts from
    current_feedback: str = ""
    trajectory: list[float] = field(default_factory=list)  # best speedup after each turn
    compile_cache: dict[str, EvalResult] = field(default_factory=dict)  # source hash -> result
    failed_attempts: list[FailedAttempt] = field(default_factory=list)
    strategies_tried: dict[str, int] = field(default_factory=dict)  # tag -> turns using it
    failed_strategies: list[str] = field(default_factory=list)  # tried, never improved
    compile_only: bool = False  # no GPU: results are compile-only, correctness unknown
    error: str = ""

    @property
    def done(self) -> bool:
        return self.status is not EpisodeStatus.RUNNING

    @property
    def best_speedup(self) -> float:
        return self.best_result.speedup if self.best_result is not None else 0.0

    @property
    def verified(self) -> bool:
        return self.best_result is not None and self.best_result.status is EvalStatus.OK

    def agent_turns(self, role: AgentRole | None = None) -> list[Turn]:
        return [t for t in self.turns if role is None or t.role is role]

    def conversation(self) -> Iterator[dict[str, str]]:
        """Generator, Tester, Optimizer, Tester, ... as readable messages (for logs/JSONL)."""
        for t in self.turns:
            yield {"role": t.role.value, "content": t.text}
            yield {"role": AgentRole.TESTER.value, "content": t.feedback}


# --------------------------------------------------------------------------- serialisation


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, EvalResult):
        return value.to_dict()
    if isinstance(value, Problem):
        return value.to_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    data = {name: _jsonable(getattr(turn, name)) for name in Turn.__dataclass_fields__}
    data["loss_mask_note"] = "loss mask = [0]*len(prompt_ids) + [1]*len(response_ids)"
    return data


def turn_from_dict(data: dict[str, Any]) -> Turn:
    kwargs = {k: v for k, v in data.items() if k in Turn.__dataclass_fields__}
    kwargs["role"] = AgentRole(kwargs["role"])
    kwargs["finish_reason"] = FinishReason(kwargs.get("finish_reason", "eos"))
    if kwargs.get("parse_failure") is not None:
        kwargs["parse_failure"] = ParseFailure(kwargs["parse_failure"])
    if kwargs.get("eval_result") is not None:
        kwargs["eval_result"] = EvalResult.from_dict(kwargs["eval_result"])
    return Turn(**kwargs)


def episode_to_dict(episode: Episode, *, include_cache: bool = False) -> dict[str, Any]:
    """The full conversation, results and rewards. The compile cache repeats turn results, so
    it is left out unless asked for."""
    data: dict[str, Any] = {}
    for name in Episode.__dataclass_fields__:
        if name == "compile_cache" and not include_cache:
            continue
        value = getattr(episode, name)
        if name == "turns":
            data[name] = [turn_to_dict(t) for t in value]
        elif name == "failed_attempts":
            data[name] = [_jsonable(vars(f)) for f in value]
        else:
            data[name] = _jsonable(value)
    data["best_speedup"] = episode.best_speedup
    data["verified"] = episode.verified
    return data


def episode_from_dict(data: dict[str, Any]) -> Episode:
    fields = Episode.__dataclass_fields__
    kwargs = {k: v for k, v in data.items() if k in fields}
    kwargs["problem"] = Problem.from_dict(kwargs["problem"])
    kwargs["status"] = EpisodeStatus(kwargs.get("status", "running"))
    kwargs["turns"] = [turn_from_dict(t) for t in kwargs.get("turns", [])]
    for key in ("best_result",):
        if kwargs.get(key) is not None:
            kwargs[key] = EvalResult.from_dict(kwargs[key])
    kwargs["compile_cache"] = {
        h: EvalResult.from_dict(r) for h, r in (kwargs.get("compile_cache") or {}).items()
    }
    kwargs["failed_attempts"] = [
        FailedAttempt(**{**f, "role": AgentRole(f["role"])}) for f in kwargs.get("failed_attempts", [])
    ]
    return Episode(**kwargs)


def write_episodes_jsonl(episodes: Iterable[Episode], path: str | Path, *, append: bool = False) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for episode in episodes:
            f.write(json.dumps(episode_to_dict(episode)) + "\n")
    return path


def read_episodes_jsonl(path: str | Path) -> list[Episode]:
    with Path(path).open(encoding="utf-8") as f:
        return [episode_from_dict(json.loads(line)) for line in f if line.strip()]
