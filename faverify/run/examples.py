"""The example store (`fuzz --db DIR`): the minimal cases of the failures a fuzz found, one file per
kernel, replayed first by the next run as a phase of its own.

The seeded draw never reads the store: the same --seed gives the same cases whatever it holds, so two
runs of one kernel in one directory (the base and the head of a pull request) are comparable. Replayed
cases are reported apart and kept out of the error statistics; a replayed case that fails is a failure
of the run (listed with its note when the draw did not find it too); one that passes leaves the store.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from pathlib import Path

from faverify.cases.case import Case
from faverify.errors import EnvironmentProblem
from faverify.files import Unreadable, describe, read_bounded, replace_whole
from faverify.reports.collector import Failure, KernelStats
from faverify.streams import say

MAX_KEPT = 64  # per kernel: the newest failures; a store is a reminder, not an archive


def _file(directory: Path, kernel: str) -> Path:
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel)[:60]
    return Path(directory) / f"{readable}-{hashlib.sha256(kernel.encode()).hexdigest()[:8]}.jsonl"


def load(directory: Path | None, kernel: str) -> list:
    """The stored cases of `kernel`; a line that is not a valid case (a store from another faverify, a line
    written by hand) is passed over."""
    if directory is None:
        return []
    try:
        lines = read_bounded(_file(directory, kernel)).decode().splitlines()
    except (Unreadable, UnicodeDecodeError):
        return []
    return list(dict.fromkeys(_cases(lines)))


def _cases(lines: list) -> list:
    cases = []
    for line in lines:
        try:
            cases.append(Case.from_json(line))
        except ValueError:  # UsageError, and what a line too deep or too long to be a case raises
            continue
    return cases


def save(directory: Path | None, kernel: str, cases: list, passed: list = ()) -> None:
    """Store these cases for `kernel`, newest last, at most MAX_KEPT, beside those another run stored in the
    meantime, less the ones this run replayed and saw pass (`passed`); none left removes the file. Under a
    lock on the store, so runs sharing it keep each other's cases; written to a temporary file and renamed,
    never through a link planted at the file's name."""
    if directory is None:
        return
    path = _file(directory, kernel)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(Path(directory)):
            kept = [c for c in load(directory, kernel) if c not in set(passed)]
            cases = list(dict.fromkeys(kept + list(cases)))[-MAX_KEPT:]
            if not cases:
                path.unlink(missing_ok=True)
                return
            text = "".join(json.dumps(c.to_dict(), sort_keys=True) + "\n" for c in cases)
            replace_whole(path, text)
    except (OSError, EnvironmentProblem) as e:  # the run's results matter more than the reminder: say so
        why = describe(e) if isinstance(e, OSError) else e
        say(f"faverify: the example store {directory} could not be written ({why})")


def replay(kernel: str, cases: list, evaluate, stats: KernelStats) -> None:
    """The store's cases for this kernel, each once, before the seeded draw and apart from it: their results
    count in stats.replay, not in the run's cases or statistics."""
    for case in cases:
        result = evaluate(case, False)
        stats.replay["cases"] += 1
        if result.failed:
            stats.replay["failed"] += 1
            stats.still_failing.append(case)
            for signature in result.signatures:
                stats.replay["signatures"][signature] = stats.replay["signatures"].get(signature, 0) + 1
                stats.replayed_failures.append(Failure(kernel=kernel, signature=signature, first=result,
                                                       minimal=result, note="replayed from the example store"))


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive lock on the store (a lock file beside the kernels' files), held while one run reads and
    writes it."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
