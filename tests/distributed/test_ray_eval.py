"""The Ray evaluation service against real clusters: a local one (``ray.init``) and a simulated
two-node one (``ray.cluster_utils.Cluster``). On this CPU machine results are compile-only and
must equal the local Evaluator's; a lost actor or node must lose no submission."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from multiminddev.commands._io import ExitCode
from multiminddev.distributed.cluster import (
    RAY_NAMESPACE,
    LocalClusterConfig,
    cluster_gpus,
    validate_address,
)
from multiminddev.distributed.ray_eval import (
    ClusterBaselines,
    RayEvalConfig,
    RayEvaluator,
    baseline_store,
    call_limit_s,
    make_evaluator,
)
from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from multiminddev.env.benchmark import TrustedBaselines
from tests.conftest import gpu_available
from tests.env._fixtures import FIXTURES, problem_named

CONFIG = EvalConfig(benchmark=False, compile_timeout_s=30)
CANDIDATES = [("1_relu", "honest/relu_basic.py"), ("3_softmax", "honest/softmax_block.py"),
              ("1_relu", "wrong/relu_compile_error.py"),
              ("adv_matmul_rand_f32", "hacks/adv_c6_cublas_via_torch_ctypes.py"),
              ("2_sum_dim", "honest/sum_dim_shared.py"), ("1_relu", "honest/relu_vec4.py")]
cpu_only = pytest.mark.skipif(gpu_available(), reason="compile-only results need a CPU machine")
# Ray kills workers when the whole machine's memory passes 95%; on a shared test machine that is
# other processes' doing, and would turn these clusters' actors into unplanned losses.
NO_MEMORY_MONITOR = {"memory_monitor_refresh_ms": 0}


def workload() -> list[tuple[object, str]]:
    return [(problem_named(p), (FIXTURES / c).read_text()) for p, c in CANDIDATES]


@pytest.fixture(scope="module")
def local_statuses() -> list[EvalStatus]:
    with Evaluator(CONFIG) as ev:
        return [r.status for r in ev.evaluate_many(workload())]


def _wait_busy(ev: RayEvaluator, node_id: str | None = None, timeout_s: float = 60.0) -> dict:
    """An actor (on ``node_id`` if given) with an evaluation in flight."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for actor in ev.actors():
            if actor["ready"] and actor["in_flight"] and node_id in (None, actor.get("node_id")):
                return actor
        time.sleep(0.02)
    raise AssertionError("no evaluation actor became busy")


# ----------------------------------------------------------------------------- pure parts


def test_validate_address_accepts_the_documented_forms():
    for address in ("auto", "local", "10.0.0.1:6379", "ray://head:10001"):
        assert validate_address(address) == address


def test_validate_address_refuses_a_bare_host():
    with pytest.raises(ValueError, match="HOST:PORT"):
        validate_address("headnode")


def test_call_limit_covers_every_stage_and_retry():
    cfg = EvalConfig(infra_retries=1, infra_retry_delay_s=2.0)
    one = (2 * cfg.startup_timeout_s + cfg.setup_timeout_s + cfg.baseline_timeout_s
           + cfg.timeout_s + cfg.inline_build_timeout_s)
    assert call_limit_s(cfg, margin_s=10.0) == pytest.approx(2 * one + 2.0 + 10.0)


def test_ray_eval_config_refuses_zero_attempts():
    with pytest.raises(ValueError, match="max_attempts"):
        RayEvalConfig(max_attempts=0)


