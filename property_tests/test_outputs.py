"""Nothing the user asked to write is lost, and nothing a run file holds becomes Markdown or HTML: outputs are
checked before any case runs, written whole after the terminal report, and every string escaped."""
import json
import os
import re

import pytest

from property_tests.cli_helpers import cli, read_json

FAST = ("--kernel", "sdpa-math", "--iters", "2", "--device", "cpu", "--no-db", "--mode", "fwd")


@pytest.mark.parametrize("make,message", [
    (lambda p: "/dev/full", "is not a regular file"),
    (lambda p: (os.mkfifo(p / "fifo"), p / "fifo")[1], "is not a regular file"),
    (lambda p: (os.symlink(p / "missing" / "x.json", p / "dangling"), p / "dangling")[1], "symbolic link"),
])
def test_an_output_that_cannot_hold_the_run_is_refused_before_it_runs(tmp_path, make, message):
    r = cli("fuzz", *FAST, "--json", make(tmp_path))
    assert r.exit_code == 2 and message in r.stderr and "cases/s" not in r.stderr, r.stderr


def test_two_outputs_on_one_path_and_folders_made_before_a_bad_kernel_are_refused(tmp_path):
    r = cli("fuzz", *FAST, "--json", tmp_path / "x", "--markdown", tmp_path / "x")
    assert r.exit_code == 2 and "same file" in r.stderr, r.stderr
    r = cli("fuzz", "--kernel", "no-such-kernel", "--json", tmp_path / "new" / "run.json")
    assert r.exit_code == 2 and not (tmp_path / "new").exists(), r.stderr


def test_a_write_that_fails_at_the_end_is_told_after_the_report(tmp_path, monkeypatch):
    """The disk fills up after the check: the terminal report is printed first, the Markdown is still
    written, and the error names the file that could not be; the old file is left whole."""
    (tmp_path / "run.json").write_text("old")
    real = os.replace

    def full(src, dst):
        if str(dst).endswith("run.json"):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", full)
    r = cli("fuzz", *FAST, "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md")
    assert r.exit_code == 2 and "could not write --json" in r.stderr and "No space left" in r.stderr, r.stderr
    assert r.stderr.index("PASS:") < r.stderr.index("could not write")
    assert (tmp_path / "run.md").read_text().startswith("**PASS**")
    assert (tmp_path / "run.json").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.json.")]  # no temporary left behind


HOSTILE = "evil|col</details><script>alert(1)</script>\n**PASS**: forged [link](http://x) `tick`"


def test_a_hostile_run_file_renders_as_text_in_markdown(tmp_path):
    cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "30", "--device", "cpu", "--no-db",
        "--no-isolate", "--mode", "fwd", "--json", tmp_path / "run.json")
    data = read_json(tmp_path / "run.json")
    kernel = data["kernels"][0]
    kernel["summary"]["kernel"] = HOSTILE
    for f in kernel["failures"]:
        f["kernel"] = HOSTILE
        f["minimal"]["reason"] = HOSTILE
    kernel["summary"]["skip_reasons"] = {HOSTILE: 1}
    data["environment"]["gpus"] = [{"index": 0, "name": HOSTILE, "capability": "9.0", "memory_gib": 1}]
    (tmp_path / "hostile.json").write_text(json.dumps(data))
    md = cli("report", tmp_path / "hostile.json", "--format", "md").stdout
    assert data["kernels"][0]["failures"] and md.startswith("**FAIL**")
    prose = re.sub(r"(`+).*?\1", "", md)  # code spans show their text as it is: HTML is not read there
    unescaped = re.compile(r"(?<!\\)(<script>|</details>|\]\(http|\|col)")
    assert not unescaped.search(prose), unescaped.search(prose)
    assert not any(line.startswith("**PASS**") for line in md.splitlines())
    for line in md.splitlines():  # every table row keeps its header's columns
        if line.startswith("| kernel "):
            columns = line.count("|") - line.count("\\|")
        elif line.startswith("|") and "evil" in line:
            assert line.count("|") - line.count("\\|") == columns, line
