"""The parallel mode of a fuzz: the cases a seed gives are drawn up front (in a thread, while the workers
start), spread over worker processes on one or more devices, and each distinct failure is then shrunk by
replaying the same draw up to it (shrink.py). Cases depend on the seed only, not on the number of workers or
GPUs. A JIT-compiled subject first runs its warm-up cases, so each compiled variant compiles once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from faverify.cases.case import Case
from faverify.reports.case_result import CaseResult, skipped_for_memory
from faverify.reports.collector import Failure, KernelStats, Roots
from faverify.run.draw import stream_cases
from faverify.run.isolation import Task
from faverify.run.plan import FuzzPlan
from faverify.run.scheduler import Pool
from faverify.run.warmup import warm_up


@dataclass
class Found:
    """The failing cases of a parallel run as the workers return them: for each signature the first case that
    showed it (its index in the draw, its result), and the signatures each failing case showed together
    (collector.Roots). shrunk: signature -> (minimal result, evaluations spent, note), as each shrink ends."""
    all_failures: bool = False
    first: dict = field(default_factory=dict)
    together: dict = field(default_factory=dict)
    shrunk: dict = field(default_factory=dict)
    grouped: bool = False  # the draw ended and the failures were grouped: what an interrupt leaves is unshrunk

    def add(self, index: int, result: CaseResult) -> None:
        if result.signatures:
            self.together[index] = result.signatures
        for s in result.signatures:
            if s not in self.first or index < self.first[s][0]:
                self.first[s] = (index, result)

    def _roots(self) -> tuple:
        """(the roots of the failing cases' signatures, met in drawing order; each root signature with its
        first case, in the order they were found)."""
        roots = Roots(self.all_failures)
        for index in sorted(self.together):
            roots.add(self.together[index])
        # the order the cases were drawn in, then the tensors' order within one case: the workers return
        # cases in the order they finish, so the insertion order of `first` is not the drawing's
        ordered = sorted(self.first.items(), key=lambda item: (item[1][0], item[1][1].signatures.index(item[0])))
        return roots, [(s, i, r) for s, (i, r) in ordered if s in roots.started and roots.primary(s)]

    def group(self) -> list:
        """One failure per root (collector.Roots): (signature, index, first result) of each, to shrink."""
        self.grouped = True
        return self._roots()[1]

    def failures(self, kernel: str) -> list:
        """The failures, in the order they were found, each shrunk or, where an interrupt came first, as
        found; the other signatures of a root's group are its companions."""
        roots, pending = self._roots()
        note = "not shrunk: the run was interrupted" + (" while shrinking" if self.grouped else "")
        return [Failure(kernel=kernel, signature=s, first=found, minimal=minimal, shrink_steps=steps, note=why,
                        companions=roots.companions(s))
                for s, _, found in pending for minimal, steps, why in [self.shrunk.get(s, (found, 0, note))]]


def evaluate_drawn(plan: FuzzPlan, pool, stats: KernelStats, found: Found,
                   progress: Callable[[CaseResult], None] = lambda r: None, warmup: list = (),
                   keep: int | None = None, key: Callable[[Case], tuple] | None = None) -> None:
    """The seed's draw evaluated over the pool's workers, each result in stats and its failures in `found`.
    warmup: the subject's warm-up (warmup.Warmup, or its cases). keep: workers per device after the warm-up
    (the pool may have started more, to compile on every core). key: the subject's compile key
    (Subject.compile_key): each configuration's cases go to the worker that compiled it (scheduler.Affinity)."""
    timing: dict = {}
    drawn = stream_cases(plan, timing)  # drawing while the warm-up compiles
    every = plan.gradcheck_every
    held: dict = {}  # index -> the skip of a case skipped for memory beside other workers

    def task(index: int, case: Case) -> Task:
        return Task(case, every > 0 and index % every == 0)

    def record(index: int, result: CaseResult, hold: bool = False) -> None:
        if hold and skipped_for_memory(result):
            held[index] = result
            return
        held.pop(index, None)
        stats.add(result)
        progress(result)
        found.add(index, result)

    try:
        index, count = plan.shard or (0, 1)
        items = ((i, task(i, c)) for i, c in enumerate(drawn) if i % count == index)
        pool.map(warm_up(pool, warmup, stats, keep, items, key), lambda i, result: record(i, result, hold=True))
        if held:
            # run again on one worker per device, the others idle (they gave back what a case past 2 GiB
            # took: memory.gives_back); a case still too large then is skipped for good
            stats.memory_retried = len(held)
            alone = {w.device: w for w in reversed(pool.workers)}
            Pool(list(alone.values())).map([(i, task(i, held[i].case)) for i in sorted(held)], record)
    finally:
        for i in sorted(held):  # interrupted before they ran again: their first verdict
            stats.add(held[i])
        stats.phases["draw"] += timing.get("draw", 0.0)
