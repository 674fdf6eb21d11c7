"""Recipes: typed, checked against TrainSettings, and every setting reachable from a config file
and from --set."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.cli import build_parser
from multiminddev.train.config_files import ConfigError, convert, field_types, to_plain
from multiminddev.train.pipeline import TrainSettings
from multiminddev.train.recipes import RECIPES, Recipe, get_recipe, recipe_table

# TrainSettings fields that a config file and --set may leave out, each with its reason. A new
# field goes here only if it is not a setting a user chooses.
NOT_CONFIGURABLE: dict[str, str] = {}


def _settings(argv):
    from multiminddev.commands.train import _settings

    return _settings(build_parser().parse_args(argv))


def test_every_recipe_builds_its_settings():
    for recipe in RECIPES.values():
        settings = TrainSettings(**recipe.settings_for())
        for key, value in recipe.settings.items():
            assert getattr(settings, key) == value, (recipe.name, key)


def test_a_recipe_with_a_field_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="unknown setting 'num_step'; did you mean 'num_steps'"):
        Recipe(name="typo", description="a typo", settings={"num_step": 3})


def test_a_recipe_with_a_conflicting_combination_is_refused():
    with pytest.raises(ValueError, match="only an agent it does not train can decode greedily"):
        Recipe(name="bad", description="greedy trained agent",
               settings={"rl_greedy_roles": ("generator",)})


def test_a_recipe_is_frozen():
    recipe = get_recipe("quickstart")
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        recipe.settings["seed"] = 3  # type: ignore[index]


def test_the_optimizer_recipe_trains_the_optimizer_against_a_greedy_generator():
    settings = TrainSettings(**get_recipe("optimizer-grpo-greedy-generator").settings_for())
    assert settings.roles == (AgentRole.GENERATOR, AgentRole.OPTIMIZER)  # SFT of both
    assert settings.rl_roles == (AgentRole.OPTIMIZER,)
    assert settings.rl_greedy_roles == (AgentRole.GENERATOR,)
    assert (settings.kl_reference, settings.learning_rate, settings.group_size,
            settings.batch_size, settings.num_steps, settings.max_turns) == (
        "start", 5e-5, 8, 3, 12, 2)


def test_the_two_agent_recipe_trains_both_agents_sampling():
    settings = TrainSettings(**get_recipe("two-agent-grpo").settings_for())
    assert settings.rl_roles is None and settings.rl_greedy_roles == ()


def test_an_unknown_recipe_names_the_nearest_one():
    with pytest.raises(ConfigError, match="unknown recipe 'quickstrat'; did you mean 'quickstart'"):
        get_recipe("quickstrat")


def test_the_recipe_table_lists_every_recipe_and_what_it_is_missing():
    table = recipe_table()
    assert all(name in table for name in RECIPES)
    assert "differs from the measured run in" in table and "time budget" in table


# --------------------------------------------------------------------------- reachability

def _sample(name: str, hint: typing.Any, default: typing.Any, tmp_path: Path):
    """A valid value of the field other than its default, and the settings it needs beside it."""
    special = {
        "kl_reference": ("start", {}),
        "family_sampling": ("signal", {}),
        "family_warm_start": (tmp_path / "counts.json", {"family_sampling": "signal"}),
        "rl_greedy_roles": ((AgentRole.GENERATOR,), {"rl_roles": "optimizer"}),
        "resume": (tmp_path / "run", {}),
        "output_dir": (tmp_path / "out", {}),
        "sft_data": (f"sakana:{tmp_path}", {}),  # validated: the archive's path must exist
        "sft_anchor_problems": ("builtin:tier0:train", {"sft_anchor": 0.1}),
        "select_also": ("builtin:tier0:train", {"select_problems": "builtin:tier1:train"}),
        "eval_dtype": ("float32", {}),
        "rl_temperature": (0.8, {}),
        "review_fraction": (0.25, {}),
        "rollout_server": ("http://127.0.0.1:8000", {}),  # validated: an http(s) URL
    }
    if name in special:
        return special[name]
    return _value_of(name, hint, default, tmp_path), {}


def _value_of(name: str, hint: typing.Any, default: typing.Any, tmp_path: Path):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _value_of(name, next(a for a in args if a is not type(None)), default, tmp_path)
    if origin is tuple:
        return (_value_of(name, args[0], None, tmp_path),)
    if origin is dict:
        return {"key": _value_of(name, args[1], None, tmp_path)}
    if origin is typing.Literal:
        return next(a for a in args if a != default)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next(m for m in hint if m != default)
    samples = {bool: not default, int: 3, float: 0.25, str: "some-text", Path: tmp_path / "p"}
    assert hint in samples, f"{name}: no sample value for type {hint}; add one to this test"
    return samples[hint]


def _as_text(value) -> str:
    plain = to_plain(value)
    if isinstance(plain, dict):
        return ",".join(f"{k}:{v}" for k, v in plain.items())
    return ",".join(map(str, plain)) if isinstance(plain, list) else str(plain)


def test_every_settings_type_can_be_read_from_a_config_file():
    for name, hint in field_types(TrainSettings).items():
        if name in NOT_CONFIGURABLE:
            continue
        try:
            convert(name, hint, "x")
        except ConfigError as exc:
            assert "cannot be read from a config file" not in str(exc), str(exc)


def _configurable_fields(tmp_path):
    (tmp_path / "counts.json").write_text(json.dumps({"families": {"add": [1, 2]}}))
    defaults = TrainSettings(output_dir=tmp_path)
    for name, hint in field_types(TrainSettings).items():
        if name in NOT_CONFIGURABLE:
            continue
        value, companions = _sample(name, hint, getattr(defaults, name), tmp_path)
        yield name, value, companions


def _reached(argv, name, capsys):
    """The setting ``name`` of the settings ``argv`` gives; a refused sample fails the test
    with the command's own error line."""
    try:
        return getattr(_settings(argv), name)
    except SystemExit:
        pytest.fail(f"{name}: {capsys.readouterr().err.strip()} (if the sample value is not a "
                    "valid one, give a valid one in _sample)")


