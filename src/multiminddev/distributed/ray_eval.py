"""``RayEvaluator``: the ``Evaluator`` interface served by evaluation actors across a Ray cluster.

    with RayEvaluator(EvalConfig(), RayEvalConfig(address="auto")) as ev:
        result = ev.evaluate(problem, candidate_source)        # same calls, same EvalResult
        future = ev.submit(problem, candidate_source)          # concurrent.futures.Future

One evaluation actor per GPU of the cluster, placed by Ray on whichever node has the GPU
(``num_gpus=1``); on a cluster without GPUs, ``RayEvalConfig.cpu_actors`` actors that give
compile-only results. Each actor wraps a local ``Evaluator`` (its own worker pool, sandbox and
isolation, unchanged), so every guarantee of docs/evaluator.md holds per actor; compilation
stays inside the actor's workers because an NVRTC compile is run by the candidate's own code
as it is imported (its sources may be built at run time), which only a sandboxed worker may do.

Baselines (peak bandwidth, eager and torch.compile timings) live in one named actor,
``BaselineStore``, on the driver's node, backed by that node's authenticated disk cache: an
evaluation actor asks it before sending a job and records what its worker measured in the
trusted stage (``Evaluator._store_baselines``); candidate code runs in worker processes that
have no Ray connection, so it can neither read nor write the store.

A submission whose actor or node dies is sent to another actor, at most
``RayEvalConfig.max_attempts`` times; its result's ``attempts`` counts the actors it was sent to
and its ``message`` names the loss. A lost actor is replaced (Ray places the replacement where
resources are free, or when they come back).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multiminddev.core.problem import Problem, load_problem
from multiminddev.distributed.cluster import (
    LOCAL,
    RAY_NAMESPACE,
    LocalClusterConfig,
    cluster_gpus,
    connect,
    disconnect,
    import_ray,
    validate_address,
)
from multiminddev.env.benchmark import TrustedBaselines
from multiminddev.env.candidate import candidate_hash
from multiminddev.env.config import EvalConfig
from multiminddev.env.evaluator import Evaluator
from multiminddev.env.results import BenchmarkResult, EvalResult, EvalStatus, StageStatus

BASELINE_STORE_NAME = "multiminddev-baselines"


@dataclass(kw_only=True)
class RayEvalConfig:
    """How the evaluation service uses the cluster (the evaluation itself is ``EvalConfig``)."""

    # "local": start a cluster in this process; "auto": the one running on this machine;
    # HOST:PORT or ray://HOST:PORT: that one. A process already connected to Ray keeps it.
    address: str = LOCAL
    local: LocalClusterConfig | None = None  # sizes of a cluster started here
    # Evaluation actors where the cluster has no GPU (compile-only results); None: 2.
    cpu_actors: int | None = None
    actor_cpus: float = 1.0  # CPUs each evaluation actor reserves (static checks, its workers)
    # Torch threads in a GPU actor (it verifies outputs on the host). Ray would leave it one
    # thread per reserved CPU; None: its node's CPUs divided by the node's GPUs. Reserving that
    # many instead would leave no CPU on the node for other actors (rollout workers).
    actor_threads: int | None = None
    # Evaluations sent to one actor at a time: 2 keeps its next job queued behind the running
    # one (its spare workers are already warm) without hoarding work a faster actor could take.
    in_flight_per_actor: int = 2
    # Actors one submission may be sent to: a lost actor or node costs one attempt.
    max_attempts: int = 3
    # A call that outlives every stage limit of EvalConfig by this margin means the actor is
    # stuck (a partitioned node): it is killed and the submission retried.
    call_margin_s: float = 120.0
    # How long a submission waits for an actor before it ends as an infrastructure error
    # (all actors lost and no resources to replace them).
    placement_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        self.address = validate_address(self.address)
        if self.cpu_actors is not None and self.cpu_actors < 1:
            raise ValueError(f"cpu_actors must be >= 1 or None (2), got {self.cpu_actors}")
        if self.actor_cpus < 0:
            raise ValueError(f"actor_cpus must be >= 0, got {self.actor_cpus}")
        if self.actor_threads is not None and self.actor_threads < 1:
            raise ValueError(f"actor_threads must be >= 1 or None, got {self.actor_threads}")
        if self.in_flight_per_actor < 1 or self.max_attempts < 1:
            raise ValueError("in_flight_per_actor and max_attempts must be >= 1 (1 attempt: "
                             "no retry after a lost actor)")
        if self.call_margin_s <= 0 or self.placement_timeout_s <= 0:
            raise ValueError("call_margin_s and placement_timeout_s must be > 0 seconds")


def call_limit_s(config: EvalConfig, margin_s: float) -> float:
    """The longest one evaluation may take in an actor: worker start-up twice (the pool's one
    retry), every stage limit, the pool's infra retries, plus ``margin_s`` (pure)."""
    stages = (config.setup_timeout_s + config.baseline_timeout_s + config.timeout_s
              + config.inline_build_timeout_s)
    one = 2 * config.startup_timeout_s + stages
    retries = config.infra_retries
    pauses = config.infra_retry_delay_s * retries * (retries + 1) / 2
    return (retries + 1) * one + pauses + margin_s


