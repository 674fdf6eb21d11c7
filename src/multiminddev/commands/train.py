"""``multiminddev sft``, ``multiminddev rl`` and ``multiminddev train`` (SFT -> RL -> eval).

A run's settings (``TrainSettings``) come from four sources, a later one winning:
``--recipe NAME`` < ``--config FILE`` < ``--set key=value`` < explicit flags. ``--config`` reads
a YAML, TOML or JSON file whose keys are the settings' names, or a run's ``run_config.json``,
which starts that run again from scratch (in ``--output-dir``, default a new runs/<timestamp>).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from multiminddev.agents.roles import AgentRole
from multiminddev.commands._io import USAGE_ERROR, ExitCode, fail
from multiminddev.distributed.cluster import LOCAL, RayUnavailableError
from multiminddev.distributed.grpo import run_ray_pipeline
from multiminddev.distributed.rollout import StaleWeights, WorkerLost
from multiminddev.policy import PolicyError
from multiminddev.policy.model import check_checkpoint, resolve_model_source
from multiminddev.policy.remote import RemoteGenerationError, list_served_models
from multiminddev.train.checkpoints import CheckpointError
from multiminddev.train.config_files import (
    ConfigError,
    merge_layers,
    parse_set_options,
    read_config_file,
    settings_record,
    write_json_atomically,
)
from multiminddev.train.pipeline import TrainSettings, resolve_checkpoint, run_pipeline
from multiminddev.train.recipes import get_recipe, recipe_table
from multiminddev.train.seeds import (
    SEEDS_CONFIG_FILE,
    collect_seed_table,
    run_seed_plan,
    seed_gpu_ids,
    seed_launch_plan,
    write_seed_table,
)


def register(subparsers) -> None:
    _register_sft(subparsers)
    _register_rl(subparsers)
    _register_train(subparsers)


def _common(p: argparse.ArgumentParser) -> None:
    # Every flag defaults to None (not given), so that a recipe, a config file and --set can
    # supply the setting and an explicit flag overrides them; the defaults are TrainSettings'.
    p.add_argument("--recipe", default=None, metavar="NAME",
                   help="start from a named recipe (--list-recipes lists them); a config file, "
                        "--set and explicit flags override it, in that order")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="settings from a YAML, TOML or JSON file (keys: the settings' names, "
                        "as --set), or a run's RUN_DIR/run_config.json to run it again")
    p.add_argument("--set", dest="set_options", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="set one setting by name, e.g. --set num_steps=12 --set "
                        "rl_roles=optimizer (repeatable; over --config, under explicit flags)")
    p.add_argument("--list-recipes", action="store_true",
                   help="print the recipes and the settings each fixes, then exit")
    p.add_argument("--model", default=None,
                   help="base model: 'default' (embedded SmolLM2-135M GGUF), a hub id, a local "
                        "directory or a .gguf file")
    p.add_argument("--output-dir", type=Path, default=None, help="default: runs/<timestamp>")
    p.add_argument("--problems", dest="train_problems", default=None,
                   help="training problems spec (e.g. builtin:tier0,tier1:train, kernelbench:PATH)")
    p.add_argument("--heldout", dest="heldout_problems", default=None,
                   help="held-out problems spec (e.g. builtin:tier0,tier1:heldout)")
    p.add_argument("--num-gpus", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument("--lora-rank", type=int, default=None, help="LoRA adapter rank (default 16)")
    p.add_argument("--full-finetune", action="store_true", default=None,
                   help="train a full copy of the model per agent instead of LoRA adapters")
    p.add_argument("--qlora", action="store_true", default=None,
                   help="QLoRA: a 4-bit NF4 base under the LoRA adapters (CUDA GPU + bitsandbytes)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--compiled-decoding", choices=["auto", "on", "off"], default=None,
                   help="decode with a static KV cache and a compiled step (CUDA graphs; CUDA "
                        "only, falls back to eager on failure); auto (default): the preset's "
                        "choice")
    p.add_argument("--preset", choices=["quickstart", "quick-test", "full"], default=None,
                   help="run size (default full; quickstart: the README's few-minute run)")


def _rl_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-episodes", type=int, default=None,
                   help="total RL episodes (conversations); steps = episodes / (batch * group)")
    p.add_argument("--num-steps", type=int, default=None, help="RL steps (instead of episodes)")
    p.add_argument("--batch-size", type=int, default=None, help="problems per RL step")
    p.add_argument("--group-size", type=int, default=None, help="episodes per problem (G)")
    p.add_argument("--max-turns", type=int, default=None, help="agent turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per agent reply (default: the preset's)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="RL learning rate (default: the preset's)")
    p.add_argument("--kl-reference", choices=["base", "start"], default=None,
                   help="what GRPO's KL term pulls toward: the pre-trained base (default) or each "
                        "agent as RL starts, e.g. its SFT checkpoint")
    p.add_argument("--family-sampling", choices=["uniform", "signal"], default=None,
                   help="how RL draws problems: every problem of the curriculum's tier alike "
                        "(default), or a family first, weighted by p(1-p) of its recent pass "
                        "rate p, so solved and hopeless families give way to those with a "
                        "learning signal")
    p.add_argument("--family-warm-start", type=Path, default=None, metavar="FILE",
                   help="with --family-sampling signal: start each family's pass-rate window "
                        "from an earlier run's counts (benchmarks/analyze_rollouts.py "
                        "--family-counts-out), so the weights hold from the first step")
    p.add_argument("--rl-roles", nargs="+", choices=["generator", "optimizer"], default=None,
                   help="the agents GRPO updates (default: both); e.g. optimizer, with "
                        "--rl-greedy-roles generator")
    p.add_argument("--rl-greedy-roles", nargs="+", choices=["generator", "optimizer"],
                   default=None,
                   help="agents GRPO does not train that decode greedily in its rollouts: a "
                        "greedy Generator hands every Optimizer turn of a group the same kernel "
                        "(the recipe that raised held-out reward: --recipe "
                        "optimizer-grpo-greedy-generator)")
    p.add_argument("--generator-checkpoint", default=None,
                   help="Generator start: an adapter dir (e.g. RUN/sft_checkpoints/generator), "
                        "'shipped' (the package's agent; with --skip-sft, GRPO continues from "
                        "the shipped agents) or a base model")
    p.add_argument("--optimizer-checkpoint", default=None, help="Optimizer start, as above")
    p.add_argument("--resume", nargs="?", const="", default=None, type=str,
                   help="resume from RUN_DIR/rl_checkpoints/latest (default: --output-dir)")
    p.add_argument("--wandb", action="store_true", default=None,
                   help="also log to Weights & Biases")


def _sft_problems_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sft-problems", default=None,
                   help="problems whose reference solutions make the SFT data (default: "
                        "--problems; RL still uses --problems), e.g. "
                        "builtin:tier0,tier1:train:allshapes+builtin:breadth")
    p.add_argument("--sft-data", default=None, metavar="SPEC",
                   help="more Generator SFT data, in addition to the reference solutions: "
                        "sakana:PATH, the SakanaAI AI CUDA Engineer archive's parquet files (or "
                        "their folder); its correct kernels with a recorded speedup become "
                        "load_inline candidates, the 2 fastest distinct ones per task")


def _register_sft(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning of the Generator and/or Optimizer")
    _common(p)
    _sft_problems_flag(p)
    p.add_argument("--role", choices=["generator", "optimizer", "both"], default=None,
                   help="which agent(s) to fine-tune (default both)")
    p.add_argument("--max-steps", type=int, default=None, help="SFT optimizer steps per role")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="SFT learning rate (default: the preset's)")
    p.set_defaults(handler=_run_sft)


def _register_rl(subparsers) -> None:
    p = subparsers.add_parser("rl", help="multi-turn, multi-agent GRPO")
    _common(p)
    _rl_flags(p)
    p.set_defaults(handler=_run_rl)


def _register_train(subparsers) -> None:
    p = subparsers.add_parser("train", help="SFT -> RL -> held-out evaluation")
    _common(p)
    _rl_flags(p)
    _sft_problems_flag(p)
    p.add_argument("--skip-sft", action="store_true", default=None, help="skip the SFT phase")
    p.add_argument("--skip-rl", action="store_true", default=None, help="skip the RL phase")
    p.add_argument("--skip-eval", action="store_true", default=None,
                   help="skip the held-out evaluation")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="N",
                   help="train once per seed into OUTPUT_DIR/seed<N>/ (one process per GPU where "
                        "there are several, else one after another), then write the mean +- "
                        "std over seeds to OUTPUT_DIR/seeds.json and seeds.md (excludes --seed)")
    p.add_argument("--quick-test", action="store_true", default=None,
                   help="a few-minute smoke test of every phase (--preset quick-test)")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="SFT optimizer steps per role (default: the preset's)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="play GRPO's rollouts on Ray actors laid out from the GPU plan (one per "
                        "GPU), the learner in this process: ADDRESS 'auto' (or ray://...) joins "
                        "a running cluster, none starts a local one; the layout goes to "
                        "RUN_DIR/layout.json (needs the ray extra)")
    p.add_argument("--rollout-server", default=None, metavar="URL",
                   help="sample GRPO's rollouts from this OpenAI-compatible server "
                        "(multiminddev serve, or vLLM with --enable-lora; http://HOST:PORT), "
                        "which must read RUN_DIR/served_adapters at the same path; the learner "
                        "stays here and publishes its adapters to it after every update")
    p.set_defaults(handler=_run_train)


# Flags whose destination is the setting of the same name (those of the command at hand).
_SAME_NAME_FLAGS = (
    "model", "output_dir", "train_problems", "heldout_problems", "num_gpus", "lora_rank",
    "full_finetune", "qlora", "seed", "preset", "num_episodes", "num_steps", "batch_size",
    "group_size", "max_turns", "max_new_tokens", "kl_reference", "family_sampling",
    "family_warm_start", "rl_roles", "rl_greedy_roles", "generator_checkpoint",
    "optimizer_checkpoint", "wandb", "sft_problems", "sft_data", "skip_sft", "skip_rl",
    "skip_eval", "sft_steps", "rollout_server")
# A later source that sets one of these drops the other from earlier sources: a recipe's step
# count gives way to --num-episodes instead of conflicting with it.
EXCLUSIVE_SETTINGS = {"num_steps": "num_episodes", "num_episodes": "num_steps"}
# What each command fixes, over every source: it is what the command is.
_COMMAND_SETTINGS = {"sft": {"skip_rl": True, "skip_eval": True}, "rl": {"skip_sft": True},
                     "train": {}}
# A run record's settings that say where and how far the recorded run went, not what it
# trains: --config RUN_DIR/run_config.json starts the same run afresh in a new folder
# (--output-dir, default runs/<timestamp>); --resume RUN_DIR continues the recorded one.
RUN_STATE_SETTINGS = ("output_dir", "resume", "roles_sft_done")


def flag_settings(args) -> dict[str, Any]:
    """The settings the command line's explicit flags give (None: a flag not given)."""
    out = {name: getattr(args, name) for name in _SAME_NAME_FLAGS
           if getattr(args, name, None) is not None}
    if getattr(args, "compiled_decoding", None) is not None:
        out["compiled_decoding"] = {"auto": None, "on": True, "off": False}[args.compiled_decoding]
    if getattr(args, "quick_test", None):
        out["preset"] = "quick-test"
    if getattr(args, "resume", None) is not None:
        out["resume"] = args.resume  # "" for a bare --resume: the output dir (_settings)
    if args.command == "sft":  # sft's --learning-rate and --max-steps are SFT's
        if getattr(args, "learning_rate", None) is not None:
            out["sft_learning_rate"] = args.learning_rate
        if getattr(args, "max_steps", None) is not None:
            out["sft_steps"] = args.max_steps
        if getattr(args, "role", None) is not None:
            out["roles"] = (("generator", "optimizer") if args.role == "both"
                            else (args.role,))
    elif getattr(args, "learning_rate", None) is not None:
        out["learning_rate"] = args.learning_rate
    return out


