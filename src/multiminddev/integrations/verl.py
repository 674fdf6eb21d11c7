"""The kernel episode as a verl agent loop (verl's agent-loop rollout, ``AgentLoopBase``).

verl's ``AgentLoopWorker`` builds one agent loop per dataset row (by the row's ``agent_name``)
and awaits ``run(sampling_params, **row_fields) -> AgentLoopOutput``. :class:`KernelAgentLoop`
(registered as ``multiminddev_kernel``) runs the multi-turn episode of
``integrations.episode_env`` for the row's problem and returns it as one sequence:
``prompt_ids``, ``response_ids``, ``response_mask`` (1 on the policy's tokens, 0 on the
Tester's reports and the Optimizer prompts between them), ``response_logprobs``,
``reward_score`` (so verl's reward stage uses ours), ``num_turns`` and metrics; the per-turn
credit is in ``extra_fields["turn_scores"]``.

Generation goes through verl's server manager (vLLM or SGLang replicas, the weights verl
trains): :class:`ServerManagerBackend` adapts its ``generate(request_id, prompt_ids=,
sampling_params=) -> TokenOutput`` to our ``GenerationBackend`` protocol, which is all the
episode code needs. Evaluations go to one ``Evaluator`` per worker process (kept for the
process's life), or to whatever ``evaluator: "module:factory"`` names (a remote evaluation
service: any object with ``async aevaluate(problem, source)``).

Settings come from the agent-loop config file verl reads (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``); every key besides ``name`` and ``_target_`` is a keyword of
:class:`KernelAgentLoop` (``examples/verl/agent_loop.yaml``). The dataset comes from
``integrations.verl_data``.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import logging
import threading
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from multiminddev.agents.roles import AgentRole
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode.runner import EpisodeConfig
from multiminddev.integrations.episode_env import (
    KernelEnvConfig,
    KernelRollout,
    TrajectoryReward,
    arun_rollouts,
)
from multiminddev.integrations.verl_data import AGENT_NAME, problem_from_extra_info
from multiminddev.policy.chat import end_of_turn_ids
from multiminddev.policy.generation import FinishReason, GenerationOutput, SamplingParams
from multiminddev.rewards.credit import CreditConfig
from multiminddev.rewards.functions import RewardConfig

log = logging.getLogger(__name__)


class ServerManagerBackend:
    """Our ``GenerationBackend`` over verl's server manager (``LLMServerClient`` or anything
    with its ``generate``). verl's sampling parameters (temperature, top_p, top_k, logprobs:
    what verl scores the tokens at) are kept; the episode sets each turn's ``max_tokens``
    and stop strings. One request per prompt, all in flight at once; ``request_id`` stays the
    episode's for sticky routing (prefix caching across turns)."""

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any],
                 *, request_id: str | None = None):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id or uuid4().hex
        self.end_ids = set(end_of_turn_ids(tokenizer))
        self.requests = 0

    def _params(self, sampling: SamplingParams) -> dict[str, Any]:
        params = dict(self.sampling_params)
        params["max_tokens"] = sampling.max_new_tokens
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        return params

    async def _one(self, prompt: list[int], sampling: SamplingParams, index: int,
                   sample: int) -> GenerationOutput:
        self.requests += 1
        request_id = self.request_id if index == 0 and sample == 0 else (
            f"{self.request_id}-{index}-{sample}")
        out = await self.server_manager.generate(request_id, prompt_ids=list(prompt),
                                                 sampling_params=self._params(sampling))
        tokens = list(out.token_ids)
        if tokens and tokens[-1] in self.end_ids:
            reason = FinishReason.EOS
        elif len(tokens) >= sampling.max_new_tokens or out.stop_reason == "aborted":
            reason = FinishReason.LENGTH
        else:
            reason = FinishReason.STOP if sampling.stop else FinishReason.EOS
        logprobs = list(out.log_probs) if out.log_probs else []
        return GenerationOutput(token_ids=tokens, logprobs=logprobs,
                                text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                                finish_reason=reason, prompt_index=index,
                                extra={"num_preempted": out.num_preempted})

    async def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                       role: AgentRole) -> list[GenerationOutput]:
        return list(await asyncio.gather(*(self._one(p, sampling, i, s)
                                           for i, p in enumerate(prompts)
                                           for s in range(sampling.n))))


# --------------------------------------------------------------------------- evaluators

_evaluators: dict[tuple[Any, ...], Any] = {}
_evaluators_lock = threading.Lock()


