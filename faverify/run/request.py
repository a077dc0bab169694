"""What a fuzz runs, once its options are checked (commands.fuzz.prepare): FuzzRun."""
from __future__ import annotations

from dataclasses import dataclass

from faverify.judge.verdict import Tolerance
from faverify.run.plan import FuzzPlan


@dataclass(frozen=True)
class FuzzRun:
    """command: the command line, for the run file and the report's heading. plan: what every subject draws
    (each subject narrows it to what it takes). subjects: the Subjects, in the order they run. devices: torch
    devices; workers: processes per device; isolate: in worker processes (False: in this one). features: what
    every subject draws, None for each its own."""
    command: str
    plan: FuzzPlan
    subjects: tuple
    devices: tuple
    workers: int
    isolate: bool
    mode: str
    tolerance: Tolerance
    timeout: float
    repeat: int
    measure: tuple
    features: tuple | None
