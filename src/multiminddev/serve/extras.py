"""What ``multiminddev serve`` adds to the core app: the web page, Prometheus ``/metrics`` and,
with a state folder, A/B rollout of agent checkpoints.

A/B (``ServeConfig.state_dir`` set): the arms live in ``STATE_DIR/ab.sqlite``
(``multiminddev ab add-arm``). Every optimize request that names neither ``adapters`` nor
``arm`` is assigned an arm by weight; the arm's adapters are loaded into the registry on first
use as ``<arm>-<role>``; a request that names its ``arm`` runs on that arm's adapters (an
unknown arm is refused with 404); every finished job is recorded on its arm. With no arm defined, jobs
run on the served agents as without A/B.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

from multiminddev.serve.ab import ABStore
from multiminddev.serve.ab_routes import install_ab
from multiminddev.serve.config import ServeConfig
from multiminddev.serve.metrics import ServeMetrics, install_metrics
from multiminddev.serve.web import web_router


def routers(config: ServeConfig) -> list[Any]:
    return [web_router()]


def install(app: Any) -> None:
    """Metrics for every app; the A/B store and arm assignment where there is a state folder."""
    config: ServeConfig = app.state.config
    jobs = app.state.jobs
    store = ABStore.in_state_dir(config.state_dir) if config.state_dir else None
    if store is not None:
        # changes need the API key where the server has one; arm adapters lie in its roots
        install_ab(app, store, admin_token=config.api_key, adapter_roots=config.adapter_folders)
        assigner = ArmAssigner(store, app.state.registry)
        jobs.assign_arm = assigner
        jobs.adapters_for_arm = assigner.for_arm
    batcher = app.state.batcher
    metrics = ServeMetrics(
        jobs_by_status=lambda: Counter(j.status.value for j in list(jobs.jobs.values())),
        store=store, queue_depth=lambda: batcher.queue_depth)
    batcher.observers.append(metrics.observe_generation)
    install_metrics(app, metrics)


class ArmAssigner:
    """``JobManager.assign_arm``: a weighted arm per request; its adapters as registry names."""

    def __init__(self, store: ABStore, registry: Any):
        self.store, self.registry = store, registry
        self._lock = threading.Lock()

    def __call__(self, source: str, options: Any) -> tuple[dict[str, str] | None, str | None]:
        if not self.store.arms():
            return None, None
        arm = self.store.assign(uuid.uuid4().hex)
        return self.adapter_names(arm.name, arm.adapters), arm.name

    def for_arm(self, name: str) -> dict[str, str]:
        """A named arm's adapters as registry names (KeyError: no such arm)."""
        arm = self.store.arm(name)
        return self.adapter_names(arm.name, arm.adapters)

    def adapter_names(self, arm: str, paths: dict[str, str]) -> dict[str, str]:
        """{role: registry name} for an arm's {role: adapter folder}, loading each once."""
        names = {}
        with self._lock:
            for role, path in sorted(paths.items()):
                name = f"{arm}-{role}"
                if name not in self.registry.adapters:
                    self.registry.load_adapter(name, path)
                names[role] = name
        return names
