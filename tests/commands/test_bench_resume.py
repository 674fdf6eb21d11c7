"""``multiminddev bench`` writes each episode as it ends and ``--resume`` finishes a killed run.

A real run with a tiny random Llama (the SmolLM2 tokenizer) on three fixture problems, greedy:
a subprocess is SIGKILLed once its first episode is on disk, a torn half line is left at the
end of the file as a kill mid-write leaves it, and ``--resume`` must end with the summary and
episodes of an uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.commands.helpers import assert_one_line_error, run_cli

# one real bench run (a module fixture) takes about a minute on the CPU machine
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "tests" / "fixtures" / "problems"
KILL_WAIT_S = 180.0


def _bench_argv(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "--model", str(model_dir), "--problems", str(PROBLEMS), "--limit", "3",
            "--turns", "2", "--max-new-tokens", "8", "--temperature", "0",
            "--no-benchmark", "--no-compile-baseline", "--concurrency", "1", "--quiet",
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    helpers = pytest.importorskip("tests.policy.helpers")
    folder = tmp_path_factory.mktemp("models") / "tiny"
    helpers.tiny_base_model().save_pretrained(folder)
    helpers.gguf_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def full_run(model_dir, tmp_path_factory):
    """An uninterrupted run's output folder."""
    from multiminddev.cli import main

    out = tmp_path_factory.mktemp("full") / "bench"
    assert main(_bench_argv(model_dir, out)) == 0
    return out


def _label_dir(out: Path) -> Path:
    """The run's folder (named after the model folder)."""
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def _episodes(out: Path) -> list[dict]:
    return [json.loads(line) for line in
            (_label_dir(out) / "episodes.jsonl").read_text().splitlines()]


def _summary(out: Path) -> dict:
    return json.loads((_label_dir(out) / "summary.json").read_text())


def _comparable(episode: dict) -> tuple:
    """What decides an episode's figures: its problem, sample, status and each turn's text and
    result status (timings differ from run to run)."""
    turns = tuple((t["text"], (t.get("eval_result") or {}).get("status"))
                  for t in episode["turns"])
    return episode["problem"]["name"], episode["sample"], episode["status"], turns


def test_bench_writes_one_line_per_episode_with_its_sample(full_run):
    episodes = _episodes(full_run)
    assert [(e["problem"]["name"], e["sample"]) for e in episodes] == [
        ("1_relu", 0), ("2_sum_dim", 0), ("3_softmax", 0)]
    assert all(e["turns"] for e in episodes)
    assert (full_run / "run_record.json").is_file()


def test_killed_bench_resumes_to_the_uninterrupted_summary(model_dir, full_run, tmp_path,
                                                           capsys):
    out = tmp_path / "bench"
    episodes_file = out / _label_dir(full_run).name / "episodes.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "multiminddev",
                             *_bench_argv(model_dir, out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if episodes_file.is_file() and episodes_file.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.01)
        assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    kept = episodes_file.read_bytes().count(b"\n")
    assert 1 <= kept < 3  # written as they ended, and the kill came before the end
    assert not (episodes_file.parent / "summary.json").exists()
    with episodes_file.open("a") as fh:  # a kill in the middle of a write leaves half a line
        fh.write('{"problem": {"name": "3_softmax"}, "turns": [{"te')

    code, _, err = run_cli(capsys, *_bench_argv(model_dir, out, "--resume"))
    assert code == 0, err
    assert "dropped 1 incomplete line" in err
    assert f"resuming: {kept} of 3 episodes on disk" in err
    resumed, full = _episodes(out), _episodes(full_run)
    assert len(resumed) == 3  # the torn line is gone, each pair once
    assert sorted(map(_comparable, resumed)) == sorted(map(_comparable, full))
    assert _summary(out) == _summary(full_run)


def test_resume_of_a_finished_run_runs_nothing_and_reports_again(full_run, tmp_path, capsys,
                                                                 model_dir):
    out = tmp_path / "bench"
    shutil.copytree(full_run, out)
    (_label_dir(out) / "summary.json").unlink()
    code, _, err = run_cli(capsys, *_bench_argv(model_dir, out, "--resume"))
    assert code == 0, err
    assert "resuming: 3 of 3 episodes on disk" in err and "loading" not in err
    assert _episodes(out) == _episodes(full_run)
    assert _summary(out) == _summary(full_run)


@pytest.mark.parametrize(("change", "named"), [
    (("--turns", "3"), "turns=2"),
    (("--temperature", "0.7"), "temperature=0.0"),
    (("--limit", "2"), "problems="),
])
def test_resume_with_other_settings_is_refused_naming_the_difference(
        full_run, model_dir, tmp_path, capsys, change, named):
    out = tmp_path / "bench"
    shutil.copytree(full_run, out)
    argv = _bench_argv(model_dir, out, "--resume")
    for flag, value in zip(change[::2], change[1::2]):
        argv[argv.index(flag) + 1] = value
    code, stdout, err = run_cli(capsys, *argv)
    assert_one_line_error(code, stdout, err, contains=named)
    assert "--resume" in err
    assert _episodes(out) == _episodes(full_run)  # nothing was touched


@pytest.mark.parametrize("flag", ["--concurrency", "--batch-size"])
def test_a_bound_below_one_is_a_one_line_error(tmp_path, capsys, flag):
    code, stdout, err = run_cli(capsys, "bench", "--model", "default", flag, "0",
                                "--out", str(tmp_path / "o"))
    assert_one_line_error(code, stdout, err, contains=flag)
    assert not (tmp_path / "o").exists()
