"""Worker replacement: a candidate that segfaults, exits or hangs in host code kills only its
worker; the result says what happened and the next evaluation runs normally."""

from __future__ import annotations

import pytest

from multiminddev.env import EvalConfig, EvalStatus, Evaluator
from tests.conftest import gpu_available
from tests.env._fixtures import FIXTURES, problem_named

pytestmark = pytest.mark.skipif(gpu_available(), reason="CPU-machine expectations (no_gpu after)")

SEGFAULT = """
import os, signal
import torch.nn as nn
os.kill(os.getpid(), signal.SIGSEGV)

class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""
EXIT = """
import os
import torch.nn as nn
os._exit(3)

class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""


# Candidate code outside the sandbox (here: defenses off) writing a frame of its own on every
# socket it holds, the evaluator's pipe among them: a pickle that makes the decoder call
# os.mkdir. Unpickled in the evaluator, it would run there, outside every isolation layer.
WRITES_ON_THE_PIPE = """
import os, pickle, stat, struct
import torch.nn as nn

class _Call:
    def __reduce__(self):
        return (os.mkdir, ({marker!r},))

frame = pickle.dumps(("done", {{"notes": [_Call()]}}))
for fd in range(3, 256):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.write(fd, struct.pack("!i", len(frame)) + frame)
    except OSError:
        pass

class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""


@pytest.fixture(scope="module")
def evaluator():
    # defenses off: the static checks would (rightly) refuse os.kill before anything runs
    cfg = EvalConfig(num_workers=1, defenses=False, compile_timeout_s=3.0)
    with Evaluator(cfg) as ev:
        yield ev


def _honest() -> str:
    return (FIXTURES / "honest" / "relu_basic.py").read_text()


def test_segfault_kills_only_the_worker(evaluator, caplog):
    with caplog.at_level("WARNING", logger="multiminddev.env.pool"):
        crashed = evaluator.evaluate(problem_named("1_relu"), SEGFAULT)
    assert crashed.status is EvalStatus.RUNTIME_ERROR and crashed.worker_restarted
    assert "SIGSEGV" in crashed.message
    # the shared stderr says which worker faulted, on what, so its CUDA warnings are attributed
    (record,) = [r for r in caplog.records if "replaced" in r.getMessage()]
    assert "eval worker pid" in record.getMessage() and "on 1_relu" in record.getMessage()
    after = evaluator.evaluate(problem_named("1_relu"), _honest())
    assert after.status is EvalStatus.NO_GPU and not after.worker_restarted


def test_process_exit_is_a_runtime_error(evaluator):
    result = evaluator.evaluate(problem_named("1_relu"), EXIT)
    assert result.status is EvalStatus.RUNTIME_ERROR and "exit code 3" in result.message


def test_host_hang_times_out_and_names_the_line(evaluator):
    path = FIXTURES / "wrong" / "relu_host_hang.py"
    hung = evaluator.evaluate(problem_named("1_relu"), path.read_text())
    assert hung.status is EvalStatus.TIMEOUT and hung.worker_restarted
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "while True" in text)
    assert f"candidate line {line}" in hung.message or f"candidate line {line + 1}" in hung.message
    assert hung.compile.status.value == "timeout"
    after = evaluator.evaluate(problem_named("1_relu"), _honest())
    assert after.status is EvalStatus.NO_GPU


def test_restarts_are_counted(evaluator):
    before = evaluator.pool.restarts
    evaluator.evaluate(problem_named("1_relu"), SEGFAULT)
    assert evaluator.pool.restarts == before + 1


def test_interpreter_exits_without_close(tmp_path):
    """Idle workers must not keep a script that forgot Evaluator.close() from exiting."""
    import subprocess
    import sys

    script = tmp_path / "forgot_close.py"
    script.write_text(
        "from multiminddev.env import EvalConfig, Evaluator\n"
        "if __name__ == '__main__':\n"
        "    ev = Evaluator(EvalConfig(num_workers=1))\n"
        "    ev.warm_up()\n"
        "    print('started')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0 and "started" in done.stdout


def test_a_gpu_gets_two_slots_with_the_timing_gate_and_one_without():
    from multiminddev.env.pool import default_slot_count

    assert default_slot_count(0, True) == 1 and default_slot_count(0, False) == 1
    assert default_slot_count(1, True) == 2 and default_slot_count(2, True) == 4
    assert default_slot_count(1, False) == 1 and default_slot_count(2, False) == 2


def test_an_evaluator_without_a_gpu_has_one_slot_unless_asked():
    if gpu_available():
        pytest.skip("counts slots on a machine without a GPU")
    from multiminddev.env.pool import WorkerPool

    assert WorkerPool(EvalConfig()).size == 1
    assert WorkerPool(EvalConfig(num_workers=3)).size == 3


def test_a_frame_written_on_the_pipe_by_candidate_code_is_refused_unread(evaluator, tmp_path):
    marker = tmp_path / "ran-in-the-evaluator"
    result = evaluator.evaluate(problem_named("1_relu"),
                                WRITES_ON_THE_PIPE.format(marker=str(marker)))
    assert not marker.exists()
    assert result.status is EvalStatus.REJECTED, result.message
    assert result.reject_reason.value == "sandbox_violation" and "own frame" in result.message
    assert result.worker_restarted
    after = evaluator.evaluate(problem_named("1_relu"), _honest())
    assert after.status is EvalStatus.NO_GPU and not after.worker_restarted
