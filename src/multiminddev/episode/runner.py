"""Run many multi-turn episodes concurrently.

Schedule: Generator, then Optimizer for every later turn (``EpisodeConfig.schedule`` changes
it); the Tester step after each agent turn is automatic (evaluate -> feedback -> reward).
Each step batches generation across all running episodes — one ``backend.generate`` call per
role per step — then submits every new candidate to the evaluator at once
(``await evaluator.aevaluate``) and waits for them; identical candidates for the same problem
are evaluated once (the compile cache). Episodes end early when a verified kernel reaches the
target speedup, when the best kernel has not improved for ``patience`` turns, or after
``max_format_failures`` consecutive replies without a candidate.

Which kernel the Optimizer sees: the latest candidate, unless it scored below a best kernel
that at least compiled — then the best one (with its report) and a line saying the last
attempt was worse. Earlier attempts appear as one line each (outcome and strategy tags) plus
the strategies that never helped; older lines are dropped, and the prompt says how many, when
the prompt would not fit ``max_prompt_tokens``.

The runner depends only on the ``GenerationBackend`` protocol and on an evaluator with
``async aevaluate(problem, source) -> EvalResult``, so a VERL AgentLoop can drive it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.pitfalls import candidate_strategies
from multiminddev.agents.prompts import generator_messages, optimizer_messages
from multiminddev.agents.roles import AgentRole
from multiminddev.agents.tester import format_failure_feedback, tester_feedback
from multiminddev.env.profile import profile_kernel
from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.episode.state import Episode, EpisodeStatus, FailedAttempt, Turn
from multiminddev.policy.chat import encode_chat
from multiminddev.policy.generation import GenerationBackend, SamplingParams
from multiminddev.rewards.functions import compute_reward
from multiminddev.tasks.problem import Problem

log = logging.getLogger(__name__)


class AsyncEvaluator(Protocol):
    async def aevaluate(self, problem: Problem, candidate: str) -> EvalResult: ...


@dataclass(kw_only=True)
class EpisodeConfig:
    max_turns: int = 5  # Generator/Optimizer turns; each is followed by an automatic Tester step
    schedule: tuple[AgentRole, ...] = ()  # roles per turn; empty: Generator then Optimizer...
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=1024)
    )
    target_speedup: float = 2.0  # stop once a verified kernel is this fast (0 disables)
    patience: int = 2  # stop after this many turns in a row without a better kernel (0: never)
    min_improvement: float = 0.01  # relative speedup gain that counts as an improvement
    max_format_failures: int = 2  # stop after this many replies in a row without a candidate
    # Per-role cap on new tokens (role value -> tokens), over sampling.max_new_tokens: a batch
    # decodes until its longest reply ends, so a role whose replies are short (the Generator's
    # first kernel) should not pay for the longest role's budget.
    max_new_tokens_by_role: dict[str, int] = field(default_factory=dict)
    # Per-role sampling temperature (role value -> temperature, 0 = greedy), over
    # sampling.temperature. GRPO that trains only the Optimizer can decode the Generator
    # greedily: every episode of a group then hands the Optimizer the same kernel, so the
    # group's reward differences are the Optimizer's alone (a sampled Generator hands it
    # kernels of every quality; docs/training.md, "Greedy Generator in the rollouts").
    temperature_by_role: dict[str, float] = field(default_factory=dict)
    max_prompt_tokens: int = 6144
    feedback_chars: int = 1500
    reward: Any = None  # rewards.functions.RewardConfig; None: no per-turn reward
    # prompts end with a line naming the kernels' pointer type (agents.prompts.element_type_line);
    # agents must be trained (SFT) on the same prompts
    element_type: bool = False
    # The Tester's report on a verified kernel adds its Nsight Compute figures (occupancy,
    # memory throughput, warp efficiency, stall reasons; env/profile.py), measured inside the
    # evaluation sandbox. Off by default: each profile takes seconds to tens of seconds, and
    # agents trained without the figures have not seen such reports. Needs ncu and a GPU; where
    # either is missing the report is the usual one.
    profiler_feedback: bool = False

    def __post_init__(self) -> None:
        self.schedule = tuple(AgentRole(r) for r in self.schedule)
        if self.max_turns < 1:
            raise ValueError("EpisodeConfig.max_turns must be >= 1")
        if any(not r.trainable for r in self.schedule):
            raise ValueError("EpisodeConfig.schedule: the Tester runs automatically after each "
                             "turn; list only generator/optimizer")
        if self.patience < 0 or self.max_format_failures < 1:
            raise ValueError("EpisodeConfig: patience must be >= 0, max_format_failures >= 1")
        if self.max_prompt_tokens < 256:
            raise ValueError("EpisodeConfig.max_prompt_tokens must be >= 256")
        if self.sampling.n != 1:
            raise ValueError("EpisodeConfig.sampling.n must be 1; use group_size for groups")
        self.max_new_tokens_by_role = {AgentRole(k).value: int(v)
                                       for k, v in self.max_new_tokens_by_role.items()}
        if any(v < 1 for v in self.max_new_tokens_by_role.values()):
            raise ValueError("EpisodeConfig.max_new_tokens_by_role: every cap must be >= 1")
        self.temperature_by_role = {AgentRole(k).value: float(v)
                                    for k, v in self.temperature_by_role.items()}
        if any(not AgentRole(k).trainable for k in self.temperature_by_role):
            raise ValueError("EpisodeConfig.temperature_by_role: only generator/optimizer "
                             "turns decode")
        if any(v < 0 for v in self.temperature_by_role.values()):
            raise ValueError("EpisodeConfig.temperature_by_role: temperatures must be >= 0 "
                             "(0 = greedy)")

    def sampling_for(self, role: AgentRole) -> SamplingParams:
        """The sampling parameters of ``role``'s turns (its own max_new_tokens and
        temperature, if set)."""
        role = AgentRole(role).value
        changes: dict[str, Any] = {}
        if role in self.max_new_tokens_by_role:
            changes["max_new_tokens"] = self.max_new_tokens_by_role[role]
        if role in self.temperature_by_role:
            changes["temperature"] = self.temperature_by_role[role]
        return dataclasses.replace(self.sampling, **changes) if changes else self.sampling

    def role_for_turn(self, index: int) -> AgentRole:
        if self.schedule:
            return self.schedule[min(index, len(self.schedule) - 1)]
        return AgentRole.GENERATOR if index == 0 else AgentRole.OPTIMIZER


# --------------------------------------------------------------------------- scoring


def result_score(result: EvalResult | None) -> tuple[int, float]:
    """Order of candidate quality: verified (by speedup) > ran but wrong (by pass rate) >
    compiled (crashed, timed out, or not run without a GPU) > compile error > nothing."""
    if result is None:
        return (0, 0.0)
    s = result.status
    if s is EvalStatus.OK:
        return (4, result.benchmark.speedup_vs_eager)
    if s is EvalStatus.INCORRECT:
        return (3, result.verify.pass_rate)
    if result.compiled and s in (EvalStatus.NO_GPU, EvalStatus.RUNTIME_ERROR, EvalStatus.TIMEOUT):
        return (2, 0.0)
    if s is EvalStatus.COMPILE_ERROR:
        return (1, 0.0)
    return (0, 0.0)


def improves(new: tuple[int, float], best: tuple[int, float] | None, min_gain: float) -> bool:
    if best is None:
        return new[0] > 0
    if new[0] != best[0]:
        return new[0] > best[0]
    if new[0] == 4:
        return new[1] > best[1] * (1.0 + min_gain)
    return new[1] > best[1]


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def repeated_turn(episode: Episode, source: str | None) -> int | None:
    """The first earlier turn of ``episode`` that wrote exactly ``source``, or None."""
    if source is None:
        return None
    return next((t.index for t in episode.turns if t.candidate_source == source), None)


def repeat_note(index: int) -> str:
    """The Tester's first line for a resubmitted kernel (``index``: the turn that wrote it)."""
    return (f"Unchanged: this is the kernel of turn {index + 1} again, so its result below is "
            "that turn's. Resubmitting it cannot do better; change the kernel.")


