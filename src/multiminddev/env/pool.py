"""A pool of evaluation workers that replaces any worker that faults, hangs or dies.

One *slot* per concurrent evaluation (default: ``default_slot_count``). A slot owns the worker
running its current job plus ``spare_workers`` started ahead of time, so after a fault (or
after every job, with the default ``max_jobs_per_worker=1``) the next job finds a warm
process. The parent enforces every stage's time limit by polling the pipe and SIGKILLing the
worker; the pool and the evaluator never die with it.

Messages that only trusted code sends (``TRUSTED_TAGS``: reference outputs, the checked
timed calls' expected outputs, baselines) are accepted only before the candidate's compile
stage begins; one arriving later came from the candidate's process: it is recorded
(``JobOutcome.late_trusted``), never used, and the job ends there.

Every frame from a worker is decoded as plain data only, and must come in the harness's order
(``env/messages.py``: ``recv_message``, ``JobProtocol``): the process that runs candidate code
writes the pipe, so any other frame is refused unread; the job ends there and the worker is
replaced.

Each GPU has a ``TimingGate`` shared by the pools given the same gates (an evaluator's candidate
pool and its baseline pool). A trusted baseline timing holds it (("gate", "acquire") ...
("gate", "release")); a candidate's job asks for it before its candidate is imported and keeps
it until the job ends: a release sent once the candidate loaded is ignored. So no baseline is
ever timed on a GPU while candidate code can run on it, and no two timings share a GPU. The
parent grants and takes back the gate, so a worker that dies or hangs holding it cannot keep it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import stat
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiminddev.env.candidate import receive_frames
from multiminddev.env.config import CANDIDATE_STAGES, EvalConfig, Stage, StartMethod
from multiminddev.env.messages import FrameStalled, JobProtocol, MessageRefused, recv_message

_log = logging.getLogger(__name__)
# Imported once by the forkserver, so every worker starts with them: no worker reads this code
# from disk while a run goes on (a tree rewritten under a long run would stop workers from
# starting), and torch._dynamo's operator registrations (it registers dozens when first
# imported, as the profiler does on first use) are in place before the dispatcher snapshot that
# candidate code is judged against. None of them initialises CUDA.
FORKSERVER_PRELOAD = ("torch", "torch._dynamo", "multiminddev.env.worker",
                      "multiminddev.env.stages", "multiminddev.env.guards",
                      "multiminddev.env.timed_checks", "multiminddev.env.precision",
                      "multiminddev.env.registry_guard", "multiminddev.env.isolation",
                      "multiminddev.env.sandbox")
# Sent by the worker's trusted stages (setup, baseline) before the candidate is imported.
TRUSTED_TAGS = frozenset({"reference", "timed_reference", "ground_truth", "reference_layouts",
                          "baseline"})
# ``before_send(job, worker_info) -> job``: completes a job once its worker is known (e.g. with
# that GPU's cached baselines); ``worker_info`` is the worker's start-up ("ready") payload.
BeforeSend = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


@dataclass
class JobOutcome:
    """Everything a worker said about one job, plus what the pool saw (death, timeout)."""

    messages: dict[str, Any] = field(default_factory=dict)  # tag -> payload (last wins)
    failure: dict[str, Any] | None = None  # the worker's ("fail", ...) payload
    timed_out_stage: str | None = None
    died_in_stage: str | None = None
    exitcode: int | None = None
    worker_restarted: bool = False
    infra_error: str = ""
    hang_stack: str = ""  # the worker's Python stack when it ran past its time limit
    device: str = ""
    gpu: bool = False
    stages_seconds: dict[str, float] = field(default_factory=dict)
    # Seconds this job waited in the parent: "slot" (for a free slot), "worker" (for its worker
    # to be ready), "gate" (for the GPU's timing gate, inside a stage).
    waits: dict[str, float] = field(default_factory=dict)
    # The worker's own start-up steps (its "ready" payload): paid while it waited as a spare,
    # on this job's clock only as far as waits["worker"] says.
    worker_startup: dict[str, float] = field(default_factory=dict)
    late_trusted: list[str] = field(default_factory=list)  # trusted tags sent after the candidate loaded
    # A frame that was not a plain-data (tag, payload) message (env/messages.py): where, and why.
    refused_message: str = ""
    refused_after_load: bool = False


class TimingGate:
    """One GPU's right to time: held by at most one job at a time and granted in the order it
    was asked for (thread-safe; any thread may release it). First come, first served: with a
    plain lock a job that had just released it could take it back before a job already waiting
    woke up, so back-to-back candidate jobs could keep a prefetching baseline job out until it
    gave up and timed ungated (figures that are not kept, so every candidate then measured its
    own baselines)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held = False
        self._waiting: deque[object] = deque()

    def acquire(self, timeout_s: float) -> bool:
        ticket = object()
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._changed:
            self._waiting.append(ticket)
            while self._held or self._waiting[0] is not ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._waiting.remove(ticket)
                    self._changed.notify_all()  # the next in line may be first now
                    return False
                self._changed.wait(left)
            self._waiting.popleft()
            self._held = True
            return True

    def release(self) -> None:
        with self._changed:
            if not self._held:
                raise RuntimeError("release of a timing gate that is not held")
            self._held = False
            self._changed.notify_all()


