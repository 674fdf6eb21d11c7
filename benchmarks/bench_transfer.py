"""How long output tensors take to reach the evaluator: the pipe vs an anonymous memory file.

    PYTHONPATH=src python3 benchmarks/bench_transfer.py [--trials 5] [--mib 64] [--repeats 5]

A spawned process plays the worker: it sends ``trials`` float32 tensors of ``mib`` MiB each with
``send_tensor_lists`` (the evaluator's own transport) and reports how long its send took (the
time the worker is held up); the parent reports when the bytes were usable on its side. Prints
one JSON line per repeat and the medians. No GPU needed: it measures the host transport only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time

import torch

from multiminddev.env.candidate import receive_frames, send_tensor_lists, unpack_tensor


def _worker(conn, trials: int, numel: int, repeats: int, transfer: str) -> None:
    outputs = [[torch.randn(numel)] for _ in range(trials)]
    for _ in range(repeats):
        conn.recv()
        start = time.perf_counter()
        send_tensor_lists(conn, "outputs", outputs, transfer=transfer)
        conn.send(("sent", time.perf_counter() - start))


def measure(transfer: str, trials: int, mib: int, repeats: int) -> list[dict[str, float]]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=_worker, args=(child, trials, mib << 18, repeats, transfer))
    proc.start()
    rows = []
    try:
        for _ in range(repeats):
            parent.send("go")
            start = time.perf_counter()
            _, payload = parent.recv()
            receive_frames(parent, payload)
            tensors = [unpack_tensor(m) for group in payload["outputs"] for m in group]
            checksum = sum(float(t[:: 1 << 12].sum()) for t in tensors)  # touch the bytes
            parent_s = time.perf_counter() - start
            _, worker_s = parent.recv()
            rows.append({"transfer": transfer, "mib": trials * mib, "worker_s": worker_s,
                         "parent_s": parent_s, "checksum": checksum})
    finally:
        proc.join(60)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for transfer in ("pipe", "memfd"):
        rows = measure(transfer, args.trials, args.mib, args.repeats)
        for row in rows:
            print(json.dumps(row))
        print(json.dumps({"transfer": transfer, "median_worker_s":
                          statistics.median(r["worker_s"] for r in rows),
                          "median_parent_s": statistics.median(r["parent_s"] for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
