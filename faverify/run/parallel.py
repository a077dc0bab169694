"""The parallel mode of a fuzz: the cases a seed gives are drawn up front (in a thread, while the workers
start), spread over worker processes on one or more devices, and each distinct failure is then shrunk by
replaying the same draw up to it. Cases depend on the seed only, not on the number of workers or GPUs.
A JIT-compiled subject first runs its warm-up cases, so each compiled variant compiles once.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from hypothesis.errors import Flaky

from faverify.cases.case import Case
from faverify.reports.case_result import CaseResult, skipped_for_memory
from faverify.reports.collector import Failure, KernelStats, Roots
from faverify.run.draw import replayable, stream_cases
from faverify.run.isolation import Task
from faverify.run.plan import Evaluate, FuzzPlan, Interesting, Shrinker, seed_only
from faverify.run.scheduler import Pool, cores
from faverify.run.warmup import warm_up


def shrink_by_replay(plan: FuzzPlan, index: int, first: CaseResult, signature: str, evaluate: Evaluate):
    """Hypothesis draws the plan's sequence again, skips to case `index` (known to fail with `signature`)
    and shrinks from there. Returns (minimal result, evaluations spent, note)."""
    shrinker = Shrinker(plan, signature, first, evaluate)
    state = {"calls": 0, "armed": False}

    def interesting(case: Case) -> bool:
        if state["armed"]:
            return shrinker.still_fails(case)
        state["calls"] += 1
        if state["calls"] <= index:
            return False
        state["armed"] = True
        return case == first.case  # the replayed draw reaches the same failing case

    def body(case: Case) -> None:
        if interesting(case):
            raise Interesting(signature)

    test = replayable(plan, body)
    note = ""
    try:
        with seed_only():
            test()
        note = "not shrunk: drawing the sequence again did not reach the failing case"
    except Interesting:
        pass
    except Flaky:
        note = "flaky: the shrunk case did not fail again when replayed"
    return shrinker.best, shrinker.steps, note


def fuzz_parallel(kernel: str, plan: FuzzPlan, pool, stats: KernelStats,
                  progress: Callable[[CaseResult], None] = lambda r: None, warmup: list = (),
                  keep: int | None = None, key: Callable[[Case], tuple] | None = None) -> KernelStats:
    """warmup: the subject's warm-up (warmup.Warmup, or its cases). keep: workers per device after the
    warm-up (the pool may have started more, to compile on every core). key: the subject's compile key
    (Subject.compile_key): each configuration's cases go to the worker that compiled it (scheduler.Affinity)."""
    start = time.perf_counter()
    timing: dict = {}
    drawn = stream_cases(plan, timing)  # drawing while the warm-up compiles
    every = plan.gradcheck_every
    first: dict = {}  # signature -> (index, result) of the first case that showed it

    def found_order(item) -> tuple:
        """The order the cases were drawn in, then the tensors' order within one case: the workers return
        cases in the order they finish, so the insertion order of `first` is not the drawing's."""
        signature, (index, result) = item
        return index, result.signatures.index(signature)

    held: dict = {}  # index -> the skip of a case skipped for memory beside other workers
    together: dict = {}  # index -> the signatures a failing case showed together (collector.Roots)

    def task(index: int, case: Case) -> Task:
        return Task(case, every > 0 and index % every == 0)

    def record(index: int, result: CaseResult, hold: bool = False) -> None:
        if hold and skipped_for_memory(result):
            held[index] = result
            return
        held.pop(index, None)
        stats.add(result)
        progress(result)
        if result.signatures:
            together[index] = result.signatures
        for s in result.signatures:
            if s not in first or index < first[s][0]:
                first[s] = (index, result)

    shrinking = False
    shrunk: dict = {}  # signature -> (minimal, steps, note)
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
        shrinking = True
        roots = _roots(plan, together)
        pending = [(sig, index, found) for sig, (index, found) in sorted(first.items(), key=found_order)
                   if sig in roots.started and roots.primary(sig)]
        if pending:
            shrink_all(plan, pending, pool.workers[:min(MAX_PARALLEL_SHRINKS, max(1, cores() // 2))], shrunk)
    finally:
        for i in sorted(held):  # interrupted before they ran again: their first verdict
            stats.add(held[i])
        # in the order the failures were found; interrupted: those not shrunk are reported as found
        note = "not shrunk: the run was interrupted" + (" while shrinking" if shrinking else "")
        ordered = sorted(first.items(), key=found_order)
        roots = _roots(plan, together)
        for signature, (index, found) in ordered:
            if signature not in roots.started or not roots.primary(signature):
                continue  # a companion: reported with its root
            minimal, steps, why = shrunk.get(signature, (found, 0, note))
            stats.failures.append(Failure(kernel=kernel, signature=signature, first=found, minimal=minimal,
                                          shrink_steps=steps, note=why, companions=roots.companions(signature)))
        stats.seconds += time.perf_counter() - start
        stats.phases["draw"] += timing.get("draw", 0.0)
    return stats


def _roots(plan: FuzzPlan, together: dict) -> Roots:
    """The roots of the failing cases' signatures (collector.Roots), met in drawing order."""
    roots = Roots(plan.all_failures)
    for index in sorted(together):
        roots.add(together[index])
    return roots


# Distinct failures shrunk at once, each on a worker of its own: at most the pool's workers and half the
# cores. It pays only with cores to spare: on the 2-core CPU machine, three workers shrinking 4 failures
# at once took 10.8 s against 7.0 s one after another.
MAX_PARALLEL_SHRINKS = 64


def shrink_all(plan: FuzzPlan, pending: list, workers: list, shrunk: dict) -> None:
    """Shrink each distinct failure (signature, index, first result) at the same time, each in a thread
    with a worker of its own: a subject with several defects spent most of a 10000-case run shrinking them
    one after another (Hypothesis runs tests from several threads since 6.136). shrunk[signature] =
    (minimal, steps, note) as each ends. On an interrupt the running shrinks stop at their next step and
    are left out of `shrunk`."""

    if not pending:
        return
    free: queue.Queue = queue.Queue()
    for w in workers:
        free.put(w)
    stopped = threading.Event()

    def shrink(signature: str, index: int, found: CaseResult) -> None:
        worker = free.get()
        try:
            def evaluate(case: Case, gradcheck: bool) -> CaseResult:
                if stopped.is_set():  # not failing: Hypothesis ends the shrink at once
                    return CaseResult(found.kernel, case, "skip", "interrupted")
                return worker.evaluate(case, gradcheck)

            result = shrink_by_replay(plan, index, found, signature, evaluate)
            if not stopped.is_set():
                shrunk[signature] = result
        finally:
            free.put(worker)

    executor = ThreadPoolExecutor(max_workers=min(len(pending), len(workers)), thread_name_prefix="faverify-shrink")
    futures = [executor.submit(shrink, *p) for p in pending]
    try:
        for f in futures:
            f.result()
    finally:
        stopped.set()
        executor.shutdown(wait=False, cancel_futures=True)
