"""A stage whose evaluations mostly failed on our side is an error naming the cause."""

from __future__ import annotations

import pytest

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode import EpisodeConfig, run_episodes
from multiminddev.episode.infra import (
    InfraFailure,
    check_episodes,
    check_share_limit,
    episode_infra_message,
    infra_failure,
)
from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced, relu_problem
from tests.policy.helpers import gguf_tokenizer

STARTUP = "worker exited during startup (exit code 1)"


def test_a_stage_fails_only_above_the_share():
    at_limit = [STARTUP, None, STARTUP, None]  # 2 of 4: exactly half
    assert infra_failure(at_limit, what="stage grpo", max_share=0.5) is None
    assert infra_failure([*at_limit, STARTUP], what="stage grpo", max_share=0.5) is not None


def test_a_share_of_one_never_fails_and_zero_fails_on_any():
    assert infra_failure([STARTUP] * 3, what="s", max_share=1.0) is None
    assert infra_failure([STARTUP, None, None], what="s", max_share=0.0) is not None
    assert infra_failure([None, None], what="s", max_share=0.0) is None


def test_the_error_counts_episodes_and_quotes_the_causes_most_common_first():
    messages = [STARTUP] * 3 + ["the evaluator is closed"] + [None]
    error = infra_failure(messages, what="stage grpo", max_share=0.5)
    assert error.startswith("stage grpo: 4 of 5 episodes ended in an infrastructure error")
    assert error.index(f"3 x {STARTUP!r}") < error.index("1 x 'the evaluator is closed'")


def test_a_worker_that_cannot_start_is_explained():
    error = infra_failure([STARTUP] * 2, what="stage grpo")
    assert "Likely cause: the evaluation workers could not start" in error
    assert "re-reads the main script" in error


def test_the_share_must_be_a_share():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="max_infra_share must be in \\[0, 1\\]"):
            check_share_limit(bad)


def _relu_episodes(evaluator, n=2):
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: fenced(RELU_KERNEL))
    return run_episodes([relu_problem(f"relu_{i}") for i in range(n)], backend, evaluator,
                        EpisodeConfig(max_turns=1), group_size=1)


def test_episodes_of_an_evaluator_whose_workers_cannot_start_stop_the_stage():
    """Real worker processes, given no time to start: every evaluation is an infrastructure
    error, and the stage says so with the evaluator's own message."""
    config = EvalConfig(num_workers=1, spare_workers=0, startup_timeout_s=1e-6,
                        infra_retry_delay_s=0.01)
    with Evaluator(config) as evaluator:
        episodes = _relu_episodes(evaluator)
    assert all("did not start within" in episode_infra_message(e) for e in episodes)
    with pytest.raises(InfraFailure, match="held-out: 2 of 2 episodes .*did not start within"):
        check_episodes(episodes, what="held-out")


def test_episodes_of_a_closed_evaluator_stop_the_stage():
    evaluator = Evaluator(EvalConfig(num_workers=1))
    evaluator.close()
    episodes = _relu_episodes(evaluator)
    with pytest.raises(InfraFailure, match="the evaluator was closed before the stage ran"):
        check_episodes(episodes, what="held-out")


def test_episodes_evaluated_normally_pass_the_check():
    with Evaluator(EvalConfig(num_workers=1, num_trials=1)) as evaluator:
        episodes = _relu_episodes(evaluator, n=1)
    assert episode_infra_message(episodes[0]) is None
    check_episodes(episodes, what="held-out")  # no error