GATE_MARGIN_S = 5.0  # a gate wait leaves the stage at least this long to time in
# A message whose first bytes came before its stage's deadline may take this much longer to
# arrive whole (its tensor frames included); a worker that stops mid-frame is then timed out.
FRAME_GRACE_S = 10.0
REAP_GRACE_S = 15.0  # how long a worker asked to stop may take to exit before it is killed


class WorkerHandle:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, device_index: int | None, config: dict[str, Any]):
        from multiminddev.env.worker import worker_main

        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_main, args=(child, device_index, config),
                                   name=f"mmd-eval-worker-{device_index}", daemon=False)
        self.started_at = time.monotonic()
        self.process.start()
        child.close()
        self.info: dict[str, Any] | None = None
        self.jobs_done = 0
        self.reaper: threading.Thread | None = None  # set by stop_soon
        self.startup_error = ""

    def wait_ready(self, timeout_s: float) -> bool:
        if self.info is not None:
            return True
        deadline = self.started_at + timeout_s
        try:
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                self.startup_error = f"worker did not start within {timeout_s:.0f} s"
                return False
            tag, payload = recv_message(self.conn)
        except (EOFError, OSError):
            self.process.join(1.0)
            self.startup_error = f"worker exited during startup (exit code {self.process.exitcode})"
            return False
        except MessageRefused as exc:
            self.startup_error = f"worker sent a message outside the protocol at startup: {exc}"
            return False
        if tag != "ready":
            self.startup_error = f"worker failed to start: {payload.get('message', tag)}"
            return False
        self.info = payload
        return True

    def stack_at_hang(self) -> str:
        """Ask the worker (SIGUSR1 -> faulthandler) where it is stuck; '' if it cannot say."""
        path = (self.info or {}).get("stack_dump")
        if not path or path == "None" or not self.process.is_alive():
            return ""
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 1.0
            text = ""
            while time.monotonic() < deadline:
                time.sleep(0.05)
                text = _read_worker_file_tail(Path(path), 4000)
                if text.strip():
                    break
            return text
        except OSError:
            return ""

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        path = (self.info or {}).get("stack_dump")
        if path and path != "None":
            with contextlib.suppress(OSError):
                os.unlink(path)

    def stop(self) -> None:
        """Ask politely (None on the pipe), then kill if it lingers."""
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.process.join(1.0)
        self.kill()

    def stop_soon(self) -> None:
        """``stop`` without waiting: ask now, reap in the background. A worker's exit (its
        interpreter and CUDA context torn down) takes a fraction of a second that the slot's
        next job need not wait for."""
        with contextlib.suppress(Exception):
            self.conn.send(None)
        # the reaper alone waits on the process: two threads waiting on one forkserver child
        # race for its exit status, and the loser records 255
        self.reaper = threading.Thread(target=self._reap, name="mmd-eval-reap", daemon=True)
        self.reaper.start()

    def _reap(self) -> None:
        # the caller does not wait for this: a worker asked to stop gets time to tear down its
        # interpreter and CUDA context even on a loaded machine before it is killed
        self.process.join(REAP_GRACE_S)
        self.kill()


class Slot:
    def __init__(self, pool: WorkerPool, device_index: int | None):
        self.pool = pool
        self.device_index = device_index
        self.idle: deque[WorkerHandle] = deque()
        self.lock = threading.Lock()

    def take(self) -> WorkerHandle:
        with self.lock:
            worker = self.idle.popleft() if self.idle else self.pool.start_worker(self.device_index)
            self.refill_locked()
        return worker

    def refill_locked(self) -> None:
        while len(self.idle) < max(1, self.pool.spare_workers) and not self.pool.closed:
            self.idle.append(self.pool.start_worker(self.device_index))

    def give_back(self, worker: WorkerHandle) -> None:
        with self.lock:
            self.idle.appendleft(worker)

    def close(self) -> None:
        with self.lock:
            while self.idle:
                self.idle.popleft().stop()


