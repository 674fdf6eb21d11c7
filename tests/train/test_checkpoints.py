"""Checkpoints: exact round trip, atomic replacement, clear errors for corrupt/missing files."""

from __future__ import annotations

import random

import pytest
import torch

from multiminddev.agents.roles import AgentRole
from multiminddev.train.checkpoints import (
    CheckpointError,
    TrainerState,
    atomic_dir,
    capture_rng,
    find_latest,
    load_latest,
    save_latest,
)
from tests.policy.helpers import tiny_policy

ROLES = [AgentRole.GENERATOR, AgentRole.OPTIMIZER]


def _optimizers(policy):
    opts = {r: torch.optim.AdamW(policy.trainable_parameters(r), lr=1e-2) for r in ROLES}
    for role, opt in opts.items():  # one real step so the optimizer has state to save
        loss = sum((p.float() ** 2).sum() for p in policy.trainable_parameters(role))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opts


def _save(tmp_path, policy, opts, step=3):
    state = TrainerState(step=step, episodes=12, best_reward=0.5, best_episode=8,
                         curriculum={"tier": 1}, rng=capture_rng())
    return save_latest(tmp_path / "rl_checkpoints", policy=policy, roles=ROLES, optimizers=opts,
                       state=state, config={"group_size": 4})


def test_round_trip_restores_adapters_optimizer_counters_and_rng(tmp_path):
    policy = tiny_policy(seed=0)
    opts = _optimizers(policy)
    _save(tmp_path, policy, opts)
    expected_draw = (random.random(), torch.rand(3))
    fresh = tiny_policy(seed=7)  # different weights until restored
    fresh_opts = {r: torch.optim.AdamW(fresh.trainable_parameters(r), lr=1e-2) for r in ROLES}
    state, config = load_latest(find_latest(tmp_path), policy=fresh, roles=ROLES,
                                optimizers=fresh_opts)
    for role in ROLES:
        for a, b in zip(policy.trainable_parameters(role), fresh.trainable_parameters(role)):
            assert torch.equal(a, b)
        sa, sb = opts[role].state_dict()["state"], fresh_opts[role].state_dict()["state"]
        assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
    assert (state.step, state.episodes, state.best_episode, state.curriculum) == (3, 12, 8, {"tier": 1})
    assert config == {"group_size": 4}
    from multiminddev.train.checkpoints import restore_rng

    restore_rng(state.rng)
    assert random.random() == expected_draw[0]
    assert torch.equal(torch.rand(3), expected_draw[1])


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    target = tmp_path / "latest"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("half-written")
        raise RuntimeError("killed mid-write")
    assert (target / "a.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_missing_checkpoint_says_how_to_proceed(tmp_path):
    with pytest.raises(CheckpointError, match="without --resume"):
        find_latest(tmp_path)


def test_truncated_adapter_file_is_named_in_the_error(tmp_path):
    policy = tiny_policy()
    opts = _optimizers(policy)
    latest = _save(tmp_path, policy, opts)
    bad = latest / "adapters" / "generator.pt"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"generator\.pt is corrupt"):
        load_latest(latest, policy=policy, roles=ROLES, optimizers=opts)


def test_missing_file_listed_in_manifest_is_reported(tmp_path):
    policy = tiny_policy()
    opts = _optimizers(policy)
    latest = _save(tmp_path, policy, opts)
    (latest / "optimizers" / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"optimizer\.pt is missing"):
        load_latest(latest, policy=policy, roles=ROLES, optimizers=opts)


def test_adapter_of_another_shape_is_refused(tmp_path):
    from multiminddev.policy import PolicyConfig, build_policy
    from tests.policy.helpers import gguf_tokenizer, tiny_base_model

    policy = tiny_policy()
    opts = _optimizers(policy)
    latest = _save(tmp_path, policy, opts)
    other = build_policy(tiny_base_model(), gguf_tokenizer(),
                         PolicyConfig(model="default", lora_rank=8, lora_alpha=16))
    other_opts = {r: torch.optim.AdamW(other.trainable_parameters(r)) for r in ROLES}
    with pytest.raises(CheckpointError, match="LoRA"):
        load_latest(latest, policy=other, roles=ROLES, optimizers=other_opts)