def test_every_setting_is_reachable_from_set(tmp_path, capsys):
    for name, value, companions in _configurable_fields(tmp_path):
        argv = ["train"]
        for key, item in {**companions, name: value}.items():
            argv += ["--set", f"{key}={_as_text(item)}"]
        assert _reached(argv, name, capsys) == value, name


def test_every_setting_is_reachable_from_a_config_file(tmp_path, capsys):
    import yaml

    for name, value, companions in _configurable_fields(tmp_path):
        data = {key: to_plain(item) for key, item in {**companions, name: value}.items()}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        assert _reached(["train", "--config", str(path)], name, capsys) == value, name


def test_the_exclusion_list_names_real_fields():
    assert set(NOT_CONFIGURABLE) <= set(field_types(TrainSettings))


# --------------------------------------------------------------------------- the measured run

def _run_m_context(tmp_path):
    from rich.console import Console

    from multiminddev.train.pipeline import Context

    settings = TrainSettings(output_dir=tmp_path,
                             **get_recipe("optimizer-grpo-greedy-generator").settings_for())
    return Context(settings, Console(quiet=True))


def test_the_optimizer_recipe_gives_grpo_the_measured_run_settings(tmp_path):
    from multiminddev.train.pipeline import grpo_config

    cfg = grpo_config(_run_m_context(tmp_path))
    assert (cfg.num_steps, cfg.problems_per_step, cfg.group_size, cfg.max_turns,
            cfg.max_new_tokens, cfg.learning_rate, cfg.kl_reference.value, cfg.kl_coef,
            cfg.normalize_std, cfg.temperature, cfg.mini_batch_size, cfg.grad_accum,
            cfg.eval_every, cfg.sft_coef, cfg.train_roles) == (
        12, 3, 8, 2, 800, 5e-5, "start", 0.1, False, 0.8, 24, 3, 0, 0.0,
        (AgentRole.OPTIMIZER,))


def test_the_optimizer_recipe_gives_episodes_and_curriculum_the_measured_run_settings(tmp_path):
    from multiminddev.train.pipeline import (
        curriculum_config,
        episode_config,
        grpo_config,
        heldout_episode_config,
    )

    ctx = _run_m_context(tmp_path)
    rollouts = episode_config(ctx, grpo_config(ctx))
    assert rollouts.element_type and rollouts.max_new_tokens_by_role == {"generator": 512}
    assert rollouts.temperature_by_role == {"generator": 0.0}
    assert rollouts.sampling.temperature == 0.8
    heldout = heldout_episode_config(ctx, grpo_config(ctx))
    assert heldout.sampling.temperature == 0.0 and heldout.temperature_by_role == {}
    curriculum = curriculum_config(ctx)
    assert (curriculum.start_tier, curriculum.review_fraction) == (1, 0.0)


def test_the_optimizer_recipe_gives_sft_and_evaluation_the_measured_run_settings(tmp_path):
    from multiminddev.train.pipeline import eval_config, sft_example_options

    ctx = _run_m_context(tmp_path)
    options = sft_example_options(ctx, AgentRole.OPTIMIZER)
    assert options["strip_comments"] and options["operation_line"]
    assert options["prompt"].keywords == {"element_type": True}
    assert sft_example_options(ctx, AgentRole.GENERATOR)["operation_line"]
    s = ctx.settings
    assert (s.sft_batch_size, s.sft_grad_accum, s.sft_max_seq_length, s.sft_steps) == (
        4, 2, 2176, 300)
    ev = eval_config(ctx)
    assert (ev.num_workers, ev.num_trials, ev.compile_baseline) == (2, 3, False)
    assert (s.eval_dtype, s.eval_compiled_decoding, s.eval_after_sft) == ("float32", False, True)
    assert s.generation_batch_size == 64


def test_the_grpo_defaults_of_the_settings_are_grpo_configs():
    from multiminddev.train.grpo import GRPOConfig

    s, g = TrainSettings(), GRPOConfig()
    assert (s.rl_temperature, s.kl_coef, s.normalize_std, s.grad_accum, s.sft_anchor) == (
        g.temperature, g.kl_coef, g.normalize_std, g.grad_accum, g.sft_coef)
