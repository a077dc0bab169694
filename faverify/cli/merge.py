"""faverify merge."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import show, write_outputs
from faverify.errors import EnvironmentProblem
from faverify.files import check_distinct, check_writable


@app.command()
def merge(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN.json...",
                                               help="Every shard's run file (fuzz --shard I/N --json)")],
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the merged run as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the merged report as Markdown")] = None,
) -> int:
    """One run from the shards of a fuzz (statistics recomputed over every case, failures kept once), or
    one fleet table from many nodes' doctor reports (outliers marked)."""
    import json

    from faverify.cli.fuzz import report
    from faverify.commands.fuzz import exit_code
    from faverify.reports.merge import merge_runs
    from faverify.reports.results import Run

    check_distinct(json=json_path, markdown=markdown)
    check_writable("--json", json_path)
    check_writable("--markdown", markdown)
    if _is_doctor(runs[0]):
        from faverify.reports import fleet
        result = fleet.fleet([(path, fleet.read(path)) for path in runs])
        try:  # written first, as fuzz's outputs are (fuzz.report)
            write_outputs([("--json", json_path, lambda: json.dumps(result, indent=1)),
                           ("--markdown", markdown, lambda: fleet.render(result, "md"))])
        finally:
            show(fleet.render(result, "table"))
        if result["failed"]:
            return 1
        if not result.get("checked"):
            raise EnvironmentProblem("the doctor reports hold no check that ran (none, or only Skip): "
                                     "nothing was checked")
        return 0
    merged = merge_runs([(path, Run.read(path, argument="RUN.json")) for path in runs])
    report(merged, json_path, markdown)
    return exit_code(merged)


def _is_doctor(path: Path) -> bool:
    """Whether a file is a doctor report; an unreadable one is left to the run reader to refuse by name."""
    import json

    from faverify.files import Unreadable, read_bounded
    try:
        return json.loads(read_bounded(path)).get("schema") == "faverify.doctor"
    except (Unreadable, ValueError, RecursionError, AttributeError):
        return False
