import pytest
import torch

from multiminddev.agents.parsing import ParseFailure
from multiminddev.agents.roles import AgentRole
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    StageStatus,
    VerifyResult,
)
from multiminddev.episode import (
    Episode,
    EpisodeConfig,
    EpisodeStatus,
    Turn,
    build_prompt,
    improves,
    record_turn,
    result_score,
    run_episodes,
    termination,
)
from multiminddev.policy import HFGenerationBackend, SamplingParams
from multiminddev.rewards.functions import RewardConfig
from tests.episode.helpers import (
    BROKEN_KERNEL,
    HACK_KERNEL,
    RELU_KERNEL,
    ReplayBackend,
    fenced,
    relu_problem,
)
from tests.policy.helpers import gguf_tokenizer, tiny_policy

GPU = torch.cuda.is_available()
G, O = AgentRole.GENERATOR, AgentRole.OPTIMIZER


def _res(status, speedup=0.0, compiled=True, pass_rate=0.0):
    return EvalResult(
        status=status, problem="relu",
        compile=CompileResult(status=StageStatus.OK if compiled else StageStatus.FAILED),
        verify=VerifyResult(status=StageStatus.OK, trials_run=4, trials_passed=int(4 * pass_rate)),
        benchmark=BenchmarkResult(status=StageStatus.OK, speedup_vs_eager=speedup))


def _turn(index, result, source="src", role=O, **kw):
    return Turn(index=index, role=role, eval_result=result, candidate_source=source,
                feedback=f"report {index}", **kw)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(num_workers=1, num_trials=2)) as ev:
        yield ev


# --------------------------------------------------------------------- pure parts


def test_config_validates():
    with pytest.raises(ValueError, match="Tester"):
        EpisodeConfig(schedule=(AgentRole.TESTER,))
    with pytest.raises(ValueError, match="group_size"):
        EpisodeConfig(sampling=SamplingParams(n=2))
    assert [EpisodeConfig().role_for_turn(i) for i in range(3)] == [G, O, O]
    assert EpisodeConfig(schedule=(G, G, O)).role_for_turn(5) is O


def test_score_orders_verified_over_wrong_over_compiled_over_broken():
    scores = [result_score(r) for r in (
        _res(EvalStatus.OK, 1.2), _res(EvalStatus.INCORRECT, pass_rate=0.5),
        _res(EvalStatus.NO_GPU), _res(EvalStatus.COMPILE_ERROR, compiled=False),
        _res(EvalStatus.REJECTED), None)]
    assert scores == sorted(scores, reverse=True)
    assert scores[-2] == scores[-1]  # a rejected hack is worth no more than no candidate
    assert len(set(scores)) == 5


def test_improvement_needs_a_relative_gain():
    assert improves((4, 1.5), (4, 1.0), 0.01)
    assert not improves((4, 1.005), (4, 1.0), 0.01)
    assert improves((2, 0.0), None, 0.01) and not improves((0, 0.0), None, 0.01)
    assert not improves((2, 0.0), (2, 0.0), 0.01)


def test_optimizer_restarts_from_the_best_after_a_regression():
    ep = Episode(problem=relu_problem())
    record_turn(ep, _turn(0, _res(EvalStatus.OK, 1.5), "good", role=G), EpisodeConfig())
    record_turn(ep, _turn(1, _res(EvalStatus.COMPILE_ERROR, compiled=False), "bad"), EpisodeConfig())
    assert ep.best_source == "good" and ep.current_source == "good"
    assert "turn 2) was worse" in ep.current_feedback and ep.trajectory == [1.5, 1.5]
    assert [f.turn for f in ep.failed_attempts] == [1]


def test_optimizer_fixes_the_latest_while_nothing_compiles():
    ep = Episode(problem=relu_problem())
    record_turn(ep, _turn(0, _res(EvalStatus.COMPILE_ERROR, compiled=False), "a"), EpisodeConfig())
    record_turn(ep, _turn(1, _res(EvalStatus.COMPILE_ERROR, compiled=False), "b"), EpisodeConfig())
    assert ep.current_source == "b" and ep.current_feedback == "report 1"


def test_failed_strategies_are_collected():
    ep = Episode(problem=relu_problem())
    record_turn(ep, _turn(0, _res(EvalStatus.OK, 1.5), "a", strategies=["grid_stride"]), EpisodeConfig())
    record_turn(ep, _turn(1, _res(EvalStatus.INCORRECT), "b", strategies=["grid_stride", "vectorized"]),
                EpisodeConfig())
    assert ep.failed_strategies == ["vectorized"]


