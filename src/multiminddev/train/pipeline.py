"""The ``train`` pipeline: SFT -> GRPO -> held-out evaluation, writing one folder per agent and phase.

```
<output_dir>/                    default runs/<timestamp>
  run_config.json                every setting, and the commands that resume and replay the run
  sft_checkpoints/{generator,optimizer}/
  rl_checkpoints/{latest,best_model_episode_N,final_model}/
  metrics.jsonl  eval_metrics.jsonl  tensorboard/  episodes.jsonl
  eval_results.json              the final held-out evaluation
```

On a machine without a GPU every phase still runs, but kernels are only compiled: rewards are
compile-only, which is printed at the start and the end and recorded in every metrics record.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.agents.prompts import generator_messages, optimizer_messages
from multiminddev.agents.roles import AgentRole
from multiminddev.agents.shipped import shipped_agents
from multiminddev.env import EvalConfig, Evaluator
from multiminddev.episode import EpisodeConfig, write_episodes_jsonl
from multiminddev.episode.infra import check_episodes
from multiminddev.policy import (
    HFGenerationBackend,
    LogprobSource,
    PolicyConfig,
    SamplingParams,
    load_policy,
)
from multiminddev.policy.remote import api_url
from multiminddev.tasks.curriculum import Curriculum, CurriculumConfig, load_family_counts
from multiminddev.tasks.loaders import load_problems
from multiminddev.train import selection
from multiminddev.train.checkpoints import SFT_DIR, CheckpointError, find_latest
from multiminddev.train.config_files import (
    RUN_CONFIG_FILE,
    settings_record,
    write_json_atomically,
)
from multiminddev.train.episode_stream import run_logged_episodes, stream_episodes
from multiminddev.train.metrics import (
    COMPILE_ONLY_NOTE,
    MetricsConfig,
    MetricsLogger,
    progress_bar,
    rollout_metrics,
)
from multiminddev.train.planner import detect_gpus, plan_gpus, render_plan
from multiminddev.train.presets import Preset, RunSize, run_size
from multiminddev.train.sakana_sft import load_sakana_sft_data, sakana_sft_path
from multiminddev.train.selection import selection_sample
from multiminddev.train.sft import SFTConfig, run_sft, tokenize_chat
from multiminddev.train.sft_data import build_sft_dataset, sft_examples

AGENT_ROLES = (AgentRole.GENERATOR, AgentRole.OPTIMIZER)


def default_output_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


@dataclass(kw_only=True)
class TrainSettings:
    """Everything ``sft``, ``rl`` and ``train`` need; None fields come from the preset."""

    output_dir: Path = field(default_factory=default_output_dir)
    model: str = "default"
    preset: Preset = Preset.FULL
    roles: tuple[AgentRole, ...] = AGENT_ROLES
    skip_sft: bool = False
    skip_rl: bool = False
    skip_eval: bool = False
    resume: Path | None = None
    num_gpus: int | None = None
    generator_checkpoint: str | None = None
    optimizer_checkpoint: str | None = None
    train_problems: str | None = None
    heldout_problems: str | None = None
    sft_problems: str | None = None  # the SFT data's problems; None: the training problems
    # Extra Generator SFT data: "sakana:PATH", the AI CUDA Engineer archive's correct kernels
    # (train/sakana_sft.py), in addition to the reference solutions of sft_problems.
    sft_data: str | None = None
    num_steps: int | None = None
    num_episodes: int | None = None  # total RL episodes; sets num_steps
    batch_size: int | None = None  # problems per RL step
    group_size: int | None = None
    max_turns: int | None = None
    max_new_tokens: int | None = None
    learning_rate: float | None = None
    kl_reference: str = "base"  # GRPO's KL reference: "base" (pre-trained) or "start" (after SFT)
    # how GRPO draws a tier's problems: "uniform" or "signal" (CurriculumConfig.family_sampling)
    family_sampling: str = "uniform"
    # an earlier run's family counts the signal sampler's windows start from (analyze_rollouts.py
    # --family-counts-out); None: empty windows, every family at 0.25 until its episodes come in
    family_warm_start: Path | None = None
    sft_steps: int | None = None
    sft_learning_rate: float | None = None
    full_finetune: bool = False
    qlora: bool = False  # 4-bit base + LoRA adapters (needs a CUDA GPU and bitsandbytes)
    lora_rank: int = 16
    compiled_decoding: bool | None = None  # None: the preset's RunSize.compiled_decoding
    wandb: bool = False
    seed: int = 0
    roles_sft_done: tuple[AgentRole, ...] = ()  # set when resuming a run that stopped in SFT
    # The agents GRPO updates; None: every agent in `roles`. Training the Optimizer alone after
    # SFT of both is the recipe that raised held-out reward (docs/training.md).
    rl_roles: tuple[AgentRole, ...] | None = None
    # Agents that decode greedily in GRPO's rollouts and the final evaluation
    # (EpisodeConfig.temperature_by_role = 0). With the Generator greedy, every Optimizer turn of
    # a group is handed the same kernel, so the group's reward differences are the Optimizer's own.
    rl_greedy_roles: tuple[AgentRole, ...] = ()
    # --- SFT data and SFT (docs/training.md, "SFT")
    sft_operation_line: bool = False  # both agents' replies start with the operation's line
    sft_strip_comments: bool = False  # the Optimizer's targets without whole-line comments
    # every prompt (SFT and episodes) ends with the kernels' pointer type (float*, __half*)
    element_type_line: bool = False
    sft_batch_size: int | None = None  # None: the preset's
    sft_grad_accum: int = 1  # micro-batches per SFT optimizer step (memory, not maths)
    sft_max_seq_length: int | None = None  # None: the preset's
    # --- GRPO (GRPOConfig fields; docs/training.md, "GRPO")
    rl_temperature: float = 1.0  # the trained agents' rollout sampling temperature
    kl_coef: float = 0.02
    normalize_std: bool = True  # False: Dr.GRPO, advantages not divided by the group's std
    mini_batch_size: int | None = None  # agent turns per optimizer step; None: the preset's
    grad_accum: int = 1  # micro-batches per GRPO optimizer step (memory, not maths)
    sft_anchor: float = 0.0  # GRPOConfig.sft_coef: SFT's loss on the SFT data in each step
    sft_anchor_problems: str | None = None  # the anchor's problems; None: the SFT problems
    curriculum_start_tier: int | None = None  # GRPO's first tier; None: the lowest
    review_fraction: float = 0.2  # share of a step's problems drawn from earlier tiers
    rl_eval_every: int | None = None  # held-out evaluations during GRPO; 0: none, None: preset's
    generator_max_new_tokens: int | None = None  # the Generator's cap; None: see episode_config
    # the Tester's report on a verified kernel adds its Nsight Compute figures (env/profile.py)
    profiler_feedback: bool = False
    generation_batch_size: int = 16  # sequences decoded together (HFGenerationBackend)
    # GRPO's rollouts sampled by this OpenAI-compatible server (multiminddev serve, or vLLM
    # with --enable-lora) at http(s)://HOST:PORT; the learner keeps the model for the update and
    # publishes its adapters to the server after each (train/remote_rollouts.py). None: here.
    rollout_server: str | None = None
    # --- held-out evaluation (and early stopping's select@ evaluations)
    eval_after_sft: bool = False  # also evaluate the SFT agents (sft_eval_results.json)
    eval_temperature: float | None = None  # None: the rollouts' sampling; 0: greedy
    eval_dtype: str = "same"  # "float32": decode from a float32 copy of the weights
    eval_compiled_decoding: bool | None = None  # None: as in training
    eval_workers: int | None = None  # evaluator processes; None: the preset's
    eval_quick_timing: bool | None = None  # 3 trials, no torch.compile baseline; None: preset
    # --- early stopping: evaluate the agents on problems neither SFT nor GRPO trained on
    # after SFT and every select_every steps; keep the best step's agents (train/selection.py)
    select_problems: str | None = None
    select_count: int = 16
    select_also: str | None = None  # a second spec joined to the sample
    select_also_count: int = 6
    select_every: int = 4
    select_min_gain: float = 0.01  # a later step must beat the chosen one by more than this

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        if self.resume is not None:
            self.resume = Path(self.resume)
        self.preset = Preset(self.preset)
        self.roles = tuple(AgentRole(r) for r in self.roles)
        if not self.roles or any(not r.trainable for r in self.roles):
            raise ValueError("roles: generator and/or optimizer (the Tester is rule-based)")
        if self.num_steps is not None and self.num_episodes is not None:
            raise ValueError("give --num-episodes or a step count, not both")
        for name in ("num_steps", "num_episodes", "batch_size", "max_turns", "max_new_tokens",
                     "sft_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.kl_reference not in ("base", "start"):  # checked here, not after SFT has run
            raise ValueError(f"kl_reference={self.kl_reference!r}: use 'base' or 'start'")
        if self.family_sampling not in ("uniform", "signal"):
            raise ValueError(f"family_sampling={self.family_sampling!r}: use 'uniform' or 'signal'")
        if self.family_warm_start is not None:
            if self.family_sampling != "signal":
                raise ValueError("--family-warm-start starts the windows that --family-sampling "
                                 "signal weighs families by: give --family-sampling signal too")
            self.family_warm_start = Path(self.family_warm_start)
            load_family_counts(self.family_warm_start)  # a bad file stops the run before SFT
        if self.rl_roles is not None:
            self.rl_roles = tuple(AgentRole(r) for r in self.rl_roles)
            if not self.rl_roles or any(r not in self.roles for r in self.rl_roles):
                raise ValueError(f"--rl-roles {' '.join(r.value for r in self.rl_roles)}: GRPO "
                                 f"can train only agents the run has "
                                 f"({' '.join(r.value for r in self.roles)})")
        self.rl_greedy_roles = tuple(AgentRole(r) for r in self.rl_greedy_roles)
        trained = set(self.rl_roles or self.roles)
        if trained & set(self.rl_greedy_roles):
            raise ValueError(f"--rl-greedy-roles {' '.join(r.value for r in self.rl_greedy_roles)}"
                             f": GRPO trains {' '.join(sorted(r.value for r in trained))} on "
                             "sampled turns; only an agent it does not train can decode "
                             "greedily (e.g. --rl-roles optimizer --rl-greedy-roles generator)")
        if self.sft_data is not None:
            sakana_sft_path(self.sft_data)  # a bad spec or path stops the run before it starts
        if self.qlora and self.full_finetune:
            raise ValueError("--qlora trains adapters on a 4-bit base; it excludes --full-finetune")
        if self.group_size is not None and self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares episodes), got {self.group_size}")
        self._check_new_knobs()

    def _check_new_knobs(self) -> None:
        for name in ("sft_batch_size", "sft_max_seq_length", "mini_batch_size", "eval_workers",
                     "generator_max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("sft_grad_accum", "grad_accum", "select_count", "select_also_count",
                     "select_every", "generation_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rl_temperature <= 0:
            raise ValueError(f"rl_temperature must be > 0 (GRPO samples), got {self.rl_temperature}")
        if self.eval_temperature is not None and self.eval_temperature < 0:
            raise ValueError(f"eval_temperature must be >= 0 (0: greedy), got "
                             f"{self.eval_temperature}")
        for name in ("kl_coef", "sft_anchor", "select_min_gain"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.review_fraction < 1:
            raise ValueError(f"review_fraction must be in [0, 1), got {self.review_fraction}")
        if self.rl_eval_every is not None and self.rl_eval_every < 0:
            raise ValueError(f"rl_eval_every must be >= 0 (0: none), got {self.rl_eval_every}")
        if self.eval_dtype not in ("same", "float32"):
            raise ValueError(f"eval_dtype={self.eval_dtype!r}: use 'same' or 'float32'")
        if self.eval_dtype != "same" and self.full_finetune:
            raise ValueError("eval_dtype float32 decodes from a float32 copy of the adapters' "
                             "base; with --full-finetune keep eval_dtype same")
        if self.sft_anchor_problems is not None and not self.sft_anchor:
            raise ValueError("sft_anchor_problems chooses the problems of the SFT anchor: give "
                             "sft_anchor > 0 too (e.g. --set sft_anchor=0.1)")
        if self.rollout_server is not None:
            api_url(self.rollout_server)  # a malformed URL stops the run before it starts
            if self.full_finetune:
                raise ValueError("--rollout-server loads LoRA adapters on the server; it "
                                 "excludes --full-finetune")
        if self.select_also is not None and self.select_problems is None:
            raise ValueError("select_also adds to the select_problems sample: give "
                             "select_problems too")


@dataclass(kw_only=True)
class PipelineResult:
    output_dir: Path
    compile_only: bool
    sft: dict[str, Any] = field(default_factory=dict)
    rl_steps: int = 0
    final_model: Path | None = None
    evaluation: dict[str, Any] | None = None
    sft_evaluation: dict[str, Any] | None = None  # eval_after_sft's
    seconds: float = 0.0


class Context:
    """What the phases share: console, sizes, plan, policy, problems."""

    def __init__(self, settings: TrainSettings, console: Any) -> None:
        import torch

        self.settings = settings
        self.console = console
        self.gpu = torch.cuda.is_available()
        self.compile_only = not self.gpu
        self.size: RunSize = run_size(settings.preset, gpu=self.gpu)
        self.plan = None
        self.policy = None
        self.train_problems: list[Any] = []
        self.sft_problems: list[Any] = []  # SFT data only; GRPO draws from train_problems
        self.heldout: list[Any] = []
        self.sakana_sft: Any = None  # SakanaSFTData from --sft-data, read before the model loads
        # Scale-out hooks (distributed.grpo.RayScaleOut): the GPUs to plan over, the learner's
        # device in that plan, and GRPO's rollout source; None: this process does everything.
        self.scale_out: Any = None
        self.evaluator: Any = None  # the pipeline's evaluator, once started


# --------------------------------------------------------------------------- setup

def banner(ctx: Context, where: str) -> None:
    if ctx.compile_only:
        ctx.console.print(f"[bold yellow]{where}: {COMPILE_ONLY_NOTE}[/bold yellow] - no GPU here, so "
                          "kernels are compiled but never run: correctness and speed are unknown "
                          "and the reward is the compile credit only.")


def load_problems_for(ctx: Context) -> None:
    s = ctx.settings
    ctx.train_problems = load_problems(s.train_problems or ctx.size.train_problems)
    ctx.sft_problems = load_problems(s.sft_problems) if s.sft_problems else ctx.train_problems
    ctx.heldout = load_problems(s.heldout_problems or ctx.size.heldout_problems)
    sft = f", {len(ctx.sft_problems)} for SFT data" if s.sft_problems else ""
    ctx.console.print(f"problems: {len(ctx.train_problems)} train{sft}, "
                      f"{len(ctx.heldout)} held-out")
    if s.sft_data is not None and not s.skip_sft and AgentRole.GENERATOR in s.roles:
        ctx.sakana_sft = load_sakana_sft_data(s.sft_data)
        ctx.console.print(ctx.sakana_sft.summary())


def policy_config(ctx: Context, device: str) -> Any:
    s = ctx.settings
    adapters: dict[str, str] = {}
    model = s.model
    for role, ckpt in ((AgentRole.GENERATOR, s.generator_checkpoint),
                       (AgentRole.OPTIMIZER, s.optimizer_checkpoint)):
        if ckpt is None or role not in s.roles:
            continue
        kind, value = resolve_checkpoint(ckpt, role)
        if kind == "adapter":
            adapters[role.value] = value
        elif model in ("default", value):
            model = value
        else:
            raise ValueError(f"--{role.value}-checkpoint {ckpt} is a base model different from "
                             f"--model {model}: agents share one base; pass an adapter directory "
                             f"or the same model")
    return PolicyConfig(model=model, device=device, agents=s.roles, adapter_paths=adapters,
                        lora_rank=s.lora_rank, lora_alpha=2 * s.lora_rank,
                        separate_models=s.full_finetune, load_in_4bit=s.qlora,
                        compiled_decoding=(ctx.size.compiled_decoding if s.compiled_decoding is None
                                           else s.compiled_decoding))


SHIPPED_CHECKPOINT = "shipped"  # --generator-checkpoint shipped: the package's agent of that role


def resolve_checkpoint(ckpt: str, role: AgentRole) -> tuple[str, str]:
    """("adapter", dir) for a LoRA/SFT checkpoint directory or ``shipped`` (the agents this
    package ships, unless a folder of that name exists here), else ("model", id-or-path)."""
    path = Path(ckpt)
    if ckpt == SHIPPED_CHECKPOINT and not path.exists():
        agents = shipped_agents()
        if agents is None:
            raise ValueError(f"--{role.value}-checkpoint shipped: this installation ships no "
                             "agents; pass an adapter directory (e.g. RUN/sft_checkpoints)")
        return "adapter", str(agents.adapters[role])
    for candidate in (path, path / role.value, path / "sft_checkpoints" / role.value):
        if (candidate / "adapter_config.json").exists():
            return "adapter", str(candidate)
    return "model", ckpt


def plan_and_load(ctx: Context) -> None:
    s = ctx.settings
    cfg = policy_config(ctx, "cpu")
    params = _model_params_hint(cfg.model)
    gpus = detect_gpus() if ctx.scale_out is None else ctx.scale_out.gpus()
    ctx.plan = plan_gpus(gpus, params, num_gpus=s.num_gpus)
    render_plan(ctx.plan, ctx.console)
    if not ctx.plan.fits:
        ctx.console.print("[red]the plan does not fit in GPU memory; see the notes above[/red]")
    device = ctx.plan.policy_device if ctx.scale_out is None else ctx.scale_out.place(ctx)
    cfg = dataclasses.replace(cfg, device=device)
    ctx.console.print(f"loading model {cfg.model!r} on {cfg.device} ...")
    ctx.policy = load_policy(cfg)


def _model_params_hint(model: str) -> int:
    """Parameter count for the planner before loading (135M for the embedded model)."""
    if model == "default" or "135m" in model.lower():
        return 135_000_000
    for tag, n in (("360m", 360e6), ("0.5b", 0.5e9), ("1.5b", 1.5e9), ("1.7b", 1.7e9),
                   ("3b", 3e9), ("7b", 7e9), ("8b", 8e9), ("14b", 14e9)):
        if tag in model.lower():
            return int(n)
    return 1_500_000_000  # a Qwen2.5-Coder-1.5B-sized model


# --------------------------------------------------------------------------- phases

def sft_phase(ctx: Context) -> dict[str, Any]:
    s, size = ctx.settings, ctx.size
    cfg = SFTConfig(output_dir=s.output_dir, max_steps=s.sft_steps or size.sft_max_steps,
                    batch_size=s.sft_batch_size or size.sft_batch_size,
                    grad_accum=s.sft_grad_accum,
                    max_seq_length=s.sft_max_seq_length or size.sft_max_seq_length,
                    learning_rate=s.sft_learning_rate or size.sft_learning_rate,
                    full_finetune=s.full_finetune, loss_eval_examples=size.sft_loss_examples,
                    logging_steps=max(1, (s.sft_steps or size.sft_max_steps) // 4), seed=s.seed)
    out = {}
    for role in s.roles:
        if role in s.roles_sft_done:
            ctx.console.print(f"SFT {role.value}: already done (resumed), skipping")
            continue
        extra = (ctx.sakana_sft.examples
                 if ctx.sakana_sft is not None and role is AgentRole.GENERATOR else ())
        dataset = build_sft_dataset(role, ctx.sft_problems, seed=s.seed, extra_examples=extra,
                                    **sft_example_options(ctx, role))
        ctx.console.rule(f"SFT {role.value}: {len(dataset)} examples, {cfg.max_steps} steps")
        result = run_sft(role, ctx.policy.config, dataset, cfg, policy=ctx.policy)
        ctx.console.print(f"SFT {role.value}: loss {result.loss_before:.3f} -> "
                          f"{result.loss_after:.3f} in {result.seconds:.0f}s -> {result.output_dir}")
        out[role.value] = {"status": result.status.value, "loss_before": result.loss_before,
                           "loss_after": result.loss_after, "steps": result.steps,
                           "examples": result.num_examples, "seconds": result.seconds,
                           "output_dir": str(result.output_dir)}
        write_sft_results(s.output_dir, out)  # after each role: a cut run keeps what finished
    return out


SFT_RESULTS_FILE = "sft_results.json"  # per agent: loss before and after, steps, examples


def write_sft_results(output_dir: Path, results: dict[str, Any]) -> None:
    """``sft_results.json``: the SFT results of this run's agents, joined to those an earlier
    part of the run (before a resume) recorded."""
    path = Path(output_dir) / SFT_RESULTS_FILE
    try:
        earlier = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        earlier = {}
    write_json_atomically(path, {**earlier, **results})


def sft_example_options(ctx: Context, role: AgentRole) -> dict[str, Any]:
    """``build_sft_dataset``'s options for ``role``: the preset's Generator variants, the
    operation line, comment-free Optimizer targets, and prompts with the element-type line, as
    the episodes' prompts have it (training sees what inference sees)."""
    import functools

    s = ctx.settings
    if role is AgentRole.GENERATOR:
        out: dict[str, Any] = {"variants": tuple(ctx.size.generator_variants),
                               "prompt": functools.partial(generator_messages,
                                                           element_type=s.element_type_line)}
    else:
        out = {"prompt": functools.partial(optimizer_messages, element_type=s.element_type_line)}
        if s.sft_strip_comments:
            out["strip_comments"] = True
    if s.sft_operation_line:
        out["operation_line"] = True
    return out


