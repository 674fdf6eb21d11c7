"""Episodes of several problems at once: generate calls merged into batches across problems,
each episode handed over as it ends, finished pairs skipped, logged episodes read back by a
resumed held-out evaluation (train/episode_stream.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode.runner import EpisodeConfig
from multiminddev.episode.state import EpisodeStatus
from multiminddev.policy import HFGenerationBackend, SamplingParams
from multiminddev.train.episode_stream import (
    BatchingBackend,
    run_logged_episodes,
    stream_episodes,
)
from tests.episode.helpers import RELU_KERNEL, ReplayBackend, fenced, relu_problem
from tests.policy.helpers import gguf_tokenizer, tiny_policy

G, O = AgentRole.GENERATOR, AgentRole.OPTIMIZER
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def hf_backend():
    return HFGenerationBackend(tiny_policy())


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as ev:
        yield ev


def _prompts(n: int) -> list[list[int]]:
    tok = gguf_tokenizer()
    return [tok(f"kernel number {i} please", add_special_tokens=False)["input_ids"]
            for i in range(n)]


async def _concurrently(batching, calls):
    return await asyncio.gather(*(batching.generate(p, s, r) for p, s, r in calls))


def test_concurrent_calls_are_merged_up_to_max_rows_and_answered_in_order(hf_backend):
    prompts = _prompts(5)
    batching = BatchingBackend(hf_backend, max_rows=2)
    got = asyncio.run(_concurrently(batching, [([p], GREEDY, G) for p in prompts]))
    assert batching.batch_rows == [2, 2, 1]
    # each caller gets the reply the backend wrote for its prompt within the same batch
    want = [o for chunk in (prompts[0:2], prompts[2:4], prompts[4:5])
            for o in hf_backend.generate_sync(chunk, GREEDY, G)]
    assert [[o.token_ids for o in g] for g in got] == [[o.token_ids] for o in want]


def test_calls_of_other_roles_or_sampling_go_in_their_own_batches(hf_backend):
    prompts = _prompts(4)
    hot = SamplingParams(temperature=0.9, max_new_tokens=6, seed=1)
    batching = BatchingBackend(hf_backend, max_rows=16)
    got = asyncio.run(_concurrently(batching, [([prompts[0]], GREEDY, G), ([prompts[1]], GREEDY, O),
                                               ([prompts[2]], GREEDY, G), ([prompts[3]], hot, G)]))
    assert batching.batch_rows == [2, 1, 1]
    assert all(len(g) == 1 for g in got)


def test_a_failed_batch_fails_its_callers_and_the_next_batch_still_runs(hf_backend):
    batching = BatchingBackend(hf_backend, max_rows=2)

    async def calls():
        return await asyncio.gather(
            batching.generate([[]], GREEDY, G),  # no token: the backend refuses the batch
            batching.generate(_prompts(1), GREEDY, G),
            batching.generate(_prompts(1), GREEDY, G), return_exceptions=True)

    empty, same_batch, next_batch = asyncio.run(calls())
    assert isinstance(empty, ValueError) and isinstance(same_batch, ValueError)
    assert len(next_batch) == 1 and next_batch[0].token_ids


def test_first_turns_of_all_problems_decode_as_one_batch_and_episodes_end_one_by_one(evaluator):
    problems = [relu_problem("relu_a"), relu_problem("relu_b")]
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: fenced(RELU_KERNEL))
    ended = []
    config = EpisodeConfig(max_turns=2, sampling=GREEDY, patience=1)
    out = stream_episodes(problems, backend, evaluator, config, concurrency=8,
                          on_episode=lambda e, s: ended.append((e.episode_id, e.group, s, e.done)))
    assert backend.calls[0] == (G, 2)  # one Generator batch spans both problems
    assert sorted(ended) == [("relu_a-0-0", 0, 0, True), ("relu_b-1-0", 1, 0, True)]
    assert [(i, s, e.problem.name) for i, s, e in out] == [(0, 0, "relu_a"), (1, 0, "relu_b")]
    assert all(e.turns[0].eval_result is not None for _, _, e in out)


def test_skipped_pairs_run_no_episode_and_samples_keep_their_index(evaluator):
    problems = [relu_problem("relu_a"), relu_problem("relu_b")]
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "no kernel here")
    config = EpisodeConfig(max_turns=2, sampling=GREEDY)
    out = stream_episodes(problems, backend, evaluator, config, samples=2,
                          skip={("relu_a", 0), ("relu_a", 1), ("relu_b", 0)})
    assert [(i, s, e.episode_id) for i, s, e in out] == [(1, 1, "relu_b-1-1")]
    assert backend.calls == [(G, 1), (O, 1)]


def test_concurrency_bounds_the_problems_in_flight(evaluator):
    problems = [relu_problem(f"relu_{c}") for c in "abc"]
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "no kernel here")
    config = EpisodeConfig(max_turns=2, sampling=GREEDY)
    stream_episodes(problems, backend, evaluator, config, concurrency=1)
    assert [n for _, n in backend.calls] == [1] * 6  # one problem at a time, two turns each
    with pytest.raises(ValueError, match="concurrency"):
        stream_episodes(problems, backend, evaluator, config, concurrency=0)


def _logged_run(evaluator, path, record, *, resume):
    problems = [relu_problem("relu_a"), relu_problem("relu_b")]
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "no kernel here")
    config = EpisodeConfig(max_turns=2, sampling=GREEDY)
    episodes = run_logged_episodes(problems, backend, evaluator, config, episodes_file=path,
                                   record=record, resume=resume)
    return episodes, backend


def test_logged_episodes_are_read_back_by_a_resumed_run_with_the_same_record(evaluator,
                                                                             tmp_path):
    path = tmp_path / "eval_episodes.jsonl"
    first, _ = _logged_run(evaluator, path, {"rl_step": 5}, resume=False)
    assert [e.problem.name for e in first] == ["relu_a", "relu_b"]
    assert len(path.read_text().splitlines()) == 2
    again, backend = _logged_run(evaluator, path, {"rl_step": 5}, resume=True)
    assert backend.calls == []  # nothing ran
    assert [(e.episode_id, e.status, len(e.turns)) for e in again] == \
        [(e.episode_id, e.status, len(e.turns)) for e in first]


def test_a_resumed_run_with_other_agents_or_after_errors_runs_them_again(evaluator, tmp_path):
    path = tmp_path / "eval_episodes.jsonl"
    _logged_run(evaluator, path, {"rl_step": 5}, resume=False)
    _, backend = _logged_run(evaluator, path, {"rl_step": 6}, resume=True)
    assert [n for _, n in backend.calls] == [2, 2]  # other agents: both problems again
    assert len(path.read_text().splitlines()) == 2
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["status"] = EpisodeStatus.ERROR.value  # the evaluator failed on this one
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    episodes, backend = _logged_run(evaluator, path, {"rl_step": 6}, resume=True)
    assert [n for _, n in backend.calls] == [1, 1]
    assert {e.problem.name for e in episodes} == {"relu_a", "relu_b"}
    assert all(e.status is not EpisodeStatus.ERROR for e in episodes)
    assert len(path.read_text().splitlines()) == 2
