"""A fuzz run (request.FuzzRun) over its subjects, one after another, each in the same stages:

1. start: the warm-up (warmup.py) and the workers (isolation.py), or this process (--no-isolate);
2. replay: the example store's cases (examples.py), apart from the seeded draw;
3. draw and evaluate: the seed's cases over the workers (parallel.py), or one worker's, Hypothesis drawing,
   steering and shrinking as it goes (sequential.py);
4. group: the failures, one per root (collector.Roots);
5. shrink: each group's first case, replaying the draw (shrink.py);
6. confirm: each minimal case alone, in a fresh worker (confirm.py);
7. save: the failures' minimal cases into the example store.

Then the Run document. A stop (Ctrl-C, SIGTERM, SIGHUP) ends the stage in progress and skips those that
measure; what keeps what was found (the workers' results, the failures, the store, the document) still runs.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

from faverify import devices
from faverify import env as environment
from faverify.cases.edges import listed
from faverify.reports.case_result import CaseResult
from faverify.reports.collector import KernelStats
from faverify.reports.results import Run
from faverify.run import examples, warmup
from faverify.run.confirm import confirm, unconfirmed
from faverify.run.isolation import case_workers, in_process
from faverify.run.parallel import Found, evaluate_drawn
from faverify.run.request import FuzzRun, SubjectPlan
from faverify.run.scheduler import Pool, cores
from faverify.run.sequential import fuzz_subject
from faverify.run.shrink import shrink_all
from faverify.run.signals import held, requested, stop_if_requested

# progress(name): the function each result of the subject of that name is given, as it comes
Progress = Callable[[str], Callable[[CaseResult], None]]


def quiet(name: str) -> Callable[[CaseResult], None]:
    return lambda result: None


def run(fuzz: FuzzRun, progress: Progress = quiet) -> Run:
    """Each subject through the stages, in turn, until a stop; the Run document of what ran."""
    stop, kernels = Stop(), []
    for subject in fuzz.subjects:
        kernels.append(_stages(fuzz, subject, progress, stop))
        if stop.stopped:
            break
    with stop.holding():  # a signal while the results are put together waits, and marks them interrupted
        return _document(fuzz, kernels, stop.stopped)


@dataclass
class Stop:
    """Whether the run was stopped: a KeyboardInterrupt (a signal turned into one) in a stage, a signal held
    while results were kept, or a stop whose KeyboardInterrupt was lost (signals.requested). The run owns it:
    once set, the stages that measure are skipped."""
    stopped: bool = False

    def stage(self, step: Callable, *args):
        """step(*args), unless the run was stopped: its value, or None."""
        if self.stopped:
            return None
        try:
            return step(*args)
        except KeyboardInterrupt:
            self.stopped = True
            return None

    @contextlib.contextmanager
    def holding(self):
        """Signals wait until the block ends (signals.held), and stop the run."""
        with held() as late:
            yield
        self.stopped = self.stopped or bool(late)


def _stages(fuzz: FuzzRun, subject: SubjectPlan, progress: Progress, stop: Stop) -> KernelStats:
    """One subject's run, stage by stage; its statistics and failures."""
    stats = _new_stats(subject)
    stored = examples.load(subject.plan.database, subject.name)
    found, lane = Found(subject.plan.all_failures), Lane(fuzz, subject)
    try:
        stop.stage(lane.start)
        stop.stage(examples.replay, subject.name, stored, lane.evaluate, stats)
        start = time.perf_counter()
        stop.stage(lane.draw_and_evaluate, stats, found, progress)
        pending = stop.stage(found.group)
        stop.stage(lane.shrink, pending, found)
        stats.seconds += time.perf_counter() - start
    except KeyboardInterrupt:  # between two stages
        stop.stopped = True
    finally:
        with stop.holding():  # a stop while the workers end must not lose what they measured
            lane.stop(stats)
            stats.merge_replayed()
            stats.failures += found.failures(subject.name)
        stop.stopped = stop.stopped or requested()
    for f in stats.failures:
        f.flags = fuzz.judging.flags(f.signature)
    stop.stage(confirm, stats.failures, subject.name, devices.resolve(fuzz.devices[0].type)[0], fuzz.judging)
    unconfirmed(stats.failures, "not replayed: the run was interrupted first")
    with stop.holding():
        examples.save(subject.plan.database, subject.name,
                      stats.still_failing + [f.minimal.case for f in stats.failures],
                      passed=[c for c in stored[:stats.replay["cases"]] if c not in stats.still_failing])
    return stats


