"""Drive Hypothesis over one subject: generate cases, steer toward large errors, shrink each distinct
failure once, and keep going until --iters cases have run.

Hypothesis stops at its first failure and shrinks it. A fuzz run should still report all its cases, so
the loop restarts Hypothesis after each shrink with the found signature marked as known: a known
signature is recorded and counted, but no longer stops the run. Distinct failures (per tensor and kind:
"out:nan", "dq:tolerance", "crash") are each shrunk to a minimal case.

That is the mode of one worker. With several (parallel.py) the cases are drawn from the seed up front and
spread over worker processes; run() below picks the mode.
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
    # strategies.cases' arguments that narrow the draw (`faverify mutants`: to the cases that run a mutant's
    # code, catalog.Mutant.cases); its dtypes are intersected with the plan's
    narrow: dict | None = None

    def case_args(self) -> dict:
        args = dict(self.narrow or {}, limits=self.limits)
        args["dtypes"] = tuple(d for d in self.dtypes if d in args.get("dtypes", self.dtypes))
        return args


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
                raise Interesting(state["shrinker"].signature)

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
                state["shrinker"] = Shrinker(plan, new[0], r, evaluate)
            return bool(new)

        test = hypothesis_settings(plan, examples=plan.iters - generated, database=db,
                         phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink))(
            seed(plan.seed + rounds)(given(cases(**plan.case_args()))(run_one)))
        before = generated
        note = ""
        try:
            test()
        except Interesting:
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


def hypothesis_settings(plan: FuzzPlan, *, examples: int, database, phases) -> settings:
    return settings(max_examples=max(1, examples), deadline=None, database=database, phases=phases,
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                    report_multiple_bugs=False, print_blob=False)


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
    from faverify.parallel import cores, fuzz_parallel, warmup_cases
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
                pool = Pool(name, devices, max(per_device, cores() // len(devices)) if warmup else per_device,
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
