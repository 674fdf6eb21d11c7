"""A worker killed behind its isolation boundary leaves no resource_tracker warning: what it
made in its private /dev/shm is not registered with the tracker outside (env/worker.py,
``enter_worker_process``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A worker as the pool starts one (forkserver), entering through the worker's own first step,
# then making a named semaphore (as torch or a library in the worker may) and being killed, as
# the pool kills the worker of a timed candidate. Run in a fresh interpreter: the tracker
# prints its warnings when that interpreter exits.
KILLED_WORKER = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    from multiminddev.env import EvalConfig
    from multiminddev.env.worker import enter_worker_process

    class Parent:
        def send(self, message):
            print("parent got", message, file=sys.stderr)

    def worker(config):
        report = enter_worker_process(Parent(), config)
        if not report.active:
            os._exit(3)
        semaphore = multiprocessing.get_context("forkserver").Semaphore(1)
        os.kill(os.getpid(), signal.SIGKILL)

    if __name__ == "__main__":
        from multiminddev.env.pool import FORKSERVER_PRELOAD

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # as the pool starts workers
        process = context.Process(target=worker, args=(EvalConfig().to_dict(),))
        process.start()
        process.join()
        sys.exit(0 if process.exitcode == -signal.SIGKILL else process.exitcode)
""")


def test_a_killed_isolated_worker_leaves_no_resource_tracker_warning(tmp_path):
    script = tmp_path / "killed_worker.py"
    script.write_text(KILLED_WORKER)
    src = Path(__file__).resolve().parents[2] / "src"
    run = subprocess.run([sys.executable, str(script)], check=False, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(src)})
    if run.returncode == 3:
        pytest.skip("worker isolation is not available on this machine")
    assert run.returncode == 0, run.stderr
    assert "resource_tracker" not in run.stderr, run.stderr


@pytest.mark.gpu
def test_an_evaluation_on_a_gpu_prints_no_resource_tracker_warning(tmp_path):
    """The memfd output transfer and a timed candidate (whose worker is killed after it):
    the command's stderr holds no resource_tracker line."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    out = tmp_path / "kb"
    cli = [sys.executable, "-m", "multiminddev"]
    subprocess.run([*cli, "problems", "export", str(out), "--family", "relu",
                    "--shapes-per-family", "1", "--with-solutions"], check=True, timeout=300)
    problem = next(out.glob("level*/*.py"))
    solution = next((out / "solutions" / "naive").rglob(problem.name))
    run = subprocess.run([*cli, "eval", str(problem), str(solution), "--tensor-transfer", "memfd"],
                         check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "resource_tracker" not in run.stderr, run.stderr
