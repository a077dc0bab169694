"""Starting worker processes: forked from a server that has imported torch once.

A spawned process imports torch afresh, 2-3 s of CPU, and a run starts one per worker, one after every crash
or timeout, and one per mutant. multiprocessing's forkserver imports the modules below once, in a server
process started on first use, and forks each worker from it. The server never touches CUDA (importing torch
does not initialize it), so each forked worker initializes its own context as a spawned one would.

A forked worker inherits the server's environment, fixed when the server started; `start` hands it this
process's environment at the time of the call instead, applied before the target runs, so a variable set
since (a test's, a command's) reaches the worker as it would a spawned one. Variables that a preloaded
module reads at import are the exception, which is why only torch and numpy are preloaded: TRITON_INTERPRET,
read when a kernel is decorated, stays the worker's own.
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
