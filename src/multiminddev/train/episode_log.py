"""Episodes on disk as they end, and the run record a resumed run must match.

An episode log is a JSONL file with one line per finished episode: the episode
(``episode.state.episode_to_dict``) plus ``sample``, its index among its problem's samples.
Each line is written, flushed and fsync'd as its episode ends, so a run killed at any moment
loses only the episodes still in flight. Reading it back keeps every complete line; a line cut
short by the kill (the last one) is dropped with a note, and the file is rewritten without it
so later appends start on a line of their own.

The run record (bench: ``RUN_RECORD_FILE`` beside the logs; the held-out evaluation:
``record_path``) holds the settings that decide what an
episode is (model, adapters, turns, decoding, problems); a resumed run whose settings differ is
refused (``ResumeMismatch``), since its episodes would not be comparable with those on disk; a
training run's held-out evaluation instead starts afresh (``reusable_log``), since its agents
may have trained further.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.episode.state import Episode, EpisodeStatus, episode_to_dict
from multiminddev.report.files import read_jsonl_rows, write_atomic

RUN_RECORD_FILE = "run_record.json"
SAMPLE_KEY = "sample"


class ResumeMismatch(ValueError):
    """A resumed run asks for other settings than the run on disk."""


@dataclass(kw_only=True)
class LoggedEpisodes:
    """The finished episodes of a log (dicts, in file order) and what was dropped reading it."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped_lines: list[int] = field(default_factory=list)  # 1-based: torn or malformed lines

    def finished(self) -> set[tuple[str, int]]:
        """The (problem name, sample) pairs already on disk."""
        return {episode_key(row) for row in self.rows}


def episode_key(row: Mapping[str, Any]) -> tuple[str, int]:
    """(problem name, sample index) of a logged episode."""
    return str(row["problem"]["name"]), int(row[SAMPLE_KEY])


def episode_record(episode: Episode, sample: int) -> dict[str, Any]:
    """The log line of ``episode``: its dict and its sample index."""
    return {**episode_to_dict(episode), SAMPLE_KEY: sample}


def _is_logged_episode(row: Mapping[str, Any]) -> bool:
    try:
        episode_key(row)
    except (KeyError, TypeError, ValueError):
        return False
    return isinstance(row.get("turns"), list)


def read_episode_log(path: Path) -> LoggedEpisodes:
    """The episodes of the log at ``path`` (none if it does not exist). Lines that are not a
    logged episode (a torn last line) are dropped and the file is rewritten with the others,
    so that the next append starts a line of its own."""
    if not path.is_file():
        return LoggedEpisodes()
    read = read_jsonl_rows(path)
    out = LoggedEpisodes(dropped_lines=list(read.bad_lines))
    for row in read.rows:
        if _is_logged_episode(row):
            out.rows.append(row)
        else:
            out.dropped_lines.append(0)  # a JSON object that is no episode: no line to name
    raw = path.read_bytes()
    if out.dropped_lines or (raw and not raw.endswith(b"\n")):
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in out.rows))
    return out


def describe_dropped(path: Path, logged: LoggedEpisodes) -> str:
    """One line: how many lines of ``path`` were dropped and why they do not count."""
    named = [n for n in logged.dropped_lines if n]
    where = f" (line {', '.join(map(str, named[:5]))})" if named else ""
    return (f"{path}: dropped {len(logged.dropped_lines)} incomplete line(s){where}, an episode "
            "cut short when the run was killed; it runs again")


class EpisodeLog:
    """Appends one line per finished episode to ``path``, durable before ``append`` returns."""

    def __init__(self, path: Path, *, fresh: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            write_atomic(self.path, "")
        self.appended = 0

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self.appended += 1


def check_run_record(path: Path, record: Mapping[str, Any], *, resume: bool) -> bool:
    """Store ``record`` (the settings that decide the episodes) at ``path``; with ``resume``,
    first compare it with the stored one. Returns whether there was a stored record to resume
    from. Raises ``ResumeMismatch`` naming the first setting that differs."""
    path = Path(path)
    stored = _stored_record(path) if resume else None
    if stored is not None:
        difference = first_difference(stored, record)
        if difference is not None:
            key, was, asked = difference
            raise ResumeMismatch(
                f"--resume: {path.parent} was run with {key}={_short(was)}, this run asks "
                f"{key}={_short(asked)}; resume with the same settings or give another --out")
    write_atomic(path, json.dumps(record, indent=2, default=str))
    return stored is not None


def first_difference(stored: Mapping[str, Any],
                     record: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """(key, stored value, asked value) of the first setting (by name) that differs, or None."""
    wanted = json.loads(json.dumps(record, default=str))  # tuples and paths as JSON has them
    for key in sorted(set(stored) | set(wanted)):
        if stored.get(key) != wanted.get(key):
            return key, stored.get(key), wanted.get(key)
    return None


def _stored_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ResumeMismatch(f"{path} is not readable JSON; remove it or give another --out to "
                             "start afresh") from None
    if not isinstance(stored, dict):
        raise ResumeMismatch(f"{path} holds no run record; remove it or give another --out to "
                             "start afresh")
    return stored


def reusable_log(episodes_file: Path, record: Mapping[str, Any], *,
                 resume: bool) -> LoggedEpisodes:
    """The episodes of ``episodes_file`` a resumed run keeps: all but those that ended in an
    error (an evaluator failure says nothing of the agents, so they run again), and none
    unless ``resume`` and the stored record (``record_path``) equals ``record``. The file is
    rewritten to hold just those, the record stored."""
    record_file = record_path(episodes_file)
    stored = _stored_record(record_file) if resume else None
    keep = LoggedEpisodes()
    if stored is not None and first_difference(stored, record) is None:
        logged = read_episode_log(episodes_file)
        keep.rows = [r for r in logged.rows if r.get("status") != EpisodeStatus.ERROR.value]
        keep.dropped_lines = logged.dropped_lines
    write_atomic(episodes_file, "".join(json.dumps(row) + "\n" for row in keep.rows))
    write_atomic(record_file, json.dumps(record, indent=2, default=str))
    return keep


def record_path(episodes_file: Path) -> Path:
    """Where the run record of an episode log lives: ``NAME.record.json`` beside it."""
    return episodes_file.with_name(f"{episodes_file.stem}.record.json")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
