"""Generator SFT examples from the Sakana archive, read from files in the archive's real schema."""

from __future__ import annotations

import dataclasses

import pytest

from multiminddev.agents.parsing import parse_candidate
from multiminddev.agents.prompts import generator_messages
from multiminddev.tasks.loaders import load_sakana_archive
from multiminddev.train.sakana_sft import (
    SakanaSkip,
    load_sakana_sft_data,
    sakana_sft_data,
    sakana_sft_path,
    select_sakana_records,
)
from multiminddev.train.sft_data import build_sft_dataset
from tests.tasks.kb_fixtures import SAKANA_CUDA_CORRECT, sakana_rows, write_sakana_parquet

pytest.importorskip("datasets", reason="the Sakana loader needs `datasets`: pip install datasets")


def _rows(*kernels: tuple[str, bool, float | None, str]) -> dict[str, list]:
    """Archive rows of task 76, one per (kernel name, Correct, speedup, CUDA_Code)."""
    template = sakana_rows()
    rows: dict[str, list] = {column: [] for column in template}
    for i, (name, correct, speedup, cuda) in enumerate(kernels):
        for column, values in template.items():
            rows[column].append(values[0])
        rows["Kernel_Name"][-1] = name
        rows["Correct"][-1] = correct
        rows["CUDA_Speedup_Native"][-1] = speedup
        rows["CUDA_Code"][-1] = cuda
        rows["__index_level_0__"][-1] = 1000 + i
    return rows


def _variant(block: int) -> str:
    """A distinct, equally valid kernel: another block size."""
    return SAKANA_CUDA_CORRECT.replace("dim3 block(128);", f"dim3 block({block});")


def _records(tmp_path, *kernels):
    return load_sakana_archive(write_sakana_parquet(tmp_path, _rows(*kernels)),
                               correct_only=False)


def test_a_correct_record_becomes_a_generator_example_whose_reply_is_a_model_new_candidate(
        tmp_path):
    static = pytest.importorskip("multiminddev.env.static_checks")
    (record,) = records = _records(tmp_path, ("base", True, 1.6, SAKANA_CUDA_CORRECT))
    (example,) = sakana_sft_data(records).examples
    assert (example.role.value, example.origin, example.variant) == ("generator", "sakana", "base")
    assert example.messages[:-1] == generator_messages(record.problem)  # the Generator's prompt
    parsed = parse_candidate(example.messages[-1]["content"])
    assert parsed.source is not None and "class ModelNew" in parsed.source
    checks = static.run_static_checks(parsed.source)
    assert checks.findings == [] and checks.candidate_kind == "load_inline"


def test_an_incorrect_record_is_skipped_and_counted(tmp_path):
    records = _records(tmp_path, ("good", True, 1.6, SAKANA_CUDA_CORRECT),
                       ("bad", False, None, _variant(64)))
    data = sakana_sft_data(records)
    assert [e.variant for e in data.examples] == ["good"]
    assert dict(data.skipped) == {SakanaSkip.INCORRECT: 1}


def test_a_correct_record_without_a_positive_speedup_is_skipped(tmp_path):
    records = _records(tmp_path, ("untimed", True, None, SAKANA_CUDA_CORRECT),
                       ("zero", True, 0.0, _variant(64)))
    kept, skipped = select_sakana_records(records)
    assert kept == [] and skipped == {SakanaSkip.NO_SPEEDUP: 2}


def test_a_record_whose_kernel_could_not_be_wrapped_is_skipped(tmp_path):
    rows = _rows(("base", True, 1.6, SAKANA_CUDA_CORRECT))
    rows["PyTorch_Code_Functional"][0] = None
    records = load_sakana_archive(write_sakana_parquet(tmp_path, rows))
    assert select_sakana_records(records) == ([], {SakanaSkip.NO_CANDIDATE: 1})


def test_a_record_whose_source_does_not_parse_as_a_candidate_is_skipped(tmp_path):
    (record,) = _records(tmp_path, ("base", True, 1.6, SAKANA_CUDA_CORRECT))
    no_model_new = dataclasses.replace(
        record, candidate_source=record.candidate_source.replace("ModelNew", "Other"))
    broken = dataclasses.replace(record, candidate_source="class ModelNew(:\n")
    assert select_sakana_records([no_model_new, broken]) == ([], {SakanaSkip.UNPARSABLE: 2})


def test_identical_kernels_of_a_task_count_once(tmp_path):
    records = _records(tmp_path, ("a", True, 1.6, SAKANA_CUDA_CORRECT),
                       ("a_again", True, 1.5, SAKANA_CUDA_CORRECT + "\n\n"))
    kept, skipped = select_sakana_records(records)
    assert [r.kernel_name for r in kept] == ["a"] and skipped == {SakanaSkip.DUPLICATE: 1}


def test_the_cap_per_task_keeps_the_fastest_kernels(tmp_path):
    records = _records(tmp_path, ("slow", True, 0.8, _variant(32)),
                       ("fast", True, 2.0, _variant(64)),
                       ("middle", True, 1.2, SAKANA_CUDA_CORRECT))
    kept, skipped = select_sakana_records(records, max_per_task=2)
    assert [r.kernel_name for r in kept] == ["fast", "middle"]
    assert skipped == {SakanaSkip.OVER_CAP: 1}


def test_the_summary_names_what_was_kept_and_each_skip_reason(tmp_path):
    records = _records(tmp_path, ("good", True, 1.6, SAKANA_CUDA_CORRECT),
                       ("bad", False, None, _variant(64)))
    summary = sakana_sft_data(records).summary()
    assert "1 Generator example(s) from 1 task(s)" in summary
    assert "skipped 1 record(s): 1 not correct in the archive" in summary


def test_loading_a_spec_reads_the_correct_rows_of_the_archive_files(tmp_path):
    path = write_sakana_parquet(tmp_path, _rows(("good", True, 1.6, SAKANA_CUDA_CORRECT),
                                                ("bad", False, None, _variant(64))))
    data = load_sakana_sft_data(f"sakana:{path.parent}")
    assert [e.variant for e in data.examples] == ["good"] and data.tasks == 1


def test_an_archive_with_no_usable_record_is_an_error_saying_why(tmp_path):
    path = write_sakana_parquet(tmp_path, _rows(("untimed", True, None, SAKANA_CUDA_CORRECT)))
    with pytest.raises(ValueError, match="gives no SFT example.*no positive speedup"):
        load_sakana_sft_data(f"sakana:{path}")


@pytest.mark.parametrize("spec", ["sakana:", "kernelbench:x", "some/archive"])
def test_a_spec_of_another_form_names_the_valid_one(spec):
    with pytest.raises(ValueError, match="give sakana:PATH"):
        sakana_sft_path(spec)


def test_a_spec_with_a_missing_path_says_it_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        sakana_sft_path(f"sakana:{tmp_path / 'nope'}")


def test_archive_examples_join_the_reference_solutions_in_the_dataset(tmp_path):
    builtin = pytest.importorskip("multiminddev.tasks.builtin", reason="corpus not installed")
    problems = builtin.builtin_problems(tiers=[0])[:1]
    records = _records(tmp_path, ("good", True, 1.6, SAKANA_CUDA_CORRECT))
    corpus = build_sft_dataset("generator", problems)
    mixed = build_sft_dataset("generator", problems,
                              extra_examples=sakana_sft_data(records).examples)
    assert len(mixed) == len(corpus) + 1
    assert sorted(set(mixed["origin"])) == ["builtin", "sakana"]