def sft_anchor_examples(ctx: Context, roles: Any) -> dict[AgentRole, list[Any]] | None:
    """GRPO's SFT anchor (``sft_anchor`` > 0): per trained role, its SFT data tokenized as SFT
    tokenizes it; None when the anchor is off."""
    s = ctx.settings
    if not s.sft_anchor:
        return None
    problems = (load_problems(s.sft_anchor_problems) if s.sft_anchor_problems
                else ctx.sft_problems)
    max_len = s.sft_max_seq_length or ctx.size.sft_max_seq_length
    return {role: [tokenize_chat(ctx.policy.tokenizer, e.messages, max_len)
                   for e in sft_examples(role, problems, **sft_example_options(ctx, role))]
            for role in roles}


def eval_config(ctx: Context) -> Any:
    # Short runs skip the torch.compile baseline (tens of seconds per problem) and time briefly.
    s = ctx.settings
    quick = s.preset is not Preset.FULL if s.eval_quick_timing is None else s.eval_quick_timing
    return EvalConfig(num_workers=s.eval_workers or ctx.size.eval_workers,
                      num_trials=3 if quick else 5,
                      compile_baseline=not quick, bench_budget_s=0.5 if quick else 2.0)


def episode_config(ctx: Context, grpo: Any) -> Any:
    # generator_max_new_tokens caps the Generator; otherwise an explicit --max-new-tokens
    # applies to every role, and without it the preset's Generator cap holds.
    s = ctx.settings
    cap = s.generator_max_new_tokens or (None if s.max_new_tokens
                                         else ctx.size.generator_max_new_tokens)
    greedy = dict.fromkeys((r.value for r in s.rl_greedy_roles), 0.0)
    return EpisodeConfig(max_turns=grpo.max_turns, reward=None,
                         max_new_tokens_by_role={"generator": cap} if cap else {},
                         temperature_by_role=greedy, element_type=s.element_type_line,
                         profiler_feedback=s.profiler_feedback,
                         sampling=SamplingParams(temperature=grpo.temperature, top_p=grpo.top_p,
                                                 max_new_tokens=grpo.max_new_tokens))


