"""Kernel optimization through ``multiminddev serve``: built-in problems submitted to
``/v1/kernels/optimize`` over HTTP, as a user of the server would, and what comes back.

    python benchmarks/bench_serve_optimize.py --device cuda --problems builtin:tier0:heldout \
        --limit 8 --turns 3 --out serve_optimize.json

Starts ``multiminddev serve`` in a subprocess on a free port (the shipped agents unless
``--adapters`` says otherwise), submits every problem's module at once (the server runs
``--max-running-jobs`` at a time and queues the rest), polls each job to its end and reports per
job its status, whether the best kernel was verified (correct on the GPU; ``compile_only`` on a
machine without one), the best speedup over eager PyTorch, the turns played and the latency;
then the totals. Prints one JSON object (also written to --out) with the command, device, date
and commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import _free_port, start_server, write_record


def job_row(job: dict[str, Any]) -> dict[str, Any]:
    """One finished job as a table row (pure)."""
    best = job.get("best_result") or {}
    speedup = job.get("best_speedup")
    return {"name": (job.get("options") or {}).get("name", job.get("name")), "status": job.get("status"),
            "verified": bool(job.get("verified")), "compile_only": bool(job.get("compile_only")),
            "best_status": best.get("status"), "episode_status": job.get("episode_status"),
            "speedup_vs_eager": speedup, "best_reward": job.get("best_reward"),
            "turns": len(job.get("turns") or []), "latency_s": job.get("latency_s"),
            "error": job.get("error")}


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the jobs (pure): finished, verified, compiled-only, failed, fast_1."""
    n = len(rows)
    fast = sum(1 for r in rows if r["verified"] and (r["speedup_vs_eager"] or 0.0) >= 1.0)
    latencies = sorted(r["latency_s"] for r in rows if r["latency_s"] is not None)
    return {"jobs": n, "succeeded": sum(r["status"] == "succeeded" for r in rows),
            "failed": sum(r["status"] == "failed" for r in rows),
            "verified": sum(r["verified"] for r in rows), "fast_1": fast,
            "median_latency_s": latencies[len(latencies) // 2] if latencies else None}


def run_jobs(url: str, problems: list[Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx

    ids = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for problem in problems:
            body = {"module": problem.source, "name": problem.name, "turns": args.turns,
                    "temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
            reply = client.post("/v1/kernels/optimize", json=body)
            reply.raise_for_status()
            ids[reply.json()["id"]] = problem.name
        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + args.timeout
        while len(done) < len(ids) and time.monotonic() < deadline:
            for job_id in ids:
                if job_id in done:
                    continue
                job = client.get(f"/v1/kernels/jobs/{job_id}").json()
                if job.get("status") in ("succeeded", "failed"):
                    done[job_id] = job
                    if args.jobs_out is not None:  # as each finishes: a cut run keeps them
                        with args.jobs_out.open("a") as f:
                            f.write(json.dumps(job) + "\n")
                    row = job_row(job)
                    print(f"{row['name']}: {row['status']} verified={row['verified']} "
                          f"speedup={row['speedup_vs_eager']} {row['latency_s']} s",
                          file=sys.stderr, flush=True)
            time.sleep(1)
    rows = [job_row(done[i]) if i in done else {**job_row({"name": n}), "status": "timed_out"}
            for i, n in ids.items()]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--adapters", default=None,
                   help="checkpoint folder with generator/ and optimizer/, or 'none' "
                        "(default: the server's default, the shipped agents)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--problems", default="builtin:tier0:heldout")
    p.add_argument("--limit", type=int, default=8, help="the first N problems (0: all)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=1024, help="per reply")
    p.add_argument("--max-running-jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for all jobs")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--server-log", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--jobs-out", type=Path, default=None,
                   help="append every finished job's full record (turns, kernels, results) "
                        "to this JSONL as it finishes")
    args = p.parse_args(argv)

    from multiminddev.tasks.loaders import load_problems

    problems = load_problems(args.problems)
    problems = problems[: args.limit] if args.limit else problems
    if not problems:
        raise SystemExit(f"{args.problems} gives no problem")
    port = _free_port()
    extra = ["--max-running-jobs", str(args.max_running_jobs)]
    if args.adapters is not None:
        extra += ["--adapters", *([] if args.adapters == "none" else [args.adapters])]
    server = start_server(args, port, extra, args.server_log)
    start = time.perf_counter()
    try:
        rows = run_jobs(f"http://127.0.0.1:{port}", problems, args)
    finally:
        server.terminate()
        server.wait(timeout=60)
    write_record(args, argv, {"problems": args.problems, "turns": args.turns,
                              "wall_s": round(time.perf_counter() - start, 1), **totals(rows),
                              "jobs_detail": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
