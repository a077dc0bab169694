"""What a command prints: its report on stdout, its progress and warnings on stderr.

A stream that cannot be written (closed, a pipe whose reader has left as `| head -n 1` does, a full disk
as `2>/dev/full`) loses what it was given and nothing else: the write is dropped, the stream is pointed at
/dev/null for what follows (the interpreter's last flush included, which would otherwise exit 120), and
the command's outputs and exit code stay what its checks made them. Nothing here raises.
"""
from __future__ import annotations

import os
import sys


def show(text: str) -> None:
    """A line (or lines) of the command's report, to stdout. A report that cannot be written, but for a
    reader that left (a pipe into head), is told on stderr."""
    problem = _write("stdout", text)
    if problem is not None and not isinstance(problem, BrokenPipeError):
        say(f"faverify: warning: the report could not be written to stdout ({_why(problem)})")


def say(text: str) -> None:
    """Progress, warnings and errors, to stderr, as they are."""
    _write("stderr", text)


def flush() -> None:
    """Both streams flushed, before the process exits: what cannot be written is dropped."""
    for name in ("stdout", "stderr"):
        _write(name, "", end="")


def _write(name: str, text: str, end: str = "\n") -> BaseException | None:
    """Write and flush; the exception that stopped it, or None."""
    stream = getattr(sys, name)
    if stream is None:  # the descriptor was closed when Python started
        return None
    try:
        try:
            stream.write(text + end)
        except UnicodeEncodeError:  # a terminal that cannot show a character: shown as ?
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write((text + end).encode(encoding, "replace").decode(encoding))
        stream.flush()
    except (OSError, ValueError) as e:  # ValueError: a file object closed under us
        silence(name)
        return e
    return None


def silence(name: str) -> None:
    """The stream's descriptor replaced by /dev/null, so the text still buffered and every later write
    go nowhere without an error; a stream with no descriptor is replaced as an object."""
    stream = getattr(sys, name)
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):
        setattr(sys, name, open(os.devnull, "w"))


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__
