"""The seeded draw: the cases a plan gives, the same on any machine and for any number of workers. Drawn at
once (draw_cases), as they come (stream_cases, while the workers evaluate), or replayed up to a failing case to
shrink it from there (parallel.shrink_by_replay, through replayable). The shape budget's pool is a draw of the
same plan without a budget (budget_pool).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Callable

from hypothesis import Phase, given, seed

from faverify.cases.case import Case
from faverify.cases.strategies import shape_pool
from faverify.run.plan import FuzzPlan, hypothesis_settings, seed_only

# The draw and its replay must use the very same settings: Hypothesis's choices depend on max_examples.
REPLAYABLE = (Phase.generate, Phase.shrink)


def replayable(plan: FuzzPlan, body: Callable[[Case], None]):
    """The plan's seeded Hypothesis test around body: the draw and every replay of it are built here."""
    return hypothesis_settings(examples=plan.iters, database=None, phases=REPLAYABLE)(
        seed(plan.seed)(given(plan.strategy())(body)))


def _draw(plan: FuzzPlan, keep: Callable[[Case], None]) -> None:
    with seed_only():
        replayable(plan, keep)()


def draw_cases(plan: FuzzPlan) -> list:
    """The cases a seed gives, without evaluating any: the same list for the same plan, on any machine."""
    drawn: list = []

    def keep(case: Case) -> None:
        drawn.append(case)

    _draw(plan, keep)
    return drawn[:plan.iters]


def stream_cases(plan: FuzzPlan, timing: dict | None = None):
    """draw_cases as they come: Hypothesis draws in a thread of its own (about 1.5 ms a case, 15 s for
    10000) while the workers already evaluate the first ones, or compile during a warm-up. The same
    cases in the same order. If the consumer stops early (an interrupt) the draw stops at its next case:
    left drawing, it would hold the interpreter's lock while the run stops its workers and writes.
    timing["draw"]: the drawing thread's CPU seconds so far."""

    q: queue.Queue = queue.Queue()
    done, stopped = object(), threading.Event()
    timing = {} if timing is None else timing

    def keep(case: Case) -> None:
        if stopped.is_set():
            raise _Abandoned  # a BaseException: Hypothesis lets it through at once, without shrinking
        timing["draw"] = time.thread_time() - timing["start"]
        q.put(case)

    def draw() -> None:
        timing["start"] = time.thread_time()
        try:
            _draw(plan, keep)
            q.put(done)
        except _Abandoned:
            pass
        except BaseException as e:  # handed to the consumer
            q.put(e)

    threading.Thread(target=draw, name="faverify-draw", daemon=True).start()
    try:
        for _ in range(plan.iters):
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stopped.set()


class _Abandoned(BaseException):
    """Ends a draw nobody reads any more."""


def budget_pool(plan: FuzzPlan) -> tuple:
    """The shape budget's pool for a kernel's plan: plan.shapes distinct shapes of the seed's draw without a
    budget (strategies.shape_pool), the same for every shard and worker. The draw is 10 cases a shape: a
    few milliseconds each."""
    drawn = draw_cases(dataclasses.replace(plan, iters=10 * plan.shapes + 20, shapes=0, shard=None))
    return shape_pool(drawn, plan.shapes)
