"""Train / held-out splits: deterministic by seed, disjoint, balanced across tiers."""

from __future__ import annotations

import json

import pytest

from multiminddev.tasks.builtin import FAMILIES, builtin_problems
from multiminddev.tasks.splits import (
    Split,
    SplitConfig,
    assign_splits,
    heldout_families,
    heldout_shape_index,
    split_manifest,
)


def test_manifest_is_deterministic_for_a_seed():
    assert split_manifest(7) == split_manifest(7)


def test_different_seeds_hold_out_different_families():
    assert split_manifest(0)["heldout_families"] != split_manifest(1)["heldout_families"]


def test_manifest_is_json_serialisable():
    data = split_manifest(0)
    assert json.loads(json.dumps(data)) == data


def test_every_problem_is_in_exactly_one_split():
    manifest = split_manifest(0)
    all_names = {f.problem_name(s) for f in FAMILIES for s in f.shapes}
    assert set(manifest["problems"]) == all_names
    assert set(manifest["problems"].values()) == {"train", "heldout"}
    counts = manifest["counts"]
    assert counts["train"] + counts["heldout"] == len(all_names)


def test_train_and_heldout_problem_lists_are_disjoint():
    train = {p.name for p in builtin_problems(split="train", shapes_per_family=None)}
    held = {p.name for p in builtin_problems(split="heldout", shapes_per_family=None)}
    assert train and held and not train & held
    assert train | held == {p.name for p in builtin_problems(shapes_per_family=None)}


def test_every_tier_has_heldout_and_training_families():
    held = heldout_families(FAMILIES, SplitConfig(seed=0))
    for tier in range(4):
        names = {f.name for f in FAMILIES if f.tier == tier}
        assert names & held, f"tier {tier} holds out nothing"
        assert names - held, f"tier {tier} trains on nothing"


def test_about_a_fifth_of_each_tier_is_held_out():
    held = heldout_families(FAMILIES, SplitConfig(seed=0))
    for tier in range(4):
        names = [f.name for f in FAMILIES if f.tier == tier]
        assert len(set(names) & held) == max(1, round(0.2 * len(names)))


def test_heldout_families_hold_out_all_shapes_and_train_families_one():
    config = SplitConfig(seed=0)
    held = heldout_families(FAMILIES, config)
    assignment = assign_splits(FAMILIES, config)
    for family in FAMILIES:
        splits = assignment[family.name]
        if family.name in held:
            assert set(splits) == {Split.HELDOUT}
        else:
            assert splits.count(Split.HELDOUT) == 1
            assert splits[heldout_shape_index(family, config)] is Split.HELDOUT


def test_split_does_not_depend_on_family_order():
    config = SplitConfig(seed=5)
    assert heldout_families(FAMILIES, config) == heldout_families(FAMILIES[::-1], config)


def test_problems_carry_their_split_label():
    manifest = split_manifest(2)
    for problem in builtin_problems(seed=2, shapes_per_family=None):
        assert problem.split == manifest["problems"][problem.name]


def test_small_problems_follow_their_family_split():
    held = set(split_manifest(0)["heldout_families"])
    for problem in builtin_problems(small=True):
        assert (problem.split == "heldout") == (problem.family in held)


def test_train_split_keeps_two_shapes_per_training_family():
    problems = builtin_problems(split="train", shapes_per_family=2)
    held = set(split_manifest(0)["heldout_families"])
    per_family: dict[str, int] = {}
    for p in problems:
        per_family[p.family] = per_family.get(p.family, 0) + 1
    assert set(per_family) == {f.name for f in FAMILIES} - held
    assert all(n <= 2 for n in per_family.values())


def test_zero_fraction_holds_out_no_family():
    assert heldout_families(FAMILIES, SplitConfig(heldout_fraction=0.0)) == frozenset()


def test_config_rejects_a_fraction_of_one():
    with pytest.raises(ValueError, match="heldout_fraction"):
        SplitConfig(heldout_fraction=1.0)
