"""`faverify mutants`: fuzz each seeded-bug variant of the Triton kernels and report whether it was
caught; then the unmutated kernels under the same settings must pass (no false alarm).

A mutant is killed by its first failing case (shrunk, with a reproducer), and only if the unmutated
kernels pass that minimal case: a failure the control shares is a bug of the kernels, not the mutant's.
"Cases to kill" counts the cases drawn up to and including the first failure.

On a GPU each mutant is its own set of kernels to compile (seconds per variant, most of a mutant's
time), so mutants run `jobs` at a time, each in its own process; the control then fuzzes with the usual
parallel workers, which compile each variant once (parallel.warm_up).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import statistics
import time

import torch

from faverify import env as environment
from faverify.cases.case import Case
from faverify.cases.strategies import Limits
from faverify.run import processes
from faverify.run.evaluate import MODES, evaluate
from faverify.run.fuzz import run
from faverify.run.isolation import Worker
from faverify.run.plan import FuzzPlan, Judging
from faverify.run.request import FuzzRun, subject_plan
from faverify.run.scheduler import Pool
from faverify.streams import say
from faverify.subjects import resolve


def _check_in_process(device, subject: str = "triton"):
    unmutated = resolve(subject)
    return lambda case, judging: evaluate(unmutated, case, device, mode=judging.mode, tolerance=judging.tolerance)


def control_mode(signature: str) -> str:
    """What the unmutated kernels must pass on a kill's minimal case for the kill to be the mutant's: the
    forward alone where the mutant failed a forward tensor (out, lse, their split partials), the backward
    costing twice the forward under the interpreter; forward and backward otherwise."""
    tensor = signature.partition(":")[0]
    return "fwd" if tensor.removesuffix("_splits") in MODES["fwd"] else "both"


def kill(name: str, plan: FuzzPlan, devices: list, *, judging: Judging, isolate: bool,
         progress_factory=lambda kernel: (lambda r: None), check=None) -> dict:
    """Fuzz one mutant until its first failure; the row of the report. check(case, judging): the unmutated
    kernels' result on a case (default: evaluated in this process)."""
    from faverify.kernels.mutants.build import source
    from faverify.kernels.mutants.catalog import BY_NAME

    mutant = BY_NAME[name]
    try:  # a stale or unparsable mutant: its workers could not load it, which is no kill
        source(mutant)
    except RuntimeError as e:
        return _error_row(name, str(e))
    start = time.perf_counter()
    plan = dataclasses.replace(plan, stop_at_first_failure=True, narrow=mutant.cases,
                               limits=capped(plan.limits, mutant))
    # the cases that ran the mutated code, counted per case: one case can take several of the file's paths
    # (forward and backward), so the per-path counts of the summary would count it more than once
    reached = 0

    def counting(kernel: str):
        shown = progress_factory(kernel)

        def progress(r) -> None:
            nonlocal reached
            reached += any(mutant.reaches(p) for p in r.paths)
            shown(r)
        return progress

    result = run(FuzzRun("mutants", plan, (subject_plan(resolve(f"mutant:{name}"), plan),), devices, judging,
                         isolate=isolate), counting)
    kernel = result.kernels[0]
    failures = kernel["failures"]
    minimal = failures[0]["minimal"] if failures else None
    check = check or _check_in_process(devices[0], mutant.subject)
    mode = control_mode(failures[0]["signature"]) if failures else "both"
    control_there = check(Case.from_dict(minimal["case"]), dataclasses.replace(judging, mode=mode)) if minimal else None
    attributable = control_there is not None and not control_there.failed
    killed = bool(failures) and attributable
    return {
        "mutant": name, "bug": mutant.bug, "why": mutant.why, "killed": killed,
        "cases_to_kill": kernel["summary"]["cases"] if killed else None,
        "cases": kernel["summary"]["cases"], "reached": reached, "paths": kernel["summary"].get("paths", {}),
        "cases_narrowed_to": mutant.cases, "max_seqlen": plan.limits.max_seqlen,
        "skipped": kernel["summary"]["skipped"], "signature": failures[0]["signature"] if failures else "",
        "minimal_case": minimal["case"] if minimal else None,
        "reason": minimal["reason"][:300] if minimal else "",
        "reproducer": failures[0]["reproducer"] if failures else "",
        "control_on_minimal_case": control_there.status if control_there else None, "control_mode": mode,
        "seconds": round(time.perf_counter() - start, 1),
        "interrupted": bool(result.settings.get("interrupted")),
    }


def capped(limits: Limits, mutant) -> Limits:
    """The run's limits with the mutant's own cap on sequence and cache lengths (catalog.Mutant.max_seqlen)."""
    cap = mutant.max_seqlen
    if cap is None or limits.max_seqlen <= cap:
        return limits
    return dataclasses.replace(limits, max_seqlen=cap, max_cache=min(limits.max_cache, cap))  # 0: max_seqlen


def _kill_job(conn, name, plan, device, judging: dict, isolate) -> None:
    """A job process: one mutant, its row sent back. Its fuzz isolates the mutant in a worker of its own."""

    try:
        row = kill(name, plan, [torch.device(device)], judging=Judging.from_dict(judging), isolate=isolate)
        conn.send(("row", row))
    except BaseException as e:  # faverify's own bug: reported as this mutant's, the others go on
        conn.send(("error", f"{type(e).__name__}: {e}"))