# Evaluation slots per GPU when EvalConfig.num_workers is None. With the timing gate a second
# slot runs its job's trusted stages (worker start, reference setup, cached baselines) while
# the first slot's candidate holds the gate, so the GPU is not idle between candidates; the
# candidates themselves still run one at a time. Without the gate one slot: two candidates
# on a GPU would time each other.
SLOTS_PER_GPU_WITH_GATE = 2


def default_slot_count(gpus: int, timing_gate: bool) -> int:
    """Evaluation slots when none are asked for: SLOTS_PER_GPU_WITH_GATE per GPU with the
    timing gate, one per GPU without it, one where there is no GPU."""
    if gpus <= 0:
        return 1
    return gpus * (SLOTS_PER_GPU_WITH_GATE if timing_gate else 1)


class WorkerPool:
    """``run(job) -> JobOutcome`` on a free slot; thread-safe; replaces faulted workers."""

    def __init__(self, config: EvalConfig, gates: dict[int, TimingGate] | None = None):
        self.config = config
        self.closed = False
        self._config_dict = config.to_dict()
        method = config.start_method
        if method is StartMethod.FORKSERVER and "forkserver" not in multiprocessing.get_all_start_methods():
            method = StartMethod.SPAWN
        self._ctx = multiprocessing.get_context(method.value)
        if method is StartMethod.FORKSERVER:
            # The server imports torch once; each worker is a fork of it (CUDA never initialised
            # before the fork), so a fresh worker costs a fork plus CUDA context creation.
            self._ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        devices = visible_gpu_count()
        self.gpu_count = devices
        self.spare_workers = (config.spare_workers if config.spare_workers is not None
                              else (3 if devices else 1))
        n = config.num_workers or default_slot_count(devices, config.timing_gate)
        self.slots = [Slot(self, (i % devices) if devices else None) for i in range(n)]
        # One gate per GPU, shared with the pools given the same dict (None: this pool's own).
        self.gates = gates if gates is not None else {}
        if config.timing_gate:
            for i in range(devices):
                self.gates.setdefault(i, TimingGate())
        self._free: queue.Queue[Slot] = queue.Queue()
        for slot in self.slots:
            self._free.put(slot)
        self.restarts = 0
        # Idle workers block on their pipe; multiprocessing's own exit handler would join them
        # forever. This runs first (atexit is LIFO) for evaluators that were never closed.
        atexit.register(_close_at_exit, weakref.ref(self))

    def start(self) -> None:
        """Start every slot's workers now (otherwise they start on first use)."""
        for slot in self.slots:
            with slot.lock:
                slot.refill_locked()

    def start_worker(self, device_index: int | None) -> WorkerHandle:
        with _main_script_hidden():
            return WorkerHandle(self._ctx, device_index, self._config_dict)

    @property
    def size(self) -> int:
        return len(self.slots)

    def run(self, job: dict[str, Any], before_send: BeforeSend | None = None) -> JobOutcome:
        if self.closed:
            return JobOutcome(infra_error="the evaluator is closed")
        waited = time.monotonic()
        slot = self._free.get()
        waited = time.monotonic() - waited
        try:
            outcome = self._run_on_slot(slot, job, before_send)
            outcome.waits["slot"] = waited
            return outcome
        finally:
            self._free.put(slot)

    def _run_on_slot(self, slot: Slot, job: dict[str, Any],
                     before_send: BeforeSend | None = None) -> JobOutcome:
        ready_start = time.monotonic()
        worker = slot.take()
        if not worker.wait_ready(self.config.startup_timeout_s):
            error = worker.startup_error
            worker.kill()
            worker = slot.take()  # one retry with a fresh process
            if not worker.wait_ready(self.config.startup_timeout_s):
                worker.kill()
                return JobOutcome(infra_error=f"{error}; retry: {worker.startup_error}")
        outcome = JobOutcome(device=str(worker.info.get("device", "")), gpu=bool(worker.info.get("gpu")))
        outcome.waits["worker"] = time.monotonic() - ready_start
        startup = worker.info.get("startup")
        if isinstance(startup, dict):
            outcome.worker_startup = {str(k): float(v) for k, v in startup.items()
                                      if isinstance(v, (int, float))}
        if before_send is not None:
            job = before_send(job, dict(worker.info))
        gate = self.gates.get(slot.device_index) if outcome.gpu else None
        job = {**job, "timing_gate": gate is not None}
        try:
            worker.conn.send(job)
            self._collect(worker, outcome, job, gate)
        except (OSError, EOFError, BrokenPipeError) as exc:
            outcome.died_in_stage = outcome.died_in_stage or "send"
            outcome.infra_error = outcome.infra_error or f"pipe to worker failed: {exc}"
        last = self._last_job(worker)
        worker.jobs_done += 1
        faulted = bool(outcome.timed_out_stage or outcome.died_in_stage or outcome.refused_message
                       or (outcome.failure or {}).get("fatal"))
        if faulted:
            outcome.worker_restarted = True
            self.restarts += 1
            # A faulting candidate's CUDA warnings (e.g. "illegal memory access (~CUDAEvent)")
            # reach the shared stderr unattributed: this line, with its time and pid, says whose.
            reason = (f"timed out in {outcome.timed_out_stage}" if outcome.timed_out_stage
                      else f"died in {outcome.died_in_stage}" if outcome.died_in_stage
                      else "sent a message outside the protocol" if outcome.refused_message
                      else "a fatal CUDA error")
            _log.warning("%s eval worker pid %s (%s) %s on %s; replaced",
                         time.strftime("%H:%M:%S", time.gmtime()), worker.process.pid,
                         outcome.device or "cpu", reason,
                         (job.get("problem") or {}).get("name") or "a candidate")
        if faulted or last:
            if faulted or not worker.process.is_alive():  # killed before the gate passed on
                worker.kill()
            else:
                worker.stop_soon()
        else:
            slot.give_back(worker)
        return outcome

    def _collect(self, worker: WorkerHandle, outcome: JobOutcome, job: dict[str, Any],
                 gate: TimingGate | None = None) -> None:
        """Read messages until done/fail; enforce each stage's time limit by killing; grant
        and take back the timing gate (whatever happens, the job does not keep it).

        A worker that held the gate with candidate code loaded, in its last job, is killed
        before the gate passes on: candidate code could otherwise go on launching GPU work
        after its job (a finalizer, a library's exit handler, a kernel still spinning) beside
        the next job's timing. Killing skips its interpreter's teardown, where such code runs."""
        held: list[bool] = [False]
        loaded: list[bool] = [False]
        try:
            self._collect_messages(worker, outcome, job, gate, held, loaded)
        finally:
            if held[0] and gate is not None:
                if loaded[0] and self._last_job(worker):
                    killed_at = time.monotonic()
                    worker.kill()  # returns once the process, and so its CUDA context, is gone
                    outcome.stages_seconds["teardown"] = time.monotonic() - killed_at
                gate.release()

    def _last_job(self, worker: WorkerHandle) -> bool:
        """Whether the job the worker is running is its last (then it is stopped)."""
        return worker.jobs_done + 1 >= self.config.max_jobs_per_worker or self.closed

    def _collect_messages(self, worker: WorkerHandle, outcome: JobOutcome, job: dict[str, Any],
                          gate: TimingGate | None, held: list[bool], loaded: list[bool]) -> None:
        """``job["compile_timeout_s"]`` (load_inline builds in the worker) overrides the compile
        limit and extends the cap on all candidate stages by the same amount. Time spent waiting
        for the gate does not count against the stage."""
        cfg = self.config
        compile_limit = float(job.get("compile_timeout_s") or cfg.compile_timeout_s)
        extra = max(0.0, compile_limit - cfg.compile_timeout_s)
        stage = Stage.SETUP
        stage_start = time.monotonic()
        candidate_start: float | None = None
        protocol = JobProtocol()
        while True:
            now = time.monotonic()
            limit = compile_limit if stage is Stage.COMPILE else cfg.stage_timeout(stage)
            deadline = stage_start + limit
            if candidate_start is not None and stage in CANDIDATE_STAGES:
                deadline = min(deadline, candidate_start + cfg.timeout_s + extra)
            try:
                message = None
                if worker.conn.poll(max(0.0, deadline - now)):
                    # A message begun in time may finish a little late, never much later.
                    frames_deadline = max(deadline, time.monotonic() + FRAME_GRACE_S)
                    message = recv_message(worker.conn, frames_deadline)
                    if message[0] in TRUSTED_TAGS and candidate_start is not None:
                        outcome.late_trusted.append(message[0])
                        worker.kill()
                        outcome.exitcode = worker.process.exitcode
                        return
                    protocol.admit(*message)
                    if isinstance(message[1], dict):  # the tensors a message announces
                        receive_frames(worker.conn, message[1], frames_deadline)
            except FrameStalled:
                message = None
            except (EOFError, OSError, RuntimeError):  # RuntimeError: no descriptor came
                worker.process.join(2.0)
                outcome.died_in_stage = stage.value
                outcome.exitcode = worker.process.exitcode
                return
            except MessageRefused as exc:
                # Nothing after it can be trusted to be the harness's: end the job, replace the
                # worker. After the candidate loaded, only its code can have written the frame.
                outcome.refused_message = f"{stage.value}: {exc}"
                outcome.refused_after_load = candidate_start is not None
                worker.kill()
                outcome.exitcode = worker.process.exitcode
                return
            if message is None:
                outcome.timed_out_stage = stage.value
                outcome.hang_stack = worker.stack_at_hang()
                worker.kill()
                outcome.exitcode = worker.process.exitcode
                return
            tag, payload = message
            if tag == "gate":
                waited = self._answer_gate(worker, gate, held, payload,
                                           deadline - time.monotonic() - GATE_MARGIN_S,
                                           candidate_loaded=candidate_start is not None)
                stage_start += waited
                if candidate_start is not None:
                    candidate_start += waited
                outcome.waits["gate"] = outcome.waits.get("gate", 0.0) + waited
                continue
            if tag == "begin":
                outcome.stages_seconds[stage.value] = time.monotonic() - stage_start
                stage, stage_start = Stage(payload), time.monotonic()
                if stage is Stage.COMPILE:
                    candidate_start = stage_start
                    loaded[0] = True
                continue
            outcome.messages[tag] = payload
            if tag in ("done", "fail"):
                outcome.stages_seconds[stage.value] = time.monotonic() - stage_start
                if tag == "fail":
                    outcome.failure = payload
                return

    @staticmethod
    def _answer_gate(worker: WorkerHandle, gate: TimingGate | None, held: list[bool],
                     request: Any, wait_s: float, *, candidate_loaded: bool = False) -> float:
        """Grant ("acquire") or take back ("release") the gate; returns the seconds waited.
        Without a gate, or past ``wait_s``, the answer is "open": the worker goes on ungated.
        Once the candidate loaded, a release is ignored (the job keeps the gate to its end) and
        an acquire never waits (a wait would extend the candidate's time limits)."""
        if candidate_loaded:
            wait_s = 0.0
        if request == "release":
            if held[0] and gate is not None and not candidate_loaded:
                gate.release()
                held[0] = False
            return 0.0
        if request != "acquire":
            return 0.0
        start = time.monotonic()
        if gate is not None and not held[0]:
            held[0] = gate.acquire(wait_s)
        waited = time.monotonic() - start
        worker.conn.send(("gate", "granted" if held[0] else "open"))
        return waited

    def close(self) -> None:
        self.closed = True
        for slot in self.slots:
            slot.close()


_MAIN_FILE_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_script_hidden() -> Any:
    """Start processes without the parent's main script: multiprocessing runs a script-run
    ``__main__`` again in each new process (from disk, as ``__mp_main__``), which workers do
    not need (their target is ``worker.worker_main``) and which breaks every later start once
    the script changes or disappears under a long run."""
    import sys

    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or "__file__" not in vars(main):
        yield
        return
    with _MAIN_FILE_LOCK:
        path = main.__dict__.pop("__file__")
        try:
            yield
        finally:
            main.__file__ = path


def _read_worker_file_tail(path: Path, limit: int) -> str:
    """The last ``limit`` characters of a regular file the worker writes. Candidate code in the
    worker may have put something else at that path: a link is not followed (it could name any
    file the evaluator may read), and a FIFO or device is not read (opening one could block the
    evaluator); those read as ''."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        start = max(0, info.st_size - 4 * limit)  # a UTF-8 character is at most 4 bytes
        return os.pread(fd, info.st_size - start, start).decode("utf-8", "replace")[-limit:]
    finally:
        os.close(fd)


def _close_at_exit(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None and not pool.closed:
        pool.close()


def visible_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means "no GPU" here
        return 0
