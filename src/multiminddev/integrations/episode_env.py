"""The kernel episode as one growing conversation, for trainers of a single policy (verl, TRL).

Our own trainer (``train/grpo.py``) re-prompts each agent turn from scratch and keeps one LoRA
adapter per agent. verl's agent loops and TRL's ``rollout_func`` train one policy on one token
sequence per episode instead: a prompt, then a response in which the policy's own tokens are
trained on (mask 1) and everything the environment wrote in between is not (mask 0). Here one
policy plays both agents in that layout:

    prompt   = the Generator's system + user messages (``agents.prompts.generator_messages``)
    response = Generator reply | Tester report + Optimizer prompt | Optimizer reply | ...
    mask     =       1 ...     |              0 ...               |      1 ...      |

Each reply is parsed (``agents.parsing``), evaluated by any object with ``async
aevaluate(problem, source) -> EvalResult`` (the local ``Evaluator``, or a remote evaluation
service), scored with ``rewards.compute_reward``, and answered with the Tester's report
(``agents.tester``). The user message between two replies is the Optimizer's own user prompt
(``agents.prompts.optimizer_messages``: the current kernel, the Tester report and the
earlier attempts), after the Optimizer's role paragraph, so a policy trained here sees what
our trainer's Optimizer sees. Episodes stop as the runner's do (``episode.runner.termination``:
target speedup reached, no improvement for ``patience`` turns, repeated format failures, max
turns) and also when the next turn would not fit ``max_response_tokens``.

Reward: every agent turn's immediate reward, then per-turn credit with
``rewards.assign_turn_rewards`` (``KernelEnvConfig.credit``). verl and TRL take one scalar per
sequence; ``KernelEnvConfig.trajectory_reward`` says which (the mean credited turn reward by
default); the per-turn credit travels with the rollout (``KernelRollout.turn_rewards`` and
``turn_spans``) for trainers that place rewards per token.

Generation goes through the ``GenerationBackend`` protocol only (our in-process HF backend, an
OpenAI-compatible server, verl's rollout servers through ``integrations.verl``), so the same
episode runs under every trainer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.pitfalls import candidate_strategies
from multiminddev.agents.prompts import generator_messages, optimizer_messages, render
from multiminddev.agents.roles import AgentRole
from multiminddev.agents.tester import format_failure_feedback, tester_feedback
from multiminddev.env.results import EvalResult, EvalStatus
from multiminddev.episode.runner import (
    AsyncEvaluator,
    EpisodeConfig,
    optimizer_context,
    record_turn,
    repeat_note,
    repeated_turn,
    source_hash,
    termination,
)
from multiminddev.episode.state import Episode, EpisodeStatus, Turn
from multiminddev.policy.chat import encode_chat, end_of_turn_ids, render_chat
from multiminddev.policy.generation import FinishReason, GenerationBackend, SamplingParams
from multiminddev.rewards.credit import CreditConfig, assign_turn_rewards
from multiminddev.rewards.functions import RewardConfig, compute_reward
from multiminddev.tasks.problem import Problem

# A turn is not started with fewer new tokens than this left in the response budget: a reply
# cut that short cannot hold a kernel, and it would still cost a generation and a Tester report.
MIN_TURN_TOKENS = 32


class TrajectoryReward(str, enum.Enum):
    """The one scalar a sequence-level trainer (verl, TRL) gets for a whole episode."""

    MEAN_CREDIT = "mean_credit"  # mean of the credited agent-turn rewards (CreditConfig)
    BEST = "best"  # the best immediate turn reward (what our trainer logs as the episode reward)
    LAST = "last"  # the last agent turn's immediate reward


@dataclass(kw_only=True)
class KernelEnvConfig:
    """How an episode runs and is scored. ``episode`` holds the runner's settings (turns,
    sampling, stopping rules, reward); ``episode.max_new_tokens_by_role`` and
    ``temperature_by_role`` apply per turn as in our trainer."""

    episode: EpisodeConfig = field(default_factory=lambda: EpisodeConfig(
        max_turns=3, reward=RewardConfig(),
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1024)))
    credit: CreditConfig = field(default_factory=CreditConfig)
    trajectory_reward: TrajectoryReward = TrajectoryReward.MEAN_CREDIT
    # All response tokens of an episode together (the policy's and the environment's): verl's
    # rollout.response_length, TRL's max_completion_length. Turns are cut to fit.
    max_response_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.episode.reward is None:
            raise ValueError("KernelEnvConfig.episode.reward is None: the environment scores every "
                             "turn; pass a RewardConfig (RewardConfig() for the default reward)")
        try:
            self.trajectory_reward = TrajectoryReward(self.trajectory_reward)
        except ValueError:
            names = ", ".join(k.value for k in TrajectoryReward)
            raise ValueError(f"KernelEnvConfig.trajectory_reward={self.trajectory_reward!r} is "
                             f"unknown; use one of {names}") from None
        if self.max_response_tokens < MIN_TURN_TOKENS:
            raise ValueError(f"KernelEnvConfig.max_response_tokens must be >= {MIN_TURN_TOKENS}; "
                             "it bounds every reply and Tester report of an episode together")


@dataclass(kw_only=True)
class KernelRollout:
    """One episode as a single sequence: ``prompt_ids + response_ids``.

    ``response_mask[i]`` is 1 where the policy wrote ``response_ids[i]`` and 0 where the
    environment did (Tester reports, Optimizer prompts, chat-template tokens between them);
    ``response_logprobs`` holds the sampler's log-probs there and 0.0 elsewhere. ``turn_spans``
    are the ``[start, end)`` slices of ``response_ids`` each agent turn wrote, aligned with
    ``episode.turns`` and ``turn_rewards``."""

    problem: Problem
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)  # credited, one per agent turn
    reward: float = 0.0
    episode: Episode | None = None
    budget_exhausted: bool = False  # stopped because the next turn did not fit the budget
    # the backend returned no log-probs for some reply (their places hold 0.0): a trainer must
    # recompute them instead of reading response_logprobs
    logprobs_missing: bool = False
    generate_seconds: float = 0.0
    eval_seconds: float = 0.0

    @property
    def eval_results(self) -> list[EvalResult | None]:
        return [t.eval_result for t in self.episode.turns] if self.episode else []

    @property
    def roles(self) -> list[AgentRole]:
        return [t.role for t in self.episode.turns] if self.episode else []

    @property
    def num_messages(self) -> int:
        """Chat messages after the system prompt: the user prompt, every reply, every report."""
        turns = len(self.episode.turns) if self.episode else 0
        return 1 + turns + max(turns - 1, 0)

    def metrics(self) -> dict[str, float]:
        """Flat numbers to log per episode."""
        results = self.eval_results
        compiled = [r is not None and r.compiled for r in results]
        correct = [r is not None and r.status is EvalStatus.OK for r in results]
        return {
            "turns": float(len(results)),
            "reward": self.reward,
            "compiled_any": float(any(compiled)),
            "correct_any": float(any(correct)),
            "format_failures": float(sum(r is None for r in results)),
            "best_speedup": float(self.episode.best_speedup) if self.episode else 0.0,
            "policy_tokens": float(sum(self.response_mask)),
            "env_tokens": float(len(self.response_mask) - sum(self.response_mask)),
            "budget_exhausted": float(self.budget_exhausted),
            "generate_seconds": self.generate_seconds,
            "eval_seconds": self.eval_seconds,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (token ids excluded): per-turn roles, results and rewards."""
        turns = self.episode.turns if self.episode else []
        return {
            "problem": self.problem.name,
            "status": self.episode.status.value if self.episode else "",
            "reward": self.reward,
            "turn_rewards": list(self.turn_rewards),
            "turns": [{"role": t.role.value, "reward": t.reward,
                       "eval_result": t.eval_result.to_dict() if t.eval_result else None,
                       "parse_failure": t.parse_failure.value if t.parse_failure else None}
                      for t in turns],
        }


