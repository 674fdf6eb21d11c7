"""The evaluator's output comparison on 5 trials of a 64 MiB float32 output (CPU only).

    PYTHONPATH=src python3 benchmarks/bench_verify.py [--mib 64] [--trials 5] [--repeats 3]

Four cases: bit-identical outputs (the byte-equality fast path), outputs within tolerance but
not identical (the chunked allclose path), one bad element at the very end (a full scan
before the mismatch report), and a wrong candidate (every trial twice the reference). Prints one JSON line per case with the median seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from multiminddev.env.verify import verify_outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    reference = [[torch.randn(args.mib << 18).relu()] for _ in range(args.trials)]
    last_bad = [[t[0].clone()] for t in reference]
    last_bad[-1][0][-1] += 1.0
    cases = {
        "identical": [[t[0].clone()] for t in reference],
        "close": [[t[0] * (1 + 1e-6)] for t in reference],
        "last_element_bad": last_bad,
        "all_wrong": [[t[0] * 2] for t in reference],
    }
    for name, candidate in cases.items():
        seconds, status = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            status = verify_outputs(reference, candidate, atol=1e-4, rtol=1e-4).status.value
            seconds.append(time.perf_counter() - start)
        print(json.dumps({"case": name, "mib": args.trials * args.mib, "status": status,
                          "median_s": round(statistics.median(seconds), 4),
                          "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
