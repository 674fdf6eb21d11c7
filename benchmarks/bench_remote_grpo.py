"""GRPO with rollouts sampled by a ``multiminddev serve`` server vs in the learner's process.

    python benchmarks/bench_remote_grpo.py --out remote_grpo.json            # one GPU
    python benchmarks/bench_remote_grpo.py --device cpu --steps 1 --warmup-steps 0 \\
        --problems-per-step 1 --group-size 2 --max-turns 1 --max-new-tokens 8   # smoke run

Starts ``python -m multiminddev.cli serve --device DEVICE --port P --adapters ...`` as a
subprocess (the same model and adapters as the learner; default: the shipped agents), then,
from the same start (a fresh learner each, the same seed and problems), ``--steps`` GRPO steps
with ``RemoteRollouts`` (episodes sampled by the server, which loads the learner's adapters
after every update) and ``--steps`` with ``LocalRollouts`` (sampled by the learner's own
model). Server and learner share the one GPU. Per variant: step, rollout and update seconds
(medians over the steps after ``--warmup-steps``), generated tokens per second, rewards; for the
remote variant also the log-prob agreement before the first update: max and mean
|server log-prob - learner log-prob| over every sampled token of the first rollout, and the
share within 0.05 (the learner recomputes them with the weights that sampled them; that
recomputation's seconds are left out of the first step's rollout time and reported apart).

Prints and writes one JSON (``--out``) with the command, device, date and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ray_grpo

AGREEMENT_TOLERANCE = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="where the server and the learner run (cpu: a smoke run, compile-only "
                        "rewards; its times say nothing about GPUs)")
    p.add_argument("--model", default="default", help="base model (default: embedded SmolLM2)")
    p.add_argument("--adapters", default=None,
                   help="a folder with generator/ and optimizer/ adapters, or 'none' for fresh "
                        "ones; default: the shipped agents")
    p.add_argument("--problems", default="builtin:tier0:train")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="first steps left out of the medians (first compiles, first workers)")
    p.add_argument("--problems-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=800,
                   help="per reply (the learning recipe's 800: a kernel needs several hundred)")
    p.add_argument("--eval-workers", type=int, default=4)
    p.add_argument("--compiled-decoding", choices=["on", "off"], default="off",
                   help="the local variant's decoding (the server decodes eagerly)")
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--server-timeout", type=float, default=600.0,
                   help="seconds to wait for the server to answer /v1/models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if args.steps <= args.warmup_steps:
        p.error("--steps must exceed --warmup-steps (some steps must be timed)")
    return args


def adapter_paths(args: argparse.Namespace) -> dict[str, str]:
    from multiminddev.agents.shipped import shipped_agents
    from multiminddev.policy.model import adapter_paths_in

    if args.adapters == "none":
        return {}
    if args.adapters is not None:
        return adapter_paths_in(args.adapters)
    shipped = shipped_agents()
    if shipped is None or shipped.model != args.model:
        raise SystemExit(f"bench_remote_grpo: no shipped agents for --model {args.model}; "
                         "give --adapters FOLDER or --adapters none")
    return shipped.adapter_paths()


def element_type_line(args: argparse.Namespace) -> bool:
    """Prompts end with the element-type line where the agents were trained on it (the shipped
    ones say so in their provenance)."""
    from multiminddev.agents.shipped import shipped_agents

    shipped = shipped_agents() if args.adapters is None else None
    return shipped is not None and shipped.element_type_line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, adapters: dict[str, str], log: Path
                 ) -> tuple[subprocess.Popen, str]:
    """``multiminddev serve`` in a subprocess; returns it and its URL once /v1/models answers."""
    from multiminddev.policy.remote import RemoteGenerationError, list_served_models

    port = args.port or free_port()
    command = [sys.executable, "-m", "multiminddev.cli", "serve", "--device", args.device,
               "--port", str(port), "--model", args.model]
    # --adapters with no value serves none; left out, the shipped ones would be served
    command += ["--adapters", *(f"{k}={v}" for k, v in adapters.items())]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.server_timeout
    while True:
        try:
            list_served_models(url, timeout_s=5.0)
            return server, url
        except RemoteGenerationError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"bench_remote_grpo: the server did not start "
                                 f"({shlex.join(command)}); its log:\n{log.read_text()[-3000:]}")
            time.sleep(1.0)


def eval_config(args: argparse.Namespace) -> Any:
    from multiminddev.env import EvalConfig

    # the quick presets' evaluation: no torch.compile baseline, brief timing
    return EvalConfig(num_workers=args.eval_workers, num_trials=3, compile_baseline=False,
                      bench_budget_s=0.5)


def trainer_for(args: argparse.Namespace, adapters: dict[str, str], out: Path, evaluator: Any,
                rollouts_for: Any = None) -> Any:
    """A fresh learner and its trainer; ``rollouts_for(policy)``: the rollout source (None:
    in-process decoding with the learner's model)."""
    from multiminddev.episode import EpisodeConfig
    from multiminddev.policy import HFGenerationBackend, PolicyConfig, SamplingParams, load_policy
    from multiminddev.tasks.curriculum import Curriculum
    from multiminddev.tasks.loaders import load_problems
    from multiminddev.train.grpo import GRPOConfig, GRPOTrainer

    policy = load_policy(PolicyConfig(model=args.model, device=args.device,
                                      adapter_paths=adapters,
                                      compiled_decoding=args.compiled_decoding == "on"))
    cfg = GRPOConfig(num_steps=args.steps, problems_per_step=args.problems_per_step,
                     group_size=args.group_size, max_turns=args.max_turns,
                     max_new_tokens=args.max_new_tokens, eval_every=0, seed=args.seed)
    episode_config = EpisodeConfig(max_turns=cfg.max_turns, sampling=SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
        element_type=element_type_line(args))
    backend = HFGenerationBackend(policy) if rollouts_for is None else None
    rollouts = None if rollouts_for is None else rollouts_for(policy, cfg)
    return GRPOTrainer(cfg, policy=policy, backend=backend, evaluator=evaluator,
                       curriculum=Curriculum.from_problems(load_problems(args.problems)),
                       episode_config=episode_config, output_dir=out, rollouts=rollouts,
                       compile_only=args.device == "cpu",
                       console=bench_ray_grpo.progress_console())


def agreement(differences: list[float]) -> dict[str, Any]:
    if not differences:
        return {"tokens": 0}
    return {"tokens": len(differences), "max_abs_diff": max(differences),
            "mean_abs_diff": statistics.fmean(differences),
            f"share_within_{AGREEMENT_TOLERANCE}": sum(
                d <= AGREEMENT_TOLERANCE for d in differences) / len(differences)}


class FirstRolloutProbe:
    """A ``RolloutSource`` that plays ``inner``'s episodes and, for the first rollout only,
    compares each sampled token's log-prob from the server with the learner's recomputation
    with the same (not yet updated) weights."""

    def __init__(self, inner: Any, policy: Any, temperature: float) -> None:
        self.inner, self.policy, self.temperature = inner, policy, temperature
        self.differences: list[float] | None = None
        self.probe_seconds = 0.0

    @property
    def tokens_generated(self) -> int:
        return self.inner.tokens_generated

    @property
    def seconds(self) -> dict[str, float]:
        return self.inner.seconds

    @property
    def version(self) -> int | None:
        return self.inner.version

    def publish(self, policy: Any, version: int) -> None:
        self.inner.publish(policy, version)

    def run_episodes(self, problems: list[Any], group_size: int, config: Any) -> list[Any]:
        episodes = self.inner.run_episodes(problems, group_size, config)
        if self.differences is None:
            start = time.perf_counter()
            self.differences = self.compare(episodes)
            self.probe_seconds = time.perf_counter() - start
        return episodes

    def compare(self, episodes: list[Any]) -> list[float]:
        import torch

        from multiminddev.agents.roles import AgentRole
        from multiminddev.policy import token_logprobs

        differences: list[float] = []
        for turn in (t for e in episodes for t in e.turns):
            role = AgentRole(turn.role)
            if not role.trainable or not turn.response_ids or role not in self.policy.roles:
                continue
            ids = torch.tensor([list(turn.prompt_ids) + list(turn.response_ids)],
                               device=self.policy.device)
            with torch.no_grad(), self.policy.use(role) as model:
                mine = token_logprobs(model, ids, torch.ones_like(ids),
                                      temperature=self.temperature)[0, len(turn.prompt_ids):]
            differences += [abs(a - b) for a, b in zip(turn.logprobs, mine.float().tolist())]
        return differences


def summarize(label: str, history: list[dict[str, Any]], warmup: int,
              extra: dict[str, Any], first_rollout_extra_s: float = 0.0) -> dict[str, Any]:
    """``bench_ray_grpo.summarize``'s figures, plus generated tokens per second and the weights
    version of each step."""
    for record in history[:1]:  # the probe's recomputation is not the rollout's
        record["time_rollout"] -= first_rollout_extra_s
    return {**bench_ray_grpo.summarize(label, history, warmup, extra),
            # generated tokens per second of the rollout (decoding and evaluation), and of its
            # sampling time (local: decoding + the log-prob pass; remote: requests in flight)
            "tokens_per_s": [r["tokens"] / max(r["time_rollout"], 1e-9) for r in history],
            "decode_tokens_per_s": [r["tokens"] / max(r.get("time_rollout_generate", 0.0)
                                                      + r.get("time_rollout_logprobs", 0.0), 1e-9)
                                    for r in history],
            "tokens": [r["tokens"] for r in history],
            "weights_version": [r.get("weights_version") for r in history]}


def run_remote(args: argparse.Namespace, adapters: dict[str, str], url: str, out: Path
               ) -> dict[str, Any]:
    from multiminddev.env import Evaluator
    from multiminddev.train.remote_rollouts import RemoteRollouts

    with Evaluator(eval_config(args)) as evaluator:
        def rollouts_for(policy: Any, cfg: Any) -> FirstRolloutProbe:
            remote = RemoteRollouts.connect(url, tokenizer=policy.tokenizer, evaluator=evaluator,
                                            output_dir=out, roles=tuple(policy.roles))
            return FirstRolloutProbe(remote, policy, cfg.temperature)

        trainer = trainer_for(args, adapters, out, evaluator, rollouts_for)
        probe = trainer.rollouts
        remote = probe.inner
        history = trainer.train()
    return summarize("remote", history, args.warmup_steps, {
        "server": url, "publish_s_total": remote.publish_seconds,
        "first_rollout_probe_s": probe.probe_seconds,
        "logprob_agreement_before_update": agreement(probe.differences or [])},
        first_rollout_extra_s=probe.probe_seconds)


def run_local(args: argparse.Namespace, adapters: dict[str, str], out: Path) -> dict[str, Any]:
    from multiminddev.env import Evaluator

    with Evaluator(eval_config(args)) as evaluator:
        trainer = trainer_for(args, adapters, out, evaluator)
        history = trainer.train()
    return summarize("local", history, args.warmup_steps, {})


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).resolve().parent,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_remote_grpo: no CUDA GPU here (--device cpu: a smoke run)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (compile only)"
    adapters = adapter_paths(args)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-remote-grpo-") as tmp:
        server, url = start_server(args, adapters, Path(tmp) / "server.log")
        print(f"server up at {url}; remote variant ...", file=sys.stderr, flush=True)
        try:
            results.append(run_remote(args, adapters, url, Path(tmp) / "remote"))
            print(json.dumps(results[-1]), flush=True)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        print("in-process variant ...", file=sys.stderr, flush=True)
        results.append(run_local(args, adapters, Path(tmp) / "local"))
        print(json.dumps(results[-1]), flush=True)
    report = {
        "benchmark": "bench_remote_grpo",
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None
        else shlex.join(["bench_remote_grpo.py", *argv]),
        "measured_on": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(), "adapters": adapters or "fresh",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "variants": results,
        "rollout_speedup_remote_vs_local":
            results[1]["median_rollout_s"] / max(results[0]["median_rollout_s"], 1e-9),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
