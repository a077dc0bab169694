"""docs/run-schema.md names every field the run file's writer writes, at the version it writes."""
import re
from pathlib import Path

from faverify.reports.results import VERSION
from property_tests.cli_helpers import cli, read_json

ROOT = Path(__file__).resolve().parent.parent


def _keys(run: dict) -> set:
    kernel = run["kernels"][0]
    failure = kernel["failures"][0]
    case_results = [failure["first"], failure["minimal"]]
    metrics = [m for r in case_results for m in r["metrics"].values()]
    gradchecks = [r["gradcheck"] for r in case_results if r["gradcheck"]]
    found = set(run) | set(run["settings"]) | set(run["tolerance"]) | set(run["environment"])
    found |= set(kernel) | set(kernel["summary"]) | {k for row in kernel["stats"] for k in row}
    found |= {k for row in kernel["gradcheck"] for k in row} | set(failure)
    found |= {k for r in case_results for k in r} | {k for m in metrics for k in m}
    found |= {k for g in gradchecks for k in g}
    return found


def test_every_field_the_writer_writes_is_documented_at_its_version(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "30", "--device", "cpu",
            "--no-db", "--no-isolate", "--gradcheck-every", "1", "--shrink-budget", "5", "--json",
            tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    run = read_json(tmp_path / "run.json")
    assert run["version"] == VERSION and run["kernels"][0]["failures"]
    text = (ROOT / "docs" / "run-schema.md").read_text()
    assert re.search(rf"^# .*version {VERSION}$", text, re.M), "the title names another version"
    documented = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text))
    assert _keys(run) - documented == set()
