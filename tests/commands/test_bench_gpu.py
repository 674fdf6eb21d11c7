"""``bench`` on a GPU with the shipped agents: episodes of several held-out problems written as
they end, a SIGKILLed run finished by ``--resume`` with every kernel timed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multiminddev.agents.shipped import shipped_agents
from tests.commands.helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = 8
KILL_WAIT_S = 400.0


def _argv(out: Path, *extra: str) -> list[str]:
    return ["bench", "--problems", "builtin:heldout", "--limit", str(PROBLEMS), "--turns", "2",
            "--temperature", "0", "--no-compile-baseline", "--quiet", "--out", str(out), *extra]


@pytest.mark.gpu
def test_killed_bench_of_the_shipped_agents_resumes_on_the_gpu(tmp_path, capsys):
    if shipped_agents() is None:
        pytest.skip("this install ships no agents")
    out = tmp_path / "bench"
    episodes = out / "shipped" / "episodes.jsonl"
    env = {**os.environ,
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "multiminddev", *_argv(out)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if episodes.is_file() and episodes.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            tail = (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
            assert episodes.read_bytes().count(b"\n") == PROBLEMS, tail
            pytest.skip("the run ended before it could be killed")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    kept = episodes.read_bytes().count(b"\n")
    assert 1 <= kept < PROBLEMS

    code, _, err = run_cli(capsys, *_argv(out, "--resume"))
    assert code == 0, err[-3000:]
    assert f"resuming: {kept} of {PROBLEMS} episodes on disk" in err
    rows = [json.loads(line) for line in episodes.read_text().splitlines()]
    assert len(rows) == PROBLEMS
    assert len({r["problem"]["name"] for r in rows}) == PROBLEMS
    summary = json.loads((out / "shipped" / "summary.json").read_text())
    assert summary["episodes"] == PROBLEMS
    assert summary["devices"] and not summary["no_gpu_rate"]
