"""Load and fault test of ``multiminddev serve`` on loopback (127.0.0.1 only).

    python benchmarks/bench_serve_load.py                       # 64 clients, 120 s, CPU
    python benchmarks/bench_serve_load.py --clients 8 --seconds 15 --out load.json

Starts ``multiminddev serve`` (embedded model, no adapters, a fresh state folder with two A/B
arms) in its own process group, then runs ``--clients`` concurrent clients for ``--seconds`` of server time (the restart's gap
added):
chat completions, completions, streamed completions, clients that drop a stream after its first
chunk, and kernel jobs (submitted, then polled to their end). Halfway through the server is
killed with SIGKILL (its whole process group) and started again on the same state folder; the
clients ride through the gap. After the run it waits (at most ``--drain-seconds``) for accepted
jobs to end, stops the server and checks:

- server errors: every HTTP status >= 500 (target 0); a refused connection while the server is
  down is counted apart;
- jobs: every accepted job is found over HTTP after the restart and in the state folder, ended
  (succeeded, or failed with its reason: those the kill cut short read "failed" with it);
- A/B: the outcomes recorded per arm are exactly the succeeded jobs of that arm.

Prints one JSON object (also written to ``--out``): p50/p99 latency per request kind, counts,
the checks and ``ok``; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
'''
KINDS = ("chat", "completion", "stream", "job", "chat", "completion", "stream", "disconnect")
ARMS = ("control", "other")


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    unreachable: int = 0  # connection refused or dropped: the server was down
    timed_out: Counter = field(default_factory=Counter)  # no answer within the client timeout
    jobs: dict[str, float] = field(default_factory=dict)  # accepted job id -> when

    def record(self, kind: str, status: int, seconds: float, what: str = "") -> None:
        self.statuses[f"{kind}:{status}"] += 1
        if status >= 500:
            self.server_errors.append(f"{kind} {status} {what[:200]}")
        elif status < 400:
            self.latencies[kind].append(seconds)


class Server:
    """``multiminddev serve`` in its own process group, restartable on the same folder."""

    def __init__(self, args: argparse.Namespace, state: Path, port: int, log: Path):
        self.args, self.state, self.port, self.log = args, state, port, log
        self.process: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> float:
        command = [sys.executable, "-m", "multiminddev.cli", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port), "--device", self.args.device, "--adapters",
                   "none", "--state-dir", str(self.state), "--max-running-jobs", "2"]
        began = time.monotonic()
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = began + self.args.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with {self.process.returncode}; "
                                 f"see {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).json().get("ready"):
                    return time.monotonic() - began
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        self.kill()
        raise SystemExit(f"the server did not become ready in {self.args.start_timeout} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


# ------------------------------------------------------------------------------ clients


async def one_request(http: httpx.AsyncClient, kind: str, stats: Stats, job_budget: list[int]
                      ) -> None:
    began = time.monotonic()
    chat = {"model": "base", "messages": [{"role": "user", "content": "Name a GPU."}],
            "max_tokens": 8}
    completion = {"model": "base", "prompt": "def relu(x):", "max_tokens": 8}
    if kind == "chat":
        reply = await http.post("/v1/chat/completions", json=chat)
        stats.record(kind, reply.status_code, time.monotonic() - began, reply.text)
    elif kind == "completion":
        reply = await http.post("/v1/completions", json=completion)
        stats.record(kind, reply.status_code, time.monotonic() - began, reply.text)
    elif kind in ("stream", "disconnect"):
        async with http.stream("POST", "/v1/completions",
                               json={**completion, "stream": True}) as reply:
            async for _ in reply.aiter_lines():
                if kind == "disconnect":
                    break  # the client goes away mid-stream
            stats.record(kind, reply.status_code, time.monotonic() - began)
    elif kind == "job":
        if job_budget[0] <= 0:
            await asyncio.sleep(1.0)
            return
        job_budget[0] -= 1
        reply = await http.post("/v1/kernels/optimize", json={
            "module": RELU, "turns": 1, "max_new_tokens": 16, "temperature": 0})
        stats.record(kind, reply.status_code, time.monotonic() - began, reply.text)
        if reply.status_code == 202:
            job_id = reply.json()["id"]
            stats.jobs[job_id] = time.time()
            await poll_job(http, job_id, stats)


async def poll_job(http: httpx.AsyncClient, job_id: str, stats: Stats) -> None:
    while True:
        await asyncio.sleep(1.0)
        began = time.monotonic()
        try:
            reply = await http.get(f"/v1/kernels/jobs/{job_id}")
        except httpx.TransportError:
            stats.unreachable += 1
            continue
        stats.record("poll", reply.status_code, time.monotonic() - began, reply.text)
        if reply.status_code != 200 or reply.json()["status"] in ("succeeded", "failed"):
            return


async def client(index: int, url: str, stats: Stats, deadline: list[float],
                 job_budget: list[int]) -> None:
    kind = KINDS[index % len(KINDS)]
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        while time.monotonic() < deadline[0]:
            try:
                await one_request(http, kind, stats, job_budget)
            except httpx.TimeoutException:
                stats.timed_out[kind] += 1
            except httpx.TransportError:  # the server is down (the kill) or restarting
                stats.unreachable += 1
                await asyncio.sleep(0.5)


async def run_load(args: argparse.Namespace, server: Server, stats: Stats) -> dict[str, Any]:
    began = time.monotonic()
    deadline = [began + args.seconds]  # moved on by the restart: --seconds of server time
    job_budget = [args.max_jobs]
    clients = [asyncio.create_task(client(i, server.url, stats, deadline, job_budget))
               for i in range(args.clients)]
    await asyncio.sleep(args.seconds * args.kill_at)
    before_kill = set(stats.jobs)
    deadline[0] = float("inf")  # the clients ride through the gap, however long the restart
    server.kill()
    killed_at = time.monotonic() - began
    restart_s = await asyncio.to_thread(server.start)
    deadline[0] = time.monotonic() + args.seconds - killed_at
    await asyncio.gather(*clients)
    return {"killed_at_s": round(killed_at, 1), "restart_s": round(restart_s, 1),
            "jobs_before_kill": sorted(before_kill)}


# ------------------------------------------------------------------------------ checks


def drain_and_check_jobs(server: Server, stats: Stats, drain_s: float) -> dict[str, Any]:
    """Every accepted job found over HTTP after the restart; wait for running ones to end."""
    deadline = time.monotonic() + drain_s
    missing, found = [], {}
    for job_id in stats.jobs:
        while True:
            reply = httpx.get(f"{server.url}/v1/kernels/jobs/{job_id}", timeout=30)
            if reply.status_code != 200:
                missing.append(job_id)
                break
            found[job_id] = reply.json()
            if found[job_id]["status"] in ("succeeded", "failed") or \
                    time.monotonic() > deadline:
                break
            time.sleep(1.0)
    return {"missing_over_http": missing,
            "statuses": Counter(j["status"] for j in found.values())}


def check_state(state: Path, stats: Stats) -> dict[str, Any]:
    """After the server stopped: each accepted job in the state folder, and A/B outcomes equal
    to the succeeded jobs of each arm."""
    from multiminddev.serve.ab import ABStore

    records, lost = {}, []
    for job_id in stats.jobs:
        path = state / "jobs" / f"{job_id}.json"
        if path.is_file():
            records[job_id] = json.loads(path.read_text())
        else:
            lost.append(job_id)
    unended = [i for i, r in records.items() if r["status"] not in ("succeeded", "failed")]
    no_reason = [i for i, r in records.items() if r["status"] == "failed" and not r.get("error")]
    expected = {i for i, r in records.items() if r["status"] == "succeeded" and r.get("arm")}
    with ABStore.in_state_dir(state) as store:
        outcomes = store.outcomes()
    recorded = {o.job_id for o in outcomes if o.job_id in stats.jobs}
    per_arm = Counter(o.arm for o in outcomes)
    expected_per_arm = Counter(records[i]["arm"] for i in expected)
    return {"lost": lost, "interrupted": len(unended), "failed_without_reason": no_reason,
            "ab_outcomes_per_arm": dict(per_arm), "succeeded_jobs_per_arm": dict(expected_per_arm),
            "ab_missing": sorted(expected - recorded), "ab_extra": sorted(recorded - expected)}


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50_s": None, "p99_s": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(values), "p50_s": round(statistics.median(ordered), 3),
            "p99_s": round(p99, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--kill-at", type=float, default=0.5,
                        help="when to SIGKILL the server, as a fraction of --seconds")
    parser.add_argument("--max-jobs", type=int, default=200, help="kernel jobs submitted at most")
    parser.add_argument("--drain-seconds", type=float, default=120.0,
                        help="how long to wait for accepted jobs to end after the load")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="a fresh folder for the server's state (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or not 0 < args.kill_at < 1:
        parser.error("--clients >= 1, --seconds > 0 and --kill-at in (0, 1)")

    from multiminddev.serve.ab import ABStore

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="serve-load-"))
    state.mkdir(parents=True, exist_ok=True)
    with ABStore.in_state_dir(state) as store:
        for arm in ARMS:
            store.add_arm(arm, None, weight=1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(args, state, port, state / "server.log")
    stats = Stats()
    first_start_s = server.start()
    try:
        fault = asyncio.run(run_load(args, server, stats))
        jobs = drain_and_check_jobs(server, stats, args.drain_seconds)
    finally:
        server.stop()
    stored = check_state(state, stats)
    # generation requests only: job polls are cheap reads that would hide them
    every = [x for kind, values in stats.latencies.items() if kind != "poll" for x in values]
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "machine": f"{os.cpu_count()} CPU cores, device {args.device}, embedded model",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "clients": args.clients, "seconds": args.seconds, "start_s": round(first_start_s, 1),
        **{k: v for k, v in fault.items() if k != "jobs_before_kill"},
        "latency": {kind: percentiles(v) for kind, v in sorted(stats.latencies.items())},
        "latency_generation": percentiles(every),
        "requests": dict(sorted(stats.statuses.items())),
        "server_errors": len(stats.server_errors), "server_error_samples": stats.server_errors[:5],
        "unreachable_during_restart": stats.unreachable,
        "timed_out": dict(stats.timed_out),
        "jobs_accepted": len(stats.jobs),
        "jobs_accepted_before_kill": len(fault["jobs_before_kill"]),
        "jobs_missing_over_http": jobs["missing_over_http"],
        "job_statuses_after_drain": dict(jobs["statuses"]),
        **stored, "state_dir": str(state),
    }
    report["ok"] = (report["server_errors"] == 0 and not jobs["missing_over_http"]
                    and not stored["lost"] and not stored["failed_without_reason"]
                    and not stored["ab_missing"] and not stored["ab_extra"])
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
