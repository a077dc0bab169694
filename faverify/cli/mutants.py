"""faverify mutants."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cases.case import Case
from faverify.cli.app import app
from faverify.cli.common import (
    MAX_WORKERS,
    DeviceOpt,
    MaxSeqlenOpt,
    TimeoutOpt,
    check_max_seqlen,
    check_timeout,
    progress_bar,
    progress_factory,
    show,
    within,
    write_outputs,
)
from faverify.errors import UsageError
from faverify.files import check_writable
from faverify.run.signals import held, sigterm_interrupts


@app.command()
def mutants(
    iters: Annotated[int, typer.Option(help="Cases each mutant may take to be caught (and the control's cases)",
                                       callback=within(1))] = 200,
    control_iters: Annotated[Optional[int], typer.Option(help="Cases of the control run (default: --iters)",
                                                         callback=within(1))] = None,
    seed: Annotated[int, typer.Option()] = 0,
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16, fp32")] = "bf16,fp16",
    device: DeviceOpt = "auto",
    max_seqlen: MaxSeqlenOpt = None,
    only: Annotated[Optional[str], typer.Option(help="Comma separated mutant names (default: all)")] = None,
    shrink_budget: Annotated[int, typer.Option(help="Evaluations spent shrinking each kill",
                                               callback=within(0, 10**6))] = 40,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON")] = None,
    isolate: Annotated[Optional[bool], typer.Option(help="Worker processes (default: on a GPU, where a mutant "
                                                          "can fault the context)")] = None,
    timeout: TimeoutOpt = 300.0,
    jobs: Annotated[Optional[int], typer.Option(help="Mutants fuzzed at once, each in its own process (default: "
                                                     "1 on the CPU; on a GPU half the CPU cores, at most 8: "
                                                     "each mutant compiles its own kernels)",
                                                callback=within(1, MAX_WORKERS))] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes of the control run (default as for "
                                                        "fuzz: 1 on the CPU, 6 on a GPU)",
                                                   callback=within(1, MAX_WORKERS))] = None,
) -> int:
    """Prove the fuzzer catches real bugs: fuzz each seeded-bug mutant of the Triton kernels, then the
    unmutated kernels (which must pass). Exit 1 if a mutant survives or the control fails."""
    import json

    from faverify import devices
    from faverify.cases.strategies import limits_for
    from faverify.commands.mutants import run_mutants
    from faverify.dtypes import parse_dtypes
    from faverify.run.plan import FuzzPlan, Judging
    from faverify.run.scheduler import cores

    check_timeout(timeout)
    check_max_seqlen(max_seqlen)
    check_writable("--json", json_path)
    targets = devices.resolve(device)[:1]
    dtypes = parse_dtypes(dtype)
    names, elsewhere = _chosen(only, targets[0], dtypes)
    on_gpu = targets[0].type == "cuda"
    if jobs is None:
        jobs = min(8, max(1, cores() // 2)) if on_gpu else 1
    if workers is None:
        workers = devices.default_workers(targets[0])
    plan = FuzzPlan(iters=iters, seed=seed, dtypes=dtypes, limits=limits_for(targets[0].type, max_seqlen),
                    database=None, shrink_budget=shrink_budget)
    isolate = on_gpu if isolate is None else isolate
    if jobs > 1 and not isolate:
        raise UsageError("--jobs", jobs, "more than one needs --isolate (each mutant's job runs it in a worker)")
    with progress_bar() as progress, sigterm_interrupts():
        report = run_mutants(names, plan, targets, judging=Judging(timeout=timeout), isolate=isolate,
                             progress_factory=progress_factory(progress, iters), jobs=jobs,
                             control_workers=workers, control_iters=control_iters)
    with held():  # a signal now waits until the report is written
        try:  # the file first: a report that cannot be printed loses none of it
            write_outputs([("--json", json_path, lambda: json.dumps(report, indent=1, default=str))])
        finally:
            _show(report, elsewhere)
    c = report["control"]
    return 1 if report["survived"] or c["failed"] or len(report["mutants"]) < len(names) or report["interrupted"] else 0


def _chosen(only: Optional[str], target, dtypes: tuple) -> tuple:
    """(the mutants to run, {name: why} of those that cannot run on this device or dtypes); naming one of
    those in --only is an error."""
    from faverify.kernels.mutants.catalog import BY_NAME, left_out
    from faverify.subjects import resolve
    names = [n.strip() for n in (only or ",".join(BY_NAME)).split(",") if n.strip()]
    for n in names:
        if n not in BY_NAME:
            raise UsageError("--only", n, f"unknown mutant; mutants: {', '.join(BY_NAME)}")
    elsewhere = {n: why for n in names if (why := left_out(BY_NAME[n], target, dtypes))}
    if only is not None and elsewhere:
        first = next(iter(elsewhere))
        raise UsageError("--only", first, elsewhere[first])
    names = [n for n in names if n not in elsewhere]
    for subject in dict.fromkeys(BY_NAME[n].subject for n in names):
        devices = resolve(subject).caps.devices  # every case would be skipped: a survival for nothing
        if target.type not in devices:
            raise UsageError("--device", str(target), f"the mutated kernels ({subject}) run on "
                             f"{', '.join(devices)} in this process; Triton runs on the CPU only under "
                             "TRITON_INTERPRET=1, set before faverify starts")
    return names, elsewhere


def _show(report: dict, elsewhere: dict) -> None:
    from faverify.reports.tables import fmt, table
    rows = [[r["mutant"], "killed" if r["killed"] else ("SURVIVED" if not r["signature"] else
                                                        "NOT ATTRIBUTABLE (the control fails there too)"),
             str(r["cases_to_kill"] or "-"), f'{r["reached"]} of {r["cases"]}', r["signature"],
             _short_case(r["minimal_case"]), fmt(r["seconds"], ".1f")] for r in report["mutants"]]
    show(table(rows, ["mutant", "result", "cases to kill", "cases that ran its code", "caught as",
                      "minimal case", "seconds"], "table"))
    narrowed = [r["mutant"] for r in report["mutants"] if r.get("cases_narrowed_to")]
    if narrowed:
        show(f"\ndrawn only from cases that run the mutated code (catalog.Mutant.cases): {', '.join(narrowed)}")
    longest = max((r.get("max_seqlen") or 0 for r in report["mutants"]), default=0)
    capped = [f'{r["mutant"]} ({r["max_seqlen"]})' for r in report["mutants"]
              if 0 < (r.get("max_seqlen") or 0) < longest]
    if capped:
        show(f"\ndrawn with shorter sequences, where longer ones only cost time (catalog.Mutant.max_seqlen): "
             f"{', '.join(capped)}")
    if elsewhere:
        show("\nnot run here: " + "; ".join(f"{n} ({why})" for n, why in elsewhere.items()))
    c = report["control"]
    show(f"\nkilled {report['killed']} of {len(report['mutants'])}, median cases to kill "
         f"{report['median_cases_to_kill']}; control (unmutated {c['kernel']}): {c['cases']} cases, "
         f"{c['failed']} failed" + (f" ({'; '.join(c['failures'])})" if c["failures"] else ""))
    if report["interrupted"]:
        show("interrupted: the mutants above ran; the others and the control did not")


def _short_case(case: Optional[dict]) -> str:
    return Case.from_dict(case).short() if case else ""