def layered_settings(args) -> dict[str, Any]:
    """The TrainSettings keyword arguments from every source, the later winning: the recipe,
    the config file, --set, the explicit flags, then what the command fixes. Raises
    ``ConfigError`` (one line) on an unknown recipe, key or value."""
    layers: list[dict[str, Any]] = []
    if args.recipe is not None:
        layers.append(get_recipe(args.recipe).settings_for())
    if args.config is not None:
        config = read_config_file(TrainSettings, args.config)
        values = dict(config.values)
        if config.is_run_record:
            for name in RUN_STATE_SETTINGS:
                values.pop(name, None)
        layers.append(values)
    layers.append(parse_set_options(TrainSettings, args.set_options))
    layers.append(flag_settings(args))
    layers.append(dict(_COMMAND_SETTINGS.get(args.command, {})))
    return merge_layers(layers, EXCLUSIVE_SETTINGS)


def _settings(args, **overrides):
    """The run's TrainSettings from every source (``layered_settings``) and ``overrides``; a
    bad source or combination is one line on stderr and exit 2."""
    try:
        kwargs = layered_settings(args)
    except ConfigError as exc:
        fail(str(exc))
        raise SystemExit(USAGE_ERROR) from exc
    kwargs.update(overrides)
    resume = kwargs.get("resume")
    if resume is not None and str(resume) == "":  # bare --resume: the output dir
        if kwargs.get("output_dir") is None:
            fail("--resume without a path needs --output-dir (the run to resume)")
            raise SystemExit(USAGE_ERROR)
        resume = kwargs["output_dir"]
    if resume is not None:
        kwargs["resume"] = Path(resume)
        kwargs.setdefault("output_dir", Path(resume))
    try:
        return TrainSettings(**kwargs)
    except ValueError as exc:  # conflicting or out-of-range settings: a usage error, not a crash
        fail(str(exc))
        raise SystemExit(USAGE_ERROR) from exc


