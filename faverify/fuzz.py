"""Drive Hypothesis over one subject: generate cases, steer toward large errors, shrink each distinct
failure once, and keep going until --iters cases have run.

Hypothesis stops at its first failure and shrinks it. A fuzz run should still report all its cases, so
the loop restarts Hypothesis after each shrink with the found signature marked as known: a known
signature is recorded and counted, but no longer stops the run. Distinct failures (per tensor and kind:
"out:nan", "dq:tolerance", "crash") are each shrunk to a minimal case.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings, target
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from faverify.case import Case
from faverify.collector import Failure, KernelStats
from faverify.runner import CaseResult
from faverify.signals import held
from faverify.strategies import Limits, cases

Evaluate = Callable[[Case, bool], CaseResult]  # (case, with gradient check) -> result


@dataclass(frozen=True)
class FuzzPlan:
    iters: int
    seed: int
    dtypes: tuple
    limits: Limits
    database: Path | None  # Hypothesis example database; failures found once are tried first next time
    gradcheck_every: int = 25  # 0: never
    shrink_budget: int = 300  # evaluations spent shrinking one failure
    shrink_seconds: float = 120.0
    stop_at_first_failure: bool = False  # `faverify mutants`: a mutant is killed by its first failure


class _Interesting(Exception):
    """Raised inside the Hypothesis test for the failure being found or shrunk."""


class _Shrinker:
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


def fuzz_subject(kernel: str, plan: FuzzPlan, evaluate: Evaluate, stats: KernelStats,
                 progress: Callable[[CaseResult], None] = lambda r: None) -> KernelStats:
    start = time.perf_counter()
    try:
        return _fuzz_sequential(kernel, plan, evaluate, stats, progress)
    finally:
        stats.seconds += time.perf_counter() - start


def _fuzz_sequential(kernel, plan, evaluate, stats, progress) -> KernelStats:
    known: set = set()
    generated = 0
    rounds = 0
    db = DirectoryBasedExampleDatabase(str(plan.database)) if plan.database else None
    while generated < plan.iters:
        state = {"shrinker": None}

        def run_one(case: Case) -> None:
            if _interesting(case):
                # one raise site: Hypothesis tells bugs apart by the line that raised
                raise _Interesting(state["shrinker"].signature)

        def _interesting(case: Case) -> bool:
            nonlocal generated
            if state["shrinker"] is not None:  # shrinking: only the same signature counts
                return state["shrinker"].still_fails(case)
            if generated >= plan.iters:
                return False
            gc = plan.gradcheck_every > 0 and generated % plan.gradcheck_every == 0
            r = evaluate(case, gc)
            generated += 1
            stats.add(r)
            progress(r)
            for t, m in r.metrics.items():
                # steer toward the tolerance edge: error / allowed, per tensor. Waived
                # (ill-conditioned) cases have huge ratios that mean nothing; they get none.
                usage = m.max_abs / m.allowed if m.allowed > 0 and not m.waived else 0.0
                target(min(usage, 1e6) if usage == usage else 0.0, label=f"{t} error / allowed")
            new = [s for s in r.signatures if s not in known]
            if new:
                state["shrinker"] = _Shrinker(plan, new[0], r, evaluate)
            return bool(new)

        test = _settings(plan, examples=plan.iters - generated, database=db,
                         phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink))(
            seed(plan.seed + rounds)(given(cases(dtypes=plan.dtypes, limits=plan.limits))(run_one)))
        before = generated
        note = ""
        try:
            test()
        except _Interesting:
            pass
        except Flaky:
            note = "flaky: the shrunk case did not fail again when replayed"
        rounds += 1
        shrinker = state["shrinker"]
        if shrinker is not None:
            known.add(shrinker.signature)
            stats.failures.append(Failure(kernel=kernel, signature=shrinker.signature, first=shrinker.first,
                                          minimal=shrinker.best, shrink_steps=shrinker.steps, note=note))
            if plan.stop_at_first_failure:
                break
        elif generated == before or generated < plan.iters:
            break  # Hypothesis ran out of distinct cases: nothing more to draw
    return stats


def _settings(plan: FuzzPlan, *, examples: int, database, phases) -> settings:
    return settings(max_examples=max(1, examples), deadline=None, database=database, phases=phases,
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                    report_multiple_bugs=False, print_blob=False)


# The draw and its replay must use the very same settings: Hypothesis's choices depend on max_examples.
_REPLAYABLE = (Phase.generate, Phase.shrink)


def _draw(plan: FuzzPlan, keep: Callable[[Case], None]) -> None:
    record = _settings(plan, examples=plan.iters, database=None, phases=_REPLAYABLE)(
        seed(plan.seed)(given(cases(dtypes=plan.dtypes, limits=plan.limits))(keep)))
    record()


def draw_cases(plan: FuzzPlan) -> list:
    """The cases a seed gives, without evaluating any: the same list for the same plan, on any machine."""
    drawn: list = []

    def keep(case: Case) -> None:
        drawn.append(case)

    _draw(plan, keep)
    return drawn[:plan.iters]


def stream_cases(plan: FuzzPlan):
    """draw_cases as they come: Hypothesis draws in a thread of its own (about 1.5 ms a case, 15 s for
    10000) while the workers already evaluate the first ones, or compile during a warm-up. The same
    cases in the same order. If the consumer stops early the thread finishes its draw unheard."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()
    done, stopped = object(), threading.Event()

    def keep(case: Case) -> None:
        if not stopped.is_set():
            q.put(case)

    def draw() -> None:
        try:
            _draw(plan, keep)
            q.put(done)
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


