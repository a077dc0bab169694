"""A fuzz run over one or more subjects: for each, the mode that fits (sequential.py with one worker,
parallel.py with several), the worker pool, and the Run document they make together.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from faverify import devices
from faverify import env as environment
from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.edges import listed
from faverify.reports.case_result import CaseResult, own_error
from faverify.reports.collector import Failure, KernelStats
from faverify.reports.results import Run
from faverify.run import examples, warmup
from faverify.run.confirm import confirm, unconfirmed
from faverify.run.draw import budget_pool
from faverify.run.evaluate import evaluate as evaluate_case
from faverify.run.guard import blame_lost_context
from faverify.run.isolation import HISTORY, case_workers
from faverify.run.parallel import fuzz_parallel
from faverify.run.plan import COMPILE_SHAPES, FuzzPlan, Judging
from faverify.run.scheduler import Pool, cores
from faverify.run.sequential import fuzz_subject
from faverify.run.signals import held, requested, stop_if_requested
from faverify.subjects import resolve

__all__ = ["FuzzPlan", "run"]


def run(kernels: list, plan: FuzzPlan, devices: list, *, judging: Judging, command: str,
        workers: int = 1, isolate: bool = True,
        progress_factory: Callable[[str], Callable[[CaseResult], None]] = lambda name: (lambda r: None),
        features: dict | None = None, conventions: dict | None = None,
        narrow_for: dict | None = None, compile_keys: dict | None = None):
    """Fuzz each kernel in turn; returns the Run document.

    features: kernel -> the variant features its cases draw (default: the plan's for every kernel).
    conventions: kernel -> the conventions its subject declares, in words, for the reports.
    narrow_for: kernel -> what every case of it needs (Capabilities.draw: splits for a combine).
    compile_keys: kernel -> its Subject.compile_key, where it declares one: a parallel run sends each
    configuration's cases to one worker.

    workers: processes per device (several: the parallel mode above). isolate=False evaluates in this
    process (one device, sequential), for speed where no subject can crash the process.
    KeyboardInterrupt (and SIGTERM, turned into one by the CLI) stops the run early: what was measured
    so far is still returned, so nothing the user asked to write is lost.
    """
    devices = [torch.device(d) for d in devices]
    # a shard runs its part of the seed's up-front draw: the parallel mode's, even on one worker
    parallel = isolate and (workers * len(devices) > 1 or plan.shard is not None)
    all_stats, interrupted = [], False
    base_plan = plan
    for name in kernels:
        plan = _plan_for(name, base_plan, features, narrow_for, name in (compile_keys or {}))
        stats = KernelStats(kernel=name, conventions=(conventions or {}).get(name, DEFAULT_CONVENTIONS.describe()),
                            keep_series=plan.shard is not None,  # merge.py recomputes statistics from them
                            edges_listed=() if plan.scale == "large" else tuple(listed(plan.case_args()["features"])),
                            shapes=plan.shapes)
        all_stats.append(stats)
        pool, stored, warm = None, [], None
        declared = (compile_keys or {}).get(name)
        try:
            # the Triton builds compile across the cores in a process of their own from now on (warmup.py)
            warm = warmup.start(name, resolve(name), plan, devices[0], judging.mode)
            if isolate:
                # a warm-up in the workers compiles on every core (one worker each), then the run keeps `workers`
                per_device = workers if parallel else 1
                many = parallel and (warm.cases or declared is not None)
                pool = Pool(case_workers(name, devices, max(per_device, cores() // len(devices)) if many
                                         else per_device, judging))
            evaluate = pool.workers[0].evaluate if pool is not None else _in_process(name, devices[0], judging)
            stored = examples.load(plan.database, name)
            replay(name, stored, evaluate, stats)
            progress = _stopping(progress_factory(name))
            if parallel:
                key = (lambda case, f=declared, kind=devices[0].type: f(case, kind)) if declared else None
                fuzz_parallel(name, plan, pool, stats, progress, warm, keep=workers, key=key)
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
        return _document(kernels, base_plan, devices, judging, command, workers, parallel, isolate,
                         all_stats, interrupted, late)


def _plan_for(name: str, base_plan: FuzzPlan, features: dict | None, narrow_for: dict | None,
              compiles: bool = False) -> FuzzPlan:
    """One kernel's plan: its features, what every case of it needs, its shape budget (COMPILE_SHAPES for a
    subject that compiles per configuration, where the run named none)."""
    shapes = base_plan.shapes if base_plan.shapes is not None else COMPILE_SHAPES if compiles else 0
    plan = dataclasses.replace(base_plan, features=(features or {}).get(name, base_plan.features), shapes=shapes)
    if (narrow_for or {}).get(name):
        plan = dataclasses.replace(plan, narrow={**(plan.narrow or {}), **narrow_for[name]})
    if plan.shapes:
        plan = dataclasses.replace(plan, narrow={**(plan.narrow or {}), "shapes": budget_pool(plan)})
    return plan


def _in_process(name: str, device, judging: Judging) -> Callable[[Case, bool], CaseResult]:
    """Evaluate cases in this process (--no-isolate): faverify's own error on a case is that case's result."""
    subject = resolve(name)
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


def _document(kernels, plan, devices, judging, command, workers, parallel, isolate, all_stats,
              interrupted, late):

    settings_doc = {"kernels": ",".join(kernels), "iters": plan.iters, "seed": plan.seed,
                    "dtypes": ",".join(plan.dtypes), "mode": judging.mode, "devices": ",".join(str(d) for d in devices),
                    "workers_per_device": workers if parallel else 1, "isolated": isolate,
                    "max_seqlen": plan.limits.max_seqlen, "gradcheck_every": plan.gradcheck_every,
                    "interrupted": interrupted or bool(late)}
    if plan.shard is not None:
        settings_doc["shard"] = f"{plan.shard[0]}/{plan.shard[1]}"
    if plan.shapes:
        settings_doc["shapes"] = plan.shapes
    if plan.sequence:
        settings_doc["sequence"] = plan.sequence
    return Run.from_stats(command, environment.collect(), settings_doc, judging.tolerance.to_dict(), all_stats)