# ----------------------------------------------------------------------------- actors


class BaselineStore(TrustedBaselines):
    """The cluster's trusted baseline figures (a named Ray actor on the driver's node): memory
    plus that node's authenticated disk cache. Only evaluation actors call ``put``, with what a
    worker measured in its trusted stage."""

    def get(self, key: str) -> dict[str, Any] | None:
        return self._get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        if isinstance(key, str) and isinstance(value, dict):
            self._put(key, value)


class ClusterBaselines(TrustedBaselines):
    """``TrustedBaselines`` whose figures come from and go to the cluster's ``BaselineStore``
    (kept in memory here too). An unreachable store reads as a miss and drops the write: the
    figure is measured again, never invented."""

    def __init__(self, store: Any, timeout_s: float = 30.0):
        # No disk of its own: the store is the one copy (TrustedBaselines' state, set directly).
        self._disk = None
        self._memory = {}
        self._lock = threading.Lock()
        self._store = store
        self._timeout_s = timeout_s

    def _get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._memory.get(key)
        if hit is not None:
            return hit
        ray = import_ray()
        try:
            hit = ray.get(self._store.get.remote(key), timeout=self._timeout_s)
        except Exception:  # noqa: BLE001 - a lost store costs a measurement, not the evaluation
            return None
        if isinstance(hit, dict):
            with self._lock:
                self._memory[key] = hit
            return hit
        return None

    def _put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._memory[key] = value
        # Waited for, so an evaluation that starts after this one returned finds the figure
        # on any actor (the store serves calls concurrently, in no promised order).
        with contextlib.suppress(Exception):  # as above: a lost store costs a measurement
            import_ray().get(self._store.put.remote(key, value), timeout=self._timeout_s)


class EvaluationActor:
    """One local ``Evaluator`` in a Ray actor, for the actor's one GPU (or compile-only) with
    that GPU's default slots (``env.pool.default_slot_count``)."""

    def __init__(self, config: dict[str, Any], store: Any, threads: int | None = None):
        cfg = replace(EvalConfig.from_dict(config), num_workers=None)
        baselines = ClusterBaselines(store) if (cfg.benchmark and store is not None) else None
        self._evaluator = Evaluator(cfg, baselines=baselines)
        if self._evaluator.pool.gpu_count:
            import torch

            torch.set_num_threads(threads or _node_cpus_per_gpu())

    def ready(self) -> dict[str, Any]:
        """Where this actor runs; called once before it gets work."""
        ray = import_ray()
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "gpus": self._evaluator.pool.gpu_count}

    def warm_up(self) -> None:
        self._evaluator.warm_up()

    def evaluate(self, problem: dict[str, Any], candidate: str) -> dict[str, Any]:
        result = self._evaluator.evaluate(Problem.from_dict(problem), candidate)
        return result.to_dict()

    def close(self) -> None:
        self._evaluator.close()