# --------------------------------------------------------------------------- pure helpers


_MARK = "MMD_CONTINUATION_MARK"


def continuation_ids(tokenizer: Any, user_content: str, response_ids: Sequence[int]) -> list[int]:
    """The tokens the chat template puts after an assistant reply to append ``user_content``
    as the next user message and open the next reply.

    Rendered from a transcript whose assistant reply is a marker, and cut after the marker, so
    no earlier token is re-tokenized. When the reply already ended with the template's
    end-of-turn token (a sampled ``<|im_end|>``) that token is not repeated; a reply cut at
    the length limit gets it here, as an environment token."""
    messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": _MARK},
                {"role": "user", "content": user_content}]
    text = render_chat(tokenizer, messages)
    if text.count(_MARK) != 1:
        raise ValueError("the chat template does not copy an assistant reply verbatim; "
                         "multi-turn rollouts need one that does")
    tail = text.split(_MARK, 1)[1]
    ids = list(tokenizer(tail, add_special_tokens=False)["input_ids"])
    ends = set(end_of_turn_ids(tokenizer))
    if response_ids and response_ids[-1] in ends and ids and ids[0] in ends:
        ids = ids[1:]
    return ids


def optimizer_role_text() -> str:
    """The Optimizer's role paragraph (its system prompt without the candidate format, which
    the conversation's system prompt already carries)."""
    return render("optimizer_system", candidate_format="").strip()


