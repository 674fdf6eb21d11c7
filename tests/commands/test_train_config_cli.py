"""``train --recipe / --config / --set``: the sources' precedence, run_config replay, and
one-line errors for unknown names and bad values."""

from __future__ import annotations

import dataclasses
import json

from multiminddev.agents.roles import AgentRole
from multiminddev.cli import build_parser
from multiminddev.train.pipeline import TrainSettings, _write_run_config
from multiminddev.train.presets import Preset
from multiminddev.train.recipes import get_recipe
from tests.commands.helpers import assert_one_line_error, run_cli


def _settings(*argv):
    from multiminddev.commands.train import _settings

    return _settings(build_parser().parse_args([str(a) for a in argv]))


def test_no_source_gives_the_settings_defaults(tmp_path):
    assert _settings("train", "--output-dir", tmp_path) == TrainSettings(output_dir=tmp_path)


def test_a_recipe_applies_its_settings(tmp_path):
    recipe = get_recipe("optimizer-grpo-greedy-generator")
    settings = _settings("train", "--recipe", recipe.name, "--output-dir", tmp_path)
    assert settings == TrainSettings(output_dir=tmp_path, **recipe.settings_for())


def test_recipe_then_config_then_set_then_flags(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('num_steps = 6\nlearning_rate = 1e-4\nseed = 1\n')
    s = _settings("train", "--recipe", "optimizer-grpo-greedy-generator", "--config", config,
                  "--set", "learning_rate=2e-4", "--set", "seed=5", "--seed", "9",
                  "--output-dir", tmp_path)
    assert s.group_size == 8  # the recipe's
    assert s.num_steps == 6  # the config file over the recipe
    assert s.learning_rate == 2e-4  # --set over the config file
    assert s.seed == 9  # the flag over --set


def test_an_episode_count_replaces_the_recipes_step_count(tmp_path):
    s = _settings("train", "--recipe", "optimizer-grpo-greedy-generator", "--num-episodes", "48",
                  "--output-dir", tmp_path)
    assert s.num_episodes == 48 and s.num_steps is None


def test_an_explicit_auto_overrides_a_configured_compiled_decoding(tmp_path):
    s = _settings("train", "--recipe", "two-agent-grpo", "--compiled-decoding", "auto",
                  "--output-dir", tmp_path)
    assert s.compiled_decoding is None


def test_quick_test_flag_overrides_a_recipes_preset(tmp_path):
    s = _settings("train", "--recipe", "quickstart", "--quick-test", "--output-dir", tmp_path)
    assert s.preset is Preset.QUICK_TEST


def test_the_command_fixes_its_phases_over_a_config_file(tmp_path):
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"skip_rl": False, "skip_sft": False,
                                  "roles": ["optimizer"]}))
    sft = _settings("sft", "--config", config, "--output-dir", tmp_path)
    assert sft.skip_rl and sft.skip_eval and sft.roles == (AgentRole.OPTIMIZER,)
    assert _settings("sft", "--config", config, "--role", "both").roles == (
        AgentRole.GENERATOR, AgentRole.OPTIMIZER)
    assert _settings("rl", "--config", config, "--output-dir", tmp_path).skip_sft


def test_sft_learning_rate_and_steps_flags_are_sfts(tmp_path):
    s = _settings("sft", "--learning-rate", "1e-4", "--max-steps", "7", "--output-dir", tmp_path)
    assert (s.sft_learning_rate, s.sft_steps, s.learning_rate) == (1e-4, 7, None)


def test_a_run_config_replays_the_run_in_a_new_folder(tmp_path):
    recorded = _settings("train", "--recipe", "optimizer-grpo-greedy-generator", "--seed", "3",
                         "--set", "num_gpus=2", "--output-dir", tmp_path / "run1")
    recorded.output_dir.mkdir()
    _write_run_config(recorded)
    record = tmp_path / "run1" / "run_config.json"
    replay = _settings("train", "--config", record, "--output-dir", tmp_path / "run2")
    assert replay == dataclasses.replace(recorded, output_dir=tmp_path / "run2")


def test_a_replay_never_writes_into_or_resumes_the_recorded_run(tmp_path):
    recorded = TrainSettings(output_dir=tmp_path / "run1", resume=tmp_path / "run1", seed=4)
    recorded.output_dir.mkdir()
    _write_run_config(recorded)
    replay = _settings("train", "--config", tmp_path / "run1")
    assert replay.output_dir != recorded.output_dir and replay.resume is None
    assert replay.seed == 4


def test_a_user_config_file_may_set_the_output_folder(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\n")
    assert _settings("train", "--config", config).output_dir == tmp_path / "out"


def test_list_recipes_prints_them(capsys):
    code, out, err = run_cli(capsys, "train", "--list-recipes")
    assert code == 0 and err == ""
    assert "optimizer-grpo-greedy-generator:" in out and "two-agent-grpo:" in out


def test_an_unknown_config_key_is_one_line_naming_the_nearest(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("num_step: 3\n")
    code, out, err = run_cli(capsys, "train", "--config", config, "--output-dir", tmp_path / "o")
    assert_one_line_error(code, out, err, contains="unknown setting 'num_step'; did you mean "
                                                   "'num_steps'?")
    assert not (tmp_path / "o").exists()


def test_a_bad_set_value_is_one_line(tmp_path, capsys):
    code, out, err = run_cli(capsys, "train", "--set", "num_steps=ten")
    assert_one_line_error(code, out, err, contains="num_steps: expected an integer, got 'ten'")


def test_an_unknown_recipe_is_one_line(capsys):
    code, out, err = run_cli(capsys, "train", "--recipe", "optimizer-grpo")
    assert_one_line_error(code, out, err, contains="did you mean "
                                                   "'optimizer-grpo-greedy-generator'?")


def test_a_conflict_between_sources_is_one_line(capsys):
    # the recipe's greedy Generator cannot stay greedy once GRPO trains it too
    code, out, err = run_cli(capsys, "train", "--recipe", "optimizer-grpo-greedy-generator",
                             "--rl-roles", "generator", "optimizer")
    assert_one_line_error(code, out, err, contains="only an agent it does not train")


def test_a_yaml_file_without_pyyaml_says_what_to_install(tmp_path, monkeypatch):
    import sys

    import pytest

    from multiminddev.train.config_files import ConfigError, read_config_file

    config = tmp_path / "run.yaml"
    config.write_text("seed: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(ConfigError, match="pip install pyyaml"):
        read_config_file(TrainSettings, config)


def test_the_run_config_of_the_measured_gpu_run_replays_its_recipe(tmp_path):
    """docs/results/learning/recipe_cli/run_config.json, written by the recipe run that
    docs/BENCHMARKS.md reports, gives back that recipe's settings (and its one --set)."""
    from pathlib import Path

    record = Path(__file__).resolve().parents[2] / "docs/results/learning/recipe_cli/run_config.json"
    replay = _settings("train", "--config", record, "--output-dir", tmp_path / "again")
    expected = _settings("train", "--recipe", "optimizer-grpo-greedy-generator",
                         "--set", "eval_after_sft=false", "--output-dir", tmp_path / "again")
    assert replay == expected
