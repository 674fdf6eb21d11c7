"""The kernel episode for TRL's ``GRPOTrainer``: a ``rollout_func`` and a reward function.

TRL (>= 0.20; the API below is the one TRL 1.x documents as experimental) calls
``rollout_func(prompts, trainer)`` with the prompts of the rows this process generates for
(already repeated ``num_generations`` times, adjacent), and takes back ``prompt_ids``,
``completion_ids``, ``logprobs`` and, for multi-turn rollouts, ``env_mask`` (1 on the policy's
tokens, 0 on the environment's: TRL leaves the 0s out of the loss). Every other key is handed
to the reward functions as a keyword argument, one value per completion.

Here each prompt is a problem's Generator chat prompt (:func:`kernel_dataset`); the rollout
runs the multi-turn episode of ``integrations.episode_env`` for every row, with the trainer's
own model generating (``SharedModelPolicy`` under our ``HFGenerationBackend``) or any
``GenerationBackend`` you pass (an OpenAI-compatible server). :class:`KernelReward` turns the
episode's ``EvalResult``s into the reward: per-turn rewards, turn credit, one scalar.

TRL's environment interface (``environment_factory``) exposes environment methods as tools the
model calls; a Tester that answers every reply is not a tool call, so the rollout function is
the interface used here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from multiminddev.agents.prompts import generator_messages
from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import EvalResult
from multiminddev.episode.runner import AsyncEvaluator
from multiminddev.integrations.episode_env import (
    KernelEnvConfig,
    KernelRollout,
    SharedModelPolicy,
    TrajectoryReward,
    arun_rollouts,
    trajectory_reward,
)
from multiminddev.policy.generation import GenerationBackend, HFGenerationBackend
from multiminddev.rewards.credit import CreditConfig, assign_turn_rewards
from multiminddev.rewards.functions import RewardConfig, compute_reward
from multiminddev.tasks.problem import Problem

BackendSource = GenerationBackend | Callable[[Any], GenerationBackend] | None


def prompt_key(prompt: Any) -> str:
    """The key a prompt (chat messages or text) is looked up by: its last user message."""
    if isinstance(prompt, list):
        users = [m["content"] for m in prompt if m.get("role") == "user"]
        return users[-1] if users else json.dumps(prompt, sort_keys=True)
    return str(prompt)


def kernel_dataset(problems: Sequence[Problem], *, element_type: bool = False) -> Any:
    """A ``datasets.Dataset`` for ``GRPOTrainer``: ``prompt`` (the Generator's chat messages)
    and ``problem`` (the name), one row per problem."""
    from datasets import Dataset

    rows = [{"prompt": generator_messages(p, element_type=element_type), "problem": p.name}
            for p in problems]
    return Dataset.from_list(rows)


def trainer_backend(trainer: Any) -> GenerationBackend:
    """Our HF backend over the trainer's current model (unwrapped from DDP/DeepSpeed): the
    rollouts sample from the weights being trained."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    return HFGenerationBackend(SharedModelPolicy(model, trainer.processing_class))


class KernelRolloutFunc:
    """``rollout_func`` for ``GRPOTrainer``: the multi-turn kernel episode of every prompt.

    ``problems`` must contain the problems of the dataset's prompts (looked up by
    :func:`prompt_key`); ``evaluator`` is kept open by the caller for the whole run. The
    trainer's ``temperature`` and ``top_p`` are used for sampling (TRL scores tokens at that
    temperature) and ``max_completion_length`` caps ``max_response_tokens``.
    """

    __name__ = "kernel_rollout"

    def __init__(self, problems: Sequence[Problem], evaluator: AsyncEvaluator,
                 config: KernelEnvConfig | None = None, *, backend: BackendSource = None,
                 element_type: bool | None = None):
        self.config = config or KernelEnvConfig()
        element = self.config.episode.element_type if element_type is None else element_type
        self.problems = {prompt_key(generator_messages(p, element_type=element)): p
                         for p in problems}
        self.evaluator = evaluator
        self.backend = backend
        self.last_rollouts: list[KernelRollout] = []  # the latest call's, for logging

    def _config_for(self, trainer: Any) -> KernelEnvConfig:
        args = getattr(trainer, "args", None)
        if args is None:
            return self.config
        episode = self.config.episode
        sampling = dataclasses.replace(episode.sampling, temperature=float(args.temperature),
                                       top_p=float(getattr(args, "top_p", 1.0) or 1.0))
        budget = self.config.max_response_tokens
        if getattr(args, "max_completion_length", None):
            budget = min(budget, int(args.max_completion_length))
        return dataclasses.replace(self.config, max_response_tokens=budget,
                                   episode=dataclasses.replace(episode, sampling=sampling))

    def _backend_for(self, trainer: Any) -> GenerationBackend:
        if self.backend is None:
            return trainer_backend(trainer)
        if isinstance(self.backend, GenerationBackend):
            return self.backend
        return self.backend(trainer)

    def problem_for(self, prompt: Any) -> Problem:
        key = prompt_key(prompt)
        if key not in self.problems:
            raise KeyError("a prompt of the dataset is not one of this rollout function's "
                           "problems; build the dataset with kernel_dataset(problems) from the "
                           "same problems")
        return self.problems[key]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        problems = [self.problem_for(p) for p in prompts]
        config = self._config_for(trainer)
        backend = self._backend_for(trainer)
        rollouts = asyncio.run(arun_rollouts(problems, backend, self.evaluator, config))
        self.last_rollouts = rollouts
        return rollout_batch(rollouts)


def rollout_batch(rollouts: Sequence[KernelRollout]) -> dict[str, list[Any]]:
    """What ``rollout_func`` returns: TRL's required keys, ``env_mask``, and per completion the
    fields :class:`KernelReward` reads (``kernel_turns``) plus the environment's own reward."""
    return {
        "prompt_ids": [list(r.prompt_ids) for r in rollouts],
        "completion_ids": [list(r.response_ids) for r in rollouts],
        "logprobs": [list(r.response_logprobs) for r in rollouts],
        "env_mask": [list(r.response_mask) for r in rollouts],
        "kernel_turns": [kernel_turns(r) for r in rollouts],
        "kernel_reward": [float(r.reward) for r in rollouts],
    }


def kernel_turns(rollout: KernelRollout) -> list[dict[str, Any]]:
    """Per agent turn: role, EvalResult (as a dict; None for a reply without a candidate), the
    candidate source, and whether it repeated an earlier turn's kernel."""
    turns = rollout.episode.turns if rollout.episode else []
    return [{"role": t.role.value,
             "eval_result": t.eval_result.to_dict() if t.eval_result is not None else None,
             "source": t.candidate_source, "repeated": t.repeat_of is not None}
            for t in turns]


class KernelReward:
    """Reward function for ``GRPOTrainer`` over the episode's ``EvalResult``s: each agent
    turn's ``compute_reward``, then ``assign_turn_rewards``, then the trajectory's scalar.

    With the same configs as the rollout's ``KernelEnvConfig`` it returns the rollout's own
    reward; give it other configs to train on another reward from the same evaluations."""

    def __init__(self, reward: RewardConfig | None = None, credit: CreditConfig | None = None,
                 trajectory: TrajectoryReward = TrajectoryReward.MEAN_CREDIT):
        self.reward = reward or RewardConfig()
        self.credit = credit or CreditConfig()
        self.trajectory = TrajectoryReward(trajectory)
        self.__name__ = "kernel_reward"  # TRL logs each reward function under its __name__

    @classmethod
    def from_config(cls, config: KernelEnvConfig) -> KernelReward:
        return cls(config.episode.reward, config.credit, config.trajectory_reward)

    def score(self, turns: Sequence[dict[str, Any]]) -> float:
        roles = [AgentRole(t["role"]) for t in turns]
        immediate = []
        for t in turns:
            result = EvalResult.from_dict(t["eval_result"]) if t["eval_result"] else None
            immediate.append(compute_reward(result, self.reward, t.get("source"),
                                            repeated=bool(t.get("repeated"))).total)
        credited = assign_turn_rewards(roles, immediate, self.credit)
        return trajectory_reward(immediate, credited, self.trajectory)

    def __call__(self, prompts: list[Any], completions: list[Any], *,
                 kernel_turns: list[list[dict[str, Any]]] | None = None,
                 **kwargs: Any) -> list[float]:
        if kernel_turns is None:
            raise ValueError("kernel_reward needs the `kernel_turns` field that "
                             "KernelRolloutFunc returns; pass rollout_func=KernelRolloutFunc(...) "
                             "to GRPOTrainer")
        return [self.score(turns) for turns in kernel_turns]
