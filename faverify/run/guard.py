"""The subject's code, guarded: whatever it raises, or an exit it attempts, becomes its case's failure with
the message; faverify's own errors pass through."""
from __future__ import annotations

import contextlib

from faverify.errors import Unsupported, printable
from faverify.files import exit_raises


class SubjectExited(Exception):
    """A subject called os._exit: in this process that would end faverify with the subject's exit code."""


class SubjectRaised(Exception):
    """Whatever a subject raised (an Exception, SystemExit, GeneratorExit, a BaseException of its own), carried
    out of its call: its case fails with `name` and the message, and nothing is blamed on faverify."""

    def __init__(self, error: BaseException):
        self.error, self.name = error, printable(type(error).__name__, 200)  # the name is in the signature
        super().__init__(f"{self.name}: {error}")


@contextlib.contextmanager
def subject_code(in_worker: bool, skips: bool = False):
    """Around the subject's own code. What it raises comes out as SubjectRaised, except (with skips, around
    its forward) Unsupported, ValueError and NotImplementedError, its word that a case is not supported, and a
    KeyboardInterrupt in the user's own process (Ctrl-C stops the run; in a worker, which ignores it, the
    subject raised it). While it runs, os._exit raises instead of ending the process: run in this process
    (--no-isolate, repro, golden verify), a kernel's os._exit(0) would end faverify with exit code 0, a pass
    for nothing."""
    try:
        with exit_raises(SubjectExited, "the subject called os._exit({code})"):
            yield
    except (Unsupported, ValueError, NotImplementedError) as e:
        if skips:
            raise
        raise SubjectRaised(e) from e
    except KeyboardInterrupt as e:
        if not in_worker:
            raise
        raise SubjectRaised(e) from e
    except BaseException as e:
        raise SubjectRaised(e) from e


# Messages after which a CUDA context cannot be trusted. A kernel's fault is reported asynchronously, at
# the next call that synchronizes: often faverify's own code after the subject returned (a copy, a
# reduction, a memory query). torch's own ops do not fault on valid tensors, so such an error is the
# subject's whichever code it surfaced in.
POISONED = ("CUDA error", "illegal memory access", "device-side assert", "unspecified launch failure",
            "CUBLAS_STATUS_EXECUTION_FAILED", "misaligned address")


def blame_lost_context(result) -> bool:
    """Whether a case's result (a failure, or faverify's own error) carries a fault of the CUDA context; if
    so it is made the subject's crash, in place: the fault came from the kernel the case ran, wherever it
    surfaced, and the reason keeps where that was."""
    if result.status not in ("fail", "error") or not any(m in result.reason for m in POISONED):
        return False
    where = " in faverify's code after the subject returned" if result.status == "error" else ""
    result.status, result.signatures = "crash", ["crash"]
    result.reason = f"CUDA context lost (the fault surfaced{where}): {result.reason.removeprefix('faverify raised ')}"
    return True
