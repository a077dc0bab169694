"""Stopping a run cleanly: SIGTERM (a CI timeout, `timeout`) stops it like Ctrl-C, and a signal that lands
while the results are being put together or written waits until they are whole.

A signal is a KeyboardInterrupt raised wherever the main thread is. While workers are still measuring,
that is what the user wants: the run stops and reports what it has. Once they are done, the same
interrupt in the middle of stopping the workers or writing the JSON would lose every result; there it
is held instead.
"""
from __future__ import annotations

import contextlib
import signal
import threading

STOPS = (signal.SIGTERM, signal.SIGHUP)  # a CI job's timeout; a closed terminal or SSH session


@contextlib.contextmanager
def sigterm_interrupts():
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    with _handlers({s: interrupt for s in STOPS}):
        yield


@contextlib.contextmanager
def held():
    """Within the block SIGINT and SIGTERM are recorded, not raised; yields the list of those received
    (empty if none), so the caller can mark its results as interrupted."""
    received: list = []
    with _handlers({s: (lambda signum, frame: received.append(signum)) for s in (signal.SIGINT,) + STOPS}):
        yield received


@contextlib.contextmanager
def _handlers(handlers: dict):
    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
        yield
        return
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
