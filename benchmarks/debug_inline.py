"""Debug helper: evaluate the load_inline fixture once and print what each side saw."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, "src")
sys.path.insert(0, ".")

if __name__ == "__main__":
    from multiminddev.env import EvalConfig, Evaluator
    from multiminddev.env import inline_build as ib
    from multiminddev.tasks.problem import load_problem

    cache = Path(os.environ.get("OUT", "/tmp")) / "inline-cache"
    cfg = EvalConfig(num_workers=1, compile_baseline=False, cache_dir=str(cache), bench_budget_s=0.3)
    src = Path("tests/fixtures/honest/relu_load_inline.py").read_text()
    problem = load_problem("tests/fixtures/problems/1_relu.py")
    (spec,) = ib.extract_inline_specs(src)
    import torch

    print("arch", ib.inline_arch(None), "key", spec.key(ib.inline_arch(None), torch.__version__))
    with Evaluator(cfg) as ev:
        for i in range(2):
            t = time.time()
            r = ev.evaluate(problem, src)
            print(i, r.status, round(time.time() - t, 1), r.message)
            print(json.dumps(r.compile.__dict__, default=str)[:1500])
            print("verify", r.verify.error[:1500])
    for p in sorted(cache.rglob("*"))[:40]:
        print(p)
