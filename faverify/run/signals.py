"""Stopping a run cleanly: SIGTERM (a CI timeout, `timeout`) stops it like Ctrl-C, and a signal that lands
while the results are being put together or written waits until they are whole.

A signal is a KeyboardInterrupt raised wherever the main thread is. While workers are still measuring,
that is what the user wants: the run stops and reports what it has. Python drops an exception raised
inside a garbage-collector callback or a finalizer (Hypothesis keeps one), so the stop is also recorded:
the run asks `requested()` after each case and stops there if the KeyboardInterrupt was lost. Once they
are done, the same interrupt in the middle of stopping the workers or writing the JSON would lose every result; there it
is held instead.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

STOPS = (signal.SIGTERM, signal.SIGHUP)  # a CI job's timeout; a closed terminal or SSH session
_requested = threading.Event()  # a stop signal arrived in sigterm_interrupts' block
_early: list = []  # the stops that arrived before it, while the command was still importing (record_early)


def record_early() -> None:
    """From now until sigterm_interrupts, SIGTERM and SIGHUP are recorded, not fatal: a stop while a fuzz
    is still importing torch then ends it as a stop in its first moment does, with its run written."""
    if threading.current_thread() is threading.main_thread():
        for s in STOPS:
            signal.signal(s, lambda signum, frame: _early.append(signum))


@contextlib.contextmanager
def stops_interrupt(received: list):
    """Around a whole command: SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does, so the blocks that
    stop its worker processes run on any stop (a signal's default action would end this process and leave
    them); each is appended to `received`. A stop whose handler is already set is left to it: fuzz records
    one that comes while it imports (record_early), nohup ignores SIGHUP."""
    def interrupt(signum, frame):
        received.append(signum)
        raise KeyboardInterrupt
    with _handlers({s: interrupt for s in STOPS if signal.getsignal(s) == signal.SIG_DFL}):
        yield


@contextlib.contextmanager
def sigterm_interrupts():
    """Within the block, SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does; each of the three is
    also recorded (requested)."""
    def interrupt(signum, frame):
        _requested.set()
        raise KeyboardInterrupt

    def unraisable(report):  # the stop's KeyboardInterrupt, dropped where Python cannot raise it: recorded
        if not (isinstance(report.exc_value, KeyboardInterrupt) and _requested.is_set()):
            previous(report)
    _requested.clear()
    previous, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        with _handlers({s: interrupt for s in (signal.SIGINT,) + STOPS}):
            yield
    finally:
        sys.unraisablehook = previous


def stop_if_early() -> None:
    """Raise the KeyboardInterrupt of a stop that came while the command was importing (record_early)."""
    if _early:
        _early.clear()
        _requested.set()
        raise KeyboardInterrupt


def requested() -> bool:
    """Whether a stop arrived in sigterm_interrupts' block, whether or not its KeyboardInterrupt got
    through."""
    return _requested.is_set()


def stop_if_requested() -> None:
    """Raise the KeyboardInterrupt of a stop that was recorded, in the main thread (a lost one's second
    chance)."""
    if _requested.is_set() and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt


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
