"""Crash isolation: subjects run in worker processes.

A worker is a process (processes.start) that resolves one subject and evaluates cases on one device. A
CUDA fault poisons the process's CUDA context and may kill it; a kernel may hang. Either way the parent records the
case as a failure (status "crash" or "timeout", with the case), and the next case runs in a fresh worker.
The run goes on.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing.connection import wait
from typing import Callable, NamedTuple

import torch

from faverify.cases import golden_files
from faverify.cases.case import Case
from faverify.errors import EnvironmentProblem, UsageError
from faverify.reports.case_result import CaseResult, failure, own_error
from faverify.run import processes
from faverify.run.evaluate import evaluate, exercise
from faverify.run.guard import blame_lost_context
from faverify.run.plan import Judging
from faverify.run.scheduler import POLL_SECONDS, cores
from faverify.subjects import resolve

STARTUP_SECONDS = 120.0  # importing torch and initializing CUDA happen once per worker, not per case
# faverify's own time on a case after the subject returned (the FP64 reference, the metrics, a gradient check),
# beside the subject's --timeout: past it the case is faverify's error, never the kernel's timeout
JUDGING_SECONDS = 600.0
# the cases a worker remembers having run, for a failure that passes alone (confirm.earlier_calls)
HISTORY = 64


class Task(NamedTuple):
    """One case for a worker. golden: (directory, golden_files.Entry), a stored case judged against its
    file's reference; warm: run only for what it compiles (parallel.warm_up), unjudged."""
    case: Case
    gradcheck: bool = False
    golden: tuple | None = None
    warm: bool = False


def _serve(conn, kernel: str, device: str, judging: dict, threads: int = 0) -> None:
    """The worker process: its own process group and orphans, then _work until told to stop; when its parent
    is gone (a stop while it started, a killed run) it leaves quietly, since nobody reads what it would say.
    The worker has this one's environment (TRITON_INTERPRET among it): processes.start.
    threads: torch's CPU threads in this worker (0: torch's default, one a core)."""
    try:  # a process group of its own: what the subject starts ends with the worker (Worker.stop)
        os.setpgid(0, 0)
    except OSError:
        pass
    processes.adopt_orphans()  # and what leaves the group (a setsid daemon) stays the worker's to end
    if threads:
        torch.set_num_threads(threads)
    # The parent stops the workers itself (a worker leads a process group of its own, out of the terminal's
    # reach). So a KeyboardInterrupt raised in here is the subject's own doing, and evaluate reports it
    # as its failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _work(conn, kernel, device, Judging.from_dict(judging))
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return
    finally:  # what the subject started ends with the worker, daemons that left its process group too
        processes.end_descendants(os.getpid())


