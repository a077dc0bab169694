"""faverify golden record | verify, and faverify doctor."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli import app
from faverify.cli.common import AtolOpt, DeviceOpt, FactorOpt, say, tolerance_from
from faverify.errors import EnvironmentProblem, UsageError


class Action(str, Enum):
    record = "record"
    verify = "verify"


class Level(str, Enum):
    quick = "quick"
    full = "full"


@app.command()
def golden(
    action: Annotated[Action, typer.Argument(help="record: rebuild the files; verify: check a kernel against them")],
    kernel: Annotated[Optional[str], typer.Option(help="The subject to verify")] = None,
    device: DeviceOpt = "auto",
    directory: Annotated[Optional[Path], typer.Option("--dir", help="The golden directory (default: golden/)")] = None,
    only: Annotated[Optional[str], typer.Option(help="Comma separated case names")] = None,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    isolate: Annotated[bool, typer.Option(help="Run the subject in a worker process")] = True,
) -> int:
    """Stored cases with FP64 outputs: record them, or verify a kernel against them."""
    from faverify import devices
    from faverify import golden as golden_files
    from faverify.report import table

    directory = directory or golden_files.DEFAULT_DIR
    names = [n.strip() for n in only.split(",")] if only else None
    for n in names or ():
        if n not in golden_files.CASES:
            raise UsageError("--only", n, f"unknown golden case; cases: {', '.join(golden_files.CASES)}")
    if action == Action.record:
        entries = golden_files.record(directory, names)
        typer.echo(f"recorded {len(entries)} cases in {directory} "
                   f"({sum(e['bytes'] for e in entries) / 1e6:.1f} MB)")
        return 0
    if not kernel:
        raise UsageError("--kernel", None, "golden verify needs the subject to check")
    from faverify.subjects import resolve
    resolve(kernel)  # unknown kernels fail here, with exit 2
    target = devices.resolve(device)[0]
    try:
        rows = golden_files.verify(kernel, target, directory=directory, tolerance=tolerance_from(factor, atol),
                                   names=names, isolate=isolate)
    except golden_files.GoldenFileProblem as e:
        raise EnvironmentProblem(f"golden index: {e}") from None
    shown = [[r["name"], r["case"].short(), r["status"], r["reason"][:150]] for r in rows]
    say(table(shown, ["case", "shape", "result", "reason"], "table"))
    outcome = golden_files.summarize(rows)
    bad, passed = outcome["bad"], len(outcome["passed"])
    say(f"{kernel} on {target}: {passed} of {len(rows)} golden cases pass, {len(bad)} fail, "
        f"{len(outcome['skipped'])} skipped")
    if bad:
        return 1
    if not passed:
        raise EnvironmentProblem(f"no golden case ran: {kernel} skipped them all")
    return 0


@app.command()
def doctor(
    level: Annotated[Level, typer.Option(help="quick: 8 golden cases per check; full: all 40")] = Level.quick,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the checks as JSON")] = None,
) -> int:
    """Check a machine: environment, then per GPU the kernels and SDPA backends against golden cases,
    run-to-run determinism, and identical bits across GPUs of one model. Exit 1 on any Fail."""
    import json

    from faverify import doctor as doctor_checks
    from faverify.env import header_lines
    from faverify.report import table
    from faverify.verdict import Tolerance

    report = doctor_checks.run(level.value, tolerance=Tolerance())
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=str))
    for line in header_lines(report["environment"]):
        typer.echo(line)
    rows = [[c["check"], c["device"], c["status"], c["detail"]] for c in report["checks"]]
    typer.echo("\n" + table(rows, ["check", "device", "result", "detail"], "table"))
    if report["failed"]:
        return 1
    if not report["passed_any"]:
        raise EnvironmentProblem("no check passed: nothing ran")
    return 0
