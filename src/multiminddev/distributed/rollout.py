"""GRPO rollouts on Ray actors (the ``ray`` extra, imported lazily).

Each rollout worker (``RolloutWorker``: one Ray actor per GPU, or per CPU slot where there are
no GPUs) loads the base model with every agent's LoRA adapter and plays the episodes it is
handed with the same episode code as the in-process trainer (``run_episodes`` over an
``HFGenerationBackend``), scored by its own evaluator: ``evaluator_factory()`` builds it in the
worker (a local ``env.Evaluator`` on the worker's GPU, or any object with ``aevaluate`` and
``close``, such as a client of a cluster's evaluation actors). A step's episodes are dealt out
round-robin (``shard_episodes``), and a kernel that several workers' episodes wrote is
evaluated once for all of them (``EvaluationShare``). Episodes come back with token ids and old
log-probs, ready for the learner's loss.

After each update the learner publishes the trained adapters (only the LoRA tensors: peft's
``get_peft_model_state_dict``) once through the object store (``ray.put``); every worker loads
them (``set_peft_model_state_dict``) before its next rollout. A batch of episodes carries the
version of the weights it was sampled with, and ``RayRollouts`` refuses one that is not the
version last published. A worker that dies is replaced, and the replacement plays its shard
again with the same weights (``RayRollouts``). select@ and held-out evaluations are spread over
the same workers (``RayRollouts.evaluate``).

Where workers and the learner go is ``layout_from_plan``, a pure function of the GPU planner's
plan, so one machine with N GPUs and several machines take the same path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from multiminddev.episode import run_episodes
from multiminddev.episode.runner import source_hash
from multiminddev.policy import HFGenerationBackend, load_policy, release_compiled_decoding
from multiminddev.train.planner import GPUPlan, PlanTier

WORKER_START_TIMEOUT_S = 900.0  # loading a model on a fresh node can take minutes
# A shard whose worker died is played again by a replacement at most this many times in all:
# a worker that dies on every attempt points at the shard (or the node), not at bad luck.
SHARD_ATTEMPTS = 3


class StaleWeights(RuntimeError):
    """A rollout worker sampled with other adapter weights than the learner's latest."""


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True, kw_only=True)
class RolloutLayout:
    """Where the rollout workers and the learner run. GPU indices are the plan's."""

    tier: str
    rollout_workers: int
    gpus_per_worker: int  # 1: one GPU each; 0: CPU workers (compile-only rewards)
    worker_gpus: tuple[int, ...]  # the plan's GPUs that host a worker, one each
    learner_gpu: int | None  # the plan's GPU for the learner (the driver process); None: CPU
    learner_exclusive: bool  # no worker shares the learner's GPU (it is reserved from Ray)
    evaluation: str  # where kernels are evaluated
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.rollout_workers < 1:
            raise ValueError(f"RolloutLayout needs at least one rollout worker, got "
                             f"{self.rollout_workers}")
        if self.gpus_per_worker not in (0, 1):
            raise ValueError("RolloutLayout.gpus_per_worker is 1 (a GPU per worker) or 0 (CPU)")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["worker_gpus"], out["notes"] = list(self.worker_gpus), list(self.notes)
        return out


def layout_from_plan(plan: GPUPlan, *, cpu_workers: int = 2) -> RolloutLayout:
    """The actor layout of ``plan``.

    Rule: the learner (both agents' adapters and optimizers, in the driver) runs on the plan's
    Generator-training GPU. Every other GPU hosts one rollout worker, which decodes and also
    evaluates its episodes' kernels on its GPU; so the plan's rollout and evaluation GPUs,
    and an Optimizer-training GPU the one learner does not need, all sample. When the plan
    gives the learner's GPU rollout or evaluation work too (1 or 2 GPUs), a worker shares it:
    rollout and update alternate, so the two never run at once. Without GPUs,
    ``cpu_workers`` CPU workers sample and rewards are compile-only."""
    if plan.tier is PlanTier.CPU:
        return RolloutLayout(
            tier=plan.tier.value, rollout_workers=cpu_workers, gpus_per_worker=0, worker_gpus=(),
            learner_gpu=None, learner_exclusive=False,
            evaluation="in each rollout worker (compile only: no GPU)",
            notes=("no GPU: CPU rollout workers; kernels are compiled but not run, so rewards "
                   "are compile-only",))
    learner = plan.generator_gpu if plan.generator_gpu is not None else 0
    sampling = set(plan.rollout_gpus) | set(plan.evaluation_gpus)
    exclusive = learner not in sampling and plan.num_gpus > 1
    workers = tuple(i for i in range(plan.num_gpus) if not (exclusive and i == learner))
    notes = []
    if plan.optimizer_gpu is not None and plan.optimizer_gpu != learner:
        notes.append(f"the learner trains both agents on GPU {learner}; GPU {plan.optimizer_gpu}, "
                     "the plan's Optimizer-training GPU, runs a rollout worker instead")
    if not exclusive:
        notes.append(f"the learner shares GPU {learner} with a rollout worker: rollout and "
                     "update alternate")
    return RolloutLayout(
        tier=plan.tier.value, rollout_workers=len(workers), gpus_per_worker=1,
        worker_gpus=workers, learner_gpu=learner, learner_exclusive=exclusive,
        evaluation="in each rollout worker, on its own GPU", notes=tuple(notes))


