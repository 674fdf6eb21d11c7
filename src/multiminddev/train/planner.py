"""GPU planner: which GPU does rollout generation, which trains each agent, which evaluates.

The layouts, by the number of GPUs:

```
8+ GPUs (optimal)        4-7 GPUs (balanced)      2-3 GPUs (minimal)       1 GPU        0 GPUs
0-1: rollout             0:   rollout             0: rollout               0: all       CPU: all
2:   Generator training  1:   Generator training  1: both agents + eval                 (compile-only
3:   Optimizer training  2:   Optimizer training  (2: evaluation)                        rewards)
4:   evaluation          3:   evaluation
5+:  extra evaluation    4+:  extra evaluation
```

The guide leaves GPUs 5-7 "available"; kernel evaluation is the step that waits on hardware, so
here they become extra evaluation workers. ``plan_gpus`` is a pure function of the detected GPUs
and the model size, so every layout is testable without hardware; ``detect_gpus`` reads torch.
In the embedded (single-process) trainer the rollout and training roles share one model copy on
the Generator's GPU; the separate rollout GPUs matter to the VERL/vLLM integration.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

GIB = 1024**3


class PlanTier(str, enum.Enum):
    CPU = "cpu"  # no GPU: everything on the CPU, compile-only rewards
    SINGLE = "single"  # one GPU shares every role
    MINIMAL = "minimal"  # 2-3 GPUs
    BALANCED = "balanced"  # 4-7 GPUs
    OPTIMAL = "optimal"  # 8+ GPUs


@dataclass(frozen=True, kw_only=True)
class GPUInfo:
    index: int
    name: str
    total_memory_bytes: int

    @property
    def total_gib(self) -> float:
        return self.total_memory_bytes / GIB


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes one training replica needs (weights + LoRA + optimizer + activations)."""

    weights: int
    lora: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.lora + self.optimizer + self.activations


@dataclass(frozen=True, kw_only=True)
class GPUPlan:
    tier: PlanTier
    num_gpus: int
    rollout_gpus: tuple[int, ...]
    generator_gpu: int | None
    optimizer_gpu: int | None
    evaluation_gpus: tuple[int, ...]
    memory: MemoryEstimate
    fits: bool
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def policy_device(self) -> str:
        """Where the embedded trainer puts the shared policy (base + per-agent adapters)."""
        return "cpu" if self.generator_gpu is None else f"cuda:{self.generator_gpu}"

    @property
    def compile_only(self) -> bool:
        return self.tier is PlanTier.CPU


