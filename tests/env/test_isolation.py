"""OS-level isolation of evaluation workers: namespaces, a read-only filesystem view, no network.

Isolation changes a process for good, so every check runs in a child process: the doctor's
probe (a throwaway interpreter isolated the way a worker is) or a real worker started by the
Evaluator's pool. Tests that need namespaces are skipped where this kernel refuses them; the
probe says so, nothing is assumed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from multiminddev.env import EvalConfig, Evaluator
from multiminddev.env.config import Isolation
from multiminddev.env.isolation import IsolationPolicy, probe_worker_isolation
from tests.env._fixtures import FIXTURES, problem_named


@pytest.fixture(scope="module")
def probe() -> dict:
    return probe_worker_isolation(Isolation.AUTO)


@pytest.fixture(scope="module")
def isolated(probe) -> dict:
    if probe["status"] != "active":
        pytest.skip(f"this kernel refuses worker isolation here: {probe['boundary']}; "
                    f"{probe['warnings']}")
    return probe


def test_write_outside_the_private_dir_is_read_only(isolated):
    assert isolated["checks"]["write_outside"] == "EROFS"


def test_private_dir_stays_writable(isolated):
    assert isolated["checks"]["write_private_dir"] == "writable"


def test_only_loopback_is_visible(isolated):
    assert isolated["checks"]["interfaces"] == ["lo"]


def test_candidate_cannot_remount_the_filesystem_writable(isolated):
    assert isolated["checks"]["remount_root_writable"] == "EPERM"


def test_parent_memory_is_out_of_reach(isolated):
    assert isolated["checks"]["parent_memory"] in {"EACCES", "EPERM"}


READABLE_UNDER_TMP = textwrap.dedent(
    r'''
    import errno, pathlib, sys
    from multiminddev.env import isolation
    cache = pathlib.Path(sys.argv[1])
    isolation.isolate_worker(isolation.make_private_dir(), [], "namespaces", readable=[cache])
    try:
        (cache / "planted").write_text("x")
        wrote = "writable"
    except OSError as exc:
        wrote = errno.errorcode[exc.errno]
    print("SEEN", (cache / "entry").read_text(), wrote)
    '''
)


def test_a_shared_cache_under_tmp_stays_visible_read_only(isolated, tmp_path):
    """The worker reads prebuilt libraries from the shared cache; a cache under the real /tmp
    must not vanish under the worker's private /tmp, nor become writable."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "entry").write_text("built")
    out = subprocess.run([sys.executable, "-c", READABLE_UNDER_TMP, str(cache)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert "SEEN built EROFS" in out.stdout, out.stdout + out.stderr[-2000:]
    assert not (cache / "planted").exists()


HIDDEN_KEY = textwrap.dedent(
    r'''
    import pathlib, sys
    from multiminddev.env import isolation
    key = pathlib.Path(sys.argv[1])
    report = isolation.isolate_worker(isolation.make_private_dir(), [], "namespaces",
                                      hidden=[key])
    print("READ", len(key.read_bytes()))
    '''
)


def test_the_cache_key_reads_as_empty_inside_the_worker(isolated):
    """The key that signs the shared caches must not be readable by a worker: native candidate
    code could sign a planted cubin or baseline with it."""
    import uuid

    key = Path.home() / f".mmd-test-key-{uuid.uuid4().hex}"  # not under the private /tmp
    key.write_bytes(b"k" * 32)
    try:
        out = subprocess.run([sys.executable, "-c", HIDDEN_KEY, str(key)],
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        key.unlink()
    assert "READ 0" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_worker_hides_the_key_of_its_cache():
    from multiminddev.cuda.cache_auth import key_path
    from multiminddev.env.isolation import worker_hidden_paths

    cfg = EvalConfig(cache_dir="/some/cache")
    assert worker_hidden_paths(cfg) == [key_path(Path("/some/cache"))]


WRITABLE_UNDER_TMP = textwrap.dedent(
    r'''
    import pathlib, sys
    from multiminddev.env import isolation
    cache = pathlib.Path(sys.argv[1])
    report = isolation.isolate_worker(isolation.make_private_dir(), [cache], "namespaces")
    (cache / "entry").write_text("written inside")
    print("WRITABLE", str(cache) in report.writable)
    '''
)


def test_writable_dir_under_tmp_reaches_the_real_directory(isolated, tmp_path):
    """/tmp is a private tmpfs in the worker; a cache dir that lies under the real /tmp is
    bound back, so what the worker writes there is what the parent reads."""
    cache = tmp_path / "cache"
    cache.mkdir()
    out = subprocess.run([sys.executable, "-c", WRITABLE_UNDER_TMP, str(cache)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert "WRITABLE True" in out.stdout, out.stderr[-2000:]
    assert (cache / "entry").read_text() == "written inside"


def test_other_processes_proc_entries_are_read_only(isolated):
    assert isolated["checks"]["write_parent_proc"] == "EROFS"


def test_own_proc_entries_stay_writable_for_the_cuda_driver(isolated):
    # a read-only /proc/self makes CUDA's device count fail (error 304, "OS call failed")
    assert isolated["checks"]["write_own_proc"] == "writable"


def test_isolation_off_reports_none_with_the_reason():
    report = probe_worker_isolation(Isolation.NONE)
    assert report["status"] == "none" and not report["ok"]
    assert report["boundary"] == "none: switched off (EvalConfig.isolation='none')"


THREADED = textwrap.dedent(
    r'''
    import json, sys, threading, pathlib
    from multiminddev.env import isolation
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()  # a second thread, as after torch
    mode = sys.argv[2]
    try:
        report = isolation.isolate_worker(pathlib.Path(sys.argv[1]), [], mode)
        print("REPORT " + json.dumps(report.to_dict()))
    except isolation.IsolationError as exc:
        print("ERROR " + str(exc))
    stop.set()
    '''
)


def _threaded(tmp_path: Path, mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", THREADED, str(tmp_path), mode],
                         capture_output=True, text=True, timeout=60, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith(("REPORT", "ERROR"))), "")
    assert line, out.stderr[-2000:]
    return line + "\n" + out.stderr


def test_multithreaded_worker_falls_back_with_a_logged_reason(tmp_path):
    output = _threaded(tmp_path, "auto")
    report = json.loads(output.split("\n", 1)[0].removeprefix("REPORT "))
    assert report["status"] == "none" and "threads" in report["boundary"]
    assert "forkserver" in output.split("\n", 1)[1]  # the warning says how to get isolation


def test_required_isolation_refuses_to_run_without_it(tmp_path):
    output = _threaded(tmp_path, "namespaces")
    assert output.startswith("ERROR isolation required"), output


def test_config_validates_the_isolation_mode():
    with pytest.raises(ValueError, match="auto.*namespaces.*none"):
        EvalConfig(isolation="container")


def test_config_round_trips_the_isolation_mode():
    cfg = EvalConfig(isolation="namespaces")
    assert cfg.isolation is Isolation.NAMESPACES
    assert EvalConfig.from_dict(cfg.to_dict()).isolation is Isolation.NAMESPACES


def test_policy_validates_the_tmpfs_size():
    with pytest.raises(ValueError, match="tmpfs_mib"):
        IsolationPolicy(tmpfs_mib=0)


# A candidate that reports, from inside a real worker, what the kernel let it do. The audit
# hook and static checks are off (sandbox=False, defenses=False) so each attempt reaches the
# kernel; the worker's compile stage fails with the findings in its message.
WORKER_PROBE = """
import errno, json, os, socket
import torch.nn as nn

found = {{}}
try:
    open(os.path.join({outside!r}, "mmd-isolation-escape"), "w").close()
    found["write_outside"] = "writable"
except OSError as exc:
    found["write_outside"] = errno.errorcode[exc.errno]
found["interfaces"] = sorted(name for _, name in socket.if_nameindex())
raise RuntimeError("PROBE " + json.dumps(found) + " END")

class ModelNew(nn.Module):
    def forward(self, x):
        return x
"""


@pytest.fixture(scope="module")
def worker_findings(isolated, tmp_path_factory) -> dict:
    outside = Path(__file__).resolve().parent  # a real directory outside the worker's own
    cfg = EvalConfig(num_workers=1, spare_workers=0, defenses=False, sandbox=False,
                     benchmark=False, compile_baseline=False, num_trials=1)
    with Evaluator(cfg) as ev:
        result = ev.evaluate(problem_named("1_relu"), WORKER_PROBE.format(outside=str(outside)))
    match = re.search(r"PROBE (\{.*?\}) END", result.message or "")
    assert match, f"no probe output: {result.status} {result.message}"
    findings = json.loads(match.group(1))
    escape = outside / "mmd-isolation-escape"
    findings["_escaped"] = escape.exists()
    escape.unlink(missing_ok=True)  # a failing run must not leave the file in the tree
    return findings


def test_worker_started_by_the_pool_cannot_write_outside(worker_findings):
    assert worker_findings["write_outside"] == "EROFS" and not worker_findings["_escaped"]


def test_worker_started_by_the_pool_sees_only_loopback(worker_findings):
    assert worker_findings["interfaces"] == ["lo"]


GPU_PROBE = textwrap.dedent(
    r'''
    import json, pathlib, sys
    from multiminddev.env.config import EvalConfig
    from multiminddev.env import isolation
    cfg = EvalConfig()
    private = isolation.make_private_dir()
    report = isolation.isolate_worker(private, [],
                                      isolation.IsolationPolicy(mode="namespaces"),
                                      readable=isolation.worker_readable_paths(cfg))
    import torch  # after isolation, as in a worker
    from multiminddev.cuda import compile_kernels
    source = 'extern "C" __global__ void twice(const float* x, float* y, int n) {' \
             ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.f * x[i]; }'
    kernels = compile_kernels(source)
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    kernels.twice(grid=(4,), block=(256,), args=(x, y, 1024))
    torch.cuda.synchronize()
    eager = torch.relu(x - 10).sum().item()  # a torch kernel too
    # torch.compile, as the trusted baseline runs it: Triton's cache must find a writable home
    compiled = torch.compile(lambda z: torch.relu(z) * 2)(x).sum().item()
    print("GPU " + json.dumps({"status": report.status.value, "ok": bool(torch.equal(y, 2 * x)),
                               "eager": eager, "compiled": compiled}))
    '''
)


@pytest.mark.gpu
def test_cuda_runs_inside_an_isolated_process(isolated):
    out = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True,
                         timeout=120, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("GPU ")), "")
    assert line, out.stderr[-3000:]
    data = json.loads(line.removeprefix("GPU "))
    assert data["status"] == "active" and data["ok"] and data["eager"] > 0
    assert data["compiled"] == 2 * sum(range(1024))


@pytest.mark.gpu
def test_honest_kernel_evaluates_ok_in_an_isolated_worker(isolated):
    from multiminddev.env import EvalStatus

    cfg = EvalConfig(num_workers=1, isolation="namespaces")
    with Evaluator(cfg) as ev:
        result = ev.evaluate(problem_named("1_relu"),
                             (FIXTURES / "honest" / "relu_basic.py").read_text())
    assert result.status is EvalStatus.OK, result.message



def test_the_workers_own_code_stays_importable_from_a_checkout_under_tmp():
    # A checkout (or virtual environment) under /tmp must not vanish under the private /tmp.
    import multiminddev
    from multiminddev.env.isolation import code_paths

    src = Path(multiminddev.__file__).resolve().parent.parent
    assert src in code_paths()


def test_readable_paths_inside_another_are_bound_with_it():
    """A code path inside another (a checkout and its src/) is bound once, with its parent."""
    from multiminddev.env.isolation import outermost

    paths = [Path("/tmp/co/src"), Path("/tmp/co"), Path("/opt/venv"), Path("/tmp/co/src"),
             Path("/tmp/col")]
    assert outermost(paths) == ["/tmp/co", "/opt/venv", "/tmp/col"]


PRIVATE_NETWORK_PROBE = r"""
import json, socket, sys
from multiminddev.env.isolation import enter_private_network, network_interfaces
outside_port = int(sys.argv[1])
entered = enter_private_network()
server = socket.create_server(("127.0.0.1", 0))
inside = socket.create_connection(server.getsockname(), timeout=5)
try:
    socket.create_connection(("127.0.0.1", outside_port), timeout=5)
    outside = "reached"
except OSError as exc:
    outside = type(exc).__name__
print(json.dumps({"entered": entered, "interfaces": network_interfaces(), "outside": outside}))
"""


def test_a_private_network_has_a_working_loopback_and_reaches_nothing_outside():
    """What the profiler's launcher enters: a loopback that is up (ncu and its target talk over
    it) and no way to the host's own loopback services (a listener of this test's process)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as outside:
        done = subprocess.run([sys.executable, "-c", PRIVATE_NETWORK_PROBE,
                               str(outside.getsockname()[1])],
                              capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0 and "Operation not permitted" in done.stderr:
        pytest.skip("this machine refuses new network namespaces")
    assert done.returncode == 0, done.stderr[-800:]
    found = json.loads(done.stdout)
    assert "net" in found["entered"] and found["interfaces"] == ["lo"]
    assert found["outside"] == "ConnectionRefusedError"
