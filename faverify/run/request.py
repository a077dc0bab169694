"""What a fuzz runs, once its options are checked (commands.fuzz.prepare): FuzzRun, with a SubjectPlan for
each subject."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from faverify.run.draw import budget_pool
from faverify.run.plan import COMPILE_SHAPES, FuzzPlan, Judging
from faverify.run.warmup import warmup_cases
from faverify.subjects.base import Subject


@dataclass(frozen=True)
class SubjectPlan:
    """One subject of a run, looked up once in this process (the workers look it up by name in theirs): the
    Subject and the plan its cases are drawn from (subject_plan)."""
    subject: Subject
    plan: FuzzPlan

    @property
    def name(self) -> str:
        return self.subject.name

    @property
    def conventions(self) -> str:
        """The conventions it declares, in words, for the reports."""
        return self.subject.caps.conventions.describe()

    @property
    def compile_key(self) -> Callable | None:
        """Subject.compile_key: a parallel run sends each configuration's cases to the worker that compiled it."""
        return self.subject.compile_key

    def warmup_cases(self) -> list:
        """Its warm-up cases for the dtypes and features its plan draws, and the gradient check's (warmup.py)."""
        return warmup_cases(self.subject, self.plan.dtypes, tuple(self.plan.case_args()["features"]),
                            self.plan.gradcheck_every > 0)


def subject_plan(subject: Subject, base: FuzzPlan, features: tuple | None = None,
                 needs: dict | None = None) -> SubjectPlan:
    """A subject's plan: the run's, with the features its cases draw (None: the run's), what every case of it
    needs (Capabilities.draw), and its shape budget (COMPILE_SHAPES for a subject that declares its compile
    key, where the run named none), drawn once here."""
    compiles = subject.compile_key is not None
    shapes = base.shapes if base.shapes is not None else COMPILE_SHAPES if compiles else 0
    plan = replace(base, features=base.features if features is None else features, shapes=shapes)
    if needs:
        plan = replace(plan, narrow={**(plan.narrow or {}), **needs})
    if plan.shapes:
        plan = replace(plan, narrow={**(plan.narrow or {}), "shapes": budget_pool(plan)})
    return SubjectPlan(subject, plan)


@dataclass(frozen=True)
class FuzzRun:
    """command: the command line, for the run file and the report's heading. plan: the run's, for its
    settings; subjects: each with its own (SubjectPlan), in the order they run. devices: torch devices;
    workers: processes per device; isolate: in worker processes (False: in this one). judging: how each case
    is judged."""
    command: str
    plan: FuzzPlan
    subjects: tuple
    devices: tuple
    judging: Judging = field(default_factory=Judging)
    workers: int = 1
    isolate: bool = True

    def __post_init__(self):
        object.__setattr__(self, "devices", tuple(torch.device(d) for d in self.devices))

    @property
    def parallel(self) -> bool:
        """Several workers, or a shard, which runs its part of the seed's up-front draw even on one worker."""
        return self.isolate and (self.workers * len(self.devices) > 1 or self.plan.shard is not None)