def detect_gpus() -> list[GPUInfo]:
    """The GPUs torch can see (empty on a CPU machine or without a CUDA build of torch)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(GPUInfo(index=index, name=props.name, total_memory_bytes=props.total_memory))
    return gpus


def estimate_memory(
    model_params: int,
    *,
    bytes_per_param: float = 2.0,
    lora_fraction: float = 0.01,
    full_finetune: bool = False,
    batch_tokens: int = 8192,
    hidden_size: int | None = None,
    num_layers: int | None = None,
) -> MemoryEstimate:
    """A deliberately rough estimate of one training replica's memory.

    Trainable parameters keep fp32 master weights, grads and two Adam moments (16 bytes each).
    Activations: ~34 * hidden bytes per token per layer in bf16 (Korthikanti et al. 2022, without
    the attention-score term since SDPA/flash attention does not store it). Without the model's
    shape, hidden and layers are guessed from the parameter count (params ~ 12 * layers * h^2).
    """
    if model_params <= 0:
        raise ValueError(f"model_params must be > 0, got {model_params}; pass the model's size")
    trainable = model_params if full_finetune else int(model_params * lora_fraction)
    if hidden_size is None or num_layers is None:
        num_layers = num_layers or 24
        hidden_size = hidden_size or max(256, int((model_params / (12 * num_layers)) ** 0.5))
    activations = int(34 * hidden_size * num_layers * batch_tokens)
    return MemoryEstimate(
        weights=int(model_params * bytes_per_param),
        lora=0 if full_finetune else trainable * 4,
        optimizer=trainable * 12,
        activations=activations,
    )


def _layout(n: int) -> tuple[PlanTier, tuple[int, ...], int | None, int | None, tuple[int, ...]]:
    """(tier, rollout, generator, optimizer, evaluation) for n GPUs, as in the training guide."""
    if n == 0:
        return PlanTier.CPU, (), None, None, ()
    if n == 1:
        return PlanTier.SINGLE, (0,), 0, 0, (0,)
    if n <= 3:
        return PlanTier.MINIMAL, (0,), 1, 1, tuple(range(1, n)) if n == 2 else (2,)
    if n <= 7:
        return PlanTier.BALANCED, (0,), 1, 2, tuple(range(3, n))
    return PlanTier.OPTIMAL, (0, 1), 2, 3, tuple(range(4, n))


def plan_gpus(
    gpus: list[GPUInfo],
    model_params: int,
    *,
    num_gpus: int | None = None,
    memory: MemoryEstimate | None = None,
    headroom: float = 0.9,
) -> GPUPlan:
    """Assign roles to GPUs and check the models fit.

    ``num_gpus`` caps how many of the detected GPUs are used (``--num-gpus``); asking for more
    than exist uses the ones that exist and says so. A GPU that trains an agent must hold
    ``memory.total`` (twice when both agents share it with separate optimizers is still one
    base model: adapters are small, so one replica plus one extra LoRA/optimizer share).
    """
    if num_gpus is not None and num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus}")
    notes: list[str] = []
    usable = list(gpus)
    if num_gpus is not None:
        if num_gpus > len(gpus):
            notes.append(f"asked for {num_gpus} GPUs but {len(gpus)} are present; using {len(gpus)}")
        usable = usable[:num_gpus]
    memory = memory or estimate_memory(model_params)
    tier, rollout, gen, opt, evaluation = _layout(len(usable))
    fits = True
    if tier is PlanTier.CPU:
        notes.append(
            "no GPU: the policy runs on the CPU and kernels are compiled but not run, "
            "so rewards are compile-only (no GPU)"
        )
    else:
        fits = _check_fit(usable, memory, gen, opt, headroom, notes)
    if tier is PlanTier.SINGLE:
        notes.append("one GPU shares rollout, both agents' training and evaluation (sequentially)")
    return GPUPlan(
        tier=tier,
        num_gpus=len(usable),
        rollout_gpus=rollout,
        generator_gpu=gen,
        optimizer_gpu=opt,
        evaluation_gpus=evaluation,
        memory=memory,
        fits=fits,
        notes=tuple(notes),
    )


def _check_fit(
    gpus: list[GPUInfo],
    memory: MemoryEstimate,
    gen: int | None,
    opt: int | None,
    headroom: float,
    notes: list[str],
) -> bool:
    fits = True
    for index in sorted({i for i in (gen, opt) if i is not None}):
        need = memory.total
        if gen == opt:  # both agents' adapters and optimizer states on one GPU
            need += memory.lora + memory.optimizer
        have = gpus[index].total_memory_bytes * headroom
        if need > have:
            fits = False
            notes.append(
                f"GPU {index} ({gpus[index].name}) needs ~{need / GIB:.1f} GiB for training but "
                f"has {have / GIB:.1f} GiB usable: use LoRA/QLoRA, a smaller batch "
                f"(--batch-size) or fewer tokens (max_new_tokens)"
            )
    return fits


def render_plan(plan: GPUPlan, console=None) -> None:
    """Print the plan as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"GPU plan: {plan.tier.value} ({plan.num_gpus} GPU(s))")
    table.add_column("role")
    table.add_column("device")

    def dev(ids) -> str:
        ids = [i for i in ids if i is not None]
        return ", ".join(f"cuda:{i}" for i in ids) if ids else "cpu"

    table.add_row("rollout generation", dev(plan.rollout_gpus))
    table.add_row("Generator training", dev([plan.generator_gpu]))
    table.add_row("Optimizer training", dev([plan.optimizer_gpu]))
    table.add_row("kernel evaluation", dev(plan.evaluation_gpus) if plan.evaluation_gpus
                  else "cpu (compile only)")
    table.add_row("memory per trainer (est.)", f"{plan.memory.total / GIB:.2f} GiB"
                  + ("" if plan.fits else "  [red]does not fit[/red]"))
    console.print(table)
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
