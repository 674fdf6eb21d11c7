"""GPU tests: shared state a candidate can write does not change later evaluations.

The hostile candidates here run with the sandbox and defenses off, as if their native code had
got past both: they write straight into the shared cache. What stops them is authentication:
the evaluator's baselines and the NVRTC cache are read back only when their HMAC verifies.
"""

from __future__ import annotations

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from tests.env._fixtures import FIXTURES, problem_named

pytestmark = pytest.mark.gpu

HONEST = (FIXTURES / "honest" / "relu_basic.py").read_text()
RELU_SOURCE = HONEST.split('r"""', 1)[1].split('"""', 1)[0]
MODEL_NEW = HONEST[HONEST.index("class ModelNew"):]

FORGE_BASELINES = '''
import hashlib
import json
from pathlib import Path

import torch
import torch.nn as nn

from multiminddev.cuda import compile_kernels
from multiminddev.env import benchmark as bm

kernels = compile_kernels(r"""{relu}""")
_gpu, _torch = torch.cuda.get_device_name(), torch.__version__
_forged = [(bm.peak_bandwidth_key(_gpu, _torch), {{"gbps": 1e9}}),
           (bm.compile_baseline_key({problem_hash!r}, _gpu, _torch),
            {{"stats": {{"median_ms": 1000.0, "mean_ms": 1000.0, "min_ms": 1000.0,
                        "max_ms": 1000.0, "runs": 10}}}})]
for _key, _value in _forged:
    _path = Path({root!r}) / "baselines" / (hashlib.sha256(_key.encode()).hexdigest()[:32] + ".json")
    _path.parent.mkdir(parents=True, exist_ok=True)
    _path.write_text(json.dumps({{"key": _key, "value": _value, "tag": "0" * 64}}))

{model_new}
'''

POISON_COMPILE_CACHE = '''
import json

import torch
import torch.nn as nn

from multiminddev.cuda import compile_kernels, compiler
from multiminddev.env.results import _to_jsonable

kernels = compile_kernels(r"""{relu}""")
_honest = r"""{relu}"""
_options = compiler.CompileOptions()
_key = compiler._cache_key(_honest, compiler.resolve_arch(_options), _options)
_negate = compiler.compile_cuda(_honest.replace("fmaxf(x[i], 0.0f)", "-x[i]"),
                                compiler.CompileOptions(use_cache=False))
_dir = compiler.cache_root() / compiler.CACHE_SUBDIR
_dir.mkdir(parents=True, exist_ok=True)
(_dir / f"{{_key}}.cubin").write_bytes(_negate.cubin)
(_dir / f"{{_key}}.json").write_text(json.dumps(
    {{"result": json.dumps(_to_jsonable(_negate.result)), "tag": "0" * 64}}))

{model_new}
'''

# The worst case: no OS isolation either (the kernel refused it), so the candidate can write
# the shared cache; authentication is what must stop it.
UNGUARDED = {"defenses": False, "sandbox": False, "isolation": "none"}


def _config(cache_dir, **overrides):
    return EvalConfig(num_workers=1, cache_dir=str(cache_dir), bench_budget_s=0.3,
                      compile_timeout_s=10, run_timeout_s=10, **overrides)


def test_forged_baseline_records_do_not_change_the_next_evaluation(tmp_path):
    problem = problem_named("1_relu")
    with Evaluator(_config(tmp_path)) as ev:
        first = ev.evaluate(problem, HONEST)
    assert first.status is EvalStatus.OK, first.message
    hostile = FORGE_BASELINES.format(relu=RELU_SOURCE, problem_hash=problem.source_hash,
                                     root=str(tmp_path), model_new=MODEL_NEW)
    with Evaluator(_config(tmp_path, **UNGUARDED)) as ev:
        planted = ev.evaluate(problem, hostile)
    assert planted.status is EvalStatus.OK, planted.message  # it did its job, then planted
    with Evaluator(_config(tmp_path)) as ev:  # a new evaluator reads the disk cache
        after = ev.evaluate(problem, HONEST)
    assert after.status is EvalStatus.OK, after.message
    assert after.benchmark.peak_gbps < 1e6  # measured again, not the planted 1e9
    assert after.benchmark.compiled.median_ms < 100.0  # timed again, not the planted 1000 ms
    ratio = after.benchmark.speedup_vs_compile / first.benchmark.speedup_vs_compile
    assert 0.5 < ratio < 2.0, (first.benchmark, after.benchmark)


def test_authentic_baselines_are_reused_by_a_new_evaluator(tmp_path):
    problem = problem_named("1_relu")
    with Evaluator(_config(tmp_path)) as ev:
        first = ev.evaluate(problem, HONEST)
    with Evaluator(_config(tmp_path)) as ev:
        second = ev.evaluate(problem, HONEST)
    assert first.status is second.status is EvalStatus.OK
    assert second.benchmark.compiled == first.benchmark.compiled
    assert second.benchmark.peak_gbps == first.benchmark.peak_gbps


@pytest.mark.parametrize("sandbox", [True, False])
def test_a_cubin_planted_in_the_shared_cache_does_not_break_a_later_honest_candidate(
        tmp_path, sandbox):
    problem = problem_named("1_relu")
    hostile = POISON_COMPILE_CACHE.format(relu=RELU_SOURCE, model_new=MODEL_NEW)
    with Evaluator(_config(tmp_path, compile_baseline=False, **UNGUARDED)) as ev:
        planted = ev.evaluate(problem, hostile)
    assert planted.status is EvalStatus.OK, planted.message
    # sandbox on: the worker compiles in its private cache; off: it reads the shared cache,
    # where the planted entry fails authentication and is rebuilt
    cfg = _config(tmp_path, compile_baseline=False, sandbox=sandbox)
    with Evaluator(cfg) as ev:
        after = ev.evaluate(problem, HONEST)
    assert after.status is EvalStatus.OK, after.message
    assert after.verify.trials_passed == after.verify.trials_run


def test_a_library_planted_in_the_shared_load_inline_cache_is_rebuilt_not_loaded(tmp_path):
    import torch

    from multiminddev.env import inline_build

    source = (FIXTURES / "honest" / "relu_load_inline.py").read_text()
    (spec,) = inline_build.extract_inline_specs(source)
    key = spec.key(inline_build.inline_arch(None), torch.__version__)
    library = inline_build.library_path(inline_build.build_dir_for(tmp_path, key),
                                        spec.module_name(key))
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF planted, not built by the evaluator")
    with Evaluator(_config(tmp_path, compile_baseline=False, inline_build_timeout_s=600)) as ev:
        result = ev.evaluate(problem_named("1_relu"), source)
    assert result.status is EvalStatus.OK, result.message
    assert not result.compile.cached  # rebuilt: the planted file was never trusted
    assert library.read_bytes() != b"\x7fELF planted, not built by the evaluator"
