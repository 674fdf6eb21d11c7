"""The child process ``env.profile.profile_kernel`` runs under ``ncu``: one forward pass of a
candidate, behind the evaluation worker's boundary.

``python -m multiminddev.env.profile_harness PROBLEM.py CANDIDATE.py CONFIG.json NAME``

Order, as in the worker (env/worker.py): read the inputs, isolate (namespaces, read-only view;
``EvalConfig.isolation``), import torch and build the reference's inputs on the GPU, point the
compile caches into a private directory, install the sandbox, and only then load the candidate
and run ``ModelNew`` once inside the NVTX range that ``ncu`` profiles. A step that fails before
the candidate loads exits with a status of ``EXIT_REASONS``; the candidate's own failure exits
``CANDIDATE_EXIT``. Where the namespaces cannot be set up (a worker falls back to the sandbox
alone with ``EvalConfig.isolation='auto'``), the harness stops before the candidate: a profile
is an extra and gets the whole boundary or none (``isolation='none'`` switches that check off
with the rest).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NVTX_RANGE = "mmd_candidate"  # the range whose kernels ncu profiles (--nvtx-include)
NO_GPU_EXIT = 10
ISOLATION_EXIT = 11
SETUP_EXIT = 12
CANDIDATE_EXIT = 13
EXIT_REASONS = {NO_GPU_EXIT: "no CUDA GPU",
                ISOLATION_EXIT: "the evaluation boundary could not be set up",
                SETUP_EXIT: "the reference's inputs could not be built",
                CANDIDATE_EXIT: "the candidate failed in the profiled run"}


def main(argv: list[str]) -> int:
    problem_path, candidate_path, config_path, name = argv
    problem_source = Path(problem_path).read_text()
    candidate_source = Path(candidate_path).read_text()
    from multiminddev.env.config import EvalConfig

    cfg = EvalConfig.from_dict(json.loads(Path(config_path).read_text()))
    from multiminddev.env.isolation import (
        IsolationError,
        IsolationPolicy,
        isolate_worker,
        make_private_dir,
        worker_hidden_paths,
        worker_readable_paths,
    )

    from multiminddev.env.config import Isolation

    try:  # first: namespaces need a single-threaded process (torch is not imported yet)
        report = isolate_worker(make_private_dir(), [],
                                IsolationPolicy(mode=cfg.isolation,
                                                tmpfs_mib=cfg.isolation_tmpfs_mib),
                                hidden=worker_hidden_paths(cfg),
                                readable=worker_readable_paths(cfg))
    except IsolationError as exc:
        print(f"IsolationError: {exc}", file=sys.stderr)
        return ISOLATION_EXIT
    if cfg.isolation is not Isolation.NONE and not report.active:
        # A worker that cannot isolate falls back to the sandbox alone (isolation 'auto'); a
        # profile is an extra, so it asks for the whole boundary and is skipped without it.
        print(f"isolation is {report.boundary}: the profile needs the worker's namespaces "
              f"({'; '.join(report.warnings)})", file=sys.stderr)
        return ISOLATION_EXIT
    import tempfile

    import torch

    if not torch.cuda.is_available():
        return NO_GPU_EXIT
    try:
        from multiminddev.core.problem import load_problem_source

        problem = load_problem_source(problem_source, name=name)
        reference: dict = {}
        # the problem's module is the trusted reference (the worker runs it the same way)
        exec(compile(problem.source, "problem.py", "exec"), reference)  # noqa: S102
        torch.manual_seed(0)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in reference["get_inputs"]()]
        init_inputs = reference["get_init_inputs"]()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported as the exit status and on stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return SETUP_EXIT
    from multiminddev.env import sandbox
    from multiminddev.env.candidate import load_module_from_source
    from multiminddev.env.worker import use_private_compile_caches

    workdir = Path(tempfile.mkdtemp(prefix="mmd-profile-"))
    use_private_compile_caches(workdir)
    sandbox.prepare_sandbox()
    sandbox.install_sandbox(workdir, sandbox.SandboxPolicy())
    try:
        module = load_module_from_source(candidate_source, "mmd_profiled_candidate", workdir)
        model = module.ModelNew(*init_inputs).cuda()
        with torch.no_grad():
            torch.cuda.nvtx.range_push(NVTX_RANGE)
            model(*inputs)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
    except BaseException as exc:  # noqa: BLE001 - the candidate's failure, reported
        print(f"{type(exc).__name__}: {exc}"[:400], file=sys.stderr)
        return CANDIDATE_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
