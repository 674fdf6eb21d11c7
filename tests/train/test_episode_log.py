"""Episode logs on disk: one line per finished episode, torn lines dropped, run records that a
resumed run must match (train/episode_log.py)."""

from __future__ import annotations

import json

import pytest

from multiminddev.episode.state import Episode, EpisodeStatus
from multiminddev.train.episode_log import (
    RUN_RECORD_FILE,
    EpisodeLog,
    ResumeMismatch,
    check_run_record,
    describe_dropped,
    episode_record,
    read_episode_log,
)
from tests.episode.helpers import relu_problem


def _episode(name: str) -> Episode:
    return Episode(problem=relu_problem(name), episode_id=f"{name}-0-0",
                   status=EpisodeStatus.MAX_TURNS)


def test_appended_episodes_read_back_as_finished_pairs(tmp_path):
    path = tmp_path / "run" / "episodes.jsonl"
    log = EpisodeLog(path, fresh=True)
    log.append(episode_record(_episode("relu_a"), 0))
    log.append(episode_record(_episode("relu_a"), 1))
    assert path.read_text().count("\n") == 2 and log.appended == 2
    logged = read_episode_log(path)
    assert logged.finished() == {("relu_a", 0), ("relu_a", 1)} and not logged.dropped_lines


def test_a_torn_last_line_is_dropped_and_cut_from_the_file(tmp_path):
    path = tmp_path / "episodes.jsonl"
    log = EpisodeLog(path, fresh=True)
    log.append(episode_record(_episode("relu_a"), 0))
    with path.open("a") as fh:
        fh.write('{"problem": {"name": "relu_b"}, "sample": 0, "tur')
    logged = read_episode_log(path)
    assert logged.finished() == {("relu_a", 0)} and logged.dropped_lines == [2]
    assert "dropped 1 incomplete line(s) (line 2)" in describe_dropped(path, logged)
    log.append(episode_record(_episode("relu_b"), 0))  # lands on a line of its own
    assert read_episode_log(path).finished() == {("relu_a", 0), ("relu_b", 0)}


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(episode_record(_episode("relu_a"), 0)))
    assert read_episode_log(path).finished() == {("relu_a", 0)}
    EpisodeLog(path).append(episode_record(_episode("relu_b"), 0))
    assert read_episode_log(path).finished() == {("relu_a", 0), ("relu_b", 0)}


def test_a_fresh_log_starts_empty_and_a_missing_one_reads_as_nothing(tmp_path):
    path = tmp_path / "episodes.jsonl"
    assert read_episode_log(path).rows == []
    path.write_text(json.dumps(episode_record(_episode("relu_a"), 0)) + "\n")
    EpisodeLog(path, fresh=True)
    assert path.read_text() == ""


def test_run_record_is_stored_and_a_different_resume_is_refused(tmp_path):
    record = {"turns": 2, "temperature": 0.0, "problems": ["relu_a"]}
    path = tmp_path / RUN_RECORD_FILE
    assert check_run_record(path, record, resume=True) is False  # nothing stored yet
    assert json.loads(path.read_text()) == record
    assert check_run_record(path, dict(record), resume=True) is True
    with pytest.raises(ResumeMismatch, match=r"turns=2, this run asks turns=3"):
        check_run_record(path, {**record, "turns": 3}, resume=True)
    assert json.loads(path.read_text()) == record  # left as it was
    # a fresh run (no --resume) replaces the record
    assert check_run_record(path, {**record, "turns": 3}, resume=False) is False
    assert json.loads(path.read_text())["turns"] == 3
