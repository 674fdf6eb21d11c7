"""Config files, --set values and the run record: conversion by field type, one-line errors,
the round trip settings -> run_config.json -> settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.train.config_files import (
    ConfigError,
    merge_layers,
    parse_set_options,
    read_config_file,
    settings_values,
    write_json_atomically,
)
from multiminddev.train.pipeline import TrainSettings, _write_run_config
from multiminddev.train.presets import Preset


def _counts(tmp_path: Path) -> Path:
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"families": {"add": [4, 8]}}))
    return path


def test_set_values_are_parsed_by_the_fields_type():
    values = parse_set_options(TrainSettings, [
        "num_steps=12", "learning_rate=5e-5", "qlora=true", "rl_roles=optimizer",
        "roles=generator,optimizer", "family_warm_start=runs/c.json", "preset=quickstart",
        "num_gpus=none", "compiled_decoding=off", "model=Qwen/Qwen2.5-Coder-1.5B"])
    assert values == {
        "num_steps": 12, "learning_rate": 5e-5, "qlora": True,
        "rl_roles": (AgentRole.OPTIMIZER,),
        "roles": (AgentRole.GENERATOR, AgentRole.OPTIMIZER),
        "family_warm_start": Path("runs/c.json"), "preset": Preset.QUICKSTART,
        "num_gpus": None, "compiled_decoding": False, "model": "Qwen/Qwen2.5-Coder-1.5B"}
    assert isinstance(values["learning_rate"], float)


def test_a_later_set_option_for_the_same_key_wins():
    assert parse_set_options(TrainSettings, ["seed=1", "seed=2"]) == {"seed": 2}


def test_an_empty_text_is_an_empty_tuple():
    assert parse_set_options(TrainSettings, ["rl_greedy_roles="]) == {"rl_greedy_roles": ()}


@pytest.mark.parametrize("item, message", [
    ("num_steps=ten", "--set: num_steps: expected an integer, got 'ten'"),
    ("learning_rate=fast", "learning_rate: expected a number, got 'fast'"),
    ("qlora=maybe", "qlora: expected true or false, got 'maybe'"),
    ("preset=huge", "preset: expected one of 'quickstart', 'quick-test', 'full', got 'huge'"),
    ("rl_roles=critic,optimizer", "rl_roles: expected one of"),
    ("seed=none", "seed: expected an integer, got 'none'"),
    ("num_steps", "give key=value"),
])
def test_a_set_value_of_the_wrong_type_names_the_setting(item, message):
    with pytest.raises(ConfigError) as exc:
        parse_set_options(TrainSettings, [item])
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_literal_setting_takes_one_of_its_values():
    from typing import Literal

    from multiminddev.train.config_files import convert

    hint = Literal["base", "start"]
    assert convert("kl_reference", hint, "start") == "start"
    with pytest.raises(ConfigError, match="expected one of 'base', 'start', got 'sft'"):
        convert("kl_reference", hint, "sft")


def test_file_values_of_the_wrong_type_are_refused():
    with pytest.raises(ConfigError, match="num_steps: expected an integer, got True"):
        settings_values(TrainSettings, {"num_steps": True}, where="run.json")
    with pytest.raises(ConfigError, match="qlora: expected true or false, got 1"):
        settings_values(TrainSettings, {"qlora": 1}, where="run.json")
    with pytest.raises(ConfigError, match="rl_roles: expected a list of"):
        settings_values(TrainSettings, {"rl_roles": {"a": 1}}, where="run.json")


def test_an_unknown_key_names_the_nearest_valid_one():
    with pytest.raises(ConfigError) as exc:
        settings_values(TrainSettings, {"learning_rat": 1e-5}, where="run.yaml")
    assert str(exc.value) == ("run.yaml: unknown setting 'learning_rat'; "
                              "did you mean 'learning_rate'?")
    with pytest.raises(ConfigError, match="the settings are: .*num_steps"):
        parse_set_options(TrainSettings, ["zzzz=1"])


@pytest.mark.parametrize("suffix, text", [
    (".yaml", ("num_steps: 12\nlearning_rate: 5e-5\nrl_roles: [optimizer]\n"
              "rl_greedy_roles: [generator]\nnum_gpus: null\nkl_reference: start\n")),
    (".toml", ('num_steps = 12\nlearning_rate = 5e-5\nrl_roles = ["optimizer"]\n'
              'rl_greedy_roles = ["generator"]\nnum_gpus = "none"\nkl_reference = "start"\n')),
    (".json", ('{"num_steps": 12, "learning_rate": 5e-5, "rl_roles": ["optimizer"], '
              '"rl_greedy_roles": ["generator"], "num_gpus": null, "kl_reference": "start"}')),
])
def test_yaml_toml_and_json_files_read_alike(tmp_path, suffix, text):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    config = read_config_file(TrainSettings, path)
    assert config.values == {"num_steps": 12, "learning_rate": 5e-5,
                             "rl_roles": (AgentRole.OPTIMIZER,),
                             "rl_greedy_roles": (AgentRole.GENERATOR,), "num_gpus": None,
                             "kl_reference": "start"}
    assert not config.is_run_record


@pytest.mark.parametrize("name, text, message", [
    ("run.yaml", "num_steps: [1,\n", "not valid YAML"),
    ("run.toml", "num_steps = \n", "not valid TOML"),
    ("run.json", "{", "not valid JSON"),
    ("run.yaml", "- 1\n- 2\n", "expected a mapping"),
    ("run.ini", "x=1", "give a .yaml, .toml or .json file"),
])
def test_an_unreadable_config_file_is_one_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        read_config_file(TrainSettings, path)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_run_folder_stands_for_its_run_config(tmp_path):
    with pytest.raises(ConfigError, match="a folder without run_config.json"):
        read_config_file(TrainSettings, tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        read_config_file(TrainSettings, tmp_path / "missing.yaml")
    _write_run_config(TrainSettings(output_dir=tmp_path, seed=3))
    assert read_config_file(TrainSettings, tmp_path).values["seed"] == 3


def _round_trip_cases(tmp_path: Path) -> list[TrainSettings]:
    return [
        TrainSettings(output_dir=tmp_path / "a"),
        TrainSettings(output_dir=tmp_path / "b", preset="quickstart", rl_roles=("optimizer",),
                      rl_greedy_roles=("generator",), kl_reference="start", learning_rate=5e-5,
                      num_steps=12, group_size=8, batch_size=3, compiled_decoding=True,
                      sft_problems="builtin:tier0:train:allshapes+builtin:breadth"),
        TrainSettings(output_dir=tmp_path / "c", roles=("optimizer",), num_episodes=64,
                      family_sampling="signal", family_warm_start=_counts(tmp_path),
                      resume=tmp_path / "c", roles_sft_done=("optimizer",), qlora=True,
                      compiled_decoding=False, num_gpus=2, generator_checkpoint="g/ckpt",
                      skip_eval=True, wandb=True, seed=7, lora_rank=8),
    ]


def test_the_run_record_reads_back_to_the_same_settings(tmp_path):
    for settings in _round_trip_cases(tmp_path):
        settings.output_dir.mkdir(parents=True, exist_ok=True)
        _write_run_config(settings)
        config = read_config_file(TrainSettings, settings.output_dir / "run_config.json")
        assert config.is_run_record
        assert TrainSettings(**config.values) == settings


def test_the_run_record_holds_every_setting(tmp_path):
    import dataclasses

    settings = TrainSettings(output_dir=tmp_path)
    _write_run_config(settings)
    data = json.loads((tmp_path / "run_config.json").read_text())
    assert {f.name for f in dataclasses.fields(TrainSettings)} <= set(data)


def test_an_atomic_write_that_fails_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "run_config.json"
    write_json_atomically(path, {"seed": 1})
    with pytest.raises(TypeError):
        write_json_atomically(path, {"seed": object()})
    assert json.loads(path.read_text()) == {"seed": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run_config.json"]


def test_an_atomic_write_gives_the_file_the_usual_permissions(tmp_path):
    import os

    umask = os.umask(0o022)
    os.umask(umask)
    write_json_atomically(tmp_path / "a.json", {})
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_later_layer_wins_and_drops_the_setting_it_excludes():
    exclusive = {"num_steps": "num_episodes", "num_episodes": "num_steps"}
    merged = merge_layers([{"num_steps": 12, "seed": 1}, {"seed": 2}, {"num_episodes": 96}],
                          exclusive)
    assert merged == {"seed": 2, "num_episodes": 96}
    # one layer giving both keeps both, so TrainSettings reports the conflict
    assert merge_layers([{"num_steps": 1, "num_episodes": 2}], exclusive) == {
        "num_steps": 1, "num_episodes": 2}
