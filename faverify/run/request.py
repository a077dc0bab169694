"""What a fuzz runs, once its options are checked (commands.fuzz.prepare): FuzzRun."""
from __future__ import annotations

from dataclasses import dataclass

from faverify.run.plan import FuzzPlan, Judging


@dataclass(frozen=True)
class FuzzRun:
    """command: the command line, for the run file and the report's heading. plan: what every subject draws
    (each subject narrows it to what it takes). subjects: the Subjects, in the order they run. devices: torch
    devices; workers: processes per device; isolate: in worker processes (False: in this one). judging: how
    each case is judged. features: what every subject draws, None for each its own."""
    command: str
    plan: FuzzPlan
    subjects: tuple
    devices: tuple
    workers: int
    isolate: bool
    judging: Judging
    features: tuple | None
