"""Problem loading: KernelBench files unchanged, metadata, tolerances, clear errors."""

import pytest

from multiminddev.tasks.problem import (
    Problem,
    ProblemError,
    load_problem,
    load_problem_source,
)

KERNELBENCH_STYLE = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Simple model that performs a ReLU activation."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

batch_size = 16
dim = 16384

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []  # No special initialization inputs needed
'''


def test_kernelbench_file_loads_unchanged_with_tier_from_level_folder(tmp_path):
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    path = level / "19_ReLU.py"
    path.write_text(KERNELBENCH_STYLE)
    problem = load_problem(path)
    assert problem.name == "19_ReLU"
    assert problem.tier == 1
    assert problem.source == KERNELBENCH_STYLE
    assert problem.tolerances == (1e-4, 1e-4)


def test_metadata_literal_is_read_without_executing():
    source = KERNELBENCH_STYLE + (
        '\nMULTIMINDDEV = {"name": "relu_big", "tier": 0, "family": "relu", "dtype": "float16",'
        ' "bytes_moved": 1024, "owner": "corpus"}\n'
    )
    problem = load_problem_source(source, name="ignored")
    assert (problem.name, problem.family, problem.dtype, problem.bytes_moved) == (
        "relu_big",
        "relu",
        "float16",
        1024,
    )
    assert problem.tolerances == (1e-2, 1e-2)
    assert problem.extra == {"owner": "corpus"}


def test_per_problem_tolerance_override():
    problem = load_problem_source(KERNELBENCH_STYLE, name="p", atol=1e-3)
    assert problem.tolerances == (1e-3, 1e-4)


def test_missing_pieces_are_named():
    broken = KERNELBENCH_STYLE.replace("def get_init_inputs", "def something_else")
    with pytest.raises(ProblemError, match="get_init_inputs"):
        load_problem_source(broken, name="p")


def test_computed_metadata_is_refused():
    source = KERNELBENCH_STYLE + "\nMULTIMINDDEV = dict(tier=1)\n"
    with pytest.raises(ProblemError, match="literal dict"):
        load_problem_source(source, name="p")


def test_syntax_error_reports_line():
    with pytest.raises(ProblemError, match="line 1"):
        load_problem_source("def (:\n", name="p")


def test_unknown_dtype_says_what_is_allowed():
    with pytest.raises(ProblemError, match="float32"):
        Problem(name="p", source=KERNELBENCH_STYLE, dtype="int8")


def test_dict_round_trip():
    problem = load_problem_source(KERNELBENCH_STYLE, name="p", tier=2)
    assert Problem.from_dict(problem.to_dict()) == problem


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ProblemError, match="does not exist"):
        load_problem(tmp_path / "nope.py")


def test_problems_are_hashable_for_use_as_keys():
    problem = load_problem_source(KERNELBENCH_STYLE, name="p", owner="x")
    assert {problem: 1}[problem] == 1