def shared_evaluator(*, num_workers: int | None = None, num_trials: int = 5,
                     timeout_s: float = 60.0) -> Any:
    """One local ``Evaluator`` per process and settings, started on first use and closed at
    exit: verl builds an agent loop per sample, the evaluator's workers must outlive them."""
    key = (num_workers, num_trials, timeout_s)
    with _evaluators_lock:
        if key not in _evaluators:
            evaluator = Evaluator(EvalConfig(num_workers=num_workers, num_trials=num_trials,
                                             timeout_s=timeout_s))
            atexit.register(evaluator.close)
            _evaluators[key] = evaluator
        return _evaluators[key]


@functools.cache
def _factory_evaluator(spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"evaluator={spec!r}: name a factory as 'package.module:function'")
    return getattr(importlib.import_module(module), name)()


# --------------------------------------------------------------------------- the agent loop


def env_config(*, max_turns: int = 3, max_new_tokens: int = 1024, response_length: int,
               reward_kind: str = "gated_shaped", credit_mode: str = "mixed",
               trajectory_reward: str = "mean_credit", patience: int = 2,
               target_speedup: float = 2.0, element_type: bool = False,
               feedback_chars: int = 1500) -> KernelEnvConfig:
    """The episode settings from the agent-loop config's plain keys."""
    return KernelEnvConfig(
        episode=EpisodeConfig(
            max_turns=max_turns, patience=patience, target_speedup=target_speedup,
            element_type=element_type, feedback_chars=feedback_chars,
            reward=RewardConfig(kind=reward_kind),
            sampling=SamplingParams(max_new_tokens=max_new_tokens)),
        credit=CreditConfig(mode=credit_mode),
        trajectory_reward=TrajectoryReward(trajectory_reward),
        max_response_tokens=response_length)


@register(AGENT_NAME)
class KernelAgentLoop(AgentLoopBase):
    """verl agent loop: one policy plays the Generator and the Optimizer on the row's problem,
    the Tester answers every reply, the reward is ours (module docstring)."""

    def __init__(self, *args: Any, max_turns: int = 3, max_new_tokens: int = 1024,
                 reward_kind: str = "gated_shaped", credit_mode: str = "mixed",
                 trajectory_reward: str = "mean_credit", patience: int = 2,
                 target_speedup: float = 2.0, element_type: bool = False,
                 feedback_chars: int = 1500, evaluator: str | None = None,
                 eval_workers: int | None = None, eval_trials: int = 5,
                 eval_timeout_s: float = 60.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.env = env_config(max_turns=max_turns, max_new_tokens=max_new_tokens,
                              response_length=self.response_length, reward_kind=reward_kind,
                              credit_mode=credit_mode, trajectory_reward=trajectory_reward,
                              patience=patience, target_speedup=target_speedup,
                              element_type=element_type, feedback_chars=feedback_chars)
        self.evaluator = (_factory_evaluator(evaluator) if evaluator else
                          shared_evaluator(num_workers=eval_workers, num_trials=eval_trials,
                                           timeout_s=eval_timeout_s))

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        problem = problem_from_extra_info(kwargs.get("extra_info") or {})
        backend = ServerManagerBackend(self.server_manager, self.tokenizer, sampling_params)
        (rollout,) = await arun_rollouts([problem], backend, self.evaluator, self.env)
        return agent_loop_output(rollout, self.response_length)


def agent_loop_output(rollout: KernelRollout, response_length: int) -> AgentLoopOutput:
    """verl's output for one rollout, cut to ``response_length`` (the episode already keeps
    within it; the cut is verl's own rule for loops that do not)."""
    n = response_length
    metrics = rollout.metrics()
    # no log-probs from the servers (rollout.calculate_log_probs off): verl recomputes them
    logprobs = None if rollout.logprobs_missing else rollout.response_logprobs[:n]
    return AgentLoopOutput(
        prompt_ids=list(rollout.prompt_ids),
        response_ids=rollout.response_ids[:n],
        response_mask=rollout.response_mask[:n],
        response_logprobs=logprobs,
        reward_score=float(rollout.reward),
        num_turns=rollout.num_messages,
        metrics=AgentLoopMetrics(generate_sequences=rollout.generate_seconds,
                                 tool_calls=rollout.eval_seconds),
        extra_fields={"turn_scores": list(rollout.turn_rewards), "tool_rewards": [],
                      "kernel_metrics": metrics,
                      "kernel_status": rollout.episode.status.value if rollout.episode else ""},
    )