class Lane:
    """Where one subject's cases run: its warm-up, its workers or this process, and the mode that draws and
    evaluates them (parallel.py with several workers, sequential.py with one)."""

    def __init__(self, fuzz: FuzzRun, subject: SubjectPlan):
        self.fuzz, self.subject = fuzz, subject
        self.warm, self.pool, self.evaluate = None, None, None

    def start(self) -> None:
        """The warm-up and the workers started: the Triton builds compile across the cores in a process of
        their own from now on (warmup.py); a warm-up in the workers compiles on every core, one worker each,
        and the run then keeps FuzzRun.workers."""
        fuzz, subject = self.fuzz, self.subject
        self.warm = warmup.start(subject, fuzz.devices[0], fuzz.judging.mode)
        if not fuzz.isolate:
            self.evaluate = in_process(subject.subject, fuzz.devices[0], fuzz.judging)
            return
        per_device = fuzz.workers if fuzz.parallel else 1
        many = fuzz.parallel and (self.warm.cases or subject.compile_key is not None)
        self.pool = Pool(case_workers(subject.name, fuzz.devices, max(per_device, cores() // len(fuzz.devices))
                                      if many else per_device, fuzz.judging))
        self.evaluate = self.pool.workers[0].evaluate

    def draw_and_evaluate(self, stats: KernelStats, found: Found, progress: Progress) -> None:
        plan, declared = self.subject.plan, self.subject.compile_key
        progress = _stopping(progress(self.subject.name))
        if self.fuzz.parallel:
            kind = self.fuzz.devices[0].type
            key = (lambda case: declared(case, kind)) if declared else None
            evaluate_drawn(plan, self.pool, stats, found, progress, self.warm, keep=self.fuzz.workers, key=key)
        else:
            self.warm.compiled(stats)  # one worker: it meets each build as it goes, loading what was compiled
            fuzz_subject(self.subject.name, plan, self.evaluate, stats, progress)

    def shrink(self, pending: list, found: Found) -> None:
        """Each group's failure shrunk on the workers, at once (the sequential mode shrank its own)."""
        if pending:
            shrink_all(self.subject.plan, pending, self.pool.workers, found.shrunk)

    def stop(self, stats: KernelStats) -> None:
        if self.warm is not None:
            self.warm.stop()
        if self.pool is not None:
            stats.restarts = self.pool.restarts
            self.pool.close()


def _new_stats(subject: SubjectPlan) -> KernelStats:
    plan = subject.plan
    return KernelStats(kernel=subject.name, conventions=subject.conventions,
                       keep_series=plan.shard is not None,  # merge.py recomputes statistics from them
                       edges_listed=() if plan.scale == "large" else tuple(listed(plan.case_args()["features"])),
                       shapes=plan.shapes)


def _stopping(progress: Callable[[CaseResult], None]) -> Callable[[CaseResult], None]:
    """The progress callback, then the stop a signal asked for if its KeyboardInterrupt was lost."""
    def after_each_case(result: CaseResult) -> None:
        progress(result)
        stop_if_requested()
    return after_each_case


def _document(fuzz: FuzzRun, kernels: list, interrupted: bool) -> Run:
    plan = fuzz.plan
    settings = {"kernels": ",".join(s.name for s in fuzz.subjects), "iters": plan.iters, "seed": plan.seed,
                "dtypes": ",".join(plan.dtypes), "mode": fuzz.judging.mode,
                "devices": ",".join(str(d) for d in fuzz.devices),
                "workers_per_device": fuzz.workers if fuzz.parallel else 1, "isolated": fuzz.isolate,
                "max_seqlen": plan.limits.max_seqlen, "gradcheck_every": plan.gradcheck_every,
                "interrupted": interrupted}
    if plan.shard is not None:
        settings["shard"] = f"{plan.shard[0]}/{plan.shard[1]}"
    if plan.shapes:
        settings["shapes"] = plan.shapes
    if plan.sequence:
        settings["sequence"] = plan.sequence
    return Run.from_stats(fuzz.command, environment.collect(), settings, fuzz.judging.tolerance.to_dict(), kernels)