class MutantJob:
    """A worker of scheduler.Pool that fuzzes one mutant per process (_kill_job): each mutant compiles its
    own kernels, so a process per mutant costs nothing a reused one would save. The result is its row."""

    def __init__(self, plan: FuzzPlan, device, judging: Judging, isolate: bool):
        self.args = (plan, str(device), judging.to_dict(), isolate)
        self.device = str(device)
        self.process = self.conn = None
        self.name = ""

    def submit(self, name: str) -> None:
        parent, child = mp.Pipe()
        self.process = processes.start(_kill_job, (child, name, *self.args))
        child.close()
        self.conn, self.name = parent, name

    def collect(self) -> dict | None:
        if self.conn.poll():
            kind, payload = self.conn.recv()
        elif not self.process.is_alive():
            kind, payload = "error", f"its job process died (exit code {self.process.exitcode})"
        else:
            return None
        self.process.join()
        row = payload if kind == "row" else _error_row(self.name, payload)
        say(f"mutants: {self.name}: {'killed' if row['killed'] else 'NOT killed'} ({row['seconds']} s, "
            f"{row['reached']} of {row['cases']} cases ran its code; {row['skipped']} skipped; paths {row['paths']})")
        return row

    def waitables(self) -> list:
        return [self.conn, self.process.sentinel]

    def stop(self) -> None:
        """Stop a job still running (an interrupt); its workers exit when their pipes close."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(5)


def _kill_parallel(names: list, plan: FuzzPlan, device, *, judging: Judging, isolate: bool, jobs: int) -> tuple:
    """(rows in the order of `names`, interrupted); on an interrupt, the rows finished so far (the running
    jobs are stopped)."""

    pool = Pool([MutantJob(plan, device, judging, isolate) for _ in range(jobs)])
    rows: dict = {}
    interrupted = False
    try:
        pool.map(((n, n) for n in names), rows.__setitem__)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pool.close()
    return [rows[n] for n in names if n in rows], interrupted


def _error_row(name: str, error: str) -> dict:
    from faverify.kernels.mutants.catalog import BY_NAME
    mutant = BY_NAME[name]
    return {"mutant": name, "bug": mutant.bug, "why": mutant.why, "killed": False, "cases_to_kill": None,
            "cases": 0, "reached": 0, "paths": {}, "skipped": 0, "signature": "", "minimal_case": None,
            "reason": f"not run to the end: {error}",
            "reproducer": "", "control_on_minimal_case": None, "seconds": 0.0, "interrupted": False}


def run_mutants(names: list, plan: FuzzPlan, devices: list, *, judging: Judging, isolate: bool, progress_factory,
                jobs: int = 1, control_workers: int = 1, control_iters: int | None = None) -> dict:
    from faverify.kernels.mutants.catalog import BY_NAME

    if jobs > 1:
        rows, interrupted = _kill_parallel(names, plan, devices[0], judging=judging, isolate=isolate, jobs=jobs)
    else:
        rows, interrupted = [], False
        # the unmutated subject behind each mutant, a worker per mode it is checked in (control_mode)
        control_workers_by_subject: dict = {}

        def check_with(subject: str):
            if not isolate:
                return None

            def check(case, judged):
                if (subject, judged.mode) not in control_workers_by_subject:
                    control_workers_by_subject[subject, judged.mode] = Worker(subject, str(devices[0]), judged)
                return control_workers_by_subject[subject, judged.mode].evaluate(case)
            return check
        try:
            for name in names:
                rows.append(kill(name, plan, devices, judging=judging, isolate=isolate,
                                 progress_factory=progress_factory, check=check_with(BY_NAME[name].subject)))
                if rows[-1]["interrupted"]:
                    interrupted = True
                    break
        finally:
            for worker in control_workers_by_subject.values():
                worker.stop()
    kills = [r["cases_to_kill"] for r in rows if r["killed"]]
    report = {"schema": "faverify.mutants", "version": 1, "interrupted": interrupted,
              "settings": {"iters": plan.iters, "seed": plan.seed, "dtypes": ",".join(plan.dtypes),
                           "devices": ",".join(str(d) for d in devices), "jobs": jobs,
                           "control_workers": control_workers},
              "mutants": rows, "killed": len(kills), "survived": len(rows) - len(kills),
              "median_cases_to_kill": statistics.median(kills) if kills else None}
    # the unmutated subjects behind the mutants: triton, and triton-fp8 where its mutants ran
    kernels = sorted({"triton-fp8" if BY_NAME[n].subject == "triton-fp8" else "triton" for n in names}) or ["triton"]
    if interrupted:  # the user stopped it: what ran is reported, the control is not started
        return dict(report, control={"kernel": ",".join(kernels), "cases": 0, "failed": 0,
                                     "failures": ["not run: the run was interrupted"]},
                    environment=environment.collect())
    control_plan = dataclasses.replace(plan, iters=control_iters) if control_iters else plan
    unmutated = tuple(subject_plan(s, control_plan, needs=s.caps.draw()) for s in map(resolve, kernels))
    control = run(FuzzRun("mutants (control)", control_plan, unmutated, devices, judging, control_workers,
                          isolate or control_workers > 1), progress_factory)
    summaries = [k["summary"] for k in control.kernels]
    return dict(report, control={**summaries[0], "kernel": ",".join(kernels),
                                 **{n: sum(s[n] for s in summaries) for n in ("cases", "failed", "passed", "skipped")},
                                 "failures": [f["minimal"]["reason"][:300] + "; " + f["reproducer"]
                                              for k in control.kernels for f in k["failures"]]},
                environment=control.environment)