def shrink_by_replay(plan: FuzzPlan, index: int, first: CaseResult, signature: str, evaluate: Evaluate):
    """Hypothesis draws the plan's sequence again, skips to case `index` (known to fail with `signature`)
    and shrinks from there. Returns (minimal result, evaluations spent, note)."""
    shrinker = _Shrinker(plan, signature, first, evaluate)
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
            raise _Interesting(signature)

    test = _settings(plan, examples=plan.iters, database=None, phases=_REPLAYABLE)(
        seed(plan.seed)(given(cases(dtypes=plan.dtypes, limits=plan.limits))(body)))
    note = ""
    try:
        test()
        note = "not shrunk: drawing the sequence again did not reach the failing case"
    except _Interesting:
        pass
    except Flaky:
        note = "flaky: the shrunk case did not fail again when replayed"
    return shrinker.best, shrinker.steps, note


def warm_up(pool, warmup: list, stats: KernelStats) -> None:
    """Run the subject's warm-up cases (Subject.warmup) over the pool's workers, unjudged: each compiles
    its variants once, into the JIT's on-disk cache, where every worker then finds them. Without it each
    of the workers compiles every variant it meets itself, and a fuzz of a JIT-compiled subject runs at
    the compiler's pace for minutes."""
    if not warmup:
        return
    start = time.perf_counter()
    pool.map(((i, c, False) for i, c in enumerate(warmup)), lambda i, r: None, warm=True)
    stats.warmup_cases, stats.warmup_seconds = len(warmup), time.perf_counter() - start


