"""Curriculum: gating, sampling mix, state round trip."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter

import pytest

from multiminddev.env.results import (
    BenchmarkResult,
    CompileResult,
    EvalResult,
    EvalStatus,
    StageStatus,
)
from multiminddev.tasks.curriculum import (
    Curriculum,
    CurriculumConfig,
    FamilySampling,
    Outcome,
    TierGate,
    family_weights,
    gate_failures,
    load_family_counts,
    spread_outcomes,
    tier_stats,
)
from multiminddev.tasks.problem import Problem

SOURCE = """import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return x
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""

PASS = Outcome(compiled=True, correct=True, speedup=1.5)
COMPILED_WRONG = Outcome(compiled=True, correct=False)
BROKEN = Outcome(compiled=False, correct=False)


def problems_by_tier(per_tier: int = 5, tiers=(0, 1, 2, 3)) -> dict[int, list[Problem]]:
    return {
        t: [Problem(name=f"t{t}_p{i}", source=SOURCE, tier=t) for i in range(per_tier)]
        for t in tiers
    }


def curriculum(**config) -> Curriculum:
    config.setdefault("gate", TierGate(min_episodes=10))
    config.setdefault("window", 20)
    return Curriculum(problems_by_tier(), CurriculumConfig(**config))


def feed(cur: Curriculum, tier: int, outcomes: list[Outcome]) -> None:
    pool = cur.problems[tier]
    for i, outcome in enumerate(outcomes):
        cur.record(pool[i % len(pool)], outcome)


# --------------------------------------------------------------------------- pure stats


def test_tier_stats_rates_and_geometric_mean_speedup():
    outcomes = [
        Outcome(compiled=True, correct=True, speedup=2.0),
        Outcome(compiled=True, correct=True, speedup=8.0),
        COMPILED_WRONG,
        BROKEN,
    ]
    stats = tier_stats(outcomes, episodes=4)
    assert (stats.compile_rate, stats.pass_rate) == (0.75, 0.5)
    assert stats.mean_speedup == pytest.approx(4.0)  # sqrt(2 * 8)


def test_gate_bounds_are_strict_as_in_the_seeds():
    gate = TierGate(min_compile_rate=0.9, min_pass_rate=0.75, min_episodes=4)
    at_bound = tier_stats([PASS, PASS, PASS, COMPILED_WRONG], episodes=4)  # pass rate 0.75
    assert any("pass rate" in f for f in gate_failures(at_bound, gate))
    above = tier_stats([PASS] * 4, episodes=4)
    assert gate_failures(above, gate) == []


def test_outcome_of_eval_result_and_mapping():
    ok = EvalResult(
        status=EvalStatus.OK,
        problem="p",
        compile=CompileResult(status=StageStatus.OK),
        benchmark=BenchmarkResult(status=StageStatus.OK, speedup_vs_eager=3.0),
    )
    assert Outcome.of(ok) == Outcome(compiled=True, correct=True, speedup=3.0)
    wrong = EvalResult(
        status=EvalStatus.INCORRECT, problem="p", compile=CompileResult(status=StageStatus.OK)
    )
    assert Outcome.of(wrong) == Outcome(compiled=True, correct=False, speedup=0.0)
    assert Outcome.of({"compiled": False, "correct": False}) == BROKEN


# --------------------------------------------------------------------------- gating


def test_does_not_advance_before_min_episodes():
    cur = curriculum()
    feed(cur, 0, [PASS] * 9)
    assert not cur.maybe_advance() and cur.current_tier == 0
    feed(cur, 0, [PASS])
    assert cur.maybe_advance() and cur.current_tier == 1


def test_does_not_advance_with_low_compile_rate():
    cur = curriculum()
    feed(cur, 0, [PASS] * 17 + [BROKEN] * 3)  # compile 0.85, pass 0.85
    assert not cur.maybe_advance()


def test_does_not_advance_with_low_pass_rate():
    cur = curriculum()
    feed(cur, 0, [PASS] * 14 + [COMPILED_WRONG] * 6)  # compile 1.0, pass 0.70
    assert not cur.maybe_advance()


