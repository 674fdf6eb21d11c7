"""Real servers and a real browser for the serve tests.

- :class:`UvicornThread` (``server_helpers``): a uvicorn server on a free port in a thread.
- :func:`job_app`: a FastAPI app holding the A/B, metrics and web routers plus the server's
  kernel job contract the page uses (``POST /v1/kernels/optimize`` ``{"module", "turns"}`` ->
  ``{"id"}``, ``GET /v1/kernels/jobs/{id}`` -> the summary with ``best_source`` and
  ``best_result``, ``GET /v1/kernels/jobs/{id}/events`` as server-sent events: ``started``, one
  ``turn`` per turn with its result's status flat on it, then ``done``). Its jobs are real but cheap: the submitted
  module is loaded as a problem, then a fixed list of candidate kernels is judged one per turn
  by the real evaluator (compile-only here) and reported with the real Tester's feedback (a
  :class:`ModelReply` candidate goes through the real parser first: a format failure where it
  holds no kernel);
  each finished job is recorded on its A/B arm.
- :class:`Chromium`: Debian's chromium, headless, driven over the DevTools protocol with a
  small websockets client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict

from tests.serve.server_helpers import UvicornThread  # noqa: F401 - the tests import it here

CHROMIUM = Path("/usr/bin/chromium")


# ------------------------------------------------------------------------------- job app


@dataclass(frozen=True)
class ModelReply:
    """A candidate given as the model's whole reply: the real parser takes the kernel out of
    it, and a reply without one is a format-failure turn."""

    text: str


class OptimizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    module: str
    turns: int = 3


class _Job:
    def __init__(self, job_id: str, arm: str):
        self.id, self.arm = job_id, arm
        self.status = "running"
        self.turns: list[dict[str, Any]] = []
        self.best: tuple[str, Any] | None = None
        self.changed = asyncio.Event()

    def summary(self) -> dict[str, Any]:
        best = self.best
        return {"id": self.id, "status": self.status, "arm": self.arm, "error": None,
                "turns": self.turns, "best_source": best[0] if best else None,
                "best_result": best[1].to_dict() if best else None}


def turn_event(turn: Any) -> dict[str, Any]:
    """A turn as the server's events carry it: its result's status flat on the turn."""
    result = turn.eval_result
    return {"index": turn.index, "role": turn.role.value, "text": turn.text,
            "candidate_source": turn.candidate_source, "feedback": turn.feedback,
            "parse_failure": turn.parse_failure.value if turn.parse_failure else None,
            "status": result.status.value if result is not None else None,
            "compiled": bool(result.compiled) if result is not None else False,
            "correct": bool(result.correct) if result is not None else False,
            "speedup": float(result.speedup) if result is not None and result.correct else None}


def job_app(store: Any, evaluator: Any, candidates: Sequence[str | ModelReply], *,
            metrics: Any = None) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import StreamingResponse

    from multiminddev.agents.parsing import parse_candidate
    from multiminddev.agents.roles import AgentRole
    from multiminddev.agents.tester import tester_feedback
    from multiminddev.episode.state import Turn
    from multiminddev.serve.ab import outcome_from_result
    from multiminddev.serve.ab_routes import ab_router
    from multiminddev.serve.metrics import install_metrics
    from multiminddev.serve.web import web_router
    from multiminddev.tasks.problem import ProblemError, load_problem_source

    app = FastAPI()
    jobs: dict[str, _Job] = {}
    tasks: set[asyncio.Task] = set()

    async def run(job: _Job, problem: Any, source: str, turns: int) -> None:
        start = time.monotonic()
        for index, candidate in enumerate(candidates[:turns]):
            role = AgentRole.GENERATOR if index == 0 else AgentRole.OPTIMIZER
            parsed = parse_candidate(candidate) if isinstance(candidate, ModelReply) else None
            if parsed is not None and parsed.source is None:  # a format failure: no kernel
                job.turns.append(turn_event(Turn(index=index, role=role, text=candidate.text,
                                                 parse_failure=parsed.failure)))
                job.changed.set()
                continue
            candidate = parsed.source if parsed is not None else candidate
            result = await evaluator.aevaluate(problem, candidate)
            turn = Turn(index=index, role=role, candidate_source=candidate, eval_result=result,
                        feedback=tester_feedback(result, candidate))
            if result.compiled:
                job.best = (candidate, result)
            job.turns.append(turn_event(turn))
            job.changed.set()
        best = job.best[1] if job.best else None
        store.record(outcome_from_result(arm=job.arm, source=source, result=best, reward=None,
                                         latency_s=time.monotonic() - start, job_id=job.id))
        job.status = "succeeded"
        job.changed.set()

    @app.post("/v1/kernels/optimize", status_code=202)
    async def optimize(body: OptimizeRequest) -> dict[str, Any]:
        try:
            problem = load_problem_source(body.module, name="module")
        except ProblemError as exc:
            raise HTTPException(400, str(exc)) from None
        job_id = uuid.uuid4().hex
        job = jobs[job_id] = _Job(job_id, store.assign(job_id).name)
        task = asyncio.create_task(run(job, problem, body.module, body.turns))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return {"id": job_id, "status": job.status, "arm": job.arm}

    def get(job_id: str) -> _Job:
        if job_id not in jobs:
            raise HTTPException(404, f"no job {job_id}")
        return jobs[job_id]

    @app.get("/v1/kernels/jobs/{job_id}")
    async def job_status(job_id: str) -> dict[str, Any]:
        return get(job_id).summary()

    @app.get("/v1/kernels/jobs/{job_id}/events")
    async def events(job_id: str) -> StreamingResponse:
        job = get(job_id)

        async def stream():
            yield f"event: started\ndata: {json.dumps({'event': 'started'})}\n\n"
            sent = 0
            while True:
                job.changed.clear()
                for turn in job.turns[sent:]:
                    yield f"event: turn\ndata: {json.dumps({'event': 'turn', **turn})}\n\n"
                sent = len(job.turns)
                if job.status == "succeeded":
                    yield f"event: done\ndata: {json.dumps(job.summary())}\n\n"
                    return
                # A short wait bounds a wake-up lost to another stream's clear().
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(job.changed.wait(), 0.5)

        return StreamingResponse(stream(), media_type="text/event-stream")

    app.include_router(ab_router(store))
    app.include_router(web_router())
    if metrics is not None:
        install_metrics(app, metrics)
    app.state.jobs = jobs
    return app


# ------------------------------------------------------------------------------ chromium


class Chromium:
    """Headless chromium with one page, driven over the DevTools protocol."""

    def __init__(self, user_data_dir: Path):
        self.user_data_dir = user_data_dir
        self.proc: subprocess.Popen | None = None
        self.ws: Any = None
        self.session = ""
        self._next_id = 0

    def __enter__(self) -> Self:
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-port=0", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
             f"--user-data-dir={self.user_data_dir}", "--window-size=1280,1600", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        ws_url = self._devtools_url()
        self.ws = connect(ws_url, max_size=None, open_timeout=30).__enter__()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)
        return self

    def _devtools_url(self) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}")
            if match := re.search(r"DevTools listening on (ws://\S+)", line):
                # Keep draining stderr so chromium never blocks on a full pipe.
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return match.group(1)
        raise RuntimeError("chromium printed no DevTools address within 60 s")

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('turns')")

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"the page never made true: {expression}")

    def insert_text(self, selector: str, text: str) -> None:
        """Focus ``selector`` and insert ``text`` as a paste does (one input event)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", session=True, text=text)

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def upload(self, selector: str, path: Path) -> None:
        """Choose ``path`` in the file input ``selector`` (the page sees a change event)."""
        root = self.call("DOM.getDocument", session=True)["root"]["nodeId"]
        node = self.call("DOM.querySelector", session=True, nodeId=root, selector=selector)
        self.call("DOM.setFileInputFiles", session=True, files=[str(path)],
                  nodeId=node["nodeId"])

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def __exit__(self, *exc: object) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def save_artifact(path: Path) -> None:
    """Copy a test artifact to ``$MMD_TEST_ARTIFACTS`` when that is set."""
    import os

    target = os.environ.get("MMD_TEST_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(target) / path.name)
