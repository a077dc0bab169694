"""faverify golden record | verify."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import AtolOpt, DeviceOpt, FactorOpt, TightOpt, show
from faverify.errors import EnvironmentProblem, UsageError
from faverify.files import check_writable


class Action(str, Enum):
    record = "record"
    verify = "verify"


@app.command()
def golden(
    action: Annotated[Action, typer.Argument(help="record: rebuild the files; verify: check a kernel against them")],
    kernel: Annotated[Optional[str], typer.Option(help="The subject to verify")] = None,
    device: DeviceOpt = "auto",
    directory: Annotated[Optional[Path], typer.Option(
        "--dir", help="The golden directory (default: the files installed with faverify)")] = None,
    only: Annotated[Optional[str], typer.Option(help="Comma separated case names")] = None,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    tight: TightOpt = None,
    isolate: Annotated[bool, typer.Option(help="Run the subject in a worker process")] = True,
) -> int:
    """Stored cases with FP64 outputs: record them, or verify a kernel against them."""
    from faverify import devices
    from faverify.cases import golden_files
    from faverify.commands import golden
    from faverify.judge.verdict import parse_tolerance
    from faverify.reports.tables import table

    tolerance = parse_tolerance(factor, atol, tight)  # every flag is checked before any work
    directory = directory or golden_files.DEFAULT_DIR
    names = [n.strip() for n in only.split(",")] if only else None
    for n in names or ():
        if n not in golden_files.CASES:
            raise UsageError("--only", n, f"unknown golden case; cases: {', '.join(golden_files.CASES)}")
    if action == Action.record:
        check_writable("--dir", directory, directory=True)
        try:
            entries = golden.record(directory, names)
        except golden_files.GoldenFileProblem as e:  # an index it would lose entries of, a link on the way
            raise EnvironmentProblem(f"golden record: {e}") from None
        show(f"recorded {len(entries)} cases in {directory} "
                   f"({sum(e['bytes'] for e in entries) / 1e6:.1f} MB)")
        return 0
    if not kernel:
        raise UsageError("--kernel", None, "golden verify needs the subject to check")
    from faverify.run.isolation import check_imports
    from faverify.subjects import resolve
    check_imports(kernel, 300.0)  # a module that ends its process at import ends a worker's, not this one
    resolve(kernel)  # unknown kernels fail here, with exit 2
    target = devices.resolve(device)[0]
    try:
        rows = golden.verify(kernel, target, directory=directory, tolerance=tolerance,
                                   names=names, isolate=isolate)
    except golden_files.GoldenFileProblem as e:
        raise EnvironmentProblem(f"golden index: {e}") from None
    shown = [[r["name"], r["case"].short(), r["status"], r["reason"][:150]] for r in rows]
    show(table(shown, ["case", "shape", "result", "reason"], "table"))
    outcome = golden.summarize(rows)
    bad, passed = outcome["bad"], len(outcome["passed"])
    show(f"{kernel} on {target}: {passed} of {len(rows)} golden cases pass, {len(bad)} fail, "
        f"{len(outcome['skipped'])} skipped")
    damaged = [r for r in bad if r["status"] == "corrupt"]
    if len(damaged) < len(bad):  # the kernel failed a case: that finding comes first
        return 1
    if damaged:  # the check itself is broken: the files must be restored, not the kernel mended
        raise EnvironmentProblem("damaged golden files (restore them, or run `faverify golden record`): "
                                 + "; ".join(r["reason"] for r in damaged))
    if not passed:
        raise EnvironmentProblem(f"no golden case ran: {kernel} skipped them all")
    return 0
