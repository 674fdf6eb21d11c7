"""Worker-side cache isolation: candidate compiles land in the worker's private directory, and
candidate code cannot write the shared cache (the evaluator's baselines and compiled kernels)."""

from __future__ import annotations

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator, RejectReason
from multiminddev.env.worker import PRIVATE_CACHE_DIRS, use_private_compile_caches
from tests.conftest import gpu_available
from tests.env._fixtures import problem_named

RELU = 'extern "C" __global__ void relu(float* y) { y[0] = 0.f; }'


def test_private_caches_point_into_the_workdir(tmp_path, monkeypatch):
    for name in PRIVATE_CACHE_DIRS:
        monkeypatch.setenv(name, "/shared/elsewhere")  # restored after the test
    use_private_compile_caches(tmp_path)
    from multiminddev.cuda import compiler

    assert compiler.cache_root() == tmp_path / "compile-cache"
    module = compiler.compile_cuda(RELU, compiler.CompileOptions(arch="sm_90"))
    assert module.result.status.value == "ok"
    assert any((tmp_path / "compile-cache" / compiler.CACHE_SUBDIR).glob("*.cubin"))


@pytest.mark.skipif(gpu_available(), reason="CPU-machine expectations (no_gpu after import)")
def test_a_candidate_cannot_write_into_the_shared_cache(tmp_path):
    target = tmp_path / "baselines" / "planted.json"
    source = (f"open({str(target)!r}, 'w').write('{{}}')\n"
              "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
              "    def forward(self, x):\n        return x\n")
    # defenses off: the static checks would refuse open() before anything ran
    cfg = EvalConfig(num_workers=1, defenses=False, cache_dir=str(tmp_path), compile_timeout_s=20)
    (tmp_path / "baselines").mkdir()
    with Evaluator(cfg) as ev:
        result = ev.evaluate(problem_named("1_relu"), source)
    assert result.status is EvalStatus.REJECTED, result.message
    assert result.reject_reason is RejectReason.SANDBOX_VIOLATION
    assert not target.exists()