def test_commands_import_without_ray():
    import subprocess
    import sys

    code = ("import sys, multiminddev.distributed, multiminddev.commands.eval, "
            "multiminddev.commands.bench; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_make_evaluator_without_address_is_the_local_evaluator():
    with make_evaluator(CONFIG, None) as ev:
        assert type(ev) is Evaluator


def _eval_dir_dirs(tmp_path):
    problems, cands = tmp_path / "problems", tmp_path / "cands"
    problems.mkdir()
    cands.mkdir()
    (problems / "1_relu.py").write_text((FIXTURES / "problems" / "1_relu.py").read_text())
    (cands / "1_relu.py").write_text((FIXTURES / "honest" / "relu_basic.py").read_text())
    return problems, cands


def test_ray_flag_without_value_means_a_local_cluster():
    from multiminddev.cli import build_parser

    args = build_parser().parse_args(["eval-dir", "p", "c", "--ray"])
    assert args.ray == "local"
    assert build_parser().parse_args(["eval-dir", "p", "c"]).ray is None


def test_eval_dir_refuses_a_malformed_ray_address(tmp_path, capsys):
    from multiminddev.cli import main

    problems, cands = _eval_dir_dirs(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["eval-dir", str(problems), str(cands), "--ray", "headnode"])
    assert exit_info.value.code == 2 and "HOST:PORT" in capsys.readouterr().err


# ----------------------------------------------------------------------------- local cluster


@cpu_only
class TestLocalCluster:
    @pytest.fixture(scope="class")
    def cluster(self):
        ray.init(address="local", num_cpus=4, include_dashboard=False, namespace=RAY_NAMESPACE,
                 object_store_memory=100 * 1024 * 1024, log_to_driver=False,
                 _system_config=NO_MEMORY_MONITOR)
        yield
        ray.shutdown()

    @pytest.fixture(scope="class")
    def evaluator(self, cluster):
        with RayEvaluator(CONFIG, RayEvalConfig(cpu_actors=2)) as ev:
            yield ev

    def test_cpu_cluster_gets_the_configured_actors(self, evaluator):
        assert cluster_gpus() == 0 and evaluator.target_actors == 2
        assert not evaluator.gpu_actors

    def test_results_equal_the_local_evaluator(self, evaluator, local_statuses):
        results = evaluator.evaluate_many(workload())
        assert [r.status for r in results] == local_statuses
        assert EvalStatus.NO_GPU in local_statuses and EvalStatus.COMPILE_ERROR in local_statuses
        assert all(r.attempts == 1 for r in results)

    def test_submit_and_aevaluate_return_eval_results(self, evaluator, local_statuses):
        import asyncio

        (problem, source), expected = workload()[0], local_statuses[0]
        assert evaluator.submit(problem, source).result().status is expected
        assert asyncio.run(evaluator.aevaluate(problem, source)).status is expected

    def test_killed_actor_loses_no_submission(self, evaluator, local_statuses):
        futures = [evaluator.submit(p, c) for p, c in workload()]
        ray.kill(_wait_busy(evaluator)["handle"], no_restart=True)
        results = [f.result(timeout=180) for f in futures]
        assert [r.status for r in results] == local_statuses
        retried = [r for r in results if r.attempts > 1]
        assert retried and all("retried on another evaluation actor" in r.message
                               for r in retried)
        assert evaluator.lost_actors >= 1

    def test_baselines_are_shared_through_the_store_and_kept_on_disk(self, cluster, tmp_path):
        store = baseline_store(tmp_path)
        ClusterBaselines(store).record_compiled_baseline("abc", "GPU X", "2.0", {"median_ms": 1.5})
        other = ClusterBaselines(store)  # another actor's view: nothing in its memory yet
        assert other.compiled_baseline("abc", "GPU X", "2.0") == {"median_ms": 1.5}
        on_disk = TrustedBaselines(tmp_path).compiled_baseline("abc", "GPU X", "2.0")
        assert on_disk == {"median_ms": 1.5}
        ray.kill(store)

    def test_eval_dir_evaluates_on_the_cluster(self, cluster, tmp_path):
        from multiminddev.cli import main

        problems, cands = _eval_dir_dirs(tmp_path)
        out = tmp_path / "results.jsonl"
        assert main(["eval-dir", str(problems), str(cands), "--no-benchmark", "--workers", "1",
                     "--out", str(out), "--ray", "auto"]) == ExitCode.UNAVAILABLE  # no_gpu
        assert '"status": "no_gpu"' in out.read_text()
        assert ray.is_initialized()  # a connection it found open is left open



# ----------------------------------------------------------------------------- two nodes


@cpu_only
class TestTwoNodeCluster:
    @pytest.fixture(scope="class")
    def cluster(self):
        from ray.cluster_utils import Cluster

        args = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}
        cluster = Cluster(initialize_head=True,
                          head_node_args={**args, "include_dashboard": False,
                                          "_system_config": NO_MEMORY_MONITOR})
        worker = cluster.add_node(**args)
        ray.init(address=cluster.address, namespace=RAY_NAMESPACE, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, worker
        ray.shutdown()
        cluster.shutdown()

    def test_removed_node_loses_no_submission(self, cluster, local_statuses):
        cluster, worker = cluster
        with RayEvaluator(CONFIG, RayEvalConfig(cpu_actors=2)) as ev:
            ev.warm_up()
            assert {a["node_id"] for a in ev.actors()} == {worker.node_id,
                                                           ray.get_runtime_context().get_node_id()}
            # Four rounds: the node's actor still has evaluations in flight when the node goes
            # (with one round it could finish its share while the node was being removed).
            futures = [ev.submit(p, c) for p, c in workload() * 4]
            _wait_busy(ev, node_id=worker.node_id)
            cluster.remove_node(worker, allow_graceful=False)
            results = [f.result(timeout=180) for f in futures]
        assert [r.status for r in results] == local_statuses * 4
        assert any(r.attempts == 2 and "lost" in r.message for r in results)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_baseline_measured_once_and_shared(tmp_path):
    """On a GPU: the first evaluation of a problem records its torch.compile baseline in the
    cluster's store; the next one, on any actor, is timed against that same figure."""
    import torch

    cfg = EvalConfig(cache_dir=str(tmp_path))
    problem, source = workload()[0]
    with RayEvaluator(cfg, RayEvalConfig(local=LocalClusterConfig(num_cpus=4))) as ev:
        first = ev.evaluate(problem, source)
        second = ev.evaluate(problem, source)
        stored = ClusterBaselines(baseline_store(tmp_path)).compiled_baseline(
            problem.source_hash, first.benchmark.gpu_name, torch.__version__)
    assert first.status is EvalStatus.OK and second.status is EvalStatus.OK
    assert stored is not None and second.benchmark.compiled is not None
    assert second.benchmark.compiled.median_ms == pytest.approx(stored["median_ms"])