def _episode_with(results, **cfg):
    config = EpisodeConfig(**cfg)
    ep = Episode(problem=relu_problem())
    for i, r in enumerate(results):
        fmt = {"parse_failure": ParseFailure.EMPTY} if r == "format" else {}
        record_turn(ep, _turn(i, None if r == "format" else r,
                              None if r == "format" else f"s{i}", **fmt), config)
    return termination(ep, config)


def test_termination_rules():
    ok = lambda s: _res(EvalStatus.OK, s)
    assert _episode_with([ok(2.5)], target_speedup=2.0) is EpisodeStatus.TARGET_REACHED
    assert _episode_with([ok(1.2)]) is EpisodeStatus.RUNNING
    assert _episode_with(["format", "format"]) is EpisodeStatus.FORMAT_FAILURES
    assert _episode_with([ok(1.2), ok(1.2), ok(1.1)], patience=2) is EpisodeStatus.NO_IMPROVEMENT
    assert _episode_with([ok(1.2), ok(1.3), ok(1.4)], max_turns=3) is EpisodeStatus.MAX_TURNS
    assert _episode_with([_res(EvalStatus.INFRA_ERROR)]) is EpisodeStatus.ERROR


def test_prompt_drops_old_history_to_fit_and_says_so():
    tok = gguf_tokenizer()
    ep = Episode(problem=relu_problem(), current_source=RELU_KERNEL, current_feedback="r")
    for i in range(40):
        ep.turns.append(_turn(i, _res(EvalStatus.COMPILE_ERROR, compiled=False), strategies=["tiling"]))
    full = build_prompt(ep, O, tok, EpisodeConfig(max_prompt_tokens=6000))
    assert full[2] == 0
    messages, ids, omitted = build_prompt(ep, O, tok, EpisodeConfig(max_prompt_tokens=1200))
    assert len(ids) <= 1200 and 0 < omitted < 40
    assert f"{omitted} earlier attempt(s) omitted" in messages[-1]["content"]
    assert "turn 40 (optimizer)" in messages[-1]["content"]
    assert build_prompt(ep, G, tok, EpisodeConfig(max_prompt_tokens=256)) is None


# --------------------------------------------------------------------- with the real evaluator


def test_episodes_with_the_real_evaluator(evaluator):
    """Generator writes a broken kernel, the Optimizer fixes it, then repeats itself (cached).
    A second problem gets a reward hack. Two episodes per problem, batched per step."""

    def reply(role, call, prompt_index):
        if prompt_index >= 2:  # the second problem's episodes
            return fenced(HACK_KERNEL)
        return fenced(BROKEN_KERNEL if role is G else RELU_KERNEL)

    backend = ReplayBackend(gguf_tokenizer(), reply)
    config = EpisodeConfig(max_turns=4, patience=2, reward=RewardConfig())
    episodes = run_episodes([relu_problem("relu"), relu_problem("relu_b")], backend, evaluator,
                            config, group_size=2)
    assert [e.group for e in episodes] == [0, 0, 1, 1]
    assert backend.calls[0] == (G, 4) and all(role is O for role, _ in backend.calls[1:])
    fixed, hacked = episodes[0], episodes[2]
    statuses = [t.eval_result.status for t in fixed.turns]
    assert statuses[0] is EvalStatus.COMPILE_ERROR
    assert statuses[1] is (EvalStatus.OK if GPU else EvalStatus.NO_GPU)
    assert fixed.best_turn == 1 and fixed.best_source.strip() == RELU_KERNEL.strip()
    assert fixed.compile_only is (not GPU)
    assert fixed.turns[2].cached and fixed.turns[2].eval_result is fixed.turns[1].eval_result
    # the resubmission is named as one: to the next turn, in the history and in the log
    assert [t.repeat_of for t in fixed.turns[:3]] == [None, None, 1]
    assert fixed.turns[2].feedback.startswith("Unchanged: this is the kernel of turn 2 again")
    assert "turn 3 (optimizer): turn 2's kernel again:" in fixed.turns[3].messages[-1]["content"]
    assert fixed.turns[2].reward == fixed.turns[1].reward  # repeat_penalty is off by default
    assert "line" in fixed.turns[0].feedback and "0.0f)" in fixed.turns[0].feedback
    assert all(t.reward is not None and t.reward_breakdown for t in fixed.turns)
    assert fixed.turns[1].reward > fixed.turns[0].reward
    assert "compile error" in fixed.turns[1].messages[-1]["content"]  # history for the optimizer
    if not GPU:
        assert fixed.status is EpisodeStatus.NO_IMPROVEMENT and len(fixed.turns) == 4
    assert all(t.eval_result.status is EvalStatus.REJECTED for t in hacked.turns)
    assert "torch_compute" in hacked.turns[0].feedback
    assert hacked.turns[0].reward < 0