def shard_episodes(num_problems: int, group_size: int,
                   num_workers: int) -> list[list[tuple[int, int]]]:
    """Each worker's episodes as (problem index, sample index) slots, in problem order; the
    workers' shares differ by at most one episode (a worker may get none).

    Rule: the slots are dealt out round-robin, so every worker plays a share of every problem's
    group. A step waits for its slowest worker, and with agents that write kernels most of a
    worker's time is their evaluation, whose cost is the problem's (its tensors, how many of its
    kernels pass); a share of every problem evens that out, where whole groups per worker do
    not. A group spread over workers is still one GRPO group (its episodes are sampled with the
    same weights), and the kernels its episodes have in common are evaluated once for all the
    workers (``EvaluationShare``)."""
    if num_problems < 0 or group_size < 1 or num_workers < 1:
        raise ValueError("shard_episodes needs num_problems >= 0, group_size >= 1 and "
                         "num_workers >= 1")
    slots = [(p, g) for p in range(num_problems) for g in range(group_size)]
    return [slots[worker::num_workers] for worker in range(num_workers)]


# --------------------------------------------------------------------------- shared evaluations


@dataclass
class _Shared:
    owner: int  # the worker that claimed the key and evaluates it
    done: Any  # asyncio.Event, set once the result (or None) is in
    result: Any = None


class EvaluationShare:
    """The kernel evaluations of a rollout, shared by its workers (a Ray actor, async).

    A group's episodes are spread over the workers and often write the same kernel. The first
    worker to ``claim`` a (rollout, problem, kernel) key evaluates it and ``put``s the result;
    every other worker's ``get`` waits for it, so a kernel is evaluated once per rollout
    however many workers hold it. ``release(rollout, worker)``: the keys a dead worker claimed
    and did not answer are answered None (their waiters evaluate the kernel themselves) and
    can be claimed again by its replacement. ``forget(rollout)`` drops a rollout's entries."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], _Shared] = {}
        self.claims = self.answers = 0  # keys claimed; results handed to another worker

    async def claim(self, key: tuple[Any, ...], worker: int) -> bool:
        """True: the caller evaluates the kernel and ``put``s the result; False: ``get`` it."""
        if key in self._entries:
            return False
        self._entries[key] = _Shared(owner=worker, done=asyncio.Event())
        self.claims += 1
        return True

    async def put(self, key: tuple[Any, ...], result: Any) -> None:
        entry = self._entries.get(key)
        if entry is not None and not entry.done.is_set():
            entry.result = result
            entry.done.set()

    async def get(self, key: tuple[Any, ...]) -> Any:
        """The claimed key's result once it is in; None: evaluate it yourself (its owner failed,
        died, or the key was never claimed)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        await entry.done.wait()
        if entry.result is not None:
            self.answers += 1
        return entry.result

    async def release(self, rollout: int, worker: int) -> int:
        """Answer None to the open keys ``worker`` claimed in ``rollout`` and forget them;
        returns how many."""
        open_keys = [k for k, e in self._entries.items()
                     if k[0] == rollout and e.owner == worker and not e.done.is_set()]
        for key in open_keys:
            self._entries.pop(key).done.set()
        return len(open_keys)

    async def forget(self, rollout: int) -> None:
        for key in [k for k in self._entries if k[0] == rollout]:
            entry = self._entries.pop(key)
            entry.done.set()  # a waiter still there gets None and evaluates for itself

    async def owners(self, rollout: int) -> dict[tuple[Any, ...], int]:
        """The worker that claimed each of ``rollout``'s keys."""
        return {k: e.owner for k, e in self._entries.items() if k[0] == rollout}

    async def counts(self) -> dict[str, int]:
        return {"claims": self.claims, "answers": self.answers, "open": len(self._entries)}