def test_optional_speedup_gate():
    cur = curriculum(gate=TierGate(min_episodes=10, min_mean_speedup=2.0))
    feed(cur, 0, [PASS] * 20)  # speedup 1.5
    assert not cur.maybe_advance()
    feed(cur, 0, [Outcome(compiled=True, correct=True, speedup=3.0)] * 20)
    assert cur.maybe_advance()


def test_rolling_window_forgets_old_failures():
    cur = curriculum()
    feed(cur, 0, [BROKEN] * 30 + [PASS] * 20)  # window 20 holds only the passes
    assert cur.stats().compile_rate == 1.0
    assert cur.maybe_advance()


def test_review_outcomes_do_not_count_for_the_current_tier():
    cur = curriculum(start_tier=1)
    feed(cur, 0, [PASS] * 20)
    assert cur.stats(1).episodes == 0 and not cur.maybe_advance()


def test_per_tier_gate_override_and_last_tier_stays():
    cur = curriculum(tier_gates={0: TierGate(min_episodes=2)})
    feed(cur, 0, [PASS] * 2)
    assert cur.maybe_advance()
    for tier in (1, 2, 3):
        feed(cur, tier, [PASS] * 10)
        cur.maybe_advance()
    assert cur.current_tier == 3 and cur.is_last_tier
    assert not cur.maybe_advance()
    assert [h["to"] for h in cur.history] == [1, 2, 3]


def test_advancing_logs_a_message(caplog):
    cur = curriculum()
    feed(cur, 0, [PASS] * 10)
    with caplog.at_level(logging.INFO, logger="multiminddev.tasks.curriculum"):
        cur.maybe_advance()
    assert "tier 0 mastered" in caplog.text and "advancing to tier 1" in caplog.text


def test_update_records_a_batch_and_advances():
    cur = curriculum()
    assert cur.update([(p, PASS) for p in cur.problems[0] * 2])
    assert cur.current_tier == 1


# --------------------------------------------------------------------------- sampling


def test_first_tier_samples_only_itself():
    cur = curriculum()
    assert {p.tier for p in cur.sample(200, random.Random(0))} == {0}


def test_sampling_mixes_review_at_the_configured_fraction():
    cur = curriculum(start_tier=3, review_fraction=0.2)
    batch = cur.sample(5000, random.Random(1234))
    tiers = Counter(p.tier for p in batch)
    assert tiers[3] / 5000 == pytest.approx(0.8, abs=0.02)
    for earlier in (0, 1, 2):  # review spread evenly over the earlier tiers
        assert tiers[earlier] / 5000 == pytest.approx(0.2 / 3, abs=0.015)


def test_sampling_is_deterministic_for_a_seed():
    cur = curriculum(start_tier=2)
    assert [p.name for p in cur.sample(50, 7)] == [p.name for p in cur.sample(50, 7)]
    assert [p.name for p in cur.sample(50, 7)] != [p.name for p in cur.sample(50, 8)]


def test_a_batch_covers_the_current_tier_before_repeating():
    cur = curriculum(review_fraction=0.0)
    batch = cur.sample(5, random.Random(3))
    assert sorted(p.name for p in batch) == sorted(p.name for p in cur.problems[0])


# --------------------------------------------------------------------------- family sampling


def families_curriculum(**config) -> Curriculum:
    """Tier 0: family "easy" with 6 problems, "half" with 3, "hard" with 3."""
    sizes = {"easy": 6, "half": 3, "hard": 3}
    problems = [Problem(name=f"{family}_{i}", source=SOURCE, tier=0, family=family)
                for family, n in sizes.items() for i in range(n)]
    return Curriculum.from_problems(problems, CurriculumConfig(**config))


def test_family_weights_match_the_posterior_variance_with_a_floor():
    weights = family_weights({"a": [True] * 6 + [False] * 2, "b": [True] * 10},
                             ["a", "b", "unseen"], prior=0.5, floor=0.02)
    p_a, p_b = (6 + 0.5) / (8 + 1), (10 + 0.5) / (10 + 1)
    assert weights["a"] == pytest.approx(p_a * (1 - p_a))
    assert weights["b"] == pytest.approx(max(p_b * (1 - p_b), 0.02))
    assert weights["unseen"] == pytest.approx(0.25)  # p = 0.5 before any outcome
    assert family_weights({"b": [True] * 100}, ["b"], prior=0.5, floor=0.02) == {"b": 0.02}


