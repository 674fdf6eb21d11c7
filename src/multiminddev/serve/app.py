"""``create_app(config, routers=...)``: the FastAPI application of ``multiminddev serve``.

``app.state`` holds what routers use: ``config`` (ServeConfig), ``registry`` (ModelRegistry:
base model and adapters), ``jobs`` (JobManager: kernel-optimization jobs and their hooks),
``batcher`` (completion requests and kernel jobs' turns decoded together), ``ready`` (the model has loaded) and
``started_at``. These exist as soon as the app is created, so a component can register hooks
(``app.state.jobs.on_finished.append(...)``) before the server starts; the model loads and the
evaluator starts in the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from multiminddev.serve import kernels_api, openai_api
from multiminddev.serve.auth import ApiKeyMiddleware
from multiminddev.serve.batching import BatchedBackend, Batcher
from multiminddev.serve.config import ServeConfig
from multiminddev.serve.errors import ApiError, error_body, validation_message, validation_param
from multiminddev.serve.jobs import JobManager
from multiminddev.serve.registry import ModelRegistry

log = logging.getLogger(__name__)


def create_app(config: ServeConfig | None = None, *, routers: Iterable[Any] = ()) -> FastAPI:
    config = config or ServeConfig()
    registry = ModelRegistry(config)
    jobs = JobManager(config, registry)
    batcher = Batcher(registry, config.max_batch_size, config.batch_wait_ms / 1000.0)
    # kernel jobs decode through the batcher too: concurrent jobs' turns share generate calls
    jobs.backend_for = lambda adapters: BatchedBackend(batcher, registry, adapters)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(registry.load)
        jobs.start()
        app.state.ready = True
        log.info("serving %s with adapters %s", config.model, sorted(registry.adapters))
        try:
            yield
        finally:
            app.state.ready = False
            await batcher.close()
            await jobs.close()

    app = FastAPI(title="MultiMindDev", lifespan=lifespan)
    app.state.config = config
    app.state.registry = registry
    app.state.jobs = jobs
    app.state.batcher = batcher
    app.state.ready = False
    app.state.started_at = time.time()
    _error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ready": app.state.ready, "models": registry.names(),
                "jobs": {"running": sum(j.status.value == "running" for j in jobs.jobs.values()),
                         "queued": sum(j.status.value == "queued" for j in jobs.jobs.values())}}

    app.include_router(openai_api.router())
    app.include_router(kernels_api.router())
    for extra in routers:
        app.include_router(extra)
    if config.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    return app


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.code, exc.param),
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(error_body(400, "the request body is not valid JSON"),
                                status_code=400)
        return JSONResponse(error_body(400, validation_message(errors), "invalid_value",
                                       validation_param(errors)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request %s %s failed", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"),
                            status_code=500)