def test_a_repeat_penalty_lowers_only_the_resubmitted_turns(evaluator):
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: fenced(RELU_KERNEL))
    config = EpisodeConfig(max_turns=3, patience=0, reward=RewardConfig(repeat_penalty=0.25))
    episode = run_episodes([relu_problem()], backend, evaluator, config)[0]
    first, *repeats = episode.turns
    assert first.repeat_of is None and "repeat" not in first.reward_breakdown
    assert [t.repeat_of for t in repeats] == [0, 0]
    for turn in repeats:
        assert turn.reward_breakdown["repeat"] == -0.25
        assert turn.reward == pytest.approx(first.reward - 0.25)


def test_format_failures_end_the_episode(evaluator):
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "I cannot write CUDA.")
    episode = run_episodes([relu_problem()], backend, evaluator,
                           EpisodeConfig(max_turns=5, reward=RewardConfig()))[0]
    assert episode.status is EpisodeStatus.FORMAT_FAILURES and len(episode.turns) == 2
    assert all(t.eval_result is None and t.reward < 0 for t in episode.turns)
    assert "format failure (no_code_block)" in episode.turns[1].messages[-1]["content"]


def test_each_role_decodes_up_to_its_own_token_cap(evaluator):
    with pytest.raises(ValueError, match=">= 1"):
        EpisodeConfig(max_new_tokens_by_role={"optimizer": 0})
    with pytest.raises(ValueError):
        EpisodeConfig(max_new_tokens_by_role={"critic": 10})
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "no code here")
    config = EpisodeConfig(max_turns=3, max_format_failures=3, patience=0,
                           sampling=SamplingParams(max_new_tokens=300),
                           max_new_tokens_by_role={"generator": 100})
    run_episodes([relu_problem()], backend, evaluator, config)
    assert [(role, s.max_new_tokens) for (role, _), s in zip(backend.calls, backend.samplings)] \
        == [(G, 100), (O, 300), (O, 300)]
    assert config.sampling.max_new_tokens == 300  # the shared parameters are not mutated


def test_each_role_decodes_at_its_own_temperature_when_given_one(evaluator):
    for bad in ({"optimizer": -0.1}, {"tester": 0.0}, {"critic": 0.0}):
        with pytest.raises(ValueError):
            EpisodeConfig(temperature_by_role=bad)
    backend = ReplayBackend(gguf_tokenizer(), lambda role, call, i: "no code here")
    config = EpisodeConfig(max_turns=3, max_format_failures=3, patience=0,
                           sampling=SamplingParams(temperature=0.8, max_new_tokens=300),
                           max_new_tokens_by_role={"generator": 100},
                           temperature_by_role={"generator": 0.0})
    run_episodes([relu_problem()], backend, evaluator, config)
    assert [(role, s.temperature, s.max_new_tokens)
            for (role, _), s in zip(backend.calls, backend.samplings)] \
        == [(G, 0.0, 100), (O, 0.8, 300), (O, 0.8, 300)]
    assert config.sampling.temperature == 0.8  # the shared parameters are not mutated


def test_tiny_model_episode_end_to_end(evaluator):
    """The real generation path: tiny policy -> HF backend -> parse -> evaluator -> feedback."""
    backend = HFGenerationBackend(tiny_policy())
    config = EpisodeConfig(max_turns=2, sampling=SamplingParams(max_new_tokens=16, seed=0),
                           reward=RewardConfig())
    episodes = run_episodes([relu_problem()], backend, evaluator, config, group_size=2)
    for ep in episodes:
        assert ep.done and 1 <= len(ep.turns) <= 2
        for t in ep.turns:
            assert len(t.response_ids) == len(t.logprobs) > 0
            assert t.prompt_ids and t.feedback and t.reward is not None
            assert all(lp <= 0 for lp in t.logprobs)


def test_prompts_of_both_roles_end_with_the_element_type_line_when_asked():
    from multiminddev.agents.prompts import element_type_line

    tok = gguf_tokenizer()
    ep = Episode(problem=relu_problem(), current_source=RELU_KERNEL, current_feedback="r")
    line = element_type_line(ep.problem)
    for role in (G, O):
        plain = build_prompt(ep, role, tok, EpisodeConfig())[0][-1]["content"]
        asked = build_prompt(ep, role, tok, EpisodeConfig(element_type=True))[0][-1]["content"]
        assert line not in plain and asked == f"{plain}\n{line}\n"