def test_signal_sampling_draws_families_by_their_weights():
    cur = families_curriculum(family_sampling="signal", family_window=40)
    for family, correct in (("easy", [True] * 40), ("half", [True, False] * 20),
                            ("hard", [False] * 38 + [True] * 2)):
        for i, ok in enumerate(correct):
            cur.record(f"{family}_{i % 3}", PASS if ok else COMPILED_WRONG)
    weights = cur.family_weights(0)
    drawn = Counter(p.family for p in cur.sample(6000, random.Random(5)))
    total = sum(weights.values())
    for family, weight in weights.items():
        assert drawn[family] / 6000 == pytest.approx(weight / total, abs=0.02)
    assert drawn["half"] > 4 * drawn["easy"]  # p(1-p): 0.25 against the 0.02 floor


def test_uniform_sampling_ignores_families():
    cur = families_curriculum()
    assert cur.config.family_sampling is FamilySampling.UNIFORM
    drawn = Counter(p.family for p in cur.sample(6000, random.Random(5)))
    assert drawn["easy"] / 6000 == pytest.approx(0.5, abs=0.02)  # 6 of the 12 problems


def test_family_windows_keep_the_latest_outcomes_and_survive_a_checkpoint():
    cur = families_curriculum(family_sampling="signal", family_window=4)
    for ok in (False, False, True, True, True, True):
        cur.record("half_0", PASS if ok else COMPILED_WRONG)
    # the 4 kept are correct: p = 4.5 / 5 (all 6 would give 4.5 / 7)
    assert cur.family_weights(0)["half"] == pytest.approx(0.9 * 0.1)
    restored = families_curriculum(family_sampling="signal", family_window=4)
    restored.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert restored.family_weights(0) == cur.family_weights(0)
    assert [p.name for p in restored.sample(30, 9)] == [p.name for p in cur.sample(30, 9)]
    older = cur.state_dict()
    del older["families"]  # a checkpoint from before family sampling
    restored.load_state_dict(older)
    assert restored.family_weights(0)["half"] == pytest.approx(0.25)


def test_spread_outcomes_keep_the_pass_rate_evenly_spread():
    for passes, episodes, length in [(3, 4, 32), (30, 40, 32), (0, 12, 32), (12, 12, 8),
                                     (5, 9, 32), (1, 100, 32), (0, 0, 32)]:
        outcomes = spread_outcomes(passes, episodes, length)
        m = min(episodes, length)
        assert len(outcomes) == m
        assert sum(outcomes) == (round(m * passes / episodes) if episodes else 0)
        # evenly spread: every run of consecutive outcomes holds its share, within one
        for start in range(m):
            for end in range(start + 1, m + 1):
                assert abs(sum(outcomes[start:end]) - (end - start) * sum(outcomes) / m) <= 1
    with pytest.raises(ValueError, match="0 <= passes <= episodes"):
        spread_outcomes(5, 4, 32)


def test_warm_windows_weigh_families_from_the_first_draw_and_give_way_to_new_outcomes():
    cur = families_curriculum(family_sampling="signal", family_window=8)
    cur.warm_family_windows({"easy": (40, 40), "half": (9, 20)})
    weights = cur.family_weights(0)
    reference = family_weights({"easy": [True] * 8, "half": spread_outcomes(9, 20, 8)},
                               ["easy", "half", "hard"], prior=0.5, floor=0.02)
    assert weights == pytest.approx(reference)
    assert weights["easy"] == pytest.approx(max((8.5 / 9) * (0.5 / 9), 0.02))
    assert weights["hard"] == pytest.approx(0.25)  # no counts: empty, as without a warm start
    for _ in range(8):  # eight new failures push every warm outcome of "easy" out
        cur.record("easy_0", COMPILED_WRONG)
    assert cur.family_weights(0)["easy"] == pytest.approx(max((0.5 / 9) * (8.5 / 9), 0.02))
    resumed = families_curriculum(family_sampling="signal", family_window=8)
    resumed.warm_family_windows({"hard": (0, 30)})
    resumed.load_state_dict(json.loads(json.dumps(cur.state_dict())))  # the checkpoint wins
    assert resumed.family_weights(0) == pytest.approx(cur.family_weights(0))