def check_model_inputs(settings) -> None:
    """Fail before any phase starts, with a PolicyError saying what to do, when --model or a
    role's --*-checkpoint cannot load (a mistyped path, a junk folder, an uncached hub id while
    offline): loading them comes after problems and the GPU plan, and ended in a traceback."""
    resolve_model_source(settings.model)
    for role in ("generator", "optimizer"):
        checkpoint = getattr(settings, f"{role}_checkpoint")
        if checkpoint is not None:
            # "shipped" names the package's agent of that role: it must exist in the package
            kind, resolved = resolve_checkpoint(checkpoint, AgentRole(role))
            check_checkpoint(resolved if kind == "adapter" else checkpoint, role)


def folder_inputs_problem(output_dir: Path | None, resume: Path | None) -> str | None:
    """Why --output-dir or --resume cannot be used, or None. A --resume folder that does not
    exist is a typo, not a fresh start: the run would otherwise begin again from scratch."""
    if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
        return f"--output-dir {output_dir} is a file; give a folder for the run"
    if resume is not None:
        if not resume.exists():
            return (f"--resume {resume}: no such run folder; give the --output-dir of the run "
                    "to resume (it holds run_config.json)")
        if not resume.is_dir():
            return f"--resume {resume} is a file; give the run folder"
    return None


