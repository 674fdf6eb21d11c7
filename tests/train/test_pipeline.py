"""Pipeline and CLI wiring: flags -> settings -> configs; checkpoint resolution; presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiminddev.agents.roles import AgentRole
from multiminddev.cli import build_parser
from multiminddev.train.pipeline import Context, TrainSettings, grpo_config, resolve_checkpoint
from multiminddev.train.presets import Preset, run_size


def _settings(argv):
    from multiminddev.commands.train import _settings

    args = build_parser().parse_args(argv)
    return _settings(args)


def test_rl_flags_follow_the_seeds():
    s = _settings(["rl", "--num-episodes", "200", "--num-gpus", "8", "--batch-size", "4",
                   "--group-size", "8", "--learning-rate", "1e-6", "--max-turns", "3",
                   "--output-dir", "/tmp/x"])
    assert (s.num_episodes, s.num_gpus, s.batch_size, s.group_size) == (200, 8, 4, 8)
    assert s.learning_rate == 1e-6 and s.max_turns == 3 and s.output_dir == Path("/tmp/x")


def test_num_episodes_sets_steps_from_batch_and_group():
    ctx = Context.__new__(Context)
    ctx.settings = TrainSettings(num_episodes=100, batch_size=4, group_size=8)
    ctx.size = run_size(Preset.FULL, gpu=False)
    cfg = grpo_config(ctx)
    assert cfg.num_steps == 4 and cfg.episodes_per_step == 32  # ceil(100 / 32)
    assert cfg.kl_reference.value == "base"


def test_kl_reference_flag_reaches_the_grpo_config():
    ctx = Context.__new__(Context)
    ctx.settings = _settings(["rl", "--kl-reference", "start", "--output-dir", "/tmp/x"])
    ctx.size = run_size(Preset.FULL, gpu=False)
    assert grpo_config(ctx).kl_reference.value == "start"
    with pytest.raises(ValueError, match="'base' or 'start'"):
        TrainSettings(kl_reference="sft")


def test_family_sampling_flag_reaches_the_curriculum():
    from multiminddev.train.pipeline import curriculum_config

    ctx = Context.__new__(Context)
    ctx.settings = _settings(["rl", "--output-dir", "/tmp/x"])
    assert curriculum_config(ctx).family_sampling.value == "uniform"
    ctx.settings = _settings(["train", "--family-sampling", "signal", "--output-dir", "/tmp/x"])
    assert curriculum_config(ctx).family_sampling.value == "signal"
    with pytest.raises(ValueError, match="'uniform' or 'signal'"):
        TrainSettings(family_sampling="loudest")


def test_rl_roles_and_greedy_roles_reach_grpo_and_the_rollouts():
    from multiminddev.train.pipeline import episode_config

    ctx = Context.__new__(Context)
    ctx.size = run_size(Preset.FULL, gpu=False)
    ctx.settings = _settings(["train", "--output-dir", "/tmp/x"])
    cfg = grpo_config(ctx)
    assert cfg.train_roles == (AgentRole.GENERATOR, AgentRole.OPTIMIZER)
    sampled = episode_config(ctx, cfg)
    assert sampled.sampling_for(AgentRole.GENERATOR).temperature == cfg.temperature > 0

    ctx.settings = _settings(["train", "--rl-roles", "optimizer", "--rl-greedy-roles",
                              "generator", "--output-dir", "/tmp/x"])
    assert ctx.settings.roles == (AgentRole.GENERATOR, AgentRole.OPTIMIZER)  # SFT: both
    cfg = grpo_config(ctx)
    assert cfg.train_roles == (AgentRole.OPTIMIZER,)
    config = episode_config(ctx, cfg)
    assert config.sampling_for(AgentRole.GENERATOR).temperature == 0.0
    assert config.sampling_for(AgentRole.OPTIMIZER).temperature == cfg.temperature


def test_a_trained_role_cannot_decode_greedily(capsys):
    with pytest.raises(SystemExit) as exc:  # both agents trained by default
        _settings(["rl", "--rl-greedy-roles", "generator", "--output-dir", "/tmp/x"])
    assert exc.value.code == 2
    assert "only an agent it does not train can decode greedily" in capsys.readouterr().err
    with pytest.raises(ValueError, match="can train only agents the run has"):
        TrainSettings(roles=("generator",), rl_roles=("optimizer",))
    with pytest.raises(SystemExit):  # argparse: not an agent
        _settings(["rl", "--rl-roles", "tester", "--output-dir", "/tmp/x"])


def test_run_config_records_the_rl_roles(tmp_path):
    import json

    from multiminddev.train.pipeline import _write_run_config

    settings = TrainSettings(output_dir=tmp_path, rl_roles=("optimizer",),
                             rl_greedy_roles=("generator",))
    _write_run_config(settings)
    data = json.loads((tmp_path / "run_config.json").read_text())
    assert data["rl_roles"] == ["optimizer"] and data["rl_greedy_roles"] == ["generator"]
    assert data["roles"] == ["generator", "optimizer"] and data["roles_sft_done"] == []


def test_family_warm_start_flag_starts_the_curriculums_windows(tmp_path, capsys):
    import json

    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.pipeline import grpo_curriculum

    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps({"families": {"add": [40, 40], "relu": [0, 40]}}))
    ctx = Context.__new__(Context)
    ctx.train_problems = load_problems("builtin:tier0:train")
    ctx.settings = _settings(["rl", "--family-sampling", "signal", "--family-warm-start",
                              str(counts), "--output-dir", "/tmp/x"])
    weights = grpo_curriculum(ctx).family_weights(0)
    assert weights["add"] == weights["relu"] == pytest.approx(0.02)  # solved and hopeless
    assert weights["exp"] == pytest.approx(0.25)  # no counts
    ctx.settings = _settings(["rl", "--family-sampling", "signal", "--output-dir", "/tmp/x"])
    assert grpo_curriculum(ctx).family_weights(0)["add"] == pytest.approx(0.25)
    # usage errors before anything loads: the flag without signal sampling, a bad file
    with pytest.raises(SystemExit):
        _settings(["rl", "--family-warm-start", str(counts), "--output-dir", "/tmp/x"])
    assert "give --family-sampling signal too" in capsys.readouterr().err
    counts.write_text('{"families": {"add": [41, 40]}}')
    with pytest.raises(SystemExit):
        _settings(["train", "--family-sampling", "signal", "--family-warm-start", str(counts),
                   "--output-dir", "/tmp/x"])
    assert "0 <= correct <= episodes" in capsys.readouterr().err


def test_bare_resume_uses_output_dir_and_resume_path_sets_it():
    s = _settings(["train", "--resume", "--output-dir", "/tmp/run1"])
    assert s.resume == Path("/tmp/run1")
    s = _settings(["rl", "--resume", "/tmp/run2"])
    assert s.resume == Path("/tmp/run2") and s.output_dir == Path("/tmp/run2")


def test_quick_test_flag_selects_preset():
    assert _settings(["train", "--quick-test"]).preset is Preset.QUICK_TEST
    assert _settings(["train", "--preset", "quickstart"]).preset is Preset.QUICKSTART


def test_sft_role_choice():
    from multiminddev.commands.train import _run_sft  # noqa: F401  (handler exists)

    args = build_parser().parse_args(["sft", "--role", "optimizer"])
    assert args.role == "optimizer" and args.handler.__name__ == "_run_sft"


def test_settings_reject_group_of_one_and_tester_role():
    with pytest.raises(ValueError, match="group_size"):
        TrainSettings(group_size=1)
    with pytest.raises(ValueError, match="Tester"):
        TrainSettings(roles=(AgentRole.TESTER,))


def test_qlora_flag_reaches_the_policy_config_and_excludes_full_finetune(capsys):
    from multiminddev.train.pipeline import policy_config

    def config_for(settings, device):
        ctx = Context.__new__(Context)
        ctx.settings = settings
        ctx.size = run_size(settings.preset, gpu=device == "cuda")
        return policy_config(ctx, device)

    s = _settings(["train", "--qlora", "--output-dir", "/tmp/x"])
    assert s.qlora and config_for(s, "cuda").load_in_4bit
    assert not config_for(_settings(["train"]), "cpu").load_in_4bit
    with pytest.raises(SystemExit) as exit_info:
        _settings(["train", "--qlora", "--full-finetune"])
    assert exit_info.value.code == 2 and "excludes --full-finetune" in capsys.readouterr().err


def test_compiled_decoding_follows_the_flag_or_else_the_preset():
    from multiminddev.train.pipeline import policy_config

    def compiled(argv, gpu):
        ctx = Context.__new__(Context)
        ctx.settings = _settings(["train", *argv, "--output-dir", "/tmp/x"])
        ctx.size = run_size(ctx.settings.preset, gpu=gpu)
        return policy_config(ctx, "cuda" if gpu else "cpu").compiled_decoding

    # the GPU quickstart decodes compiled: eager decoding did not fit its 10 minutes on an H100
    assert compiled(["--preset", "quickstart"], gpu=True)
    assert not compiled(["--preset", "quickstart"], gpu=False)
    assert not compiled(["--preset", "quickstart", "--compiled-decoding", "off"], gpu=True)
    assert compiled(["--compiled-decoding", "on"], gpu=False)


def test_checkpoint_resolves_to_adapter_dirs_or_a_model(tmp_path):
    sft = tmp_path / "sft_checkpoints" / "generator"
    sft.mkdir(parents=True)
    (sft / "adapter_config.json").write_text("{}")
    assert resolve_checkpoint(str(tmp_path), AgentRole.GENERATOR) == ("adapter", str(sft))
    assert resolve_checkpoint(str(sft), AgentRole.GENERATOR) == ("adapter", str(sft))
    assert resolve_checkpoint("Qwen/Qwen2.5-Coder-1.5B-Instruct", AgentRole.OPTIMIZER) == (
        "model", "Qwen/Qwen2.5-Coder-1.5B-Instruct")


def test_shipped_checkpoint_is_the_packages_agent_of_each_role(tmp_path, monkeypatch):
    from multiminddev.agents.shipped import SHIPPED_DIR
    monkeypatch.chdir(tmp_path)
    for role in (AgentRole.GENERATOR, AgentRole.OPTIMIZER):
        assert resolve_checkpoint("shipped", role) == ("adapter", str(SHIPPED_DIR / role.value))
    # a folder called "shipped" here is what the user means
    local = tmp_path / "shipped" / "generator"
    local.mkdir(parents=True)
    (local / "adapter_config.json").write_text("{}")
    assert resolve_checkpoint("shipped", AgentRole.GENERATOR) == ("adapter", "shipped/generator")


def test_shipped_checkpoint_without_shipped_agents_says_so(tmp_path, monkeypatch):
    import multiminddev.train.pipeline as pipeline
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "shipped_agents", lambda: None)
    with pytest.raises(ValueError, match="ships no agents"):
        resolve_checkpoint("shipped", AgentRole.OPTIMIZER)


def test_quickstart_is_small_on_cpu():
    size = run_size(Preset.QUICKSTART, gpu=False)
    episodes = size.rl_steps * size.problems_per_step * size.group_size
    assert episodes <= 8 and size.max_new_tokens <= 512


@pytest.mark.parametrize("preset", [Preset.QUICKSTART, Preset.FULL])
def test_gpu_sizes_leave_room_for_every_sft_reply(preset):
    """A reply cut at max_new_tokens has no closing fence and cannot parse: the GPU sizes must
    hold the longest reply each agent is taught (Optimizer: a fast kernel, up to ~750 tokens)."""
    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.sft_data import sft_examples
    from tests.policy.helpers import gguf_tokenizer

    tokenizer = gguf_tokenizer()
    size = run_size(preset, gpu=True)
    problems = load_problems(size.train_problems)

    def longest(role, **kwargs):
        return max(len(tokenizer.encode(e.messages[-1]["content"]))
                   for e in sft_examples(role, problems, **kwargs))

    generator_cap = size.generator_max_new_tokens or size.max_new_tokens
    assert longest(AgentRole.GENERATOR, variants=size.generator_variants) < generator_cap
    assert longest(AgentRole.OPTIMIZER) < size.max_new_tokens


def test_episode_config_caps_the_generator_unless_tokens_are_set():
    from types import SimpleNamespace

    from multiminddev.train.grpo import GRPOConfig
    from multiminddev.train.pipeline import episode_config

    size = run_size(Preset.QUICKSTART, gpu=True)
    grpo = GRPOConfig(max_new_tokens=size.max_new_tokens)
    preset_ctx = SimpleNamespace(settings=TrainSettings(), size=size)
    config = episode_config(preset_ctx, grpo)
    assert config.sampling_for(AgentRole.GENERATOR).max_new_tokens == size.generator_max_new_tokens
    assert config.sampling_for(AgentRole.OPTIMIZER).max_new_tokens == size.max_new_tokens
    explicit = SimpleNamespace(settings=TrainSettings(max_new_tokens=300), size=size)
    config = episode_config(explicit, GRPOConfig(max_new_tokens=300))
    assert config.sampling_for(AgentRole.GENERATOR).max_new_tokens == 300


def test_sft_problems_flag_gives_the_sft_data_and_leaves_rl_its_problems():
    import io

    from rich.console import Console

    from multiminddev.train.pipeline import load_problems_for

    spec = "builtin:tier0:train:allshapes+builtin:breadth"

    def loaded(argv):
        ctx = Context.__new__(Context)
        ctx.settings = _settings([*argv, "--problems", "builtin:tier0:train",
                                  "--heldout", "builtin:tier0:heldout", "--output-dir", "/tmp/x"])
        ctx.size = run_size(Preset.FULL, gpu=False)
        ctx.console = Console(file=io.StringIO())
        load_problems_for(ctx)
        return ctx

    ctx = loaded(["train", "--sft-problems", spec])
    assert ctx.settings.sft_problems == spec
    sft_names = {p.name for p in ctx.sft_problems}
    assert {p.name for p in ctx.train_problems} < sft_names and "neg_4096x4096" in sft_names
    assert all("breadth" not in p.extra for p in ctx.train_problems)  # GRPO's curriculum
    assert loaded(["sft", "--sft-problems", spec]).settings.sft_problems == spec
    plain = loaded(["train"])
    assert plain.settings.sft_problems is None and plain.sft_problems is plain.train_problems


def test_sft_data_flag_adds_the_archives_generator_examples_before_the_model_loads(tmp_path):
    import io

    from rich.console import Console

    from multiminddev.train.pipeline import load_problems_for
    from tests.tasks.kb_fixtures import write_sakana_parquet

    pytest.importorskip("datasets", reason="the Sakana loader needs `datasets`")
    spec = f"sakana:{write_sakana_parquet(tmp_path / 'archive')}"

    def loaded(argv):
        ctx = Context(_settings([*argv, "--problems", "builtin:tier0:train", "--heldout",
                                 "builtin:tier0:heldout", "--output-dir", str(tmp_path / "o")]),
                      Console(file=io.StringIO()))
        load_problems_for(ctx)
        return ctx

    for command in ("sft", "train"):
        ctx = loaded([command, "--sft-data", spec])
        assert ctx.settings.sft_data == spec
        assert [e.variant for e in ctx.sakana_sft.examples] == ["linear_relu_scale_base"]
        assert "1 Generator example(s) from 1 task(s)" in ctx.console.file.getvalue()
    assert loaded(["sft", "--sft-data", spec, "--role", "optimizer"]).sakana_sft is None
    assert loaded(["train"]).sakana_sft is None


@pytest.mark.parametrize("argv0, program", [
    ("/usr/local/bin/multiminddev", ["multiminddev"]),
    ("/site-packages/multiminddev/__main__.py", ["python", "-m", "multiminddev"]),
    ("", ["multiminddev"]),
])
def test_resume_command_is_one_the_user_can_type(monkeypatch, argv0, program):
    from multiminddev.train.pipeline import _resume_argv

    monkeypatch.setattr("sys.argv", [argv0, "train", "--recipe", "r"])
    argv = _resume_argv(TrainSettings(output_dir=Path("/tmp/run")))
    assert argv == [*program, "train", "--recipe", "r", "--resume", "/tmp/run",
                    "--output-dir", "/tmp/run"]
