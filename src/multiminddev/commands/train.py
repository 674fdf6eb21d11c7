"""``multiminddev sft``, ``multiminddev rl`` and ``multiminddev train`` (SFT -> RL -> eval).

The flags follow the seeds (``run_multiturn_rl_training.py``): ``--num-episodes``, ``--num-gpus``,
``--generator-checkpoint``, ``--optimizer-checkpoint``, ``--batch-size``, ``--learning-rate``,
``--output-dir``; plus ``--group-size``, ``--max-turns``, ``--resume`` and ``--model``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from multiminddev.commands._io import USAGE_ERROR, fail


def register(subparsers) -> None:
    _register_sft(subparsers)
    _register_rl(subparsers)
    _register_train(subparsers)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="base model: 'default' (embedded SmolLM2-135M GGUF), a hub id, a local "
                        "directory or a .gguf file")
    p.add_argument("--output-dir", type=Path, default=None, help="default: runs/<timestamp>")
    p.add_argument("--problems", dest="train_problems", default=None,
                   help="training problems spec (e.g. builtin:tier0,tier1:train, kernelbench:PATH)")
    p.add_argument("--heldout", dest="heldout_problems", default=None,
                   help="held-out problems spec (e.g. builtin:tier0,tier1:heldout)")
    p.add_argument("--num-gpus", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA adapter rank (default 16)")
    p.add_argument("--full-finetune", action="store_true",
                   help="train a full copy of the model per agent instead of LoRA adapters")
    p.add_argument("--qlora", action="store_true",
                   help="QLoRA: a 4-bit NF4 base under the LoRA adapters (CUDA GPU + bitsandbytes)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--compiled-decoding", choices=["auto", "on", "off"], default="auto",
                   help="decode with a static KV cache and a compiled step (CUDA graphs; CUDA "
                        "only, falls back to eager on failure); auto: the preset's choice")
    p.add_argument("--preset", choices=["quickstart", "quick-test", "full"], default="full",
                   help="run size (quickstart: the README's few-minute run)")


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
    p.add_argument("--kl-reference", choices=["base", "start"], default="base",
                   help="what GRPO's KL term pulls toward: the pre-trained base (default) or each "
                        "agent as RL starts, e.g. its SFT checkpoint")
    p.add_argument("--family-sampling", choices=["uniform", "signal"], default="uniform",
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
    p.add_argument("--rl-greedy-roles", nargs="+", choices=["generator", "optimizer"], default=(),
                   help="agents GRPO does not train that decode greedily in its rollouts: a "
                        "greedy Generator hands every Optimizer turn of a group the same kernel "
                        "(the recipe that raised held-out reward; docs/BENCHMARKS.md, run M)")
    p.add_argument("--generator-checkpoint", default=None,
                   help="Generator start: an adapter dir (e.g. RUN/sft_checkpoints/generator) or "
                        "a base model")
    p.add_argument("--optimizer-checkpoint", default=None, help="Optimizer start, as above")
    p.add_argument("--resume", nargs="?", const="", default=None, type=str,
                   help="resume from RUN_DIR/rl_checkpoints/latest (default: --output-dir)")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases")


def _sft_problems_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sft-problems", default=None,
                   help="problems whose reference solutions make the SFT data (default: "
                        "--problems; RL still uses --problems), e.g. "
                        "builtin:tier0,tier1:train:allshapes+builtin:breadth")


def _register_sft(subparsers) -> None:
    p = subparsers.add_parser("sft", help="supervised fine-tuning of the Generator and/or Optimizer")
    _common(p)
    _sft_problems_flag(p)
    p.add_argument("--role", choices=["generator", "optimizer", "both"], default="both",
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
    p.add_argument("--skip-sft", action="store_true", help="skip the SFT phase")
    p.add_argument("--skip-rl", action="store_true", help="skip the RL phase")
    p.add_argument("--skip-eval", action="store_true", help="skip the held-out evaluation")
    p.add_argument("--quick-test", action="store_true", help="a few-minute smoke test of every phase")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="SFT optimizer steps per role (default: the preset's)")
    p.set_defaults(handler=_run_train)


def _settings(args, **overrides):
    from multiminddev.train.pipeline import TrainSettings, default_output_dir

    resume = getattr(args, "resume", None)
    output_dir = args.output_dir
    if resume == "":  # bare --resume: the output dir
        if output_dir is None:
            fail("--resume without a path needs --output-dir (the run to resume)")
            raise SystemExit(USAGE_ERROR)
        resume = str(output_dir)
    if resume is not None and output_dir is None:
        output_dir = Path(resume)
    preset = "quick-test" if getattr(args, "quick_test", False) else args.preset
    kwargs = {
        "output_dir": output_dir or default_output_dir(), "model": args.model, "preset": preset,
        "num_gpus": args.num_gpus, "train_problems": args.train_problems,
        "heldout_problems": args.heldout_problems, "lora_rank": args.lora_rank,
        "full_finetune": args.full_finetune, "qlora": args.qlora, "seed": args.seed,
        "compiled_decoding": {"auto": None, "on": True, "off": False}[
            getattr(args, "compiled_decoding", "auto")],
        "resume": Path(resume) if resume else None,
    }
    for name in ("num_episodes", "num_steps", "batch_size", "group_size", "max_turns",
                 "max_new_tokens", "learning_rate", "generator_checkpoint", "optimizer_checkpoint",
                 "wandb", "sft_steps", "kl_reference", "sft_problems", "family_sampling",
                 "family_warm_start", "rl_roles", "rl_greedy_roles"):
        if hasattr(args, name):
            kwargs[name] = getattr(args, name)
    kwargs.update(overrides)
    try:
        return TrainSettings(**kwargs)
    except ValueError as exc:  # conflicting or out-of-range flags: a usage error, not a crash
        fail(str(exc))
        raise SystemExit(USAGE_ERROR) from exc


def check_model_inputs(settings) -> None:
    """Fail before any phase starts, with a PolicyError saying what to do, when --model or a
    role's --*-checkpoint cannot load (a mistyped path, a junk folder, an uncached hub id while
    offline): loading them comes after problems and the GPU plan, and ended in a traceback."""
    from multiminddev.policy.model import check_checkpoint, resolve_model_source

    resolve_model_source(settings.model)
    for role in ("generator", "optimizer"):
        checkpoint = getattr(settings, f"{role}_checkpoint")
        if checkpoint is not None:
            check_checkpoint(checkpoint, role)


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


def _run(settings) -> int:
    from multiminddev.policy import PolicyError
    from multiminddev.train.checkpoints import CheckpointError
    from multiminddev.train.pipeline import run_pipeline

    if (problem := folder_inputs_problem(settings.output_dir, settings.resume)) is not None:
        return fail(problem)
    try:
        check_model_inputs(settings)
        run_pipeline(settings)
    except (CheckpointError, PolicyError, ValueError) as exc:
        return fail(" ".join(str(exc).split()))
    return 0


def _run_sft(args) -> int:
    roles = ("generator", "optimizer") if args.role == "both" else (args.role,)
    return _run(_settings(args, roles=roles, skip_rl=True, skip_eval=True,
                          sft_steps=args.max_steps, sft_learning_rate=args.learning_rate))


def _run_rl(args) -> int:
    return _run(_settings(args, skip_sft=True))


def _run_train(args) -> int:
    return _run(_settings(args, skip_sft=args.skip_sft, skip_rl=args.skip_rl,
                          skip_eval=args.skip_eval))