def outcome_line(turn: Turn) -> str:
    """One line for the history: what the turn tried and what came of it."""
    if turn.format_failed:
        what = f"format failure ({turn.parse_failure.value})"  # type: ignore[union-attr]
    else:
        what = _result_summary(turn.eval_result)
    if turn.repeat_of is not None:
        what = f"turn {turn.repeat_of + 1}'s kernel again: {what}"
    tags = f"; used {', '.join(turn.strategies)}" if turn.strategies else ""
    best = " -> new best" if turn.improved else ""
    return f"turn {turn.index + 1} ({turn.role.value}): {what}{tags}{best}"


def _result_summary(result: EvalResult | None) -> str:
    if result is None:
        return "not evaluated"
    s = result.status
    if s is EvalStatus.OK:
        return f"correct, {result.benchmark.speedup_vs_eager:.2f}x vs eager"
    if s is EvalStatus.INCORRECT:
        return f"wrong output (max abs error {result.verify.max_abs_error:.3g})"
    if s is EvalStatus.COMPILE_ERROR:
        first = result.compile.errors[0].message.strip() if result.compile.errors else ""
        return f"compile error{': ' + first[:80] if first else ''}"
    if s is EvalStatus.NO_GPU:
        return "compiled (not run: no GPU)" if result.compiled else "not compiled (no GPU)"
    if s is EvalStatus.REJECTED:
        return f"rejected ({result.reject_reason.value if result.reject_reason else 'rule'})"
    return s.value.replace("_", " ")