def next_user_message(episode: Episode, role: AgentRole, config: EpisodeConfig) -> str:
    """What the environment says before ``role``'s next reply: for the Optimizer, its role and
    its prompt (the current kernel, the Tester report, earlier attempts); for the Generator,
    the Tester report and the Generator's request again."""
    if role is AgentRole.OPTIMIZER:
        history, tail = optimizer_context(episode)
        messages = optimizer_messages(episode.problem, episode.current_source,
                                      episode.current_feedback, history + tail,
                                      element_type=config.element_type)
        return f"{optimizer_role_text()}\n\n{messages[-1]['content']}"
    request = generator_messages(episode.problem, element_type=config.element_type)[-1]["content"]
    return f"Tester report:\n{episode.current_feedback.strip()}\n\n{request}"


def trajectory_reward(immediate: Sequence[float], credited: Sequence[float],
                      kind: TrajectoryReward) -> float:
    """The sequence's scalar reward from its agent turns' immediate and credited rewards."""
    if not immediate:
        return 0.0
    if kind is TrajectoryReward.BEST:
        return float(max(immediate))
    if kind is TrajectoryReward.LAST:
        return float(immediate[-1])
    return float(sum(credited) / len(credited))


def score_episode(episode: Episode, config: KernelEnvConfig) -> tuple[list[float], float]:
    """(credited reward per agent turn, trajectory reward) of a finished episode."""
    roles = [t.role for t in episode.turns]
    immediate = [float(t.reward or 0.0) for t in episode.turns]
    credited = assign_turn_rewards(roles, immediate, config.credit)
    return credited, trajectory_reward(immediate, credited, config.trajectory_reward)


# --------------------------------------------------------------------------- the episode


@dataclass
class _State:
    rollout: KernelRollout
    episode: Episode
    messages: list[dict[str, str]]
    budget: int  # response tokens the episode may still hold, in all

    @property
    def context(self) -> list[int]:
        return self.rollout.prompt_ids + self.rollout.response_ids

    @property
    def budget_left(self) -> int:
        return self.budget - len(self.rollout.response_ids)


class _Evaluations:
    """Evaluations shared by the episodes of one call: identical kernels of a problem (a GRPO
    group's) are evaluated once, in flight too."""

    def __init__(self, evaluator: AsyncEvaluator):
        self.evaluator = evaluator
        self.tasks: dict[tuple[str, str], asyncio.Future[EvalResult]] = {}

    async def get(self, problem: Problem, source: str) -> tuple[EvalResult, bool]:
        key = (problem.source_hash + problem.name, source_hash(source))
        cached = key in self.tasks
        if not cached:
            self.tasks[key] = asyncio.ensure_future(self.evaluator.aevaluate(problem, source))
        return await self.tasks[key], cached


