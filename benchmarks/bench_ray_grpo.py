"""GRPO step time with rollouts on 1 vs 2 (or more) Ray rollout workers, same recipe.

    python benchmarks/bench_ray_grpo.py --workers 1 2 --steps 3 --out ray_grpo.json
    python benchmarks/bench_ray_grpo.py --workers 1 2 --adapters shipped   # kernels evaluated too
    python benchmarks/bench_ray_grpo.py --adapters RUN/sft_checkpoints --local   # + in-process

One local Ray cluster over this machine's GPUs. For each worker count: a fresh learner (the
same model and adapters, seed and problems) on cuda:0 in this process, that many rollout
workers (Ray actors, one GPU each, each evaluating its episodes' kernels on its GPU), and
``--steps`` GRPO steps; the first ``--warmup-steps`` (compiled decoding's compiles, the
evaluators' first workers) are left out of the medians. Before its first step each variant
measures the baselines of the problems it can draw, as ``train`` does, into a baseline cache
of its own, so the variants start alike; that time is reported apart from the steps.
``--local`` adds today's in-process
trainer (no Ray) on cuda:0 as a reference. Decoding is launch-bound: a worker decodes up to
16 rows at once for about the cost of one, so the default step (8 problems x 4 episodes = 32)
gives one worker two batches per turn and two workers one each.

Prints and writes JSON: per variant the step, rollout, update and publish seconds (median of
the timed steps), the rewards (to compare results across variants), where each worker ran;
and ``speedup`` = median step time of the fewest workers / of each other count (target on
two GPUs: >= 1.6x). Every figure says the device it was measured on.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                   help="rollout worker counts to time (one GPU each)")
    p.add_argument("--local", action="store_true", help="also time the in-process trainer")
    p.add_argument("--model", default="default", help="base model (default: embedded SmolLM2)")
    p.add_argument("--adapters", default=None,
                   help="a folder with generator/ and optimizer/ adapters (e.g. an SFT run's "
                        "RUN/sft_checkpoints), or 'shipped': the package's agents with the "
                        "prompts they were trained on (the recipe's SFT stage: rollouts write "
                        "kernels that compile); default: fresh adapters (the base model writes "
                        "no kernel, so no evaluation is timed)")
    p.add_argument("--problems", default="builtin:tier0,tier1:train")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--problems-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--eval-workers", type=int, default=4, help="evaluation workers per GPU")
    p.add_argument("--compiled-decoding", choices=["on", "off"], default="on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    p.add_argument("--cpu", action="store_true",
                   help="a smoke test of this script without GPUs: CPU workers, compile-only "
                        "rewards (its times say nothing about GPUs)")
    args = p.parse_args(argv)
    if args.steps <= args.warmup_steps:
        p.error("--steps must exceed --warmup-steps (some steps must be timed)")
    return args


def policy_config(args: argparse.Namespace, device: str) -> Any:
    from multiminddev.policy import PolicyConfig
    from multiminddev.policy.model import adapter_paths_in

    shipped = shipped_or_none(args)
    adapters = (shipped.adapter_paths() if shipped is not None
                else adapter_paths_in(args.adapters) if args.adapters else {})
    return PolicyConfig(model=args.model, device=device, adapter_paths=adapters,
                        compiled_decoding=args.compiled_decoding == "on")


def shipped_or_none(args: argparse.Namespace) -> Any:
    """The package's shipped agents when ``--adapters shipped``, else None."""
    if args.adapters != "shipped":
        return None
    from multiminddev.agents.shipped import shipped_agents

    agents = shipped_agents()
    if agents is None:
        raise SystemExit("bench_ray_grpo: this installation ships no agents; pass a folder")
    return agents


def eval_config(args: argparse.Namespace, cache_dir: Path) -> Any:
    from multiminddev.env import EvalConfig

    # the quick presets' evaluation: no torch.compile baseline, brief timing; a cache of its
    # own per variant, so every variant measures the same baselines before its first step
    return EvalConfig(num_workers=args.eval_workers, num_trials=3, compile_baseline=False,
                      bench_budget_s=0.5, cache_dir=str(cache_dir))


def trainer_for(args: argparse.Namespace, out: Path, device: str, rollouts: Any = None,
                evaluator: Any = None) -> Any:
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import HFGenerationBackend, SamplingParams, load_policy
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer

    policy = load_policy(policy_config(args, device))
    cfg = GRPOConfig(num_steps=args.steps, problems_per_step=args.problems_per_step,
                     group_size=args.group_size, max_turns=args.max_turns,
                     max_new_tokens=args.max_new_tokens, eval_every=0, seed=args.seed)
    shipped = shipped_or_none(args)
    episode_config = EpisodeConfig(max_turns=cfg.max_turns, sampling=SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
        element_type=shipped is not None and shipped.element_type_line)
    backend = HFGenerationBackend(policy) if rollouts is None else None
    return GRPOTrainer(cfg, policy=policy, backend=backend, evaluator=evaluator,
                       curriculum=Curriculum.from_problems(load_problems(args.problems)),
                       episode_config=episode_config, output_dir=out, rollouts=rollouts,
                       console=progress_console())


