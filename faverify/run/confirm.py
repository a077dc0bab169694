"""A reproducer is printed only once it was seen to fail.

Each failure a fuzz found is replayed before it is reported: its minimal case alone, in a fresh worker
process, with the settings its reproducer line carries (mode, tolerance, gradient check, repeats, timeout),
as `faverify repro` runs it. A case that fails there has a reproducer; one that passes failed only after
earlier calls in the same worker (state a kernel carried from one call into the next), and the report says
so instead of printing a line that would pass.
"""
from __future__ import annotations

from faverify.judge.verdict import DEFAULT_ATOL, DEFAULT_FACTOR, DEFAULT_TIGHT, Tolerance
from faverify.reports.collector import REPLAY_FAILED, REPLAY_PASSED, Failure
from faverify.run.isolation import Worker

DEFAULT_TIMEOUT = 300.0  # faverify repro's own --timeout
# what the report says of a failure whose minimal case passed alone
PASSED_ALONE = ("its minimal case passed when replayed by itself in a fresh process: it fails only after "
                "earlier calls in the same process")


def repro_flags(signature: str, mode: str, tolerance: Tolerance, timeout: float, repeat: int) -> tuple:
    """The options of `faverify repro` that replay a failure of this signature under the run's settings."""
    flags: list = []
    if mode != "both":
        flags += ["--mode", mode]
    for option, values, defaults in (("--factor", tolerance.factor, DEFAULT_FACTOR),
                                     ("--atol", tolerance.atol, DEFAULT_ATOL),
                                     ("--tight", tolerance.tight, DEFAULT_TIGHT)):
        changed = [f"{t}={values[t]:g}" for t in defaults if values.get(t, defaults[t]) != defaults[t]]
        if changed:
            flags += [option, ",".join(changed)]
    if signature.startswith("gradcheck"):
        flags.append("--gradcheck")
    if repeat > 1:
        flags += ["--repeat", str(repeat)]
    if timeout != DEFAULT_TIMEOUT:
        flags += ["--timeout", f"{timeout:g}"]
    return tuple(flags)


def confirm(failures: list, kernel: str, device, *, mode: str, tolerance: Tolerance, timeout: float,
            repeat: int) -> None:
    """Set each failure's flags, and replay it: Failure.replayed and replay_reason. A KeyboardInterrupt
    stops the replays; those not done stay not replayed, and it propagates."""
    for f in failures:
        f.flags = repro_flags(f.signature, mode, tolerance, timeout, repeat)
    for f in failures:
        result = replay(f, kernel, device, mode=mode, tolerance=tolerance, timeout=timeout, repeat=repeat)
        f.replayed = REPLAY_FAILED if result.failed else REPLAY_PASSED
        f.replay_reason = result.reason if result.failed else PASSED_ALONE


def replay(f: Failure, kernel: str, device, *, mode: str, tolerance: Tolerance, timeout: float, repeat: int):
    """The failure's minimal case in a fresh worker, as its reproducer runs it."""
    worker = Worker(kernel, str(device), mode, tolerance.to_dict(), timeout, repeat)
    try:
        return worker.evaluate(f.minimal.case, f.signature.startswith("gradcheck"))
    finally:
        worker.stop()


def unconfirmed(failures: list, why: str) -> None:
    """Failures left without a replay (the run was interrupted first): their flags still set by the caller."""
    for f in failures:
        if not f.replayed:
            f.replay_reason = why
