"""faverify merge."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import check_writable, say


@app.command()
def merge(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN.json...", help="Every shard's run file (fuzz --shard I/N --json)")],
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the merged run as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the merged report as Markdown")] = None,
) -> int:
    """One run from the shards of a fuzz (statistics recomputed over every case, failures kept once), or
    one fleet table from many nodes' doctor reports (outliers marked)."""
    import json

    from faverify.cli.fuzz import _exit_code, _write_outputs
    from faverify.merge import merge_runs
    from faverify.report import render
    from faverify.results import Run

    check_writable("--json", json_path)
    check_writable("--markdown", markdown)
    if _is_doctor(runs[0]):
        from faverify import fleet
        result = fleet.fleet([(path, fleet.read(path)) for path in runs])
        if json_path:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(result, indent=1))
        if markdown:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            markdown.write_text(fleet.render(result, "md"))
        say(fleet.render(result, "table"))
        return 1 if result["failed"] else 0
    merged = merge_runs([(path, Run.read(path, argument="RUN.json")) for path in runs])
    _write_outputs(merged, json_path, markdown)
    say(render(merged, "table"))
    return _exit_code(merged)


def _is_doctor(path: Path) -> bool:
    """Whether a file is a doctor report; an unreadable one is left to the run reader to refuse by name."""
    import json
    try:
        return json.loads(path.read_text()).get("schema") == "faverify.doctor"
    except (OSError, ValueError, AttributeError):
        return False