class SharedEvaluator:
    """A worker's ``evaluator`` whose evaluations go through an ``EvaluationShare``: a kernel
    that another worker of the same rollout claimed first is not evaluated here.

    A kernel is claimed only when this worker has an evaluation slot free for it (at most
    ``config.num_workers`` of its kernels are claimed and unfinished at once), so a kernel two
    workers hold goes to whichever is free first, not to whichever finished decoding first:
    the workers' shares of the common kernels follow their loads. The share only saves time:
    where it cannot be reached, this worker evaluates every kernel itself."""

    def __init__(self, evaluator: Any, share: Any, rollout: int, worker: int) -> None:
        self.evaluator, self.share, self.rollout, self.worker = evaluator, share, rollout, worker
        self._slots: Any = None  # asyncio.Semaphore, made in the running loop

    @property
    def config(self) -> Any:
        return getattr(self.evaluator, "config", None)

    async def aevaluate(self, problem: Any, candidate: str) -> Any:
        import ray

        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, getattr(self.config, "num_workers", 1)))
        key = (self.rollout, problem.source_hash + problem.name, source_hash(candidate))
        async with self._slots:
            try:
                mine = await self.share.claim.remote(key, self.worker)
            except ray.exceptions.RayActorError:
                return await self.evaluator.aevaluate(problem, candidate)
            if mine:
                result = None
                try:
                    result = await self.evaluator.aevaluate(problem, candidate)
                    return result
                finally:  # None (it raised) tells the waiters to evaluate for themselves
                    with contextlib.suppress(ray.exceptions.RayActorError):
                        await self.share.put.remote(key, result)
        try:  # another worker evaluates it: wait without holding a slot
            result = await self.share.get.remote(key)
        except ray.exceptions.RayActorError:
            result = None
        return result if result is not None else await self.evaluator.aevaluate(problem, candidate)


# --------------------------------------------------------------------------- adapter weights


def adapter_weights(policy: Any) -> dict[str, dict[str, Any]]:
    """Every agent's LoRA tensors (peft's state dict of the adapter, on the CPU), by role."""
    from peft import get_peft_model_state_dict

    if policy.separate:
        raise ValueError("distributed rollouts send LoRA adapters to the workers; full "
                         "fine-tuning (separate models) is not supported there: drop "
                         "--full-finetune")
    return {role.value: {k: v.detach().to("cpu", copy=True) for k, v in
                         get_peft_model_state_dict(policy.peft_model, adapter_name=role.value).items()}
            for role in policy.roles}


def load_adapter_weights(policy: Any, weights: dict[str, dict[str, Any]]) -> None:
    """Write ``adapter_weights``' tensors into ``policy``'s adapters of the same roles."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    for role, state in weights.items():
        mine = get_peft_model_state_dict(policy.peft_model, adapter_name=role)
        if set(mine) != set(state):
            raise ValueError(f"the published {role} adapter does not match this worker's LoRA "
                             f"layout (rank or target modules differ): "
                             f"{sorted(set(mine) ^ set(state))[:3]}")
        set_peft_model_state_dict(policy.peft_model, state, adapter_name=role)


# --------------------------------------------------------------------------- the worker


@dataclass(kw_only=True)
class RolloutBatch:
    """One worker's episodes of a rollout and the weights they were sampled with."""

    worker: int
    version: int
    episodes: list[Any]
    tokens: int
    # "episodes": the whole call's; "generate", "logprobs": in decoding and in log-prob passes
    seconds: dict[str, float] = field(default_factory=dict)


