"""faverify report | compare."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from faverify.cli.app import app
from faverify.cli.common import show
from faverify.errors import EnvironmentProblem, UsageError


class Format(str, Enum):
    md = "md"
    table = "table"


@app.command()
def report(
    run_file: Annotated[Path, typer.Argument(metavar="RUN.json", help="A run written by fuzz --json")],
    format: Annotated[Format, typer.Option("--format", help="md: GitHub Markdown; table: the terminal")] = Format.table,
) -> int:
    """Render a run as GitHub-flavored Markdown (for a pull request) or terminal tables."""
    from faverify.reports.report import render
    from faverify.reports.results import Run

    show(render(Run.read(run_file, argument="RUN.json"), format.value).rstrip("\n"))
    return 0


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(metavar="BASE.json", help="The run before the change")],
    head: Annotated[Path, typer.Argument(metavar="HEAD.json", help="The run after it")],
    factor: Annotated[float, typer.Option(help="A statistic changed by more than this factor is marked")] = 1.5,
    format: Annotated[Format, typer.Option("--format",
                                           help="md: a pull-request comment; table: the terminal")] = Format.table,
    all_rows: Annotated[bool, typer.Option("--all", help="Show every row, not only the marked ones")] = False,
) -> int:
    """What got worse (+), better (-), newly fails (!) or cannot be compared (x). Exit 1 on + or !."""
    from faverify.reports.compare import compare_runs, summary_line
    from faverify.reports.results import Run
    from faverify.reports.tables import Style, fmt, ratio, table

    if not factor > 1:
        raise UsageError("--factor", factor, "must be a number > 1")
    runs = [Run.read(path, argument=name) for name, path in (("BASE.json", base), ("HEAD.json", head))]
    for path, run in zip((base, head), runs):  # a CI gate must not pass on a run that proved nothing
        if run.ran == 0:
            why = "interrupted before its first case" if run.settings.get("interrupted") else "every case was skipped"
            raise EnvironmentProblem(f"{path} checked no case ({why}): there is nothing to compare")
    result = compare_runs(*runs, factor)
    style = format.value
    shown = result["rows"] if all_rows else [r for r in result["rows"] if r["mark"]]
    rows = [[r["kernel"], r["dtype"], r["tensor"], r["statistic"], fmt(r["before"]), fmt(r["after"]),
             ratio(r["ratio"]), r["mark"]] for r in shown]
    st = Style(style)
    parts = []
    if st.md:
        parts.append("### faverify: numerics comparison")
    parts.append(st.text(summary_line(result)))
    if result["environment_differences"]:
        lead = "- " if st.md else "  "
        differences = result["environment_differences"]
        parts.append("environment differences:\n" + "\n".join(lead + st.text(d) for d in differences))
    parts.append(table(rows, ["kernel", "dtype", "tensor", "statistic", "before", "after", "ratio", "mark"], style)
                 if rows else "(no statistic changed by more than the factor)")
    show("\n\n".join(parts))
    if result["regressed"]:
        return 1
    if not result["comparable"]:  # a CI gate must not pass on runs that share nothing to compare
        raise EnvironmentProblem("no row of the two runs can be compared (other kernels, dtypes or GPU models, "
                                 "or statistics defined anew between their schema versions): nothing was compared")
    if result["uncompared"]:  # nor on a head that lost what the base checked
        raise EnvironmentProblem(f"{result['uncompared']} statistics of {base} have none in {head} to compare "
                                 "with (a row it lacks, or a value it could not give): the head is not shown to "
                                 "be no worse")
    return 0
