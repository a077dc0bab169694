"""The example store (`fuzz --db DIR`): the minimal cases of the failures a fuzz found, one file per
kernel, replayed first by the next run as a phase of its own.

The seeded draw never reads the store: the same --seed gives the same cases whatever it holds, so two
runs of one kernel in one directory (the base and the head of a pull request) are comparable. Replayed
cases are reported apart and kept out of the error statistics; a replayed case that fails is a failure
of the run (listed with its note when the draw did not find it too); one that passes leaves the store.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from faverify.case import Case

MAX_KEPT = 64  # per kernel: the newest failures; a store is a reminder, not an archive


def _file(directory: Path, kernel: str) -> Path:
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", kernel)[:60]
    return Path(directory) / f"{readable}-{hashlib.sha256(kernel.encode()).hexdigest()[:8]}.jsonl"


def load(directory: Path | None, kernel: str) -> list:
    """The stored cases of `kernel`; a line that is not a valid case (a store from another faverify) is
    passed over."""
    if directory is None:
        return []
    try:
        lines = _file(directory, kernel).read_text().splitlines()
    except OSError:
        return []
    cases = []
    for line in lines:
        try:
            cases.append(Case.from_json(line))
        except ValueError:
            continue
    return list(dict.fromkeys(cases))


def save(directory: Path | None, kernel: str, cases: list) -> None:
    """Replace `kernel`'s stored cases by these (newest last, at most MAX_KEPT); none removes the file."""
    if directory is None:
        return
    path = _file(directory, kernel)
    cases = list(dict.fromkeys(cases))[-MAX_KEPT:]
    try:
        if not cases:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(c.to_dict(), sort_keys=True) + "\n" for c in cases))
    except OSError as e:  # the run's results matter more than the reminder: say so, lose nothing else
        print(f"faverify: the example store {directory} could not be written ({e.strerror or e})",
              file=sys.stderr)