class RolloutWorker:
    """A Ray actor's state: the policy (base + every agent's adapter), a generation backend
    and an evaluator. Wrapped by ``ray.remote`` in ``RayRollouts.start``."""

    def __init__(self, index: int, policy_config: Any,
                 evaluator_factory: Callable[[], Any], *, max_batch_size: int = 16) -> None:
        self.index = index
        self.policy = load_policy(policy_config)
        self.backend = HFGenerationBackend(self.policy, max_batch_size=max_batch_size)
        self.evaluator = evaluator_factory()
        self.version: int | None = None

    def describe(self) -> dict[str, Any]:
        import socket

        import ray

        return {"worker": self.index, "host": socket.gethostname(),
                "node": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()], "device": str(self.policy.device)}

    def load_adapters(self, weights: dict[str, dict[str, Any]], version: int) -> int:
        load_adapter_weights(self.policy, weights)
        self.version = version
        return version

    def adapter_weights(self) -> dict[str, dict[str, Any]]:
        """The adapters this worker samples with (tests compare them with the learner's)."""
        return adapter_weights(self.policy)

    def prefetch_baselines(self, problems: Sequence[Any]) -> int:
        """This worker's evaluator measures ``problems``' baselines now, on its GPU (nothing
        decodes there meanwhile: the call returns when they are measured); returns how many it
        measured."""
        prefetch = getattr(self.evaluator, "prefetch_baselines", None)
        return prefetch(list(problems), wait=True) if prefetch is not None else 0

    def run(self, problems: Sequence[Any], slots: Sequence[tuple[int, int]],
            config: Any, decoding: Mapping[str, Any] | None = None, *,
            share: Any = None, rollout: int = 0) -> RolloutBatch:
        """One episode per slot; ``problems[i]`` is slot i's problem. Each episode's group is
        its problem's index in the whole rollout, so the learner sees the usual groups.
        ``decoding``: ``HFGenerationBackend`` settings for this call alone (an evaluation's:
        the sampler's log-probs, a float32 copy, eager decoding); None: the rollout backend.
        ``share``: an ``EvaluationShare`` the rollout's workers evaluate kernels through
        (``rollout`` numbers the rollout in it); None: this worker evaluates all its own."""
        if self.version is None:
            raise StaleWeights(f"rollout worker {self.index} has no published weights yet")
        backend = (self.backend if decoding is None
                   else HFGenerationBackend(self.policy, **dict(decoding)))
        evaluator = (self.evaluator if share is None
                     else SharedEvaluator(self.evaluator, share, rollout, self.index))
        tokens, seconds = backend.tokens_generated, dict(backend.seconds)
        start = time.perf_counter()
        episodes = run_episodes(list(problems), backend, evaluator, config)
        for episode, (group, sample) in zip(episodes, slots):
            episode.group = group
            episode.episode_id = f"{episode.problem.name}-{group}-{sample}"
        return RolloutBatch(
            worker=self.index, version=self.version, episodes=episodes,
            tokens=backend.tokens_generated - tokens,
            seconds={"episodes": time.perf_counter() - start,
                     **{k: v - seconds.get(k, 0.0) for k, v in backend.seconds.items()}})

    def close(self) -> None:
        close = getattr(self.evaluator, "close", None)
        if close is not None:
            close()
        release_compiled_decoding()


# --------------------------------------------------------------------------- the source


def worker_policy_config(policy_config: Any) -> Any:
    """The learner's policy settings for a worker: its own device (Ray hands it one GPU, or
    none), no adapter files (the learner publishes the adapters' weights)."""
    if policy_config.separate_models:
        raise ValueError("distributed rollouts send LoRA adapters to the workers; full "
                         "fine-tuning (separate models) is not supported there: drop "
                         "--full-finetune")
    return dataclasses.replace(policy_config, device="auto", adapter_paths={})


