"""A reproducer is printed only once it was seen to fail.

Each failure a fuzz found is replayed before it is reported: its minimal case alone, in a fresh worker
process, with the settings its reproducer line carries (mode, tolerance, gradient check, repeats, timeout),
as `faverify repro` runs it. A case that fails there has a reproducer. One that passes failed only after
earlier calls in the same worker: state a kernel carried from one call into the next. Then the cases that
worker ran before the first failing one are replayed before it, in one fresh worker, and cut to the fewest
that still make it fail (earlier_calls); the reproducer replays that call sequence (a case whose `before`
holds the earlier calls).
Where no sequence fails again, the report says so, and prints no line that would pass.
"""
from __future__ import annotations

from dataclasses import replace

from faverify.cases.case import Case
from faverify.cases.checks import MAX_CALLS
from faverify.reports.collector import REPLAY_FAILED, REPLAY_PASSED, Failure
from faverify.run.isolation import Worker
from faverify.run.plan import Judging

# what the report says of a failure whose minimal case passed alone
PASSED_ALONE = ("its minimal case passed when replayed by itself in a fresh process: it fails only after "
                "earlier calls in the same process")


def confirm(failures: list, kernel: str, device, judging: Judging) -> None:
    """Replay each failure: Failure.replayed and replay_reason. A KeyboardInterrupt stops the replays; those
    not done stay not replayed, and it propagates."""
    judging = replace(judging, measure=())  # as the reproducer judges: it measures no relation
    for f in failures:
        _without_needless_calls(f, kernel, device, judging)
        result = replay(f, kernel, device, judging)
        f.replayed = REPLAY_FAILED if result.failed else REPLAY_PASSED
        f.replay_reason = result.reason if result.failed else PASSED_ALONE
        if not result.failed and (f.first.history or f.first.case.before):
            found = earlier_calls(f, kernel, device, judging)
            if found is not None:
                f.sequence = found.to_json()
                f.replayed = REPLAY_FAILED
                f.replay_reason = (f"passes alone; fails after {len(found.before)} earlier call(s) in one process, "
                                   "a state carried from call to call")


def _without_needless_calls(f: Failure, kernel: str, device, judging: Judging) -> None:
    """A minimal case that is a call sequence, made its last call alone where that fails as it did: the
    shrink keeps earlier calls whenever dropping them would change the last call (a sequence draws each
    call from the one before), and a failure that needs none has its smallest input without them."""
    if f.minimal.case.before:
        f.minimal = _failing(replace(f.minimal.case, before=()), f, kernel, device, judging) or f.minimal


def replay(f: Failure, kernel: str, device, judging: Judging):
    """The failure's minimal case in a fresh worker, as its reproducer runs it."""
    worker = Worker(kernel, str(device), judging)
    try:
        return worker.evaluate(f.minimal.case, f.signature.startswith("gradcheck"))
    finally:
        worker.stop()


# how many fresh-worker sequences earlier_calls may run for one failure
SEQUENCE_TRIALS = 24


def _failing(case, f: Failure, kernel: str, device, judging: Judging):
    """`case` (a call sequence) in one fresh worker: its result where it fails as `f` did (its signature, or
    a crash or timeout where it was one), else None."""
    worker = Worker(kernel, str(device), judging)
    try:
        r = worker.evaluate(case, f.signature.startswith("gradcheck"))
    finally:
        worker.stop()
    return r if r.failed and (f.signature in r.signatures or f.signature == r.status) else None


def _fails(case, f: Failure, kernel: str, device, judging: Judging) -> bool:
    return _failing(case, f, kernel, device, judging) is not None


def earlier_calls(f: Failure, kernel: str, device, judging: Judging) -> Case | None:
    """The fewest earlier calls before a failing case that make it fail again in one fresh worker, as a call
    sequence (Case.before): those before the minimal case in its worker first, then those before the first
    failing case (the minimal one, shrunk in a worker that kept state from other cases, may fail after none of
    its own). None where neither history makes its case fail again."""
    seen = []
    for result in (f.minimal, f.first):
        earlier = [c for case in result.history for c in case.before + (replace(case, before=()),)]
        sequence = replace(result.case, before=tuple((earlier + list(result.case.before))[-(MAX_CALLS - 1):]))
        if sequence not in seen:
            seen.append(sequence)
            found = _cut(sequence, f, kernel, device, judging)
            if found is not None:
                return found
    return None


def _cut(sequence: Case, f: Failure, kernel: str, device, judging: Judging) -> Case | None:
    """The sequence with the fewest earlier calls that still fails as f did: cut by halves, then one by one
    (at most SEQUENCE_TRIALS sequences); None where the whole of it passes."""
    earlier, target, trials = list(sequence.before), replace(sequence, before=()), 1

    def fails(cases: list) -> bool:
        nonlocal trials
        trials += 1
        return _fails(replace(target, before=tuple(cases)), f, kernel, device, judging)

    if not _fails(sequence, f, kernel, device, judging):
        return None
    size = max(1, len(earlier) // 2)
    while earlier and trials < SEQUENCE_TRIALS:
        cut = False
        for start in range(0, len(earlier), size):
            kept = earlier[:start] + earlier[start + size:]
            if trials < SEQUENCE_TRIALS and fails(kept):
                earlier, cut = kept, True
                break
        if not cut:
            if size == 1:
                break
            size = max(1, size // 2)
    return replace(target, before=tuple(earlier))


def unconfirmed(failures: list, why: str) -> None:
    """Failures left without a replay (the run was interrupted first)."""
    for f in failures:
        if not f.replayed:
            f.replay_reason = why
