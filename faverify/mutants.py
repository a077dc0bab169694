"""`faverify mutants`: fuzz each seeded-bug variant of the Triton kernels and report whether it was
caught; then the unmutated kernels under the same settings must pass (no false alarm).

A mutant is killed by its first failing case (shrunk, with a reproducer), and only if the unmutated
kernels pass that minimal case: a failure the control shares is a bug of the kernels, not the mutant's.
"Cases to kill" counts the cases drawn up to and including the first failure.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from faverify.fuzz import FuzzPlan, run


def run_mutants(names: list, plan: FuzzPlan, devices: list, *, tolerance, isolate: bool, timeout: float,
                progress_factory) -> dict:
    from faverify.kernels.mutants.catalog import BY_NAME

    from faverify.case import Case
    from faverify.isolation import Worker
    from faverify.runner import evaluate
    from faverify.subjects import resolve

    kill_plan = dataclasses.replace(plan, stop_at_first_failure=True)
    if isolate:
        control_worker = Worker("triton", str(devices[0]), "both", tolerance.to_dict(), timeout)
        check = control_worker.evaluate
    else:
        unmutated = resolve("triton")

        def check(case):
            return evaluate(unmutated, case, devices[0], tolerance=tolerance)
    rows = []
    for name in names:
        mutant = BY_NAME[name]
        start = time.perf_counter()
        result = run([f"mutant:{name}"], kill_plan, devices, mode="both", tolerance=tolerance, command="mutants",
                     workers=1, isolate=isolate, timeout=timeout, progress_factory=progress_factory)
        kernel = result.kernels[0]
        failures = kernel["failures"]
        minimal = failures[0]["minimal"] if failures else None
        control_there = check(Case.from_dict(minimal["case"])) if minimal else None
        attributable = control_there is not None and not control_there.failed
        killed = bool(failures) and attributable
        rows.append({
            "mutant": name, "bug": mutant.bug, "why": mutant.why, "killed": killed,
            "cases_to_kill": kernel["summary"]["cases"] if killed else None,
            "cases": kernel["summary"]["cases"], "signature": failures[0]["signature"] if failures else "",
            "minimal_case": minimal["case"] if minimal else None,
            "reason": minimal["reason"][:300] if minimal else "",
            "reproducer": failures[0]["reproducer"] if failures else "",
            "control_on_minimal_case": control_there.status if control_there else None,
            "seconds": round(time.perf_counter() - start, 1),
        })
        if result.settings.get("interrupted"):
            break
    if isolate:
        control_worker.stop()
    control = run(["triton"], plan, devices, mode="both", tolerance=tolerance, command="mutants (control)",
                  workers=1, isolate=isolate, timeout=timeout, progress_factory=progress_factory)
    kills = [r["cases_to_kill"] for r in rows if r["killed"]]
    return {
        "schema": "faverify.mutants", "version": 1,
        "settings": {"iters": plan.iters, "seed": plan.seed, "dtypes": ",".join(plan.dtypes),
                     "devices": ",".join(str(d) for d in devices)},
        "mutants": rows,
        "killed": len(kills), "survived": len(rows) - len(kills),
        "median_cases_to_kill": statistics.median(kills) if kills else None,
        "control": {"kernel": "triton", **control.kernels[0]["summary"],
                    "failures": [f["minimal"]["reason"][:300] for f in control.kernels[0]["failures"]]},
        "environment": control.environment,
    }
