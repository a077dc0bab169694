"""What a run file holds and what is shown of it: a kernel's message is printable and of a stated length in
the run file, the terminal, the Markdown and `report`."""
import json
import re

from faverify.errors import MESSAGE_CHARS
from property_tests.cli_helpers import cli, read_json

CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_a_kernels_message_is_printable_and_cut_everywhere_it_is_shown(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted_trust:raises_a_hostile_message", "--iters", "3",
            "--device", "cpu", "--no-db", "--no-isolate", "--mode", "fwd", "--shrink-budget", "3",
            "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md")
    assert r.exit_code == 1 and "RuntimeError" in r.stderr, r.stderr[-2000:]
    run = read_json(tmp_path / "run.json")
    assert (tmp_path / "run.json").stat().st_size < 200_000
    assert all(not CONTROL.search(s) and len(s) <= MESSAGE_CHARS for s in _strings(run))
    assert "\\x1b]0;owned\\x07\\r\\x1b[2JPASS" in run["kernels"][0]["failures"][0]["minimal"]["reason"]
    shown = [r.stdout, r.stderr, (tmp_path / "run.md").read_text()]
    shown += [cli("report", tmp_path / "run.json", "--format", f).stdout for f in ("table", "md")]
    assert all(not CONTROL.search(text) for text in shown)


def test_report_shows_a_forged_run_files_strings_printable(tmp_path):
    cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "4", "--device", "cpu", "--no-db",
        "--no-isolate", "--shrink-budget", "1", "--json", tmp_path / "run.json")
    data = read_json(tmp_path / "run.json")
    forged = "\x1b]0;owned\x07\rPASS " + "y" * 10_000
    data["kernels"][0]["summary"]["kernel"] = forged
    data["kernels"][0]["failures"][0]["minimal"]["reason"] = forged
    data["kernels"][0]["summary"]["skip_reasons"] = {forged: 1}
    data["command"] = forged
    (tmp_path / "forged.json").write_text(json.dumps(data))
    for style in ("table", "md"):
        r = cli("report", tmp_path / "forged.json", "--format", style)
        assert r.exit_code == 0 and not CONTROL.search(r.stdout), r.stderr
        assert "y" * (MESSAGE_CHARS + 1) not in r.stdout

