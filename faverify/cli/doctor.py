"""faverify doctor."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cases.vocabulary import parse_choice
from faverify.cli.app import app
from faverify.cli.common import show, write_outputs
from faverify.errors import EnvironmentProblem
from faverify.files import check_writable


class Level(str, Enum):
    quick = "quick"
    full = "full"


@app.command()
def doctor(
    level: Annotated[Level, typer.Option(help="quick: 8 golden cases per check; full: all 40")] = Level.quick,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the checks as JSON")] = None,
    with_: Annotated[Optional[str], typer.Option("--with", help="Kernel libraries to check too, comma separated: "
                                                 "flash-attn, flash-attn-3, flash-attn-4, flashinfer (each "
                                                 "skipped with the reason where it does not import)")] = None,
) -> int:
    """Check a machine: environment, then per GPU the kernels and SDPA backends (and the libraries --with
    names) against golden cases, run-to-run determinism, and identical bits across GPUs of one model. Exit 1
    on any Fail."""
    import json

    from faverify.commands import doctor as doctor_checks
    from faverify.env import header_lines
    from faverify.judge.verdict import Tolerance
    from faverify.reports.tables import table

    check_writable("--json", json_path)
    from faverify.subjects.registry import LIBRARIES
    libraries = parse_choice(with_, LIBRARIES, "--with") if with_ is not None else ()
    report = doctor_checks.run(level.value, tolerance=Tolerance(), libraries=libraries)
    rows = [[c["check"], c["device"], c["status"], c["detail"]] for c in report["checks"]]
    try:  # the file first: a report that cannot be printed loses none of it
        write_outputs([("--json", json_path, lambda: json.dumps(report, indent=1, default=str))])
    finally:
        show("\n".join(header_lines(report["environment"])) + "\n\n"
             + table(rows, ["check", "device", "result", "detail"], "table"))
    if report["failed"]:
        return 1
    if not report["passed_any"]:
        raise EnvironmentProblem("no check passed: nothing ran")
    return 0