async def _evaluate(episode: Episode, turn: Turn, evaluations: _Evaluations,
                    config: EpisodeConfig) -> None:
    """The Tester step: evaluate, report, score (as the episode runner does)."""
    start = time.perf_counter()
    if turn.candidate_source is None:
        turn.feedback = format_failure_feedback(
            turn.parse_failure.value if turn.parse_failure else "unknown", turn.parse_detail,
            max_chars=config.feedback_chars)
    else:
        key = source_hash(turn.candidate_source)
        if key in episode.compile_cache:
            turn.eval_result, turn.cached = episode.compile_cache[key], True
            turn.repeat_of = repeated_turn(episode, turn.candidate_source)
        else:
            turn.eval_result, turn.cached = await evaluations.get(episode.problem,
                                                                  turn.candidate_source)
            episode.compile_cache[key] = turn.eval_result
        turn.feedback = tester_feedback(turn.eval_result, turn.candidate_source,
                                        max_chars=config.feedback_chars)
        if turn.repeat_of is not None:
            turn.feedback = repeat_note(turn.repeat_of) + "\n" + turn.feedback
    turn.eval_seconds = time.perf_counter() - start
    breakdown = compute_reward(turn.eval_result, config.reward, turn.candidate_source,
                               repeated=turn.repeat_of is not None)
    turn.reward, turn.reward_breakdown = breakdown.total, dict(breakdown.components)


async def _generate(states: list[_State], role: AgentRole, backend: GenerationBackend,
                    config: KernelEnvConfig) -> list[Any]:
    """One ``backend.generate`` per distinct token cap (episodes with little budget left get
    a smaller one), all at once; outputs in the order of ``states``."""
    sampling = config.episode.sampling_for(role)
    caps = [min(sampling.max_new_tokens, s.budget_left) for s in states]
    groups: dict[int, list[int]] = {}
    for i, cap in enumerate(caps):
        groups.setdefault(cap, []).append(i)
    calls = [backend.generate([states[i].context for i in rows],
                              dataclasses.replace(sampling, max_new_tokens=cap), role)
             for cap, rows in groups.items()]
    outputs: list[Any] = [None] * len(states)
    for rows, outs in zip(groups.values(), await asyncio.gather(*calls)):
        for i, out in zip(rows, outs):
            outputs[i] = out
    return outputs


async def _step(index: int, active: list[_State], backend: GenerationBackend,
                evaluations: _Evaluations, config: KernelEnvConfig) -> None:
    cfg = config.episode
    role = cfg.role_for_turn(index)
    start = time.perf_counter()
    outputs = await _generate(active, role, backend, config)
    seconds = (time.perf_counter() - start) / len(active)
    turns = []
    for state, out in zip(active, outputs):
        parsed = parse_candidate(out.text)
        turn = Turn(index=len(state.episode.turns), role=role, prompt_ids=state.context,
                    response_ids=list(out.token_ids), logprobs=list(out.logprobs), text=out.text,
                    finish_reason=FinishReason(out.finish_reason), messages=list(state.messages),
                    candidate_source=parsed.source, parse_failure=parsed.failure,
                    parse_detail=parsed.detail, generate_seconds=seconds,
                    strategies=[s.value for s in candidate_strategies(parsed.source)])
        rollout = state.rollout
        begin = len(rollout.response_ids)
        rollout.response_ids += turn.response_ids
        rollout.response_mask += [1] * len(turn.response_ids)
        logprobs = turn.logprobs
        if len(logprobs) != len(turn.response_ids):
            logprobs, rollout.logprobs_missing = [0.0] * len(turn.response_ids), True
        rollout.response_logprobs += [float(x) for x in logprobs]
        rollout.turn_spans.append((begin, len(rollout.response_ids)))
        rollout.generate_seconds += seconds
        state.messages.append({"role": "assistant", "content": out.text})
        turns.append(turn)
    results = await asyncio.gather(
        *(_evaluate(s.episode, t, evaluations, cfg) for s, t in zip(active, turns)),
        return_exceptions=True)
    for state, turn, res in zip(active, turns, results):
        episode = state.episode
        state.rollout.eval_seconds += turn.eval_seconds
        if isinstance(res, BaseException):
            episode.turns.append(turn)
            episode.status, episode.error = EpisodeStatus.ERROR, f"evaluation failed: {res!r}"
            continue
        record_turn(episode, turn, cfg)
        episode.status = termination(episode, cfg)
        if episode.status is EpisodeStatus.RUNNING:
            _append_user_turn(state, cfg.role_for_turn(index + 1), backend.tokenizer, cfg)


