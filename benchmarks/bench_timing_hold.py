"""How the timing's batch hold changes what a timing costs and what it measures: run on a GPU.

    PYTHONPATH=src python3 benchmarks/bench_timing_hold.py --out $OUT [--budget 0.25 1] [--repeats 3]

Every timed batch starts behind a hold so the host's enqueueing never lies inside a timed
interval (``env/benchmark.py``). Two holds, side by side in one process, on honest fixture
kernels:

  spin   ``SpinHold``: a spin kernel sized from the previous batch's enqueue time
  host   ``HostReleasedHold``: a kernel that waits until the host says the batch is enqueued

Each kernel is timed the way the evaluator times a candidate (``env.benchmark.time_calls``:
fresh inputs drawn and copied in before every call, the L2 flush, the same time budget), the two
holds alternating, ``--repeats`` times each. Reports per kernel and budget the wall seconds of
one timing and its median, for each hold, and their ratios. Writes bench_timing_hold.json and
bench_timing_hold.md under --out (default: $OUT, else ./bench-out).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "src"))

# honest fixtures: (candidate stem); its problem comes from the fixture's header
KERNELS = ("relu_vec4", "softmax_warp", "matmul_tiled", "sum_dim_shared", "scale_add_fp16_half2")


def _import(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed_calls(stem: str) -> Any:
    """``TimedCalls`` for a fixture's ModelNew: fresh inputs copied in before every call."""
    import torch

    from multiminddev.env.benchmark import TimedCalls

    path = FIXTURES / "honest" / f"{stem}.py"
    problem_stem = re.search(r"problem:\s*(\S+)", path.read_text()).group(1)
    problem = _import(FIXTURES / "problems" / f"{problem_stem}.py")
    model = _import(path).ModelNew(*problem.get_init_inputs()).cuda()

    def prepare(_i: int) -> list[Any]:
        with torch.device("cuda"):
            fresh = problem.get_inputs()
        return [torch.empty_like(x).copy_(x) if isinstance(x, torch.Tensor) else x for x in fresh]

    def run(args: list[Any]) -> Any:
        with torch.no_grad():
            return model(*args)

    return TimedCalls(run=run, prepare=prepare)


def measure(budgets: list[float], repeats: int) -> dict[str, Any]:
    import torch

    from multiminddev.env import benchmark as bm
    from multiminddev.env import worker
    from multiminddev.env.config import EvalConfig

    host_hold = worker._warm_kernel_launch(worker._warm_toolchain(EvalConfig()))
    if host_hold is None:
        raise SystemExit("the host-released hold cannot run on this GPU")
    flush = bm.l2_flush_buffer(0)
    holds = {"spin": bm.SpinHold(), "host": host_hold}
    rows = []
    for stem in KERNELS:
        calls = _timed_calls(stem)
        for budget in budgets:
            plan = bm.TimingPlan(budget_s=budget)
            figures: dict[str, dict[str, list[float]]] = {h: {"wall_s": [], "median_ms": []}
                                                          for h in holds}
            for _ in range(repeats):
                for name, hold in holds.items():
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    stats = bm.time_calls(calls, plan, flush, hold=hold)
                    figures[name]["wall_s"].append(time.perf_counter() - started)
                    figures[name]["median_ms"].append(stats.median_ms)
                    figures[name].setdefault("runs", []).append(stats.runs)
            row = {"kernel": stem, "budget_s": budget}
            for name in holds:
                row[f"{name}_wall_s"] = statistics.median(figures[name]["wall_s"])
                row[f"{name}_median_ms"] = statistics.median(figures[name]["median_ms"])
                row[f"{name}_runs"] = statistics.median(figures[name]["runs"])
            row["wall_ratio_spin_over_host"] = row["spin_wall_s"] / row["host_wall_s"]
            row["median_ratio_host_over_spin"] = row["host_median_ms"] / row["spin_median_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows}


def _markdown(report: dict[str, Any]) -> str:
    lines = [f"# Timing hold: spin against host-released ({report['machine']}, {report['date']})",
             "", f"`{report['command']}`", "",
             "| kernel | budget | wall, spin | wall, host | spin / host | median, spin | median, host | host / spin |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['kernel']} | {r['budget_s']:g} s | {r['spin_wall_s']:.3f} s | "
                     f"{r['host_wall_s']:.3f} s | {r['wall_ratio_spin_over_host']:.2f}x | "
                     f"{r['spin_median_ms']:.4f} ms | {r['host_median_ms']:.4f} ms | "
                     f"{r['median_ratio_host_over_spin']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument("--budget", type=float, nargs="+", default=[0.25, 1.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_timing_hold: needs a GPU", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    report = {"benchmark": "bench_timing_hold",
              "command": "python3 benchmarks/bench_timing_hold.py " + " ".join(argv or sys.argv[1:]),
              "machine": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
              "commit": commit or "not recorded", **measure(args.budget, args.repeats)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_timing_hold.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench_timing_hold.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