def start_share() -> Any:
    """An ``EvaluationShare`` actor on the driver's node (it holds no GPU or CPU)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return ray.remote(EvaluationShare).options(
        num_cpus=0, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True)).remote()


class WorkerLost(RuntimeError):
    """A rollout worker died (its process, or its node) and no replacement could play its
    episodes within ``SHARD_ATTEMPTS``."""


class RayRollouts:
    """A ``RolloutSource`` (train.grpo) whose episodes are played by Ray actors.

    A worker that dies (its process killed, out of memory, its node gone) loses no episode: a
    replacement actor is started where Ray finds the resources, loads the adapters last
    published, and plays the dead worker's shard again with the same weights; ``restarts``
    counts them, and each batch says how many attempts it took."""

    def __init__(self, workers: list[Any], layout: RolloutLayout,
                 placements: list[dict[str, Any]],
                 spawn: Callable[[int], Any] | None = None,
                 start_timeout_s: float = WORKER_START_TIMEOUT_S, share: Any = None) -> None:
        self.workers, self.layout, self.placements = workers, layout, placements
        self.share = share  # an EvaluationShare actor; None: each worker evaluates its own
        self.rollouts_started = 0
        self._spawn = spawn  # index -> a new actor in that worker's place; None: no replacing
        self.start_timeout_s = start_timeout_s
        self._weights: Any = None  # the object-store reference of the last published adapters
        self.version: int | None = None
        self.tokens_generated = 0
        self.seconds: dict[str, float] = {}
        self.publish_seconds = 0.0
        self.restarts = 0
        # worker, episodes, version, attempts, seconds (the worker's in its episodes)
        self.last_batches: list[dict[str, float]] = []

    @classmethod
    def start(cls, layout: RolloutLayout, policy_config: Any,
              evaluator_factory: Callable[[], Any], *, max_batch_size: int = 16,
              start_timeout_s: float = WORKER_START_TIMEOUT_S) -> RayRollouts:
        """Start ``layout.rollout_workers`` actors (Ray must be initialised) and wait until each
        has loaded its model."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayRollouts.start needs a Ray connection: call ray.init first")
        config = worker_policy_config(policy_config)
        options = {"num_cpus": 1, "num_gpus": layout.gpus_per_worker}
        actor = ray.remote(RolloutWorker)

        def spawn(index: int) -> Any:
            return actor.options(**options).remote(index, config, evaluator_factory,
                                                   max_batch_size=max_batch_size)

        workers = [spawn(i) for i in range(layout.rollout_workers)]
        try:
            placements = ray.get([w.describe.remote() for w in workers], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for w in workers:
                ray.kill(w)
            raise RuntimeError(
                f"{layout.rollout_workers} rollout workers ({options}) did not start within "
                f"{start_timeout_s:.0f}s; the cluster has {ray.available_resources()} free: add "
                "nodes or lower --num-gpus") from None
        return cls(workers, layout, placements, spawn, start_timeout_s,
                   share=start_share() if len(workers) > 1 else None)

    def publish(self, policy: Any, version: int) -> None:
        """Send the learner's adapters to every worker once through the object store (a worker
        found dead is replaced, and the replacement loads them)."""
        import ray

        start = time.perf_counter()
        self._weights = ray.put(adapter_weights(policy))
        loaded = []
        calls = [w.load_adapters.remote(self._weights, version) for w in self.workers]
        for index, call in enumerate(calls):
            try:
                loaded.append(ray.get(call))
            except ray.exceptions.RayActorError:
                loaded.append(self._replace(index, version, "it died before loading the "
                                            "adapters"))
        if any(v != version for v in loaded):
            raise StaleWeights(f"workers loaded versions {loaded}, not {version}")
        self.version = version
        self.publish_seconds += time.perf_counter() - start

    def _replace(self, index: int, version: int, why: str) -> int:
        """Start a new actor in worker ``index``'s place and give it the last published
        adapters as ``version``; returns the version it loaded. Raises ``WorkerLost`` when it
        cannot (no spawner, no resources within the start timeout)."""
        import ray

        if self._spawn is None:
            raise WorkerLost(f"rollout worker {index} was lost ({why}) and this source cannot "
                             "start another")
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.workers[index], no_restart=True)
        worker = self._spawn(index)
        try:
            placement = ray.get(worker.describe.remote(), timeout=self.start_timeout_s)
            loaded = ray.get(worker.load_adapters.remote(self._weights, version),
                             timeout=self.start_timeout_s)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            with contextlib.suppress(Exception):
                ray.kill(worker, no_restart=True)
            raise WorkerLost(f"rollout worker {index} was lost ({why}) and its replacement did "
                             f"not start ({type(exc).__name__}); the cluster has "
                             f"{ray.available_resources()} free") from None
        self.workers[index] = worker
        self.placements[index] = placement
        self.restarts += 1
        return loaded

    def run_episodes(self, problems: list[Any], group_size: int, config: Any,
                     decoding: Mapping[str, Any] | None = None) -> list[Any]:
        """``group_size`` episodes per problem, problem by problem, spread over the workers;
        ``decoding`` as in ``RolloutWorker.run``."""
        import ray

        if self.version is None:
            raise StaleWeights("publish the learner's adapters before the first rollout")
        shards = shard_episodes(len(problems), group_size, len(self.workers))
        self.rollouts_started += 1
        rollout = self.rollouts_started

        share = self.share

        def submit(index: int) -> Any:
            shard = shards[index]
            return self.workers[index].run.remote([problems[p] for p, _ in shard], shard,
                                                  config, decoding, share=share,
                                                  rollout=rollout)

        calls = {i: submit(i) for i, shard in enumerate(shards) if shard}
        attempts = dict.fromkeys(calls, 1)
        batches: list[RolloutBatch] = []
        try:
            # as they end, not in order: a live worker may be waiting on a kernel a dead one
            # claimed, until that one's claims are released
            while calls:
                [ready], _ = ray.wait(list(calls.values()), num_returns=1)
                index = next(i for i, call in calls.items() if call == ready)
                try:
                    batches.append(ray.get(ready))
                    del calls[index]
                except ray.exceptions.RayActorError as exc:
                    if share is not None:
                        with contextlib.suppress(ray.exceptions.RayActorError):
                            ray.get(share.release.remote(rollout, index))
                    if attempts[index] >= SHARD_ATTEMPTS:
                        raise WorkerLost(f"rollout worker {index} died on each of "
                                         f"{SHARD_ATTEMPTS} attempts at its "
                                         f"{len(shards[index])} episodes ({type(exc).__name__})"
                                         ) from None
                    self._replace(index, self.version, f"{type(exc).__name__} mid-rollout")
                    attempts[index] += 1
                    calls[index] = submit(index)
        finally:
            if share is not None:
                share.forget.remote(rollout)
        batches.sort(key=lambda b: b.worker)
        stale = [(b.worker, b.version) for b in batches if b.version != self.version]
        if stale:
            raise StaleWeights(f"workers sampled with weight versions {stale}, but the learner "
                               f"published version {self.version}")
        self.tokens_generated += sum(b.tokens for b in batches)
        # workers run at the same time: a rollout's time in each phase is its slowest worker's;
        # the fastest worker's time in its episodes says how evenly the work was spread
        for key in {k for b in batches for k in b.seconds}:
            self.seconds[key] = (self.seconds.get(key, 0.0)
                                 + max(b.seconds.get(key, 0.0) for b in batches))
        self.seconds["episodes_fastest"] = self.seconds.get("episodes_fastest", 0.0) + min(
            (b.seconds.get("episodes", 0.0) for b in batches), default=0.0)
        self.last_batches = [{"worker": b.worker, "episodes": len(b.episodes),
                              "version": b.version, "attempts": attempts[b.worker],
                              "seconds": b.seconds.get("episodes", 0.0)}
                             for b in batches]
        by_slot = {slot: e for b in batches for slot, e in zip(shards[b.worker], b.episodes)}
        return [by_slot[slot] for slot in sorted(by_slot)]  # problem by problem, as one process

    def prefetch_baselines(self, problems: list[Any]) -> int:
        """The workers measure ``problems``' baselines before the first rollout, each a
        round-robin share on its GPU; returns how many were measured. Workers on one node share
        the figures through the evaluator's disk cache; a worker on another node measures the
        ones it lacks at first sight. A worker that dies here is replaced at the next rollout."""
        import ray

        shares = [problems[i :: len(self.workers)] for i in range(len(self.workers))]
        calls = [w.prefetch_baselines.remote(share) for w, share in zip(self.workers, shares)
                 if share]
        measured = 0
        for call in calls:
            with contextlib.suppress(ray.exceptions.RayActorError):
                measured += ray.get(call)
        return measured

    @property
    def evaluated_by(self) -> str:
        """Where ``evaluate`` plays its episodes, for the results' record."""
        return f"{len(self.workers)} Ray rollout workers"

    def evaluate(self, policy: Any, problems: list[Any], config: Any,
                 decoding: Mapping[str, Any]) -> list[Any]:
        """One episode per problem with ``policy``'s adapters as they are now (a select@ or
        held-out evaluation), spread over the workers. The adapters are published first under
        the current version: after early stopping has loaded an earlier step's agents, the
        workers hold other weights than the policy."""
        self.publish(policy, self.version or 0)
        return self.run_episodes(problems, 1, config, decoding)

    def worker_adapter_weights(self) -> list[dict[str, dict[str, Any]]]:
        import ray

        return ray.get([w.adapter_weights.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        try:
            ray.get([w.close.remote() for w in self.workers], timeout=60)
        except Exception:  # noqa: BLE001 - a dead worker has nothing left to close
            pass
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self.share is not None:
            ray.kill(self.share)
            self.share = None