def _run(settings, ray: str | None = None) -> int:
    """``ray``: None runs in this process; else the Ray address ("" for a local cluster)."""
    if (problem := folder_inputs_problem(settings.output_dir, settings.resume)) is not None:
        return fail(problem)
    if ray is not None and settings.rollout_server is not None:
        return fail("--ray and --rollout-server both say where GRPO's rollouts are sampled "
                    "(Ray actors, or one OpenAI-compatible server): pick one")
    try:
        check_model_inputs(settings)
        check_rollout_server(settings)
        if ray is None:
            run_pipeline(settings)
        else:
            run_ray_pipeline(settings, ray or LOCAL)  # a bare --ray starts a local cluster
    except (PolicyError, RayUnavailableError, RemoteGenerationError) as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE)  # a model, a cluster or a server not there
    except (CheckpointError, ValueError) as exc:
        return fail(str(exc))
    except (WorkerLost, StaleWeights) as exc:  # the cluster's doing: checkpoints are kept
        return fail(f"{exc}; continue the run with --resume {settings.output_dir}",
                    ExitCode.UNAVAILABLE)
    return 0


def check_rollout_server(settings) -> None:
    """Fail before any phase starts when ``rollout_server`` does not answer ``/v1/models``
    (``RemoteGenerationError``, one line); GRPO would otherwise stop on it after SFT."""
    if settings.rollout_server is not None and not settings.skip_rl:
        list_served_models(settings.rollout_server)