def fuzz_parallel(kernel: str, plan: FuzzPlan, pool, stats: KernelStats,
                  progress: Callable[[CaseResult], None] = lambda r: None, warmup: list = (),
                  keep: int | None = None) -> KernelStats:
    """keep: workers per device after the warm-up (the pool may have started more, to compile on every
    core)."""
    start = time.perf_counter()
    drawn = stream_cases(plan)  # drawing while the warm-up compiles
    warm_up(pool, list(warmup), stats)
    if keep is not None:
        pool.retain(keep)
    every = plan.gradcheck_every
    first: dict = {}  # signature -> (index, result) of the first case that showed it

    def record(index: int, result: CaseResult) -> None:
        stats.add(result)
        progress(result)
        for s in result.signatures:
            if s not in first or index < first[s][0]:
                first[s] = (index, result)

    shrinking = False
    shrunk: dict = {}  # signature -> (minimal, steps, note)
    try:
        pool.map(((i, c, every > 0 and i % every == 0) for i, c in enumerate(drawn)), record)
        shrinking = True
        pending = [(sig, index, found) for sig, (index, found) in sorted(first.items(), key=lambda kv: kv[1][0])]
        if pending:
            shrink_all(plan, pending, pool.workers[:min(MAX_PARALLEL_SHRINKS, max(1, _cores() // 2))], shrunk)
    finally:
        # in the order the failures were found; interrupted: those not shrunk are reported as found
        note = "not shrunk: the run was interrupted" + (" while shrinking" if shrinking else "")
        for signature, (index, found) in sorted(first.items(), key=lambda kv: kv[1][0]):
            minimal, steps, why = shrunk.get(signature, (found, 0, note))
            stats.failures.append(Failure(kernel=kernel, signature=signature, first=found, minimal=minimal,
                                          shrink_steps=steps, note=why))
        stats.seconds += time.perf_counter() - start
    return stats


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
    import queue
    import threading
    from concurrent.futures import ThreadPoolExecutor

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


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def warmup_cases(name: str, plan: FuzzPlan) -> list:
    """The subject's warm-up cases for the plan's dtypes, and for the gradient check's dtype (fp32 where
    the subject has it) when the plan runs the check."""
    from faverify.gradcheck import dtype_for
    from faverify.subjects import resolve
    subject = resolve(name)
    if subject.warmup is None:
        return []
    extra = dtype_for(subject) if plan.gradcheck_every > 0 else None
    return list(subject.warmup(tuple(dict.fromkeys(plan.dtypes + ((extra,) if extra else ())))))


def run(kernels: list, plan: FuzzPlan, devices: list, *, mode: str, tolerance, command: str,
        workers: int = 1, isolate: bool = True, timeout: float = 300.0,
        progress_factory: Callable[[str], Callable[[CaseResult], None]] = lambda name: (lambda r: None)):
    """Fuzz each kernel in turn; returns the Run document.

    workers: processes per device (several: the parallel mode above). isolate=False evaluates in this
    process (one device, sequential), for speed where no subject can crash the process.
    KeyboardInterrupt (and SIGTERM, turned into one by the CLI) stops the run early: what was measured
    so far is still returned, so nothing the user asked to write is lost.
    """
    import torch

    from faverify.isolation import Pool
    from faverify.runner import evaluate as evaluate_case
    from faverify.subjects import resolve

    devices = [torch.device(d) for d in devices]
    parallel = isolate and workers * len(devices) > 1
    all_stats, interrupted = [], False
    for name in kernels:
        stats = KernelStats(kernel=name)
        all_stats.append(stats)
        pool = None
        try:
            warmup = warmup_cases(name, plan) if parallel else []
            if isolate:
                # the warm-up compiles on every core (one worker each), then the run keeps `workers`
                per_device = workers if parallel else 1
                pool = Pool(name, devices, max(per_device, _cores() // len(devices)) if warmup else per_device,
                            mode, tolerance.to_dict(), timeout)
            if parallel:
                fuzz_parallel(name, plan, pool, stats, progress_factory(name), warmup, keep=workers)
            else:
                if pool is not None:
                    evaluate = pool.evaluate
                else:
                    subject = resolve(name)

                    def evaluate(case: Case, gradcheck: bool, subject=subject) -> CaseResult:
                        return evaluate_case(subject, case, devices[0], mode=mode, tolerance=tolerance,
                                             gradcheck=gradcheck)
                fuzz_subject(name, plan, evaluate, stats, progress_factory(name))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            # held: an interrupt while the workers stop must not lose what they measured
            with held() as late:
                if pool is not None:
                    stats.restarts = pool.restarts
                    pool.close()
            interrupted = interrupted or bool(late)
        if interrupted:
            break
    with held() as late:  # the same while the results are put together
        return _document(kernels, plan, devices, mode, tolerance, command, workers, parallel, isolate,
                         all_stats, interrupted, late)


def _document(kernels, plan, devices, mode, tolerance, command, workers, parallel, isolate, all_stats,
              interrupted, late):
    from faverify import env as environment
    from faverify.results import Run

    settings_doc = {"kernels": ",".join(kernels), "iters": plan.iters, "seed": plan.seed,
                    "dtypes": ",".join(plan.dtypes), "mode": mode, "devices": ",".join(str(d) for d in devices),
                    "workers_per_device": workers if parallel else 1, "isolated": isolate,
                    "max_seqlen": plan.limits.max_seqlen, "gradcheck_every": plan.gradcheck_every,
                    "interrupted": interrupted or bool(late)}
    return Run.from_stats(command, environment.collect(), settings_doc, tolerance.to_dict(), all_stats)