def heldout_episode_config(ctx: Context, grpo: Any) -> Any:
    """The held-out (and select@) evaluations' episodes: the rollouts' settings, every agent
    decoding at ``eval_temperature`` where it is given (0: greedy)."""
    s = ctx.settings
    cfg = episode_config(ctx, grpo)
    if s.eval_temperature is None:
        return cfg
    return dataclasses.replace(cfg, temperature_by_role={},
                               sampling=dataclasses.replace(cfg.sampling,
                                                            temperature=s.eval_temperature))


def evaluation_decoding(ctx: Context) -> dict[str, Any]:
    """The generation backend settings of evaluations (``HFGenerationBackend``'s keywords):
    nothing is trained, so the sampler's own log-probs spare the recomputation pass;
    ``eval_dtype`` float32 decodes from a float32 copy of the weights,
    ``eval_compiled_decoding`` overrides the training's decoding."""
    import torch

    s = ctx.settings
    return {"logprob_source": LogprobSource.SAMPLER, "max_batch_size": s.generation_batch_size,
            "compiled_decoding": s.eval_compiled_decoding,
            "sampling_dtype": None if s.eval_dtype == "same" else getattr(torch, s.eval_dtype)}


def evaluation_backend(ctx: Context) -> Any:
    """The generation backend of evaluations in this process (``evaluation_decoding``)."""
    return HFGenerationBackend(ctx.policy, **evaluation_decoding(ctx))


