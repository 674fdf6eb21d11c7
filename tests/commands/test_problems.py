"""``multiminddev problems list|show|export`` on the built-in corpus."""

from __future__ import annotations

import json

from multiminddev.cli import main
from multiminddev.tasks.builtin import FAMILIES
from multiminddev.tasks.problem import load_problem
from multiminddev.tasks.splits import split_manifest


def test_list_json_gives_every_problem_with_its_split(capsys):
    assert main(["problems", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == sum(len(f.shapes) for f in FAMILIES)
    assert {r["split"] for r in rows} == {"train", "heldout"}


def test_list_filters_by_tier_and_split(capsys):
    assert main(["problems", "list", "--tier", "3", "--split", "heldout", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["tier"] == 3 and r["split"] == "heldout" for r in rows)


def test_show_prints_the_problem_source(capsys):
    assert main(["problems", "show", "softmax"]) == 0
    assert "class Model(nn.Module)" in capsys.readouterr().out


def test_show_prints_a_solution(capsys):
    assert main(["problems", "show", "matmul_square_1024x1024x1024", "--solution", "fast"]) == 0
    out = capsys.readouterr().out
    assert "class ModelNew(nn.Module)" in out and "mm_fast" in out


def test_show_fails_clearly_for_a_missing_variant(capsys):
    naive_only = next(f for f in FAMILIES if f.fast is None)
    assert main(["problems", "show", naive_only.name, "--solution", "fast"]) == 2
    assert "no fast solution" in capsys.readouterr().err


def test_show_fails_clearly_for_an_unknown_name(capsys):
    assert main(["problems", "show", "no_such_problem"]) == 2
    assert "no built-in problem" in capsys.readouterr().err


def test_export_writes_a_kernelbench_layout_with_solutions(tmp_path, capsys):
    assert main(["problems", "export", str(tmp_path), "--tier", "1", "--with-solutions",
                 "--seed", "3"]) == 0
    problems = sorted((tmp_path / "level1").glob("*.py"))
    assert len(problems) == sum(len(f.shapes) for f in FAMILIES if f.tier == 1)
    for path in problems:
        problem = load_problem(path)
        assert problem.tier == 1 and path.name.split("_", 1)[1] == problem.name + ".py"
        assert (tmp_path / "solutions" / "naive" / "level1" / path.name).is_file()
    fast = list((tmp_path / "solutions" / "fast" / "level1").glob("*.py"))
    assert 0 < len(fast) < len(problems)  # some tier-1 families are naive-only
    assert json.loads((tmp_path / "splits.json").read_text()) == split_manifest(3)
    index = json.loads((tmp_path / "index.json").read_text())
    assert {e["file"] for e in index} == {str(p.relative_to(tmp_path)) for p in problems}


def test_export_refuses_a_non_empty_folder_without_force(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    code = main(["problems", "export", str(tmp_path), "--family", "relu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is not empty" in err and "--force" in err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_export_force_replaces_an_earlier_export_without_leftovers(tmp_path, capsys):
    out = tmp_path / "kb"
    assert main(["problems", "export", str(out), "--tier", "1", "--with-solutions"]) == 0
    assert main(["problems", "export", str(out), "--family", "relu", "--force"]) == 0
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    index = json.loads((out / "index.json").read_text())
    assert files == {e["file"] for e in index} | {"index.json", "splits.json"}
    assert [p.name for p in tmp_path.iterdir()] == ["kb"]  # no staging folder left beside it


def test_export_force_never_clears_a_folder_that_is_not_an_export(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    code = main(["problems", "export", str(tmp_path), "--family", "relu", "--force"])
    assert code == 2 and "not an earlier export" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_an_empty_selection_is_an_error(tmp_path, capsys):
    assert main(["problems", "list", "--tier", "9"]) == 2
    assert "no built-in problem matches" in capsys.readouterr().err
    assert main(["problems", "export", str(tmp_path / "out"), "--tier", "9"]) == 2
    assert not (tmp_path / "out").exists()
