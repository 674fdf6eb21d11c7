"""``train --ray [ADDRESS]``: the training pipeline (SFT -> GRPO -> held-out evaluation) with
GRPO's rollouts on a Ray cluster.

Steps: connect (``ADDRESS``: ``auto`` or ``ray://...`` for a running cluster; none starts a
local one) -> the GPU planner's plan over the cluster's GPUs -> ``layout_from_plan`` -> the
learner's GPU, leased from Ray on the driver's node when the learner has it alone, so that no
rollout worker lands there -> the rollout workers, started when GRPO starts (after SFT), each
given the learner's adapters. The layout is printed and written to ``RUN_DIR/layout.json``
(then again with the node and GPU each worker landed on). One machine with N GPUs and several
machines take this same path; the learner always runs in this process, on one GPU.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from multiminddev.distributed.cluster import LOCAL, connect
from multiminddev.distributed.rollout import RayRollouts, RolloutLayout, layout_from_plan
from multiminddev.env import Evaluator
from multiminddev.train.config_files import write_json_atomically
from multiminddev.train.pipeline import eval_config, run_pipeline
from multiminddev.train.planner import GIB, GPUInfo, GPUPlan, detect_gpus

LAYOUT_FILE = "layout.json"
ASSUMED_GPU_MEMORY = 80 * GIB  # a remote GPU's memory when the driver has none to copy


def cluster_gpu_list(local: list[GPUInfo], cluster_gpus: int) -> list[GPUInfo]:
    """The GPUs to plan over: the driver's own first (the learner's GPU is one of them), then
    the cluster's others, taken to be like the driver's first (or 80 GiB ones when the driver
    has none): Ray counts remote GPUs but does not describe them."""
    gpus = list(local[:cluster_gpus])
    model = local[0] if local else GPUInfo(index=0, name="unknown (remote)",
                                           total_memory_bytes=ASSUMED_GPU_MEMORY)
    for index in range(len(gpus), cluster_gpus):
        gpus.append(GPUInfo(index=index, name=model.name,
                            total_memory_bytes=model.total_memory_bytes))
    return gpus


def driver_cuda_index(gpu_id: str, visible: str | None) -> int:
    """The driver's torch index of the GPU Ray calls ``gpu_id`` on the driver's node (Ray
    numbers the GPUs in CUDA_VISIBLE_DEVICES' list when it is set, the physical ones if not)."""
    if not visible:
        return int(gpu_id)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if gpu_id in ids:
        return ids.index(gpu_id)
    raise ValueError(f"Ray leased GPU {gpu_id} to the learner, which CUDA_VISIBLE_DEVICES={visible} "
                     "hides from this process: start Ray with the same CUDA_VISIBLE_DEVICES")


def learner_device(layout: RolloutLayout, local_gpus: int, leased: str | None) -> str:
    """The torch device of the learner in this process."""
    if layout.learner_gpu is None or local_gpus == 0:
        return "cpu"
    if leased is not None:
        return f"cuda:{driver_cuda_index(leased, os.environ.get('CUDA_VISIBLE_DEVICES'))}"
    return f"cuda:{layout.learner_gpu if layout.learner_gpu < local_gpus else 0}"


class _GPULease:
    """Holds one GPU in Ray's books for the learner (which runs outside Ray, in the driver)."""

    def gpu_ids(self) -> list[str]:
        import ray

        return [str(i) for i in ray.get_gpu_ids()]


class RayScaleOut:
    """The pipeline's scale-out hooks (``run_pipeline(scale_out=)``) for a Ray cluster."""

    def __init__(self, address: str = LOCAL, *, cpu_workers: int = 2) -> None:
        self.address, self.cpu_workers = address, cpu_workers
        self.started = connect(address)
        self.layout: RolloutLayout | None = None
        self.plan: GPUPlan | None = None
        self.learner: str | None = None
        self._lease: Any = None
        self._rollouts: RayRollouts | None = None
        self._output_dir: Path | None = None

    def gpus(self) -> list[GPUInfo]:
        import ray

        return cluster_gpu_list(detect_gpus(), int(ray.cluster_resources().get("GPU", 0)))

    def place(self, ctx: Any) -> str:
        """The layout of ``ctx.plan``; leases the learner's GPU; returns the learner's device."""
        self.plan, self._output_dir = ctx.plan, Path(ctx.settings.output_dir)
        self.layout = layout_from_plan(ctx.plan, cpu_workers=self.cpu_workers)
        leased = self._lease_learner_gpu() if self.layout.learner_exclusive else None
        self.learner = learner_device(self.layout, len(detect_gpus()), leased)
        render_layout(self.layout, self.learner, ctx.console)
        self.write()
        return self.learner

    def rollouts(self, ctx: Any) -> RayRollouts:
        """The rollout workers (started on first use), holding the policy's current adapters."""
        if self._rollouts is None:
            if self.layout is None:
                raise RuntimeError("RayScaleOut.rollouts before place(): plan first")
            ctx.console.print(f"starting {self.layout.rollout_workers} Ray rollout workers ...")
            self._rollouts = RayRollouts.start(self.layout, ctx.policy.config,
                                               functools.partial(Evaluator, eval_config(ctx)))
            self._rollouts.publish(ctx.policy, 0)
            self.write()
        return self._rollouts

    def record(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "address": self.address or "local",
            "plan": None if plan is None else {
                "tier": plan.tier.value, "num_gpus": plan.num_gpus,
                "rollout_gpus": list(plan.rollout_gpus), "generator_gpu": plan.generator_gpu,
                "optimizer_gpu": plan.optimizer_gpu, "evaluation_gpus": list(plan.evaluation_gpus)},
            "layout": None if self.layout is None else self.layout.to_dict(),
            "learner_device": self.learner,
            "workers": [] if self._rollouts is None else self._rollouts.placements,
        }

    def write(self) -> Path | None:
        if self._output_dir is None:
            return None

        self._output_dir.mkdir(parents=True, exist_ok=True)
        path = self._output_dir / LAYOUT_FILE
        write_json_atomically(path, json.loads(json.dumps(self.record(), default=str)))
        return path

    def close(self) -> None:
        import ray

        if self._rollouts is not None:
            self._rollouts.close()
            self._rollouts = None
        if self._lease is not None:
            ray.kill(self._lease)
            self._lease = None
        if self.started and ray.is_initialized():
            ray.shutdown()

    def _lease_learner_gpu(self) -> str:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        self._lease = ray.remote(_GPULease).options(
            num_gpus=1, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote()
        try:
            ids = ray.get(self._lease.gpu_ids.remote(), timeout=300)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError("no free GPU on this node for the learner: run the driver on a "
                               "node with a GPU Ray has not handed out") from None
        return ids[0]


def render_layout(layout: RolloutLayout, learner: str, console: Any = None) -> None:
    """Print the actor layout as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"Ray layout ({layout.tier})")
    table.add_column("role")
    table.add_column("where")
    workers = (f"{layout.rollout_workers} x 1 GPU (plan GPUs "
               f"{', '.join(map(str, layout.worker_gpus))})" if layout.gpus_per_worker
               else f"{layout.rollout_workers} x CPU")
    table.add_row("rollout workers (Ray actors)", workers)
    table.add_row("learner (this process)", learner + (" (its own GPU)" if layout.learner_exclusive
                                                       else ""))
    table.add_row("kernel evaluation", layout.evaluation)
    console.print(table)
    for note in layout.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def run_ray_pipeline(settings: Any, address: str = LOCAL, *, console: Any = None) -> Any:
    """``train --ray [ADDRESS]``: ``run_pipeline`` with GRPO's rollouts on Ray actors."""
    if settings.full_finetune:
        raise ValueError("--ray sends LoRA adapters to the rollout workers; it does not support "
                         "--full-finetune")
    scale_out = RayScaleOut(address)
    try:
        return run_pipeline(settings, console=console, scale_out=scale_out)
    finally:
        scale_out.close()