def _list_recipes() -> int:
    print(recipe_table())
    return 0


def _run_sft(args) -> int:
    return _list_recipes() if args.list_recipes else _run(_settings(args))


def _run_rl(args) -> int:
    return _list_recipes() if args.list_recipes else _run(_settings(args))


def _run_train(args) -> int:
    if args.list_recipes:
        return _list_recipes()
    if args.seeds is not None:
        return _run_seeds(args)
    return _run(_settings(args), ray=args.ray)


def seeds_problem(args) -> str | None:
    """Why ``--seeds`` cannot be used with the other flags, or None."""
    if args.seed is not None:
        return "--seed and --seeds exclude each other: give --seeds 0 1 2 for several seeds"
    if getattr(args, "resume", None) is not None:
        return ("--seeds starts fresh runs; resume one seed with train --resume "
                "OUTPUT_DIR/seed<N>")
    if getattr(args, "ray", None) is not None:
        return "--seeds runs one process per GPU itself; train each seed with --ray on its own"
    if len(set(args.seeds)) != len(args.seeds):
        return f"--seeds {' '.join(map(str, args.seeds))}: give each seed once"
    return None


def _run_seeds(args) -> int:
    """Write the settings once, run each seed as its own ``train`` process (``seed_launch_plan``),
    then the table over seeds; exit 1 when any seed failed or gave no figures."""
    import os
    import sys

    if (problem := seeds_problem(args)) is not None:
        return fail(problem)
    settings = _settings(args)
    if (problem := folder_inputs_problem(settings.output_dir, None)) is not None:
        return fail(problem)
    if settings.rollout_server is not None:  # seeds at once would overwrite each other's adapters
        return fail("--seeds with --rollout-server: the seeds would publish adapters of the same "
                    "names to one server; train each seed on its own server instead")
    try:  # a bad --model stops here once, not once per seed
        check_model_inputs(settings)
    except PolicyError as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE)
    except ValueError as exc:
        return fail(str(exc))
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    config_path = settings.output_dir / SEEDS_CONFIG_FILE
    record = {k: v for k, v in settings_record(settings).items()
              if k not in (*RUN_STATE_SETTINGS, "seed")}
    write_json_atomically(config_path, record)
    gpu_ids = seed_gpu_ids(os.environ.get("CUDA_VISIBLE_DEVICES"), _cuda_device_count(),
                           settings.num_gpus)
    plan = seed_launch_plan(args.seeds, gpu_ids=gpu_ids, config_path=config_path,
                            output_dir=settings.output_dir,
                            command=(sys.executable, "-m", "multiminddev.cli"))
    how = (f"one process per GPU ({', '.join(gpu_ids)})" if len(gpu_ids) >= 2
           else "one after another")
    print(f"seeds: {len(plan)} seeds ({' '.join(map(str, args.seeds))}), {how}, into "
          f"{settings.output_dir}", file=sys.stderr)
    table = collect_seed_table(run_seed_plan(plan), settings.output_dir)
    json_path, md_path = write_seed_table(table, settings.output_dir)
    if table.stages:
        print(md_path.read_text(encoding="utf-8"))
    print(f"seeds: table in {json_path} and {md_path}", file=sys.stderr)
    if table.failed:
        print(f"seeds: {len(table.failed)} of {len(plan)} seeds failed or gave no figures: "
              f"{', '.join(map(str, sorted(table.failed)))}", file=sys.stderr)
        return 1
    return 0


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
