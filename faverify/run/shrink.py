"""Shrinking a failure to its minimal case: a Shrinker tells whether a smaller case still fails the same way
within the plan's budget. The sequential mode shrinks as Hypothesis draws (sequential.py); the parallel mode
shrinks each failure after the draw, replaying the seed's draw up to it (shrink_by_replay), every failure at
once on workers of its own (shrink_all).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hypothesis.errors import Flaky

from faverify.cases.case import Case
from faverify.reports.case_result import CaseResult
from faverify.run.draw import replayable
from faverify.run.plan import Evaluate, FuzzPlan, seed_only
from faverify.run.scheduler import cores


class Interesting(Exception):
    """Raised inside the Hypothesis test for the failure being found or shrunk."""


class Shrinker:
    """One shrink step: is this smaller case still failing with the same signature? Past the budget
    (evaluations or seconds) nothing new is evaluated and only the best case found replays, so Hypothesis
    ends its shrink on it."""

    def __init__(self, plan: FuzzPlan, signature: str, first: CaseResult, evaluate: Evaluate):
        self.plan, self.signature, self.first, self.best, self.evaluate = plan, signature, first, first, evaluate
        self.steps, self.t0 = 0, time.perf_counter()

    def still_fails(self, case: Case) -> bool:
        if case == self.best.case:
            return True
        if self.steps >= self.plan.shrink_budget or time.perf_counter() - self.t0 > self.plan.shrink_seconds:
            return False
        self.steps += 1
        r = self.evaluate(case, self.signature == "gradcheck")
        if self.signature in r.signatures:
            self.best = r
            return True
        return False


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


# Distinct failures shrunk at once, each on a worker of its own: at most the pool's workers and half the
# cores. It pays only with cores to spare: on the 2-core CPU machine, three workers shrinking 4 failures
# at once took 10.8 s against 7.0 s one after another.
MAX_PARALLEL_SHRINKS = 64


def shrink_all(plan: FuzzPlan, pending: list, workers: list, shrunk: dict) -> None:
    """Shrink each distinct failure (signature, index, first result) at the same time, each in a thread
    with a worker of its own (of MAX_PARALLEL_SHRINKS workers at most): a subject with several defects spent
    most of a 10000-case run shrinking them one after another (Hypothesis runs tests from several threads
    since 6.136). shrunk[signature] = (minimal, steps, note) as each ends. On an interrupt the running shrinks
    stop at their next step and are left out of `shrunk`."""

    if not pending:
        return
    workers = workers[:min(MAX_PARALLEL_SHRINKS, max(1, cores() // 2))]
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