def _append_user_turn(state: _State, role: AgentRole, tokenizer: Any,
                      config: EpisodeConfig) -> None:
    """Append the environment's next message (mask 0), or end the episode when it and a
    useful reply would not fit the budget."""
    content = next_user_message(state.episode, role, config)
    ids = continuation_ids(tokenizer, content, state.rollout.response_ids)
    if state.budget_left - len(ids) < MIN_TURN_TOKENS:
        state.rollout.budget_exhausted = True
        state.episode.status = EpisodeStatus.MAX_TURNS
        return
    rollout = state.rollout
    rollout.response_ids += ids
    rollout.response_mask += [0] * len(ids)
    rollout.response_logprobs += [0.0] * len(ids)
    state.messages.append({"role": "user", "content": content})


async def arun_rollouts(
    problems: Sequence[Problem],
    backend: GenerationBackend,
    evaluator: AsyncEvaluator,
    config: KernelEnvConfig | None = None,
    *,
    group_size: int = 1,
) -> list[KernelRollout]:
    """Run ``group_size`` episodes per problem concurrently, each as one sequence; returns
    them problem by problem (a problem's group adjacent). Every step makes one
    ``backend.generate`` call for all running episodes (per token cap) and evaluates their
    kernels concurrently."""
    config = config or KernelEnvConfig()
    if group_size < 1:
        raise ValueError("group_size must be >= 1")
    cfg = config.episode
    states = []
    for i, problem in enumerate(problems):
        messages = generator_messages(problem, element_type=cfg.element_type)
        prompt_ids = encode_chat(backend.tokenizer, messages)
        for g in range(group_size):
            episode = Episode(problem=problem, episode_id=f"{problem.name}-{i}-{g}", group=i)
            rollout = KernelRollout(problem=problem, prompt_ids=list(prompt_ids), episode=episode)
            states.append(_State(rollout=rollout, episode=episode, messages=list(messages),
                                 budget=config.max_response_tokens))
    evaluations = _Evaluations(evaluator)
    for index in range(cfg.max_turns):
        active = [s for s in states if not s.episode.done]
        if not active:
            break
        await _step(index, active, backend, evaluations, config)
    for state in states:
        if state.episode.status is EpisodeStatus.RUNNING:
            state.episode.status = EpisodeStatus.MAX_TURNS
        state.rollout.turn_rewards, state.rollout.reward = score_episode(state.episode, config)
    return [s.rollout for s in states]


def run_rollouts(
    problems: Sequence[Problem],
    backend: GenerationBackend,
    evaluator: AsyncEvaluator,
    config: KernelEnvConfig | None = None,
    *,
    group_size: int = 1,
) -> list[KernelRollout]:
    """Synchronous wrapper of :func:`arun_rollouts` (inside an event loop, await that one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun_rollouts(problems, backend, evaluator, config,
                                         group_size=group_size))
    raise RuntimeError("run_rollouts was called inside a running event loop; "
                       "use `await arun_rollouts(...)` there")


# --------------------------------------------------------------------------- one model, all roles


class SharedModelPolicy:
    """One causal LM (and its tokenizer) that plays every role, shaped like ``policy.Policy``
    for ``HFGenerationBackend``: a trainer that owns the model (TRL) samples through our
    backend (stop tokens, batching, log-probs) without our per-agent adapters."""

    def __init__(self, model: Any, tokenizer: Any):
        self.model = model
        self.tokenizer = tokenizer  # the backend pads by itself (left), with EOS if no pad token
        self.config = types.SimpleNamespace(compiled_decoding=False)  # the backend reads it
        self.roles = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def context_window(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)

    def use(self, role: AgentRole | str) -> Any:
        import contextlib

        return contextlib.nullcontext(self.model)

    def sampling_model(self, role: AgentRole | str, dtype: Any = None) -> Any:
        return self.model
