"""The processes ``env.profile.profile_kernel`` runs: one forward pass of a candidate under
``ncu``, behind the evaluation worker's boundary.

    python -m multiminddev.env.profile_harness launch CONFIG.json -- NCU_COMMAND...
    python -m multiminddev.env.profile_harness PROBLEM.py CANDIDATE.py CONFIG.json NAME

``launch`` (single-threaded, before ``ncu`` starts) moves into a network namespace of its own
whose only interface is a loopback, then runs ``ncu``: Nsight Compute and the process it
profiles talk over loopback TCP, so they share that namespace, and nothing else is reachable.

The second form is the one ``ncu`` starts. A process under ``ncu`` is not single-threaded (its
injection library starts a thread as it loads), and namespaces need a single-threaded process,
so the profiled run happens in a forked child, which starts with one thread and which ``ncu``
follows (``--target-processes all``). The child, in the worker's order (env/worker.py): isolate
(user and mount namespaces, read-only view, capabilities dropped; ``EvalConfig.isolation``;
the network namespace is the launcher's), import torch and build the reference's inputs on the
GPU, point the compile caches into a private directory, install the sandbox, and only then load
the candidate and run ``ModelNew`` once inside the NVTX range that ``ncu`` profiles. A step that
fails before the candidate loads exits with a status of ``EXIT_REASONS``; the candidate's own
failure exits ``CANDIDATE_EXIT``. A profile is an extra and gets the whole boundary or none:
outside a network namespace with a loopback alone, or where the child's namespaces cannot be set
up (a worker falls back to the sandbox alone with ``EvalConfig.isolation='auto'``), the harness
stops before the candidate (``isolation='none'`` switches those checks off with the rest).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

from multiminddev.env.config import EvalConfig, Isolation
from multiminddev.env.isolation import (
    IsolationError,
    IsolationPolicy,
    enter_private_network,
    isolate_worker,
    make_private_dir,
    network_interfaces,
    worker_hidden_paths,
    worker_readable_paths,
)

# What ncu may give its injection library besides the CUDA_ variables the sandbox keeps anyway
# (NVTX_INJECTION64_PATH is read once, by the first NVTX range, opened before the sandbox).
NCU_ENVIRONMENT_PREFIXES = ("NV_", "NSIGHT", "NCU_", "CUPTI")
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
    if argv and argv[0] == "launch":
        return launch(argv[1:])
    problem_path, candidate_path, config_path, name = argv
    problem_source = Path(problem_path).read_text()
    candidate_source = Path(candidate_path).read_text()
    cfg = EvalConfig.from_dict(json.loads(Path(config_path).read_text()))
    if cfg.isolation is not Isolation.NONE and network_interfaces() != ["lo"]:
        print(f"the profiled run needs a network namespace with a loopback alone (this one has "
              f"{', '.join(network_interfaces())}): start it through `launch`", file=sys.stderr)
        return ISOLATION_EXIT
    with warnings.catch_warnings():  # ncu's thread is the one a forked child goes without
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = CANDIDATE_EXIT
        try:
            code = profiled_run(problem_source, candidate_source, cfg, name)
        except BaseException as exc:  # noqa: BLE001 - reported on stderr, as the exit status
            print(f"{type(exc).__name__}: {exc}"[:400], file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else CANDIDATE_EXIT  # killed by a signal: the candidate's doing


def launch(argv: list[str]) -> int:
    """``launch CONFIG.json -- COMMAND...``: a network namespace of its own (unless isolation is
    switched off), then exec COMMAND."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: profile_harness launch CONFIG.json -- COMMAND...", file=sys.stderr)
        return SETUP_EXIT
    cfg = EvalConfig.from_dict(json.loads(Path(argv[0]).read_text()))
    command = argv[2:]
    if cfg.isolation is not Isolation.NONE:
        try:
            enter_private_network()
        except OSError as exc:
            print(f"no network namespace for the profiled run: {exc}", file=sys.stderr)
            return ISOLATION_EXIT
    sys.stdout.flush()
    os.execvp(command[0], command)
    return SETUP_EXIT  # not reached: execvp replaces this process or raises


def profiled_run(problem_source: str, candidate_source: str, cfg: EvalConfig, name: str) -> int:
    """The forked child: the worker's boundary, the reference's inputs, the candidate's one
    forward pass inside the NVTX range."""
    try:  # first: namespaces need a single-threaded process (torch is not imported yet)
        report = isolate_worker(make_private_dir(), [],
                                IsolationPolicy(mode=cfg.isolation, network=False,
                                                tmpfs_mib=cfg.isolation_tmpfs_mib),
                                hidden=worker_hidden_paths(cfg),
                                readable=worker_readable_paths(cfg))
    except IsolationError as exc:
        print(f"IsolationError: {exc}", file=sys.stderr)
        return ISOLATION_EXIT
    if cfg.isolation is not Isolation.NONE and not report.active:
        print(f"isolation is {report.boundary}: the profile needs the worker's namespaces "
              f"({'; '.join(report.warnings)})", file=sys.stderr)
        return ISOLATION_EXIT
    # torch, and with it CUDA, loads only now: behind the boundary
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
        # NVTX loads ncu's injection library on its first call, from NVTX_INJECTION64_PATH,
        # which the sandbox's scrubbed environment no longer has: a first range now, while
        # the variable is there, so that ncu sees the candidate's range
        torch.cuda.nvtx.range_push("mmd_setup")
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported as the exit status and on stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return SETUP_EXIT
    from multiminddev.env import sandbox
    from multiminddev.env.candidate import load_module_from_source
    from multiminddev.env.worker import use_private_compile_caches

    workdir = Path(tempfile.mkdtemp(prefix="mmd-profile-"))
    use_private_compile_caches(workdir)
    # The launcher's network namespace already has a loopback alone; a namespace of the child's
    # own would cut the injection library off from ncu, which it reaches over that loopback.
    # The environment keeps what ncu gave its injection library (no secrets: profiler settings).
    policy = sandbox.SandboxPolicy(network_namespace=False,
                                   keep_environment_prefixes=NCU_ENVIRONMENT_PREFIXES)
    sandbox.prepare_sandbox(policy)
    sandbox.install_sandbox(workdir, policy)
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
