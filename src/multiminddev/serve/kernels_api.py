"""Kernel-optimization routes.

- ``POST /v1/kernels/optimize`` ``{"module": "<KernelBench source>", "turns": 3, ...,
  "adapters": {"generator": NAME, "optimizer": NAME}, "arm": NAME}`` -> 202 ``{"id", "status"}``.
- ``GET /v1/kernels/limits``: the largest ``turns``, ``max_new_tokens`` and module size this
  server takes (every value out of range is answered 400).
- ``GET /v1/kernels/jobs/{id}``: status, one entry per turn, the best kernel and its
  ``EvalResult`` as a dict.
- ``GET /v1/kernels/jobs/{id}/events``: server-sent events: ``started``, one ``turn`` per turn
  as it is evaluated, ``done`` (the poll's summary); a late subscriber gets every event from
  the first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from multiminddev.serve.errors import ApiError
from multiminddev.serve.jobs import JobError, JobManager, JobOptions


class OptimizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    module: str
    name: str = Field(default="module", max_length=100)
    turns: int = Field(default=3, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=1024, ge=1)
    target_speedup: float = Field(default=2.0, ge=0.0)
    patience: int = Field(default=2, ge=0)
    seed: int | None = None
    adapters: dict[str, str] | None = None
    arm: str | None = None


def router() -> APIRouter:
    api = APIRouter(prefix="/v1/kernels")

    @api.post("/optimize", status_code=202)
    async def optimize(body: OptimizeRequest, request: Request) -> JSONResponse:
        jobs: JobManager = request.app.state.jobs
        if not request.app.state.ready:
            raise ApiError(503, "the server is still loading; retry in a moment")
        try:
            options = JobOptions(turns=body.turns, temperature=body.temperature,
                                 top_p=body.top_p, max_new_tokens=body.max_new_tokens,
                                 target_speedup=body.target_speedup, patience=body.patience,
                                 seed=body.seed, name=body.name)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        try:
            job = jobs.submit(body.module, options, body.adapters, body.arm)
        except JobError as exc:
            raise ApiError(exc.status, str(exc), param=exc.param) from exc
        return JSONResponse({"id": job.id, "status": job.status.value, "arm": job.arm,
                             "adapters": job.adapters}, status_code=202)

    @api.get("/limits")
    async def limits(request: Request) -> dict[str, Any]:
        return request.app.state.config.limits.to_dict()

    @api.get("/jobs/{job_id}")
    async def job_status(job_id: str, request: Request) -> dict[str, Any]:
        return _job(request, job_id).summary()

    @api.get("/jobs/{job_id}/events", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
    async def job_events(job_id: str, request: Request) -> StreamingResponse:
        jobs: JobManager = request.app.state.jobs
        _job(request, job_id)

        async def stream() -> AsyncIterator[str]:
            async for event in jobs.events(job_id):
                kind = event.get("event", "message")
                yield f"event: {kind}\ndata: {json.dumps(event, default=str)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    return api


def _job(request: Request, job_id: str) -> Any:
    job = request.app.state.jobs.get(job_id)
    if job is None:
        raise ApiError(404, f"no job {job_id!r} on this server")
    return job