def _work(conn, kernel: str, device: str, judging: Judging) -> None:
    """The worker's loop: (case, gradcheck, golden) in, CaseResult dict out, until None or a poisoned
    context. It changes nothing of its process, so a test can run it in its own."""
    try:
        subject = resolve(kernel)
        conn.send(("ready", None))
    except BaseException as e:  # a subject that cannot load: told to the parent, which reports it
        # a missing toolchain (EnvironmentProblem) or a module that will not import (UsageError) is no crash
        # of the kernel: the run stops with exit 2, as it would had this process failed to load it
        stops = isinstance(e, (EnvironmentProblem, UsageError))
        conn.send(("environment" if stops else "error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        case_dict, gradcheck, golden, warm = request
        case = Case.from_dict(case_dict)
        try:
            if warm:  # run it only for what it compiles (parallel.warm_up); a failure here is the cases' to find
                result = _warm(subject, case, device, judging.mode)
            else:
                stored = None
                if golden is not None:  # (directory, golden_files.Entry): a stored case, its reference from the file
                    directory, entry = golden
                    stored = golden_files.load(directory, entry, device)
                result = evaluate(subject, case, device, mode=judging.mode, tolerance=judging.tolerance,
                                  gradcheck=gradcheck, stored=stored, in_worker=True, repeat=judging.repeat,
                                  measure=judging.measure, tell=lambda phase: conn.send((phase, None)))
        except BaseException as e:  # faverify's own bug while judging: its error, not the subject's failure
            result = own_error(kernel, case, e, device)
        poisoned = blame_lost_context(result)  # the subject's crash, and this process cannot go on
        conn.send(("result", result.to_dict()))
        if poisoned:
            return


def _warm(subject, case: Case, device: str, mode: str) -> CaseResult:
    """The case's calls alone, unjudged, with what they compiled (Subject.compiles)."""
    subject.take()
    try:
        exercise(subject, case, device, mode)
    except Exception as e:  # not judged: the drawn cases that need this variant will fail and report it
        return failure(subject.name, case, "fail", f"warm-up raised {type(e).__name__}: {e}", "warmup", device)
    return CaseResult(subject.name, case, "skip", "warm-up", device=device, compiles=subject.take().compiles)


class Worker:
    """One worker process; started on first use, restarted after a crash or a timeout.

    Starting does not wait: the worker spends seconds importing torch and initializing CUDA, and a pool
    starts all of its workers at once. A case's timeout counts from when its worker is ready."""

    def __init__(self, kernel: str, device: str, judging: Judging, threads: int = 0):
        self.kernel, self.device, self.judging, self.threads = kernel, device, judging, threads
        self.timeout = judging.timeout
        self.process = None
        self.conn = None
        self.ready = False
        self.pending: Case | None = None
        self.returned = False  # the pending case's subject has returned: faverify judges it (JUDGING_SECONDS)
        self.sent_at = 0.0  # when the time the pending case is allowed began (its subject's, or faverify's)
        self.submitted = 0.0  # when the pending case was sent, for its round trip
        self.restarts = 0
        self.history: list = []  # the cases this worker's process ran, oldest first (at most HISTORY)
        self._before: tuple = ()  # the history before the pending case

    def start(self) -> None:
        parent, child = mp.Pipe()
        self.process = processes.start(_serve, (child, self.kernel, self.device, self.judging.to_dict(),
                                                self.threads), daemon=True)
        child.close()
        self.conn, self.ready, self.sent_at = parent, False, time.monotonic()
        self.history = []  # a fresh process carries nothing over

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            processes.end_descendants(self.process.pid)  # while it lives to adopt their orphans
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self.process.join(2)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        if self.process is not None:
            _end_group(self.process.pid)
        self.process = None

    def load(self) -> None:
        """Start this worker, wait until its subject has loaded there or the worker said why it cannot (this
        process then loads it and says so itself), and stop it. A worker that ends before it says either (a
        module that calls libc's _exit or os.abort while it is imported) is a UsageError naming the module,
        as is one that takes past its startup time."""
        module = self.kernel.partition(":")[0]
        limit = STARTUP_SECONDS + self.timeout
        self.start()
        try:
            while time.monotonic() - self.sent_at < limit:
                wait(self.waitables(), timeout=POLL_SECONDS)
                try:
                    if self.conn.poll():
                        self.conn.recv()
                        return
                except (EOFError, OSError):  # the pipe's end: the worker is gone
                    break
                if not self.process.is_alive():
                    break
            else:
                raise UsageError("--kernel", self.kernel, f"importing module {module!r} took more than {limit:g} s")
            self.process.join(5)  # its exit status comes through the forkserver, a moment after the pipe's end
            code = self.process.exitcode
            how = f"killed by signal {-code}, {signal.strsignal(-code)}" if code and code < 0 else f"exit code {code}"
            raise UsageError("--kernel", self.kernel, f"importing module {module!r} ended the process that "
                                                      f"imported it ({how}), so faverify does not import it")
        finally:
            self.stop()

    def submit(self, task: Task) -> None:
        if self.process is None or not self.process.is_alive():
            if self.conn is not None:  # it ran before: this is a fresh worker after a crash or a timeout
                self.restarts += 1
            self.start()
        self._before = tuple(self.history)
        self.history = (self.history + [task.case])[-HISTORY:]
        self.pending, self.returned = task.case, False
        if self.ready:
            self.sent_at = self.submitted = time.monotonic()
        self.conn.send((task.case.to_dict(), task.gradcheck, task.golden, task.warm))

    def collect(self) -> CaseResult | None:
        """The pending case's result if it is ready, a crash/timeout result if it never will be, else None;
        with the cases this process ran before it (CaseResult.history)."""
        result = self._collect()
        if result is not None:
            result.history = self._before
        return result

    def _collect(self) -> CaseResult | None:
        case = self.pending
        try:
            while self.conn.poll():
                kind, payload = self.conn.recv()
                if kind == "ready":
                    self.ready, self.sent_at = True, time.monotonic()
                    self.submitted = self.sent_at
                    continue
                if kind in ("judging", "subject"):  # whose time runs from here: faverify's, or the subject's again
                    self.returned, self.sent_at = kind == "judging", time.monotonic()
                    continue
                self.pending = None
                if kind == "environment":  # this machine cannot run the subject: exit 2, as in this process
                    self.stop()
                    raise EnvironmentProblem(f"{self.kernel} could not load in a worker process: {payload}")
                if kind == "error":  # the subject would not load in the worker
                    self.stop()
                    return failure(self.kernel, case, "crash", f"the worker could not load the subject: {payload}",
                                   "crash", self.device)
                result = CaseResult.from_dict(payload)
                if self.ready and result.seconds:
                    # the round trip less the worker's own time on the case: sending the case, returning
                    # its result (tensors' metrics, not tensors), and this process's turn to collect it
                    result.phases["transfer"] = max(0.0, time.monotonic() - self.submitted - result.seconds)
                if result.status == "crash":
                    self.stop()
                return result
        except (EOFError, OSError):
            pass
        else:
            if self.process.is_alive():
                limit = (JUDGING_SECONDS + self.timeout if self.returned else self.timeout if self.ready
                         else STARTUP_SECONDS + self.timeout)
                if time.monotonic() - self.sent_at <= limit:
                    return None
                self.stop()
                self.pending = None
                if self.returned:  # the subject had returned: the time was faverify's, not the kernel's
                    return own_error(self.kernel, case, TimeoutError(
                        f"faverify's judging of the case took more than {limit:g} s after the subject returned"),
                        self.device)
                return failure(self.kernel, case, "timeout", f"the subject gave no result within {self.timeout:g} "
                               "s: the worker was killed and the run went on in a fresh one", "timeout", self.device)
        if self.process is not None:
            # a forked worker's exit status comes through its server (processes.py), which may tell it a
            # moment after the pipe's end: a segfault read as exit code None before the wait
            self.process.join(5)
        code = self.process.exitcode if self.process is not None else None
        self.stop()
        self.pending = None
        return failure(self.kernel, case, "crash", f"the worker process died (exit code {code}) while running "
                       "this case", "crash", self.device)

    def waitables(self) -> list:
        return [self.conn, self.process.sentinel]

    def evaluate(self, case: Case, gradcheck: bool = False, golden: tuple | None = None) -> CaseResult:
        self.submit(Task(case, gradcheck, golden))
        while True:
            wait(self.waitables(), timeout=POLL_SECONDS)
            result = self.collect()
            if result is not None:
                return result


def in_process(subject, device, judging: Judging) -> Callable[[Case, bool], CaseResult]:
    """Evaluate cases in this process (--no-isolate), as a Worker would: faverify's own error on a case is that
    case's result, and each result carries the cases this process ran before it."""
    name = subject.name
    history: list = []  # the cases this process ran, as a worker keeps them (isolation.Worker.history)
    lost: list = []  # the case on which this process's CUDA context was lost: nothing after it can run here

    def evaluate_here(case: Case, gradcheck: bool) -> CaseResult:
        if lost:
            return CaseResult(name, case, "skip", "not run: this process's CUDA context was lost on an earlier "
                              "case (" + lost[0].short() + "); without --no-isolate each case after a crash "
                              "runs in a fresh worker", device=str(device))
        try:
            result = evaluate(subject, case, device, mode=judging.mode, tolerance=judging.tolerance,
                                   gradcheck=gradcheck, repeat=judging.repeat, measure=judging.measure)
        except Exception as e:  # faverify's own bug: this case's error, and the run goes on
            result = own_error(name, case, e, str(device))
        if blame_lost_context(result):
            lost.append(case)
        result.history = tuple(history)
        history[:] = (history + [case])[-HISTORY:]
        return result
    return evaluate_here


def _end_group(pid: int) -> None:
    """Kill what is left of a worker's process group: processes the subject started, which would otherwise
    outlive the run and hold its output open (a `| cat` after it waits for them)."""
    try:
        if os.getpgid(pid) == pid:  # still its own group's leader, or gone (ProcessLookupError below)
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            os.killpg(pid, signal.SIGKILL)  # the leader has exited; its group may live on in its children
        except (ProcessLookupError, PermissionError, OSError):
            pass


def case_workers(kernel: str, devices: list, per_device: int, judging: Judging) -> list:
    """`per_device` workers of one subject on each device, in device order (scheduler.Pool's lane), sharing
    the cores (thread_share)."""
    threads = thread_share(per_device * len(devices))
    return [Worker(kernel, str(d), judging, threads) for d in devices
            for _ in range(per_device)]


def thread_share(workers: int) -> int:
    """torch's CPU threads for each of `workers` processes that run at once: the cores split among them.
    Each worker's torch would take a thread a core, and workers that outnumber the cores then fight over
    them: on the 2-core CPU two sdpa-math workers spent 215 ms a case on the FP64 reference against 8 for
    one worker. OMP_NUM_THREADS, where set, caps the share."""
    share = max(1, cores() // max(1, workers))
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(cap)) if cap.isdigit() and int(cap) > 0 else share


def check_imports(kernels: str, timeout: float) -> None:
    """Import each package.module:function subject of `kernels` first in a worker (Worker.load), before this
    process does: a module that ends its process while it is imported then ends the worker, and is named,
    rather than ending faverify with its exit status (0: a pass for nothing)."""
    for name in dict.fromkeys(n.strip() for n in kernels.split(",")):
        if ":" in name and not name.startswith("mutant:"):
            Worker(name, "cpu", Judging(mode="fwd", timeout=timeout)).load()
