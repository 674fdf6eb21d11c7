"""Early stopping on selection problems: the steps evaluated, the step kept, the sample."""

from __future__ import annotations

import pytest

from multiminddev.tasks.loaders import load_problems
from multiminddev.train.selection import (
    SelectionError,
    chosen_step,
    selection_marks,
    selection_sample,
)


def test_marks_are_every_k_steps_and_the_last():
    assert selection_marks(12, 4) == [4, 8, 12]
    assert selection_marks(10, 4) == [4, 8, 10]
    assert selection_marks(3, 4) == [3]


def test_a_later_step_must_beat_the_chosen_one_by_more_than_the_margin():
    assert chosen_step({0: 0.60, 4: 0.605, 8: 0.62}, min_gain=0.01) == 8
    assert chosen_step({0: 0.60, 4: 0.605}, min_gain=0.01) == 0


def test_a_tie_keeps_the_step_nearer_sft():
    assert chosen_step({0: 0.5, 4: 0.5, 8: 0.5}) == 0


def test_no_evaluation_chooses_no_step():
    assert chosen_step({}) is None


def test_the_sample_leaves_out_trained_problems():
    problems = load_problems("builtin:tier1:train:resized2from12")
    trained = problems[:3]
    sample = selection_sample(problems, 100, trained=trained)
    assert sample and not {p.name for p in trained} & {p.name for p in sample}


def test_the_sample_is_the_same_for_every_call():
    problems = load_problems("builtin:tier0,tier1:train:resized2from12")
    assert ([p.name for p in selection_sample(problems, 5)]
            == [p.name for p in selection_sample(problems, 5)])


def test_a_held_out_problem_in_the_sample_is_refused():
    heldout = load_problems("builtin:tier0:heldout")
    with pytest.raises(SelectionError, match="are held out"):
        selection_sample(heldout, 3, heldout=heldout)


def test_a_sample_of_trained_problems_only_is_refused():
    problems = load_problems("builtin:tier0:train")
    with pytest.raises(SelectionError, match="every problem of it is trained on"):
        selection_sample(problems, 3, trained=problems)


def test_the_agents_grpo_started_from_come_back_when_step_0_is_chosen(tmp_path):
    import torch

    from multiminddev.agents.roles import AgentRole
    from multiminddev.train.selection import load_chosen, save_if_best
    from tests.policy.helpers import tiny_policy

    policy, roles = tiny_policy(0), (AgentRole.OPTIMIZER,)
    start = {n: p.detach().clone() for n, p in policy.peft_model.named_parameters()
             if ".optimizer." in n and "lora_" in n}
    assert save_if_best({0: 0.5}, 0, 4, policy, roles, tmp_path, 0.01)
    with torch.no_grad():  # GRPO's steps move the adapter
        for name, p in policy.peft_model.named_parameters():
            if name in start:
                p.add_(1.0)
    assert not save_if_best({0: 0.5, 4: 0.505}, 4, 4, policy, roles, tmp_path, 0.01)
    load_chosen(policy, 0, 4, tmp_path, roles)
    now = dict(policy.peft_model.named_parameters())
    assert all(torch.equal(now[name], value) for name, value in start.items())