def grpo_config(ctx: Context) -> Any:
    # train.grpo imports torch (through rl/); the settings above are read by `train --help`
    # and config checks, which must not load it, so grpo is imported where a run needs it.
    from multiminddev.train.grpo import GRPOConfig

    s, size = ctx.settings, ctx.size
    problems = s.batch_size or size.problems_per_step
    group = s.group_size or size.group_size
    steps = s.num_steps or size.rl_steps
    if s.num_episodes is not None:
        steps = -(-s.num_episodes // (problems * group))
    return GRPOConfig(num_steps=steps, problems_per_step=problems, group_size=group,
                      max_turns=s.max_turns or size.max_turns,
                      max_new_tokens=s.max_new_tokens or size.max_new_tokens,
                      learning_rate=s.learning_rate or size.learning_rate,
                      mini_batch_size=s.mini_batch_size or size.mini_batch_size,
                      grad_accum=s.grad_accum,
                      eval_every=size.eval_every if s.rl_eval_every is None else s.rl_eval_every,
                      eval_problems=max(1, size.eval_problems), temperature=s.rl_temperature,
                      kl_coef=s.kl_coef, normalize_std=s.normalize_std, sft_coef=s.sft_anchor,
                      kl_reference=s.kl_reference, train_roles=s.rl_roles or s.roles,
                      seed=s.seed)


def curriculum_config(ctx: Context) -> Any:
    """GRPO's problem sampler settings: CurriculumConfig's defaults and the run's flags."""
    s = ctx.settings
    return CurriculumConfig(family_sampling=s.family_sampling,
                            start_tier=s.curriculum_start_tier,
                            review_fraction=s.review_fraction)


def grpo_curriculum(ctx: Context) -> Any:
    """GRPO's problem sampler over the training problems, its family windows started from
    --family-warm-start's counts if given (a resumed run's checkpoint replaces them)."""
    curriculum = Curriculum.from_problems(ctx.train_problems, curriculum_config(ctx))
    if ctx.settings.family_warm_start is not None:
        curriculum.warm_family_windows(load_family_counts(ctx.settings.family_warm_start))
    return curriculum


def rl_phase(ctx: Context, evaluator: Any) -> Any:
    from multiminddev.train.grpo import GRPOTrainer

    s = ctx.settings
    cfg = grpo_config(ctx)
    metrics = MetricsLogger(MetricsConfig(output_dir=s.output_dir, wandb=s.wandb,
                                          run_name=s.output_dir.name), run_config=cfg.to_dict())
    trainer = GRPOTrainer(cfg, policy=ctx.policy,
                          backend=HFGenerationBackend(
                              ctx.policy, max_batch_size=s.generation_batch_size),
                          evaluator=evaluator, curriculum=grpo_curriculum(ctx),
                          episode_config=episode_config(ctx, cfg), output_dir=s.output_dir,
                          heldout=ctx.heldout, metrics=metrics, compile_only=ctx.compile_only,
                          console=ctx.console, rollouts=_rollouts(ctx),
                          sft_anchor=sft_anchor_examples(ctx, cfg.train_roles))
    if s.resume is not None:
        trainer.resume(s.resume)
        ctx.console.print(f"resumed from {s.resume} at step {trainer.step}, "
                          f"{trainer.episodes_done} episodes")
    ctx.console.rule(f"GRPO: {cfg.num_steps} steps x {cfg.problems_per_step} problems x "
                     f"G={cfg.group_size}, up to {cfg.max_turns} turns"
                     + (f" [{COMPILE_ONLY_NOTE}]" if ctx.compile_only else ""))
    progress, task = progress_bar(cfg.num_steps, "GRPO")
    with progress:
        progress.update(task, completed=trainer.step)
        if s.select_problems is None:
            trainer.train(progress, task)
        else:
            train_with_selection(ctx, trainer, progress, task)
    return trainer


def evaluate_agents(ctx: Context, trainer: Any, problems: list[Any]) -> list[Any]:
    """One episode per problem with the agents the policy holds now, decoded as the held-out
    evaluation decodes (``heldout_episode_config``, ``evaluation_decoding``): spread over the
    rollout workers where they can evaluate (``train --ray``: they are sent the policy's
    adapters first), else in this process, every problem's episode at once
    (``train.episode_stream``)."""
    config = heldout_episode_config(ctx, trainer.cfg)
    if hasattr(trainer.rollouts, "evaluate"):
        return trainer.rollouts.evaluate(ctx.policy, problems, config, evaluation_decoding(ctx))
    # A server's or this process's rollouts: evaluated here, where the policy holds the agents.
    return [episode for _, _, episode in stream_episodes(
        problems, evaluation_backend(ctx), trainer.evaluator, config)]


def selection_problems(ctx: Context) -> list[Any]:
    """The early-stopping sample (train/selection.py); a bad spec is a ``SelectionError``."""
    s = ctx.settings
    return selection_sample(load_problems(s.select_problems), s.select_count,
                            also=load_problems(s.select_also) if s.select_also else (),
                            also_count=s.select_also_count,
                            trained=[*ctx.train_problems, *ctx.sft_problems],
                            heldout=ctx.heldout)


def train_with_selection(ctx: Context, trainer: Any, progress: Any, task: Any) -> None:
    """GRPO paused after every ``select_every`` steps for a select@ evaluation; at the end the
    policy holds the chosen step's agents (train/selection.py). The rewards and the chosen step
    go to ``select.json``; a resumed run reads the earlier rewards back."""
    from multiminddev.train.grpo import score_episodes

    s, cfg = ctx.settings, trainer.cfg
    problems = selection_problems(ctx)
    record_path = s.output_dir / selection.RECORD_FILE
    rewards: dict[int, float] = {}
    if trainer.step > 0 and record_path.is_file():
        rewards = {int(k): v for k, v in json.loads(record_path.read_text())["rewards"].items()}
    ctx.console.print(f"early stopping: {len(problems)} select@ problems: "
                      + ", ".join(p.name for p in problems))

    def measure(step: int) -> None:
        episodes = evaluate_agents(ctx, trainer, problems)
        check_episodes(episodes, what=f"the select@{step} evaluation",
                       max_share=cfg.max_infra_share)
        rewards[step] = score_episodes(episodes, cfg)[1]["reward_mean"]
        selection.save_if_best(rewards, step, cfg.num_steps, ctx.policy, cfg.train_roles,
                               s.output_dir, s.select_min_gain)
        write_json_atomically(record_path, {
            "problems": [p.name for p in problems], "rewards": rewards,
            "chosen_step": selection.chosen_step(rewards, s.select_min_gain)})
        ctx.console.print(f"select@{step}: reward {rewards[step]:+.3f}")

    if trainer.step == 0 and 0 not in rewards:
        measure(0)
    for mark in selection.selection_marks(cfg.num_steps, s.select_every):
        if mark in rewards or mark < trainer.step:  # measured, or its agents are gone
            continue
        trainer.train(progress, task, until=mark)
        measure(mark)
    chosen = selection.chosen_step(rewards, s.select_min_gain)
    selection.load_chosen(ctx.policy, chosen, cfg.num_steps, s.output_dir, cfg.train_roles)
    ctx.console.print(f"early stopping kept the agents of step {chosen} of {cfg.num_steps} "
                      f"(select@ rewards {rewards})")


def final_evaluation(ctx: Context, trainer: Any, evaluator: Any,
                     stage: str = "") -> dict[str, Any]:
    """Held-out problems, one episode each, with the agents the policy holds. Raises
    ``InfraFailure`` (its episodes written first) when most of them failed on the evaluator's
    side. ``stage`` prefixes the files (``sft_``: the SFT agents' evaluation)."""
    from multiminddev.train.grpo import GRPOTrainer, score_episodes

    cfg = trainer.cfg if trainer is not None else grpo_config(ctx)
    problems = ctx.heldout[: ctx.size.final_eval_problems]
    # evaluation only: no SFT anchor (GRPOTrainer asks for its examples when sft_coef > 0)
    runner = trainer or GRPOTrainer(dataclasses.replace(cfg, sft_coef=0.0), policy=ctx.policy,
                                    backend=HFGenerationBackend(
                                        ctx.policy,
                                        max_batch_size=ctx.settings.generation_batch_size),
                                    evaluator=evaluator, curriculum=None,
                                    episode_config=episode_config(ctx, cfg),
                                    output_dir=ctx.settings.output_dir, metrics=_NullMetrics(),
                                    rollouts=_rollouts(ctx))
    episodes_file = ctx.settings.output_dir / f"{stage}eval_episodes.jsonl"
    episodes = heldout_episodes(ctx, runner, problems, episodes_file)
    # an evaluation that mostly failed on our side is an error, never a figure (its episodes
    # are on disk already)
    check_episodes(episodes, what=f"the {stage}held-out evaluation",
                   max_share=cfg.max_infra_share)
    _, rewards = score_episodes(episodes, cfg)
    out = {"problems": len(problems), "reward_mean": rewards["reward_mean"],
           "compile_only": ctx.compile_only, "measured_on": _device_name(),
           # a source that evaluates (Ray workers) says where; else evaluate_agents ran here
           "evaluated_by": getattr(runner.rollouts, "evaluated_by", "this process"),
           **rollout_metrics(episodes, compile_only=ctx.compile_only)}
    path = ctx.settings.output_dir / f"{stage}eval_results.json"
    path.write_text(json.dumps(out, indent=2))
    return out


def heldout_episodes(ctx: Context, trainer: Any, problems: list[Any],
                     episodes_file: Path) -> list[Any]:
    """The held-out evaluation's episodes. In this process every problem's episode runs at
    once (``train.episode_stream``), each appended to ``episodes_file`` as it ends, and a
    resumed run (``--resume``) runs only those the file lacks for the same agents (RL step)
    and episode settings. Rollout workers that evaluate (``train --ray``) hand theirs back
    together; they are written then."""
    if hasattr(trainer.rollouts, "evaluate"):
        episodes = evaluate_agents(ctx, trainer, problems)
        write_episodes_jsonl(episodes, episodes_file)
        return episodes
    config = heldout_episode_config(ctx, trainer.cfg)
    record = {"rl_step": trainer.step, "problems": [p.name for p in problems],
              "episode_config": dataclasses.asdict(config)}
    return run_logged_episodes(problems, evaluation_backend(ctx), trainer.evaluator, config,
                               episodes_file=episodes_file, record=record,
                               resume=ctx.settings.resume is not None, progress=True)


def _rollouts(ctx: Context) -> Any:
    """GRPO's rollout source: the scale-out's (its workers hold the policy's current adapters),
    or None for the trainer's in-process one."""
    return None if ctx.scale_out is None else ctx.scale_out.rollouts(ctx)


class _NullMetrics:
    """Evaluation-only runs log nothing per step."""

    def log_step(self, record):
        pass

    def log_eval(self, step, metrics):
        pass

    def close(self):
        pass


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu (compile only)"


# --------------------------------------------------------------------------- the pipeline

def run_pipeline(settings: TrainSettings, *, console: Any = None,
                 scale_out: Any = None) -> PipelineResult:
    """``scale_out``: hooks that plan over a cluster and play GRPO's rollouts there
    (``distributed.grpo.RayScaleOut``); None: everything in this process."""
    from rich.console import Console

    console = console or Console()
    start = time.perf_counter()
    ctx = Context(settings, console)
    if scale_out is None and settings.rollout_server is not None:
        from multiminddev.train.remote_rollouts import RemoteScaleOut

        scale_out = RemoteScaleOut(settings.rollout_server)
    ctx.scale_out = scale_out
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    _write_run_config(settings)
    banner(ctx, "start")
    console.print(f"output: {settings.output_dir}")
    load_problems_for(ctx)
    plan_and_load(ctx)
    result = PipelineResult(output_dir=settings.output_dir, compile_only=ctx.compile_only)
    try:
        if settings.resume is not None and not _has_rl_checkpoint(settings.resume):
            _resume_from_sft(ctx)  # the run stopped during SFT: keep finished adapters, redo the rest
        if not settings.skip_sft and settings.resume is None:
            result.sft = sft_phase(ctx)
        trainer = None
        with Evaluator(eval_config(ctx)) as evaluator:
            ctx.evaluator = evaluator  # a rollout server's episodes are evaluated here too
            if settings.eval_after_sft and settings.resume is None and not settings.skip_eval:
                console.rule("held-out evaluation of the SFT agents")
                result.sft_evaluation = final_evaluation(ctx, None, evaluator, stage="sft_")
            if not settings.skip_rl:
                trainer = rl_phase(ctx, evaluator)
                result.rl_steps = trainer.step
                result.final_model = trainer.finish()
            if not settings.skip_eval:
                console.rule("held-out evaluation")
                result.evaluation = final_evaluation(ctx, trainer, evaluator)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted.[/yellow] {resume_hint(settings)}")
        raise
    result.seconds = time.perf_counter() - start
    summarize(ctx, result)
    return result


def _has_rl_checkpoint(path: Path) -> bool:
    try:
        find_latest(path)
    except CheckpointError:
        return False
    return True


def _resume_from_sft(ctx: Context) -> None:
    """No RL checkpoint yet: load the SFT adapters that were finished; SFT redoes the others."""
    s = ctx.settings
    sft_dir = Path(s.resume) / SFT_DIR
    done = [r for r in s.roles if (sft_dir / r.value / "adapter_config.json").exists()]
    if done:
        ctx.policy.load_adapters({r.value: str(sft_dir / r.value) for r in done})
    ctx.console.print(f"no RL checkpoint under {s.resume} yet; loaded SFT adapters for "
                      f"{[r.value for r in done] or 'no role'} and continuing from there")
    s.resume = None
    if done and not s.skip_sft:
        s.roles_sft_done = tuple(done)


def resume_hint(settings: TrainSettings) -> str:
    latest = settings.output_dir / "rl_checkpoints" / "latest"
    if not latest.exists():
        return "No RL checkpoint was written yet; rerun the command to start again."
    return (f"The latest checkpoint is {latest}; resume with: "
            f"{' '.join(_resume_argv(settings))}")


def _program(argv0: str) -> list[str]:
    """How the user started this program, as a command to type again: ``python -m multiminddev``
    runs ``__main__.py``, whose name alone is not a command."""
    name = Path(argv0).name if argv0 else ""
    if not name:
        return ["multiminddev"]
    return ["python", "-m", "multiminddev"] if name == "__main__.py" else [name]


def _resume_argv(settings: TrainSettings) -> list[str]:
    argv = [*_program(sys.argv[0] if sys.argv else ""), *sys.argv[1:]]
    if "--resume" not in argv:
        argv += ["--resume", str(settings.output_dir)]
    if "--output-dir" not in argv:
        argv += ["--output-dir", str(settings.output_dir)]
    return argv


def _write_run_config(settings: TrainSettings) -> None:
    """The run record: every TrainSettings field (``train --config`` reads it back to the same
    settings) and the commands that resume and replay the run; written whole or not at all."""
    path = settings.output_dir / RUN_CONFIG_FILE
    data = settings_record(settings)
    data["resume_command"] = " ".join(_resume_argv(settings))
    data["replay_command"] = f"multiminddev train --config {path}"
    write_json_atomically(path, data)


def summarize(ctx: Context, result: PipelineResult) -> None:
    from rich.table import Table

    console = ctx.console
    table = Table(title=f"run finished in {result.seconds / 60:.1f} min")
    table.add_column("what")
    table.add_column("where / value")
    for role, info in result.sft.items():
        table.add_row(f"SFT {role}", f"loss {info['loss_before']:.3f} -> {info['loss_after']:.3f}"
                      f"  ({info['output_dir']})")
    if result.final_model is not None:
        table.add_row("RL final model", str(result.final_model))
        table.add_row("metrics", str(ctx.settings.output_dir / "metrics.jsonl")
                      + f"  (tensorboard --logdir {ctx.settings.output_dir / 'tensorboard'})")
    for name, e, file in (("held-out eval (SFT)", result.sft_evaluation, "sft_eval_results.json"),
                          ("held-out eval", result.evaluation, "eval_results.json")):
        if e is not None:
            table.add_row(name, f"{e['problems']} problems: reward {e['reward_mean']:+.3f}, "
                          f"compile {e['compile_rate']:.2f}, pass {e['pass_rate']:.2f}, "
                          f"fast_1 {e['fast_1']:.2f}  ({ctx.settings.output_dir / file})")
    console.print(table)
    if result.final_model is not None:
        console.print(f"results: {ctx.settings.output_dir}; to train further (raise the step "
                      f"count): {' '.join(_resume_argv(ctx.settings))}")
    elif not ctx.settings.skip_rl:
        console.print(resume_hint(ctx.settings))
    else:
        console.print(f"results: {ctx.settings.output_dir}; RL from these adapters: multiminddev rl "
                      f"--generator-checkpoint {ctx.settings.output_dir} --optimizer-checkpoint "
                      f"{ctx.settings.output_dir}")
    banner(ctx, "end")
