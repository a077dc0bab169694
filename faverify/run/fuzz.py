"""A fuzz run over one or more subjects: for each, the mode that fits (sequential.py with one worker,
parallel.py with several), the worker pool, and the Run document they make together.
"""
from __future__ import annotations

from typing import Callable

from faverify import devices
from faverify import env as environment
from faverify.cases.case import Case
from faverify.cases.edges import listed
from faverify.reports.case_result import CaseResult, own_error
from faverify.reports.collector import Failure, KernelStats
from faverify.reports.results import Run
from faverify.run import examples, warmup
from faverify.run.confirm import confirm, unconfirmed
from faverify.run.evaluate import evaluate as evaluate_case
from faverify.run.guard import blame_lost_context
from faverify.run.isolation import HISTORY, case_workers
from faverify.run.parallel import fuzz_parallel
from faverify.run.plan import FuzzPlan, Judging
from faverify.run.request import FuzzRun
from faverify.run.scheduler import Pool, cores
from faverify.run.sequential import fuzz_subject
from faverify.run.signals import held, requested, stop_if_requested

__all__ = ["FuzzPlan", "run"]


def run(fuzz: FuzzRun, progress_factory: Callable[[str], Callable[[CaseResult], None]] = lambda name: (lambda r: None)):
    """Fuzz each subject in turn; returns the Run document. progress_factory(name): the function each of the
    subject's results is given, as it comes.

    Several workers (FuzzRun.parallel) run the parallel mode, one the sequential mode; isolate=False evaluates
    in this process (one device, sequential), for speed where no subject can crash the process.
    KeyboardInterrupt (and SIGTERM, turned into one by the CLI) stops the run early: what was measured
    so far is still returned, so nothing the user asked to write is lost.
    """
    devices, judging, parallel = fuzz.devices, fuzz.judging, fuzz.parallel
    all_stats, interrupted = [], False
    for subject in fuzz.subjects:
        name, plan = subject.name, subject.plan
        stats = KernelStats(kernel=name, conventions=subject.conventions,
                            keep_series=plan.shard is not None,  # merge.py recomputes statistics from them
                            edges_listed=() if plan.scale == "large" else tuple(listed(plan.case_args()["features"])),
                            shapes=plan.shapes)
        all_stats.append(stats)
        pool, stored, warm = None, [], None
        declared = subject.compile_key
        try:
            # the Triton builds compile across the cores in a process of their own from now on (warmup.py)
            warm = warmup.start(subject, devices[0], judging.mode)
            if fuzz.isolate:
                # a warm-up in the workers compiles on every core (one worker each), then the run keeps `workers`
                per_device = fuzz.workers if parallel else 1
                many = parallel and (warm.cases or declared is not None)
                pool = Pool(case_workers(name, devices, max(per_device, cores() // len(devices)) if many
                                         else per_device, judging))
            evaluate = (pool.workers[0].evaluate if pool is not None
                        else _in_process(subject.subject, devices[0], judging))
            stored = examples.load(plan.database, name)
            replay(name, stored, evaluate, stats)
            progress = _stopping(progress_factory(name))
            if parallel:
                key = (lambda case, f=declared, kind=devices[0].type: f(case, kind)) if declared else None
                fuzz_parallel(name, plan, pool, stats, progress, warm, keep=fuzz.workers, key=key)
            else:
                warm.compiled(stats)  # one worker: it meets each build as it goes, loading what was compiled
                fuzz_subject(name, plan, evaluate, stats, progress)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            # held: an interrupt while the workers stop must not lose what they measured
            with held() as late:
                if warm is not None:
                    warm.stop()
                if pool is not None:
                    stats.restarts = pool.restarts
                    pool.close()
                stats.merge_replayed()
            interrupted = interrupted or bool(late) or requested()
        interrupted = _confirmed(stats, name, devices[0], interrupted, judging)
        with held() as late:
            examples.save(plan.database, name, stats.still_failing + [f.minimal.case for f in stats.failures],
                          passed=[c for c in stored[:stats.replay["cases"]] if c not in stats.still_failing])
        interrupted = interrupted or bool(late)
        if interrupted:
            break
    with held() as late:  # the same while the results are put together
        return _document(fuzz, all_stats, interrupted or bool(late))


def _in_process(subject, device, judging: Judging) -> Callable[[Case, bool], CaseResult]:
    """Evaluate cases in this process (--no-isolate): faverify's own error on a case is that case's result."""
    name = subject.name
    history: list = []  # the cases this process ran, as a worker keeps them (isolation.Worker.history)
    lost: list = []  # the case on which this process's CUDA context was lost: nothing after it can run here

    def evaluate(case: Case, gradcheck: bool) -> CaseResult:
        if lost:
            return CaseResult(name, case, "skip", "not run: this process's CUDA context was lost on an earlier "
                              "case (" + lost[0].short() + "); without --no-isolate each case after a crash "
                              "runs in a fresh worker", device=str(device))
        try:
            result = evaluate_case(subject, case, device, mode=judging.mode, tolerance=judging.tolerance,
                                   gradcheck=gradcheck, repeat=judging.repeat, measure=judging.measure)
        except Exception as e:  # faverify's own bug: this case's error, and the run goes on
            result = own_error(name, case, e, str(device))
        if blame_lost_context(result):
            lost.append(case)
        result.history = tuple(history)
        history[:] = (history + [case])[-HISTORY:]
        return result
    return evaluate


def _stopping(progress: Callable[[CaseResult], None]) -> Callable[[CaseResult], None]:
    """The progress callback, then the stop a signal asked for if its KeyboardInterrupt was lost."""
    def after_each_case(result: CaseResult) -> None:
        progress(result)
        stop_if_requested()
    return after_each_case


def _confirmed(stats: KernelStats, name: str, device, interrupted: bool, judging: Judging) -> bool:
    """Replay each failure alone before it is reported (confirm.py); an interrupt stops the replays, and
    the failures not replayed say so. Returns whether the run was interrupted."""
    for f in stats.failures:
        f.flags = judging.flags(f.signature)
    if not interrupted:
        try:
            confirm(stats.failures, name, _replay_device(device), judging)
        except KeyboardInterrupt:
            interrupted = True
    unconfirmed(stats.failures, "not replayed: the run was interrupted first")
    return interrupted


def _replay_device(device):
    """The device a reproducer line names resolves to: its type alone is printed (`--device cuda`)."""
    return devices.resolve(device.type)[0]


def replay(kernel: str, cases: list, evaluate, stats: KernelStats) -> None:
    """The example store's cases for this kernel (examples.py), each once, before the seeded draw and
    apart from it: their results count in stats.replay, not in the run's cases or statistics."""
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


def _document(fuzz: FuzzRun, all_stats: list, interrupted: bool) -> Run:
    plan = fuzz.plan
    settings_doc = {"kernels": ",".join(s.name for s in fuzz.subjects), "iters": plan.iters, "seed": plan.seed,
                    "dtypes": ",".join(plan.dtypes), "mode": fuzz.judging.mode,
                    "devices": ",".join(str(d) for d in fuzz.devices),
                    "workers_per_device": fuzz.workers if fuzz.parallel else 1, "isolated": fuzz.isolate,
                    "max_seqlen": plan.limits.max_seqlen, "gradcheck_every": plan.gradcheck_every,
                    "interrupted": interrupted}
    if plan.shard is not None:
        settings_doc["shard"] = f"{plan.shard[0]}/{plan.shard[1]}"
    if plan.shapes:
        settings_doc["shapes"] = plan.shapes
    if plan.sequence:
        settings_doc["sequence"] = plan.sequence
    return Run.from_stats(fuzz.command, environment.collect(), settings_doc, fuzz.judging.tolerance.to_dict(),
                          all_stats)