def progress_console() -> Any:
    """Each step's line on stderr as it ends: a run cut off by a time limit still shows how far
    it got (the JSON comes only at the end)."""
    from rich.console import Console

    return Console(stderr=True)


def summarize(label: str, history: list[dict[str, Any]], warmup: int,
              extra: dict[str, Any]) -> dict[str, Any]:
    timed = history[warmup:]

    def median(key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in timed)

    step_s = [sum(v for k, v in r.items() if k.startswith("time_") and k.count("_") == 1)
              for r in history]
    return {"variant": label, "step_seconds": step_s,
            "median_step_s": statistics.median(step_s[warmup:]),
            "median_rollout_s": median("time_rollout"), "median_update_s": median("time_update"),
            "median_rollout_generate_s": median("time_rollout_generate"),
            # each worker's seconds in its episodes: the slowest one's is the rollout's
            "median_slowest_worker_s": median("time_rollout_episodes"),
            "median_fastest_worker_s": median("time_rollout_episodes_fastest"),
            "reward_mean": [r["reward_mean"] for r in history],
            "compile_rate": [r["compile_rate"] for r in history],
            "pass_rate": [r["pass_rate"] for r in history],
            "episodes_per_step": history[0]["episodes"] if history else 0, **extra}


def run_ray(args: argparse.Namespace, workers: int, out: Path, device: str) -> dict[str, Any]:
    from multiminddev.distributed.rollout import RayRollouts, RolloutLayout
    from multiminddev.env import Evaluator

    gpu = 0 if args.cpu else 1
    layout = RolloutLayout(tier="benchmark", rollout_workers=workers, gpus_per_worker=gpu,
                           worker_gpus=tuple(range(workers)) if gpu else (),
                           learner_gpu=0 if gpu else None,
                           learner_exclusive=False, evaluation="in each rollout worker")
    start = time.perf_counter()
    rollouts = RayRollouts.start(layout, policy_config(args, "auto"),
                                 functools.partial(Evaluator, eval_config(args, out / "cache")))
    started_s = time.perf_counter() - start
    try:
        import ray

        trainer = trainer_for(args, out, device, rollouts=rollouts)
        history = trainer.train()
        # kernels claimed through the workers' share, and results one worker handed another
        shared = None if rollouts.share is None else ray.get(rollouts.share.counts.remote())
        return summarize(f"ray x{workers}", history, args.warmup_steps, {
            "workers": workers, "worker_start_s": started_s, "evaluations_shared": shared,
            "baselines_before_step_1": trainer.baseline_prefetch,
            "publish_s_total": rollouts.publish_seconds, "placements": rollouts.placements})
    finally:
        rollouts.close()


def run_local(args: argparse.Namespace, out: Path, device: str) -> dict[str, Any]:
    from multiminddev.env import Evaluator

    with Evaluator(eval_config(args, out / "cache")) as evaluator:
        trainer = trainer_for(args, out, device, evaluator=evaluator)
        history = trainer.train()
    return summarize("local", history, args.warmup_steps, {
        "workers": 0, "baselines_before_step_1": trainer.baseline_prefetch})


def main(argv: list[str] | None = None) -> int:
    import ray
    import torch

    args = parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < max(args.workers) and not args.cpu:
        print(f"bench_ray_grpo: {max(args.workers)} workers need as many GPUs; this machine "
              f"has {gpus} (--cpu: a smoke test on CPU workers)", file=sys.stderr)
        return 2
    device = "cpu" if args.cpu else "cuda:0"
    name = "cpu (compile only)" if args.cpu else torch.cuda.get_device_name(0)
    ray.init(include_dashboard=False, logging_level="WARNING",
             **({"num_cpus": max(args.workers)} if args.cpu else {}))
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ray-grpo-") as tmp:
            if args.local:
                results.append(run_local(args, Path(tmp) / "local", device))
                print(json.dumps(results[-1]), flush=True)
            for n in args.workers:
                results.append(run_ray(args, n, Path(tmp) / f"ray{n}", device))
                print(json.dumps(results[-1]), flush=True)
    finally:
        ray.shutdown()
    ray_runs = [r for r in results if r["workers"]]
    base = min(ray_runs, key=lambda r: r["workers"])
    report = {
        "benchmark": "bench_ray_grpo",
        "measured_on": name if args.cpu else f"{gpus} x {name}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "variants": results,
        "speedup": {f"x{r['workers']}_vs_x{base['workers']}":
                    base["median_step_s"] / r["median_step_s"] for r in ray_runs},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
