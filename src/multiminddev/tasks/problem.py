"""A benchmark problem as a file, defined in ``core.problem``.

``Problem`` lives on the floor because the evaluator (``env``) takes problems as well as the
task sets built here; this module keeps ``multiminddev.tasks.problem`` the place to import from.
"""

from multiminddev.core.problem import (
    DEFAULT_TOLERANCES,
    METADATA_VARIABLE,
    Problem,
    ProblemError,
    load_problem,
    load_problem_source,
    validate_problem_source,
)

__all__ = ["DEFAULT_TOLERANCES", "METADATA_VARIABLE", "Problem", "ProblemError", "load_problem",
           "load_problem_source", "validate_problem_source"]
