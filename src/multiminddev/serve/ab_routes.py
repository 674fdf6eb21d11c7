"""HTTP routes of the A/B rollout: ``GET /v1/ab/status``, ``POST /v1/ab/arms``,
``POST /v1/ab/weights`` and ``POST /v1/ab/promote``.

Changing arms moves production traffic, so when ``admin_token`` is given every POST needs
``Authorization: Bearer <token>`` (``multiminddev serve`` passes its API key, which then also
guards the status with every other ``/v1/`` route).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from multiminddev.policy.model import PolicyError, adapter_paths_in
from multiminddev.serve.ab import ABStore, ArmExistsError, record_job
from multiminddev.serve.auth import PathOutsideRootsError, bearer_matches, confine_adapter_path


class AddArmRequest(BaseModel):
    name: str
    # A checkpoint folder holding generator/ and optimizer/ adapters, or the adapters one by
    # one as {role: path}; neither: the base model without adapters.
    path: str | None = None
    adapters: dict[str, str] | None = None
    weight: float = Field(default=1.0, ge=0)


class WeightsRequest(BaseModel):
    weights: dict[str, float]


class PromoteRequest(BaseModel):
    arm: str


def checkpoint_adapters(path: str | Path) -> dict[str, str]:
    """``{role: path}`` of the adapters in a checkpoint folder; ValueError saying what is
    missing otherwise."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; give a checkpoint folder holding "
                         "generator/ and optimizer/ adapters")
    try:
        return {role: str(Path(p).resolve()) for role, p in adapter_paths_in(folder).items()}
    except PolicyError as exc:
        raise ValueError(str(exc)) from None


def ab_router(store: ABStore, *, admin_token: str | None = None,
              adapter_roots: Sequence[Path] | None = None) -> APIRouter:
    """With ``adapter_roots``, an arm's adapter folders must lie inside them (403 otherwise)."""
    router = APIRouter(prefix="/v1/ab", tags=["ab"])

    def authorize(authorization: str | None) -> None:
        if admin_token is None:
            return
        if not bearer_matches(authorization, admin_token):
            raise HTTPException(401, "this server changes A/B arms only with its admin token: "
                                     "send 'Authorization: Bearer <token>'")

    @router.get("/status")
    def status() -> dict[str, Any]:
        return store.summary()

    @router.post("/arms", status_code=201)
    def add_arm(body: AddArmRequest,
                authorization: str | None = Header(default=None)) -> dict[str, Any]:
        authorize(authorization)
        if body.path is not None and body.adapters is not None:
            raise HTTPException(400, "give either path (a checkpoint folder) or adapters "
                                     "({role: path}), not both")
        try:
            if adapter_roots is not None:
                for given in [body.path] if body.path is not None else list(
                        (body.adapters or {}).values()):
                    confine_adapter_path(given, adapter_roots)
            adapters = (checkpoint_adapters(body.path) if body.path is not None
                        else dict(body.adapters or {}))
            missing = [p for p in adapters.values() if not Path(p).exists()]
            if missing:
                raise ValueError(f"adapter path {missing[0]} does not exist on the server")
            arm = store.add_arm(body.name, adapters, weight=body.weight)
        except PathOutsideRootsError as exc:
            raise HTTPException(403, str(exc)) from None
        except ArmExistsError as exc:
            raise HTTPException(409, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return {"name": arm.name, "adapters": arm.adapters, "weight": arm.weight}

    @router.post("/weights")
    def set_weights(body: WeightsRequest,
                    authorization: str | None = Header(default=None)) -> dict[str, Any]:
        authorize(authorization)
        try:
            store.set_weights(body.weights)
        except KeyError as exc:
            raise HTTPException(404, exc.args[0]) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return store.summary()

    @router.post("/promote")
    def promote(body: PromoteRequest,
                authorization: str | None = Header(default=None)) -> dict[str, Any]:
        authorize(authorization)
        try:
            store.promote(body.arm)
        except KeyError as exc:
            raise HTTPException(404, exc.args[0]) from None
        return store.summary()

    return router


def install_ab(app: FastAPI, store: ABStore, *, admin_token: str | None = None,
               adapter_roots: Sequence[Path] | None = None) -> None:
    """Serve the A/B routes on ``app`` (see ``ab_router``) and record every finished job of its
    job manager (``app.state.jobs.on_finished``) on the job's arm."""
    app.include_router(ab_router(store, admin_token=admin_token, adapter_roots=adapter_roots))
    app.state.jobs.on_finished.append(lambda job: record_job(store, job))
