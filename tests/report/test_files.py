"""Atomic output files and tolerant JSONL reading."""

from __future__ import annotations

import os

import pytest

from multiminddev.report.files import describe_bad_lines, read_jsonl_rows, write_atomic


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out" / "summary.json"
    write_atomic(path, "old")
    write_atomic(path, "new")
    assert path.read_text() == "new" and [p.name for p in path.parent.iterdir()] == ["summary.json"]


def test_a_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    path.write_text("old report")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_atomic(path, "new report")
    assert path.read_text() == "old report" and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_read_jsonl_rows_counts_lines_that_are_not_objects(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\n\n[1, 2]\n\xff\n{"b": 2}\n{"cut')
    read = read_jsonl_rows(path)
    assert read.rows == [{"a": 1}, {"b": 2}] and read.bad_lines == [3, 4, 6]


def test_describe_bad_lines_counts_and_names_the_first_lines(tmp_path):
    text = describe_bad_lines(tmp_path / "x.jsonl", list(range(1, 9)))
    assert "skipped 8 lines" in text and "line 1, 2, 3, 4, 5, ..." in text


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path, umask):
    """Reports are for others to read: 0644 under umask 022 (mkstemp alone gives 0600)."""
    old = os.umask(umask)
    try:
        path = write_atomic(tmp_path / "report.html", "<p>hi</p>")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_rewritten_file_keeps_its_mode(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_atomic(path, "{\"n\": 1}")
    assert path.stat().st_mode & 0o777 == 0o640 and path.read_text() == "{\"n\": 1}"
