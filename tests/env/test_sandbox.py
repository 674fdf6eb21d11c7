"""The sandbox refuses escapes and keeps the honest path working.

The sandbox is process-wide and permanent, so every probe runs in a fresh interpreter
(``subprocess.run([sys.executable, ...])``) that installs it the way the worker does (torch
imported first) and reports what each attempted operation did as JSON.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from multiminddev.env.sandbox import SandboxPolicy, sandbox_capabilities

PROBE = textwrap.dedent(
    r'''
    import json, os, sys, pathlib
    import torch  # the worker initialises torch before installing the sandbox
    from multiminddev.env import sandbox

    workdir, problem, outside = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    sandbox.install_sandbox(workdir)
    sandbox.install_sandbox(workdir)  # idempotent
    results = {}

    def attempt(name, fn):
        try:
            fn()
            results[name] = "ok"
        except sandbox.SandboxViolation as exc:
            results[name] = "refused: " + str(exc)
        except Exception as exc:
            results[name] = f"error: {type(exc).__name__}: {exc}"

    def spawn():
        import subprocess
        subprocess.run(["true"], check=False)

    def connect():
        import socket
        socket.create_connection(("127.0.0.1", 9), timeout=1)

    def inet_socket():
        import socket
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def dns():
        import socket
        socket.getaddrinfo("example.com", 80)

    def libc_by_path():
        import ctypes, ctypes.util
        ctypes.CDLL("/lib/x86_64-linux-gnu/libc.so.6")

    def libc_by_name():
        import ctypes
        ctypes.CDLL("libc.so.6")

    def write_inside():
        (pathlib.Path("inside.txt")).write_text("ok")
        assert (workdir / "inside.txt").read_text() == "ok"

    def compile_kernel():
        from multiminddev.cuda import compile_kernels
        from multiminddev.cuda.compiler import CACHE_SUBDIR
        source = 'extern "C" __global__ void k(float* y) { y[0] = %d.f; }' % os.getpid()
        k = compile_kernels(source, arch="sm_90")
        assert not k.compile_result.cached
        cache = pathlib.Path(os.environ["MULTIMINDDEV_CACHE"]) / CACHE_SUBDIR
        assert any(cache.glob("*.cubin")), "compile cache not written"
        assert compile_kernels(source, arch="sm_90").compile_result.cached, "cache not read"

    attempt("spawn", spawn)
    attempt("os_system", lambda: os.system("true"))
    attempt("fork", os.fork)
    attempt("connect", connect)
    attempt("inet_socket", inet_socket)
    attempt("dns", dns)
    attempt("write_outside", lambda: open(outside, "w").write("x"))
    attempt("os_open_outside", lambda: os.open(outside, os.O_WRONLY | os.O_CREAT))
    attempt("remove_outside", lambda: os.remove(problem))
    attempt("rename_outside", lambda: os.rename("inside_missing", outside))
    attempt("libc_by_path", libc_by_path)
    attempt("libc_by_name", libc_by_name)
    seen = []
    sys.addaudithook(lambda event, args: seen.append(event))  # CPython drops it silently
    open(problem).read()
    results["second_hook_events"] = len(seen)
    attempt("settrace", lambda: sys.settrace(None))
    attempt("gc_objects", lambda: __import__("gc").get_objects())
    attempt("write_inside", write_inside)
    attempt("read_problem", lambda: open(problem).read())
    attempt("import_numpy", lambda: __import__("numpy").zeros(3).sum())
    attempt("import_new_module", lambda: __import__("fractions").Fraction(1, 3))
    attempt("torch_cpu_compute", lambda: torch.ones(4).sum().item())
    attempt("tempfile", lambda: __import__("tempfile").NamedTemporaryFile().close())
    attempt("compile_kernel", compile_kernel)
    attempt("proc_environ", lambda: open("/proc/self/environ", "rb").read())
    attempt("parent_proc", lambda: open(f"/proc/{os.getppid()}/cmdline", "rb").read())
    attempt("proc_self_status", lambda: open("/proc/self/status").read())
    attempt("write_devnull", lambda: open(os.devnull, "w").write("x"))
    attempt("symlink_escape", lambda: (os.symlink(outside, "link"), open("link", "w")))
    results["env"] = dict(os.environ)
    results["cwd"] = os.getcwd()
    results["violations"] = [f.rule for f in sandbox.violations()]
    print("RESULTS " + json.dumps(results))
    '''
)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("sandbox")
    workdir, outside = base / "work", tmp_path_factory.mktemp("outside") / "escape.txt"
    problem = Path(__file__).parents[1] / "fixtures" / "problems" / "1_relu.py"
    copy = tmp_path_factory.mktemp("problem") / "1_relu.py"
    copy.write_text(problem.read_text())
    env = {**__import__("os").environ, "AWS_SECRET_ACCESS_KEY": "leak-me", "HF_TOKEN": "leak-me"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(workdir), str(copy), str(outside)],
                         capture_output=True, text=True, timeout=240, env=env, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line is not None, f"probe failed (rc={out.returncode}):\n{out.stderr[-3000:]}"
    results = json.loads(line.removeprefix("RESULTS "))
    results["_outside_exists"] = outside.exists()
    results["_problem_exists"] = copy.exists()
    results["_workdir"] = str(workdir.resolve())
    return results


@pytest.mark.parametrize(
    "operation",
    ["spawn", "os_system", "fork", "connect", "inet_socket", "dns", "write_outside",
     "os_open_outside", "remove_outside", "rename_outside", "libc_by_path", "libc_by_name",
     "settrace", "gc_objects", "symlink_escape", "proc_environ", "parent_proc"],
)
def test_escape_is_refused(probe, operation):
    assert probe[operation].startswith("refused: sandbox refused"), probe[operation]


def test_second_audit_hook_is_not_added(probe):
    # CPython swallows a hook's Exception for "sys.addaudithook" and skips adding the new hook.
    assert probe["second_hook_events"] == 0
    assert "sandbox:sys.addaudithook" in probe["violations"]


def test_refused_writes_leave_no_file(probe):
    assert not probe["_outside_exists"] and probe["_problem_exists"]


@pytest.mark.parametrize(
    "operation",
    ["write_inside", "read_problem", "import_numpy", "import_new_module", "torch_cpu_compute",
     "tempfile", "compile_kernel", "write_devnull", "proc_self_status"],
)
def test_honest_operation_still_works(probe, operation):
    assert probe[operation] == "ok", probe[operation]


def test_environment_is_scrubbed(probe):
    env = probe["env"]
    assert "AWS_SECRET_ACCESS_KEY" not in env and "HF_TOKEN" not in env
    assert env["HOME"] == env["TMPDIR"] == probe["_workdir"]
    assert "PATH" in env and "MULTIMINDDEV_CACHE" in env


def test_working_directory_is_the_workdir(probe):
    assert probe["cwd"] == probe["_workdir"]


def test_violations_are_recorded_even_when_caught(probe):
    assert "sandbox:subprocess.Popen" in probe["violations"]
    assert "sandbox:open" in probe["violations"]


ALLOWLIST_PROBE = textwrap.dedent(
    r'''
    import pathlib, subprocess, sys
    from multiminddev.env import sandbox
    sandbox.install_sandbox(pathlib.Path(sys.argv[1]),
                            sandbox.SandboxPolicy(allowed_executables=("true",)))
    subprocess.run(["true"], check=True)
    try:
        subprocess.run(["sh", "-c", "true"], check=True)
    except sandbox.SandboxViolation:
        print("RESULT allowlisted-only")
    '''
)


def test_allowed_executables_are_the_only_spawnable_ones(tmp_path):
    out = subprocess.run([sys.executable, "-c", ALLOWLIST_PROBE, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert "RESULT allowlisted-only" in out.stdout, out.stderr[-2000:]


PREPARED_PROBE = textwrap.dedent(
    r'''
    import pathlib, socket, sys
    from multiminddev.env import sandbox
    sandbox.prepare_sandbox()  # the worker does this at start-up, before any job
    namespace = sandbox._STATE.network_namespace
    assert not sandbox.is_installed()
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()  # nothing refused yet
    sandbox.install_sandbox(pathlib.Path(sys.argv[1]))
    assert sandbox._STATE.network_namespace == namespace  # not unshared a second time
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except sandbox.SandboxViolation:
        print("RESULT", namespace)
    '''
)


def test_prepared_sandbox_installs_without_redoing_the_namespace(tmp_path):
    """The network namespace is made at worker start-up (off the evaluation's clock); the
    job-time install keeps it and still refuses the network."""
    out = subprocess.run([sys.executable, "-c", PREPARED_PROBE, str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), "")
    assert line, out.stderr[-2000:]
    assert line.split(" ", 1)[1] == "isolated" or line.split(" ", 1)[1].startswith("unavailable")


def test_policy_validates_limits():
    with pytest.raises(ValueError, match="positive int or None"):
        SandboxPolicy(max_file_bytes=0)


def test_capabilities_report_what_is_enforceable():
    caps = sandbox_capabilities()
    assert caps["audit_hooks"] is True and caps["installed_here"] is False
    assert caps["network_namespace"] == "available" or str(caps["network_namespace"]).startswith(
        "unavailable")
    assert "not a security boundary" in str(caps["boundary"])


ISOLATED_DESCRIBE_PROBE = textwrap.dedent(
    r'''
    import json, pathlib, sys
    from multiminddev.env import isolation, sandbox
    report = isolation.isolate_worker(isolation.make_private_dir(), [], "auto",
                                      readable=isolation.code_paths())  # as a worker sees it
    sandbox.prepare_sandbox()  # its own unshare fails now: every capability is gone
    sandbox.install_sandbox(pathlib.Path(sys.argv[1]))
    print("DESCRIBE " + json.dumps(sandbox.describe()))
    '''
)


def test_describe_reports_the_workers_os_isolation(tmp_path):
    out = subprocess.run([sys.executable, "-c", ISOLATED_DESCRIBE_PROBE, str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=120, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("DESCRIBE ")), "")
    assert line, out.stderr[-2000:]
    described = json.loads(line.removeprefix("DESCRIBE "))
    if described["isolation"]["status"] != "active":
        pytest.skip(f"this kernel refuses worker isolation: {described['isolation']['boundary']}")
    assert described["network_namespace"] == "isolated (the worker's own network namespace)"


def test_a_policy_keeps_the_environment_prefixes_it_names(tmp_path):
    """What the profile harness relies on: ncu's settings for its injection library survive the
    scrub when named, and the rest goes as usual."""
    script = textwrap.dedent(
        r'''
        import json, os, pathlib, sys
        from multiminddev.env import sandbox
        sandbox._scrub_environment(pathlib.Path(sys.argv[1]), {}, ("NV_",))
        print(json.dumps(sorted(os.environ)))
        ''')
    env = {**__import__("os").environ, "NV_TPS_LAUNCH_TOKEN": "x", "HF_TOKEN": "secret"}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    names = json.loads(out.stdout)
    assert "NV_TPS_LAUNCH_TOKEN" in names and "HF_TOKEN" not in names
    default = subprocess.run([sys.executable, "-c", script.replace('("NV_",)', "()"),
                              str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
    assert "NV_TPS_LAUNCH_TOKEN" not in json.loads(default.stdout)


ERASE_SCRIPT = r"""
import json, os, posix, sys
from pathlib import Path
from multiminddev.env import sandbox
sandbox._scrub_environment(Path(sys.argv[1]), {})
print(json.dumps({"proc": Path("/proc/self/environ").read_bytes().decode("latin-1"),
                  "posix": repr(posix.environ), "os": repr(dict(os.environ)),
                  "home": os.environ.get("HOME")}))
"""


def test_the_exec_environment_block_is_erased_with_the_scrub(tmp_path):
    """A canary in the environment a process was exec'd with is gone from /proc/self/environ,
    posix.environ and os.environ after the scrub; the kept variables still work."""
    canary = secrets.token_hex(16)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, f"MMD_CANARY_{secrets.token_hex(4).upper()}": canary, "PYTHONPATH": src}
    run = subprocess.run([sys.executable, "-c", ERASE_SCRIPT, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert canary not in run.stdout
    seen = json.loads(run.stdout)
    assert seen["home"] == str(tmp_path) and "PATH" in seen["os"]
    assert f"PATH={os.environ['PATH']}" in seen["proc"]  # a kept entry stays where it was