def _node_cpus_per_gpu() -> int:
    """This node's CPUs divided by its GPUs (at least 1)."""
    ray = import_ray()
    here = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == here:
            resources = node.get("Resources", {})
            return max(1, int(resources.get("CPU", 1) // max(1, resources.get("GPU", 0))))
    return 1


@functools.cache
def _remote_classes() -> tuple[Any, Any]:
    ray = import_ray()
    return ray.remote(EvaluationActor), ray.remote(BaselineStore)


def baseline_store(cache_dir: str | Path) -> Any:
    """The cluster's ``BaselineStore`` actor, started on this node if none runs yet. Pinned to
    this node (a node that leaves takes no figures with it) and taking no CPU."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _, store_cls = _remote_classes()
    here = ray.get_runtime_context().get_node_id()
    return store_cls.options(
        name=BASELINE_STORE_NAME, namespace=RAY_NAMESPACE, get_if_exists=True, num_cpus=0,
        max_concurrency=16,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(Path(cache_dir))


# ----------------------------------------------------------------------------- the service


@dataclass
class _Actor:
    handle: Any
    ready_ref: Any
    ready: bool = False
    in_flight: int = 0
    info: dict[str, Any] | None = None


class _ActorLost(Exception):
    """The actor running a submission died, its node left, or it stopped answering."""


class RayEvaluator:
    """The ``Evaluator`` interface over evaluation actors; see the module docstring."""

    def __init__(self, config: EvalConfig | None = None, ray_config: RayEvalConfig | None = None):
        self.config = config or EvalConfig()
        self.ray_config = ray_config or RayEvalConfig()
        self._owns_ray = connect(self.ray_config.address, self.ray_config.local)
        self._ray = import_ray()
        self._closed = False
        self._cond = threading.Condition()
        self._actors: list[_Actor] = []
        self._start_errors: list[str] = []
        self.lost_actors = 0
        try:
            self._store = baseline_store(self.config.cache_path) if self.config.benchmark else None
            gpus = cluster_gpus()
            self.gpu_actors = gpus > 0
            self.target_actors = gpus or self.ray_config.cpu_actors or 2
            for _ in range(self.target_actors):
                self._actors.append(self._start_actor())
        except Exception:
            disconnect(self._owns_ray)
            raise
        self._call_limit_s = call_limit_s(self.config, self.ray_config.call_margin_s)
        self._executor = cf.ThreadPoolExecutor(
            max_workers=self.target_actors * self.ray_config.in_flight_per_actor,
            thread_name_prefix="mmd-ray-eval")

    # ------------------------------------------------------------------ public API

    def evaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        return self.submit(problem, candidate).result()

    def submit(self, problem: Problem | str | Path, candidate: str) -> cf.Future[EvalResult]:
        if self._closed:
            future: cf.Future[EvalResult] = cf.Future()
            future.set_result(_infra_result(problem, candidate, "the evaluator is closed"))
            return future
        return self._executor.submit(self._evaluate_safely, problem, candidate)

    def evaluate_many(self, pairs: Iterable[tuple[Problem | str | Path, str]]) -> list[EvalResult]:
        futures = [self.submit(p, c) for p, c in pairs]
        return [f.result() for f in futures]

    async def aevaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        return await asyncio.wrap_future(self.submit(problem, candidate))

    def prefetch_baselines(self, problems: Any, *, wait: bool = False) -> int:
        """Baselines on the cluster are measured by each actor's trusted stage and shared
        through the ``BaselineStore``; nothing is scheduled ahead here (0 jobs)."""
        return 0

    def warm_up(self) -> None:
        """Wait until every evaluation actor is placed and its workers have started."""
        with self._cond:
            actors = list(self._actors)
        refs = [a.handle.warm_up.remote() for a in actors]
        self._ray.wait(refs, num_returns=len(refs), timeout=self.ray_config.placement_timeout_s)
        with self._cond:
            self._poll_ready_locked()

    def actors(self) -> list[dict[str, Any]]:
        """The evaluation actors now: handle, whether placed, where, evaluations in flight."""
        with self._cond:
            self._poll_ready_locked()
            return [{"handle": a.handle, "ready": a.ready, "in_flight": a.in_flight,
                     **(a.info or {})} for a in self._actors]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            actors, self._actors = list(self._actors), []
        closing = [a.handle.close.remote() for a in actors if a.ready]
        if closing:
            self._ray.wait(closing, num_returns=len(closing), timeout=30)
        for a in actors:
            self._kill(a.handle)
        # No actor handle may outlive the connection: one released after Ray shut down can
        # crash the interpreter as it exits.
        actors.clear()
        self._store = None
        disconnect(self._owns_ray)

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ actors

    def _start_actor(self) -> _Actor:
        actor_cls, _ = _remote_classes()
        options: dict[str, Any] = {
            "num_cpus": self.ray_config.actor_cpus,
            # calls beyond the evaluations in flight: ready, warm_up, close
            "max_concurrency": self.ray_config.in_flight_per_actor + 2,
            "max_restarts": 0,  # a lost actor is replaced by the service, its work retried
            "scheduling_strategy": "SPREAD",
        }
        if self.gpu_actors:
            options["num_gpus"] = 1
        handle = actor_cls.options(**options).remote(self.config.to_dict(), self._store,
                                                     self.ray_config.actor_threads)
        return _Actor(handle=handle, ready_ref=handle.ready.remote())

    def _poll_ready_locked(self) -> None:
        pending = [a for a in self._actors if not a.ready]
        if not pending:
            return
        done, _ = self._ray.wait([a.ready_ref for a in pending], num_returns=len(pending),
                                 timeout=0)
        done_ids = {ref.hex() for ref in done}
        for actor in pending:
            if actor.ready_ref.hex() not in done_ids:
                continue
            try:
                actor.info = self._ray.get(actor.ready_ref)
                actor.ready = True
            except Exception as exc:  # noqa: BLE001 - the actor failed to start
                self._start_errors.append(_one_line(exc))
                self._actors.remove(actor)
                self._kill(actor.handle)
                if len(self._start_errors) <= 3 * self.target_actors and not self._closed:
                    self._actors.append(self._start_actor())

    def _acquire(self) -> _Actor | None:
        """The placed actor with the fewest evaluations in flight, below the cap; waits for one
        (None after ``placement_timeout_s``, or once closed). A lost actor has left the list, so
        a retry always goes to another one."""
        deadline = time.monotonic() + self.ray_config.placement_timeout_s
        cap = self.ray_config.in_flight_per_actor
        with self._cond:
            while not self._closed:
                self._poll_ready_locked()
                free = [a for a in self._actors if a.ready and a.in_flight < cap]
                pick = min(free, key=lambda a: a.in_flight, default=None)
                if pick is not None:
                    pick.in_flight += 1
                    return pick
                left = deadline - time.monotonic()
                if left <= 0 or (not self._actors and self._start_errors):
                    return None
                self._cond.wait(min(0.2, left))
        return None

    def _release(self, actor: _Actor) -> None:
        with self._cond:
            actor.in_flight -= 1
            self._cond.notify()

    def _lose(self, actor: _Actor) -> None:
        """Drop a lost actor and start its replacement (Ray places it where resources are)."""
        with self._cond:
            actor.in_flight -= 1
            if actor not in self._actors:
                return
            self._actors.remove(actor)
            self.lost_actors += 1
            if not self._closed:
                self._actors.append(self._start_actor())
            self._cond.notify_all()
        self._kill(actor.handle)

    def _kill(self, handle: Any) -> None:
        with contextlib.suppress(Exception):  # already gone
            self._ray.kill(handle, no_restart=True)

    # ------------------------------------------------------------------ one submission

    def _evaluate_safely(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        start = time.perf_counter()
        try:
            result = self._evaluate(problem, candidate)
        except Exception as exc:  # noqa: BLE001 - our bug must not kill the caller's loop
            result = _infra_result(problem, candidate,
                                   f"evaluator error: {type(exc).__name__}: {exc}")
        result.seconds = time.perf_counter() - start
        return result

    def _evaluate(self, problem: Problem | str | Path, candidate: str) -> EvalResult:
        if not isinstance(problem, Problem):
            problem = load_problem(problem)
        job = problem.to_dict()
        losses: list[str] = []
        for attempt in range(1, self.ray_config.max_attempts + 1):
            actor = self._acquire()
            if actor is None:
                why = ("the evaluator is closed" if self._closed else
                       f"no evaluation actor could start: {self._start_errors[-1]}"
                       if self._start_errors and not self._actors else
                       "no evaluation actor became free within "
                       f"{self.ray_config.placement_timeout_s:.0f} s")
                return _lost_result(problem, candidate, why, losses, attempt - 1)
            try:
                data = self._call(actor, job, candidate)
            except _ActorLost as exc:
                losses.append(str(exc))
                self._lose(actor)
                continue
            except BaseException:
                self._release(actor)
                raise
            self._release(actor)
            result = EvalResult.from_dict(data)
            result.attempts = attempt
            if losses:
                result.message = (f"{result.message} [retried on another evaluation actor: "
                                  f"{'; '.join(losses)}]").strip()
            return result
        return _lost_result(problem, candidate, "every attempt lost its actor", losses,
                            self.ray_config.max_attempts)

    def _call(self, actor: _Actor, job: dict[str, Any], candidate: str) -> dict[str, Any]:
        ray = self._ray
        ref = actor.handle.evaluate.remote(job, candidate)
        try:
            return ray.get(ref, timeout=self._call_limit_s)
        except ray.exceptions.GetTimeoutError:
            raise _ActorLost(f"actor stopped answering after {self._call_limit_s:.0f} s") from None
        except ray.exceptions.RayTaskError:
            raise  # a bug in the actor's own code: retrying elsewhere would repeat it
        except ray.exceptions.RayError as exc:
            where = (actor.info or {}).get("node_id", "")[:12]
            raise _ActorLost(f"actor{' on node ' + where if where else ''} lost "
                             f"({type(exc).__name__})") from None


def make_evaluator(eval_config: EvalConfig, ray_address: str | None = None,
                   ray_config: RayEvalConfig | None = None) -> Any:
    """The evaluator a command uses: the local ``Evaluator`` without ``ray_address``, else a
    ``RayEvaluator`` on that cluster (``local``, ``auto``, HOST:PORT). ``EvalConfig.num_workers``
    sets the number of compile-only actors where the cluster has no GPU."""
    if ray_address is None:
        return Evaluator(eval_config)
    base = ray_config or RayEvalConfig()
    cpu_actors = base.cpu_actors if base.cpu_actors is not None else eval_config.num_workers
    return RayEvaluator(eval_config, replace(base, address=ray_address, cpu_actors=cpu_actors))


# ----------------------------------------------------------------------------- results


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _infra_result(problem: Any, candidate: str, message: str) -> EvalResult:
    name = problem.name if isinstance(problem, Problem) else str(problem)
    return EvalResult(status=EvalStatus.INFRA_ERROR, problem=name,
                      candidate_hash=candidate_hash(candidate or ""), message=message,
                      benchmark=BenchmarkResult(status=StageStatus.SKIPPED))


def _lost_result(problem: Problem, candidate: str, why: str, losses: list[str],
                 attempts: int) -> EvalResult:
    detail = f" after {attempts} lost attempt(s): {'; '.join(losses)}" if losses else ""
    result = _infra_result(problem, candidate, f"{why}{detail}")
    result.attempts = max(1, attempts)
    return result
