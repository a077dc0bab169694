"""Starting worker processes, forked from a server that has imported torch once, and ending what a worker
started.

A spawned process imports torch afresh, 2-3 s of CPU, and a run starts one per worker, one after every crash
or timeout, and one per mutant. multiprocessing's forkserver imports the modules below once, in a server
process started on first use, and forks each worker from it. The server never touches CUDA (importing torch
does not initialize it), so each forked worker initializes its own context as a spawned one would.

A forked worker inherits the server's environment, fixed when the server started; `start` hands it this
process's environment at the time of the call instead, applied before the target runs, so a variable set
since (a test's, a command's) reaches the worker as it would a spawned one. Variables that a preloaded
module reads at import are the exception, which is why only torch and numpy are preloaded: TRITON_INTERPRET,
read when a kernel is decorated, stays the worker's own.

A worker adopts the orphans of what its subject starts (adopt_orphans): a daemon that double-forked into a
session of its own is out of reach of the worker's process group, and it would hold the forkserver's and
the resource tracker's pipes open, keeping them alive after the run. Adopted, it is one of the worker's
descendants, and end_descendants ends it with the worker.
"""
from __future__ import annotations

import multiprocessing as mp
import os

PRELOAD = ["torch", "numpy"]


def context():
    if "forkserver" not in mp.get_all_start_methods():  # Windows has spawn alone
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start(target, args: tuple, daemon: bool | None = None):
    """target(*args) in a new process with this process's current environment; returns the started Process.
    Connections among args travel as in any multiprocessing start (the server passes their descriptors)."""
    process = context().Process(target=_with_environment, args=(dict(os.environ), target, *args), daemon=daemon)
    process.start()
    return process


def _with_environment(environment: dict, target, *args) -> None:
    os.environ.clear()
    os.environ.update(environment)
    target(*args)


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def adopt_orphans() -> None:
    """Make this process the subreaper of what it starts (Linux): a process it started that leaves its
    parent (a double fork, a `setsid` daemon) becomes this process's child rather than init's, so
    end_descendants still finds it. Elsewhere, or where the call is refused, nothing changes."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants(pid: int) -> list:
    """The living processes below `pid` (children, theirs, ...), read from /proc; [] where there is none."""
    parents: dict = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold anything
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":  # a zombie is dead already; its parent has not reaped it
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def end_descendants(pid: int, rounds: int = 20) -> None:
    """SIGKILL every process below `pid`, again until none is left (each round's orphans come back to `pid`
    where it adopts them, adopt_orphans), at most `rounds` times."""
    import signal
    import time
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            return
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)  # a killed process takes a moment to die and give its children to `pid`