# --------------------------------------------------------------------------- prompts


def history_lines(episode: Episode) -> list[str]:
    return [outcome_line(t) for t in episode.turns]


def optimizer_context(episode: Episode) -> tuple[list[str], list[str]]:
    """(history lines, trailing lines) the Optimizer's next prompt shows after the kernel."""
    failed = list(episode.failed_strategies)
    tail = [f"strategies tried without improvement: {', '.join(failed)}"] if failed else []
    return history_lines(episode), tail


def build_prompt(
    episode: Episode, role: AgentRole, tokenizer: Any, config: EpisodeConfig
) -> tuple[list[dict[str, str]], list[int], int] | None:
    """(messages, token ids, history lines omitted), or None when nothing fits the window."""
    if role is AgentRole.GENERATOR:
        messages = generator_messages(episode.problem, element_type=config.element_type)
        ids = encode_chat(tokenizer, messages)
        return (messages, ids, 0) if len(ids) <= config.max_prompt_tokens else None
    history, tail = optimizer_context(episode)
    feedback = episode.current_feedback
    omitted = 0
    while True:
        messages = optimizer_messages(episode.problem, episode.current_source, feedback,
                                      history + tail, omitted=omitted,
                                      element_type=config.element_type)
        ids = encode_chat(tokenizer, messages)
        if len(ids) <= config.max_prompt_tokens:
            return messages, ids, omitted
        if history:  # drop the oldest attempt first; the prompt says how many are gone
            history, omitted = history[1:], omitted + 1
        elif len(feedback) > 200:
            feedback = feedback[: len(feedback) // 2] + " …(trimmed)"
        else:
            return None


# --------------------------------------------------------------------------- state update


def record_turn(episode: Episode, turn: Turn, config: EpisodeConfig) -> None:
    """Add an evaluated turn: best kernel, trajectory, strategies, what the next turn sees."""
    episode.turns.append(turn)
    if turn.eval_result is not None and turn.eval_result.status is EvalStatus.NO_GPU:
        episode.compile_only = True
    for tag in turn.strategies:
        episode.strategies_tried[tag] = episode.strategies_tried.get(tag, 0) + 1
    new = result_score(turn.eval_result)
    best = result_score(episode.best_result) if episode.best_turn is not None else None
    turn.improved = improves(new, best, config.min_improvement)
    if turn.improved:
        episode.best_turn, episode.best_source = turn.index, turn.candidate_source
        episode.best_result = turn.eval_result
    else:
        _record_failure(episode, turn)
    episode.trajectory.append(episode.best_speedup)
    _choose_current(episode, turn, new, best)


def _record_failure(episode: Episode, turn: Turn) -> None:
    outcome = (f"format:{turn.parse_failure.value}" if turn.parse_failure is not None
               else (turn.eval_result.status.value if turn.eval_result else "none"))
    episode.failed_attempts.append(FailedAttempt(
        turn=turn.index, role=turn.role, outcome=outcome, summary=outcome_line(turn),
        strategies=list(turn.strategies)))
    best_tags = set(episode.turns[episode.best_turn].strategies) if episode.best_turn is not None else set()
    for tag in turn.strategies:
        if tag not in best_tags and tag not in episode.failed_strategies:
            episode.failed_strategies.append(tag)


def _choose_current(episode: Episode, turn: Turn, new: tuple[int, float],
                    best: tuple[int, float] | None) -> None:
    if turn.candidate_source is None:  # no candidate: keep the kernel, say what went wrong
        if episode.current_source is None:
            episode.current_feedback = turn.feedback
        else:
            episode.current_feedback = (f"{turn.feedback}\n(The kernel below is still the "
                                        f"current one.)\n{_strip_status(episode.current_feedback)}")
        return
    if turn.improved or best is None or best[0] < 2:
        episode.current_source, episode.current_feedback = turn.candidate_source, turn.feedback
        return
    best_turn = episode.turns[episode.best_turn]  # type: ignore[index]
    episode.current_source = best_turn.candidate_source
    episode.current_feedback = (f"{best_turn.feedback}\nThe last attempt (turn {turn.index + 1}) "
                                f"was worse: {_result_summary(turn.eval_result)}. This is the "
                                "best kernel so far; improve it differently.")


def _strip_status(feedback: str) -> str:
    return feedback if len(feedback) < 800 else feedback[:800] + " …"


def termination(episode: Episode, config: EpisodeConfig) -> EpisodeStatus:
    turns = episode.turns
    last = turns[-1]
    if last.eval_result is not None and last.eval_result.status is EvalStatus.INFRA_ERROR:
        episode.error = last.eval_result.message or "evaluation infrastructure error"
        return EpisodeStatus.ERROR
    if (config.target_speedup > 0 and episode.verified
            and episode.best_speedup >= config.target_speedup):
        return EpisodeStatus.TARGET_REACHED
    recent = turns[-config.max_format_failures:]
    if len(recent) == config.max_format_failures and all(t.format_failed for t in recent):
        return EpisodeStatus.FORMAT_FAILURES
    if config.patience and len(turns) > config.patience:
        if not any(t.improved for t in turns[-config.patience:]):
            return EpisodeStatus.NO_IMPROVEMENT
    if len(turns) >= config.max_turns:
        return EpisodeStatus.MAX_TURNS
    return EpisodeStatus.RUNNING


# --------------------------------------------------------------------------- evaluation


class _EvalCache:
    """Per-run cache keyed by (problem, candidate) so group members share evaluations;
    in-flight evaluations are shared too (identical candidates in one step)."""

    def __init__(self, evaluator: AsyncEvaluator):
        self.evaluator = evaluator
        self.tasks: dict[tuple[str, str], asyncio.Task[EvalResult]] = {}
        self.profiles: dict[tuple[str, str], asyncio.Task[Any]] = {}

    async def profile(self, problem: Problem, source: str) -> Any:
        """The kernel's Nsight Compute figures (``env.profile.profile_kernel``, under the
        evaluator's isolation settings), measured once per run and kernel, off the event loop."""
        key = (problem.source_hash + problem.name, source_hash(source))
        if key not in self.profiles:
            config = getattr(self.evaluator, "config", None)
            self.profiles[key] = asyncio.ensure_future(
                asyncio.to_thread(profile_kernel, problem, source, config))
        return await self.profiles[key]

    async def get(self, problem: Problem, source: str) -> tuple[EvalResult, bool]:
        key = (problem.source_hash + problem.name, source_hash(source))
        cached = key in self.tasks
        if not cached:
            self.tasks[key] = asyncio.ensure_future(self.evaluator.aevaluate(problem, source))
        return await self.tasks[key], cached


async def _evaluate_turn(episode: Episode, turn: Turn, cache: _EvalCache, config: EpisodeConfig) -> None:
    start = time.perf_counter()
    if turn.candidate_source is None:
        turn.feedback = format_failure_feedback(
            turn.parse_failure.value if turn.parse_failure else "unknown", turn.parse_detail,
            max_chars=config.feedback_chars)
    else:
        key = source_hash(turn.candidate_source)
        if key in episode.compile_cache:  # an earlier turn of this episode wrote this kernel
            turn.eval_result, turn.cached = episode.compile_cache[key], True
            turn.repeat_of = repeated_turn(episode, turn.candidate_source)
        else:
            turn.eval_result, turn.cached = await cache.get(episode.problem, turn.candidate_source)
            episode.compile_cache[key] = turn.eval_result
        profile = None
        if config.profiler_feedback and turn.eval_result.status is EvalStatus.OK:
            profile = await cache.profile(episode.problem, turn.candidate_source)
            turn.profile = profile.to_dict()
        turn.feedback = tester_feedback(turn.eval_result, turn.candidate_source,
                                        max_chars=config.feedback_chars, profile=profile)
        if turn.repeat_of is not None:
            turn.feedback = repeat_note(turn.repeat_of) + "\n" + turn.feedback
    turn.eval_seconds = time.perf_counter() - start
    if config.reward is not None:
        breakdown = compute_reward(turn.eval_result, config.reward, turn.candidate_source,
                                   repeated=turn.repeat_of is not None)
        turn.reward, turn.reward_breakdown = breakdown.total, dict(breakdown.components)


# --------------------------------------------------------------------------- the loop


async def _step(
    index: int, active: list[Episode], backend: GenerationBackend, cache: _EvalCache,
    config: EpisodeConfig,
) -> None:
    role = config.role_for_turn(index)
    prompts = []
    for episode in active:
        built = build_prompt(episode, role, backend.tokenizer, config)
        if built is None:
            episode.status = EpisodeStatus.ERROR
            episode.error = f"the {role.value} prompt does not fit max_prompt_tokens"
        prompts.append(built)
    ready = [(e, p) for e, p in zip(active, prompts) if p is not None]
    if not ready:
        return
    start = time.perf_counter()
    outputs = await backend.generate([p[1] for _, p in ready], config.sampling_for(role), role)
    seconds = (time.perf_counter() - start) / len(ready)
    turns = []
    for (episode, (messages, ids, omitted)), out in zip(ready, outputs):
        parsed = parse_candidate(out.text)
        turns.append(Turn(
            index=len(episode.turns), role=role, prompt_ids=list(ids),
            response_ids=list(out.token_ids), logprobs=list(out.logprobs), text=out.text,
            finish_reason=out.finish_reason, messages=messages,
            candidate_source=parsed.source, parse_failure=parsed.failure,
            parse_detail=parsed.detail, history_omitted=omitted, generate_seconds=seconds,
            strategies=[s.value for s in candidate_strategies(parsed.source)],
        ))
    results = await asyncio.gather(
        *(_evaluate_turn(e, t, cache, config) for (e, _), t in zip(ready, turns)),
        return_exceptions=True,
    )
    for (episode, _), turn, res in zip(ready, turns, results):
        if isinstance(res, BaseException):
            episode.turns.append(turn)
            episode.status, episode.error = EpisodeStatus.ERROR, f"evaluation failed: {res!r}"
            continue
        record_turn(episode, turn, config)
        episode.status = termination(episode, config)


@functools.cache
def _warn_window_once(prompt_tokens: int, new_tokens: int, window: int) -> None:
    """Once per process and setting: runs of many problems start one runner per problem."""
    log.warning("max_prompt_tokens (%d) + max_new_tokens (%d) exceed the model's window "
                "(%d): long prompts will be cut short by the model", prompt_tokens, new_tokens,
                window)


async def arun_episodes(
    problems: Sequence[Problem],
    backend: GenerationBackend,
    evaluator: AsyncEvaluator,
    config: EpisodeConfig | None = None,
    *,
    group_size: int = 1,
    on_step: Callable[[list[Episode]], Any] | None = None,
) -> list[Episode]:
    """Run ``group_size`` episodes per problem concurrently; returns them problem by problem.
    ``on_step(episodes)``, if given, is called after each step (every running episode has one
    more turn), e.g. to stream turns as they end."""
    config = config or EpisodeConfig()
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    episodes = [
        Episode(problem=p, episode_id=f"{p.name}-{i}-{g}", group=i)
        for i, p in enumerate(problems) for g in range(group_size)
    ]
    window = getattr(backend, "context_window", None)
    longest = max([config.sampling.max_new_tokens, *config.max_new_tokens_by_role.values()])
    if window and config.max_prompt_tokens + longest > window:
        _warn_window_once(config.max_prompt_tokens, longest, window)
    cache = _EvalCache(evaluator)
    for index in range(config.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        await _step(index, active, backend, cache, config)
        if on_step is not None:
            on_step(episodes)
    for episode in episodes:
        if episode.status is EpisodeStatus.RUNNING:
            episode.status = EpisodeStatus.MAX_TURNS
    if any(e.compile_only for e in episodes):
        log.warning("compile-only results: no GPU here, kernels were compiled but not run, so "
                    "correctness and speed are unknown")
    return episodes


def run_episodes(
    problems: Sequence[Problem],
    backend: GenerationBackend,
    evaluator: AsyncEvaluator,
    config: EpisodeConfig | None = None,
    *,
    group_size: int = 1,
) -> list[Episode]:
    """Synchronous wrapper of :func:`arun_episodes` (inside an event loop, await that one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun_episodes(problems, backend, evaluator, config,
                                         group_size=group_size))
    raise RuntimeError("run_episodes was called inside a running event loop; "
                       "use `await arun_episodes(...)` there")


def single_episode_config(
    *, turns: int, sampling: SamplingParams, target_speedup: float, patience: int,
    context_window: int,
) -> EpisodeConfig:
    """The episode of ``optimize`` (one problem, one episode): prompts get what the model's
    window leaves after the reply, at most 6144 tokens and at least 256."""
    return EpisodeConfig(
        max_turns=turns, sampling=sampling, target_speedup=target_speedup, patience=patience,
        max_prompt_tokens=max(256, min(6144, context_window - sampling.max_new_tokens)),
    )


def with_sampling(config: EpisodeConfig, **changes: Any) -> EpisodeConfig:
    """A copy of ``config`` with some sampling parameters changed."""
    return dataclasses.replace(config, sampling=dataclasses.replace(config.sampling, **changes))