def test_family_counts_load_from_json_and_a_bad_file_says_what_it_needs(tmp_path):
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"source": "run", "families": {"add": [3, 4], "relu": [0, 0]}}))
    assert load_family_counts(path) == {"add": (3, 4), "relu": (0, 0)}
    for text in ("[1, 2]", '{"families": {"add": [1]}}', '{"families": {"add": [5, 4]}}'):
        path.write_text(text)
        with pytest.raises(ValueError, match="(?i)correct"):
            load_family_counts(path)
    with pytest.raises(ValueError, match="FileNotFoundError"):
        load_family_counts(tmp_path / "missing.json")


def test_signal_summary_has_each_familys_weight():
    summary = families_curriculum(family_sampling="signal").summary()
    assert summary["curriculum/family_weight/hard"] == pytest.approx(0.25)
    assert "curriculum/family_weight/hard" not in families_curriculum().summary()


# --------------------------------------------------------------------------- state


def test_state_round_trips_through_json():
    cur = curriculum()
    feed(cur, 0, [PASS] * 10)
    cur.maybe_advance()
    feed(cur, 1, [PASS, BROKEN, COMPILED_WRONG])
    state = json.loads(json.dumps(cur.state_dict()))
    restored = curriculum()
    restored.load_state_dict(state)
    assert restored.state_dict() == cur.state_dict()
    assert restored.current_tier == 1 and restored.stats(1) == cur.stats(1)
    assert [p.name for p in restored.sample(20, 5)] == [p.name for p in cur.sample(20, 5)]


def test_state_from_other_tiers_is_refused():
    cur = curriculum()
    other = Curriculum(problems_by_tier(tiers=(0, 1)), CurriculumConfig())
    with pytest.raises(ValueError, match="differ from this run"):
        cur.load_state_dict(other.state_dict())


def test_summary_is_flat_numbers_for_reached_tiers():
    cur = curriculum()
    feed(cur, 0, [PASS] * 10)
    cur.maybe_advance()
    summary = cur.summary()
    assert summary["curriculum/tier"] == 1.0
    assert summary["curriculum/tier0/pass_rate"] == 1.0
    assert "curriculum/tier1/episodes" in summary and "curriculum/tier2/episodes" not in summary
    assert all(isinstance(v, float) for v in summary.values())


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"review_fraction": 1.0}, "review_fraction"),
        ({"window": 0}, "window"),
        ({"tiers": []}, "tiers is empty"),
        ({"tiers": [0, 0]}, "duplicates"),
        ({"family_sampling": "loudest"}, "loudest"),
        ({"family_window": 0}, "family_window"),
        ({"family_prior": 0.0}, "family_prior"),
        ({"family_floor": 0.3}, "family_floor"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CurriculumConfig(**kwargs)


def test_config_from_json_like_dicts():
    config = CurriculumConfig(gate={"min_episodes": 5}, tier_gates={"1": {"min_pass_rate": 0.5}})
    assert config.gate == TierGate(min_episodes=5)
    assert config.gate_for(1) == TierGate(min_pass_rate=0.5) and config.gate_for(2) == config.gate


def test_gate_validation():
    with pytest.raises(ValueError, match="min_pass_rate"):
        TierGate(min_pass_rate=1.0)


def test_tiers_without_problems_are_refused():
    with pytest.raises(ValueError, match=r"tiers \[5\] have no problems"):
        Curriculum(problems_by_tier(), CurriculumConfig(tiers=[0, 5]))


def test_from_problems_groups_by_tier():
    problems = [p for ps in problems_by_tier(per_tier=2).values() for p in ps]
    cur = Curriculum.from_problems(problems)
    assert cur.tiers == [0, 1, 2, 3] and len(cur.problems[2]) == 2


def test_problems_in_draw_order_start_at_the_current_tier_then_later_then_earlier():
    cur = curriculum(start_tier=2)
    names = [p.name for p in cur.problems_in_draw_order()]
    tiers = [int(n[1]) for n in names]
    assert tiers == [2] * 5 + [3] * 5 + [0] * 5 + [1] * 5
    assert sorted(names) == sorted(p.name for ps in problems_by_tier().values() for p in ps)
