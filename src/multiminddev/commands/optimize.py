"""``multiminddev optimize PROBLEM.py``: one Generator -> Tester -> Optimizer episode.

Prints the best verified kernel and its speedup; on a machine without a GPU, the best
compiling kernel marked "compile-only: not verified".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from multiminddev.agents.shipped import shipped_agents
from multiminddev.commands._io import (
    NON_NEGATIVE_FLOAT,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    ExitCode,
    InputError,
    bounded_number,
    dir_problem,
    fail,
    read_text,
)
from multiminddev.commands._progress import ProgressBackend, ProgressEvaluator
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode import episode_to_dict, run_episodes
from multiminddev.episode.runner import outcome_line, single_episode_config
from multiminddev.episode.state import write_episodes_jsonl
from multiminddev.policy import (
    HFGenerationBackend,
    PolicyConfig,
    PolicyError,
    SamplingParams,
    adapter_paths_in,
    load_policy,
)
from multiminddev.policy.model import resolve_model_source
from multiminddev.tasks.loaders import load_problems
from multiminddev.tasks.problem import ProblemError, load_problem


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "optimize",
        help="run one multi-turn episode on a problem file and print the best kernel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("problem", type=Path,
                   help="KernelBench-format problem file, or a built-in problem spec such as "
                        "builtin:tier0:heldout:relu (the first problem it gives)")
    p.add_argument("--model", default="default",
                   help="'default' (embedded SmolLM2-135M GGUF), hub id, local dir or .gguf file")
    p.add_argument("--adapters", type=Path, default=None,
                   help="folder with generator/ and optimizer/ adapters (e.g. a checkpoint); "
                        "default: the agents the package ships, if any, on their model; "
                        "'none': the model alone")
    p.add_argument("--turns", type=POSITIVE_INT, default=5,
                   help="Generator/Optimizer turns (default 5)")
    p.add_argument("--temperature", type=NON_NEGATIVE_FLOAT, default=0.7,
                   help="sampling temperature (default 0.7)")
    p.add_argument("--top-p", type=bounded_number(float, above=0.0, maximum=1.0), default=0.95,
                   help="nucleus sampling p (default 0.95)")
    p.add_argument("--max-new-tokens", type=POSITIVE_INT, default=1024,
                   help="tokens per agent reply (default 1024)")
    p.add_argument("--target-speedup", type=NON_NEGATIVE_FLOAT, default=2.0,
                   help="stop once a verified kernel is this much faster than eager "
                        "(default 2; 0: never)")
    p.add_argument("--patience", type=NON_NEGATIVE_INT, default=2,
                   help="stop after this many turns without a better kernel (default 2; 0: never)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--device", default="auto",
                   help="where the model runs: auto (cuda if available), cuda, cpu")
    p.add_argument("--profile-feedback", action="store_true",
                   help="the Tester's report on a verified kernel adds its Nsight Compute "
                        "figures (needs ncu and a GPU; seconds per kernel)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--save", type=Path, default=None, help="append the episode to this JSONL")
    p.add_argument("--json", action="store_true", help="print the whole episode as JSON")
    p.set_defaults(handler=run)


def no_adapters(value: Path | None) -> bool:
    """``--adapters none``: the model alone, without the shipped agents."""
    return value is not None and str(value).lower() == "none"


def default_agents(model: str, adapters: Path | None, shipped: Any) -> Any:
    """The shipped agents (``agents.shipped.ShippedAgents``) when the command uses them: no
    ``--adapters`` given and ``--model`` is the model they were trained on; else None."""
    if adapters is not None or shipped is None or model != shipped.model:
        return None
    return shipped


def _policy_config(args: argparse.Namespace, shipped: Any = None) -> Any:
    """The policy of the run: ``--adapters`` (a folder, or ``none``), else ``shipped``'s
    adapters where ``default_agents`` takes them."""
    chosen = default_agents(args.model, args.adapters, shipped)
    if chosen is not None:
        return PolicyConfig(model=args.model, device=args.device,
                            adapter_paths=chosen.adapter_paths())
    adapters = (adapter_paths_in(args.adapters)
                if args.adapters and not no_adapters(args.adapters) else {})
    separate = bool(adapters) and all(
        not (Path(p) / "adapter_config.json").exists() for p in adapters.values())
    return PolicyConfig(model=args.model, device=args.device, adapter_paths=adapters,
                        separate_models=separate)


BUILTIN_PREFIX = "builtin:"


def builtin_problem(spec: str, quiet: bool) -> Any:
    """The first problem a built-in spec gives (``problems list`` shows the names)."""
    problems = load_problems(spec)
    if not problems:
        raise InputError(f"{spec} gives no problem; `multiminddev problems list` shows them")
    if len(problems) > 1:
        progress(f"problem: {problems[0].name} (the first of {len(problems)} that {spec} gives)",
                 quiet)
    return problems[0]


def run(args: argparse.Namespace) -> int:
    try:
        builtin = str(args.problem).startswith(BUILTIN_PREFIX)
        if not builtin:
            read_text(args.problem, "problem file")
        if (args.adapters is not None and not no_adapters(args.adapters)
                and (problem := dir_problem(args.adapters, "checkpoint folder"))):
            raise InputError(problem)
        if args.save is not None and args.save.is_dir():
            raise InputError(f"--save {args.save} is a directory; give a JSONL file")
        problem = builtin_problem(str(args.problem), args.quiet) if builtin else load_problem(
            args.problem)
        shipped = default_agents(args.model, args.adapters,
                                 None if args.adapters is not None else shipped_agents())
        config = _policy_config(args, shipped)
        if shipped is not None:
            progress(f"agents: the shipped adapters ({shipped.root}; --adapters none for the "
                     "model alone)", args.quiet)
        # The sampling settings are checked by their own config before the model loads.
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                  max_new_tokens=args.max_new_tokens, seed=args.seed)
        resolve_model_source(config.model)  # a bad --model fails here, before anything loads
    except (InputError, ProblemError, ValueError) as exc:
        return fail(str(exc))
    except PolicyError as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE)
    try:
        progress(f"loading model {config.model!r} ...", args.quiet)
        policy = load_policy(config)
    except PolicyError as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE)
    except ValueError as exc:  # a setting the model refuses (e.g. --device)
        return fail(str(exc))
    config = dataclasses.replace(
        single_episode_config(turns=args.turns, sampling=sampling,
                              target_speedup=args.target_speedup, patience=args.patience,
                              context_window=policy.context_window),
        # agents trained on prompts with the element-type line get it at inference too
        element_type=shipped is not None and shipped.element_type_line,
        profiler_feedback=args.profile_feedback)
    backend: Any = HFGenerationBackend(policy)
    with Evaluator(EvalConfig()) as evaluator:
        judge: Any = evaluator
        if not args.quiet:
            backend, judge = ProgressBackend(backend), ProgressEvaluator(evaluator)
        episode = run_episodes([problem], backend, judge, config)[0]
    if args.save:
        write_episodes_jsonl([episode], args.save, append=True)
    if args.json:
        print(json.dumps(episode_to_dict(episode), indent=2))
    else:
        print(describe(episode))
    return episode_exit_code(episode)


def episode_exit_code(episode: Any) -> ExitCode:
    """OK for a verified best kernel; UNAVAILABLE for one that compiles where no GPU could
    verify it; EVALUATION_FAILED where no kernel got that far."""
    if episode.verified:
        return ExitCode.OK
    result = episode.best_result
    if result is not None and result.compiled and episode.compile_only:
        return ExitCode.UNAVAILABLE
    return ExitCode.EVALUATION_FAILED


def describe(episode: Any) -> str:
    """Human summary: turns, then the best kernel (verified or compile-only)."""
    lines = [f"problem {episode.problem.name}: {len(episode.turns)} turn(s), "
             f"ended: {episode.status.value}"]
    lines += [f"  {outcome_line(t)}" for t in episode.turns]
    result = episode.best_result
    if episode.verified:
        lines.append(f"best kernel (turn {episode.best_turn + 1}): verified, "
                     f"{result.benchmark.speedup_vs_eager:.2f}x vs eager PyTorch "
                     f"on {result.device or result.benchmark.gpu_name}")
    elif result is not None and result.compiled and episode.compile_only:
        lines.append(f"best kernel (turn {episode.best_turn + 1}): compiles; "
                     "compile-only: not verified (no GPU on this machine)")
    elif result is not None and result.compiled:
        lines.append(f"no verified kernel; best attempt (turn {episode.best_turn + 1}) "
                     f"compiled but ended {result.status.value}: {result.message}")
    else:
        lines.append("no kernel compiled")
        return "\n".join(lines)
    lines += ["", episode.best_source or ""]
    return "\n".join(lines)


def progress(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)
