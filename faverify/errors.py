"""Errors the command line turns into exit codes (docs/design.md): usage/environment errors exit 2; and the
form any message from outside faverify takes before it is written or printed (printable)."""
from __future__ import annotations

import re


class UsageError(ValueError):
    """Bad input from the user: names the argument, its value and the rule. Exit code 2."""

    def __init__(self, argument: str, value: object, rule: str):
        self.argument, self.value, self.rule = argument, value, rule
        super().__init__(f"{argument}={value!r}: {rule}")


class EnvironmentProblem(RuntimeError):
    """The machine cannot do what was asked (no GPU, no nvcc, nothing ran). Exit code 2."""


class Unsupported(NotImplementedError):
    """A subject cannot run this case: counted as skipped with the reason, never as a pass."""


class OwnError(RuntimeError):
    """faverify's own code failed (a bug in faverify, never the subject's): exit code 2, in one line."""


# The longest message faverify writes or prints whole: an exception's text past it is cut, so a kernel that
# raises with 50 MB of text makes a run file of its usual size.
MESSAGE_CHARS = 2000
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text, limit: int | None = MESSAGE_CHARS) -> str:
    """Text that came from outside faverify (an exception's message, a run file's string) as faverify writes
    and prints it: each control character but the newline shown as its escape (a terminal would act on an
    escape sequence or a carriage return, a bidirectional override reorders what is read), and at most
    `limit` characters (None: any), the last of them saying how long it was. Printable text is its own
    printable form."""
    text = str(text)
    head = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text[:limit])
    if limit is None or (len(text) <= limit and len(head) <= limit):
        return head
    cut = f"... (cut from {len(text)} characters)"
    return head[:max(0, limit - len(cut))] + cut[:limit]
