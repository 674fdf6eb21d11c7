from multiminddev.agents.parsing import ParseFailure
from multiminddev.agents.roles import AgentRole
from multiminddev.env.results import CompileResult, EvalResult, EvalStatus, StageStatus
from multiminddev.episode import (
    Episode,
    EpisodeStatus,
    FailedAttempt,
    Turn,
    episode_from_dict,
    episode_to_dict,
    read_episodes_jsonl,
    write_episodes_jsonl,
)
from multiminddev.policy import FinishReason
from tests.episode.helpers import RELU_KERNEL, relu_problem


def _episode():
    result = EvalResult(status=EvalStatus.NO_GPU, problem="relu",
                        compile=CompileResult(status=StageStatus.OK, arch="sm_90"))
    turns = [
        Turn(index=0, role=AgentRole.GENERATOR, prompt_ids=[1, 2, 3], response_ids=[4, 5],
             logprobs=[-0.5, -1.25], text="no code", parse_failure=ParseFailure.NO_CODE_BLOCK,
             parse_detail="none", feedback="format failure", reward=-0.1,
             reward_breakdown={"format_failure": -0.1}),
        Turn(index=1, role=AgentRole.OPTIMIZER, prompt_ids=[1], response_ids=[6],
             logprobs=[-0.1], text="```python ...", finish_reason=FinishReason.LENGTH,
             candidate_source=RELU_KERNEL, eval_result=result, reward=0.1, improved=True,
             strategies=["read_only_cache"], messages=[{"role": "user", "content": "hi"}]),
    ]
    return Episode(problem=relu_problem(), episode_id="relu-0-0", turns=turns,
                   status=EpisodeStatus.NO_IMPROVEMENT, best_turn=1, best_source=RELU_KERNEL,
                   best_result=result, trajectory=[0.0, 0.0], compile_only=True,
                   compile_cache={"abc": result}, strategies_tried={"read_only_cache": 1},
                   failed_attempts=[FailedAttempt(turn=0, role=AgentRole.GENERATOR,
                                                  outcome="format:no_code_block", summary="x")])


def test_loss_mask_marks_only_the_agents_tokens():
    turn = _episode().turns[0]
    assert turn.input_ids == [1, 2, 3, 4, 5]
    assert turn.loss_mask == [0, 0, 0, 1, 1]
    assert len(turn.logprobs) == sum(turn.loss_mask)


def test_jsonl_round_trip(tmp_path):
    episode = _episode()
    path = write_episodes_jsonl([episode, episode], tmp_path / "e.jsonl")
    back = read_episodes_jsonl(path)
    assert len(back) == 2
    got = back[0]
    assert episode_to_dict(got) == episode_to_dict(episode)
    assert got.turns[0].parse_failure is ParseFailure.NO_CODE_BLOCK
    assert got.turns[1].eval_result.status is EvalStatus.NO_GPU
    assert got.turns[1].finish_reason is FinishReason.LENGTH
    assert got.status is EpisodeStatus.NO_IMPROVEMENT and got.problem == episode.problem
    assert got.compile_cache == {}  # the cache repeats turn results; left out by default


def test_cache_is_kept_on_request():
    data = episode_to_dict(_episode(), include_cache=True)
    assert episode_from_dict(data).compile_cache["abc"].status is EvalStatus.NO_GPU


def test_conversation_interleaves_tester_feedback():
    roles = [m["role"] for m in _episode().conversation()]
    assert roles == ["generator", "tester", "optimizer", "tester"]
