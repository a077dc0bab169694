"""What a run file holds and what is shown of it: a kernel's message is printable and of a stated length in
the run file, the terminal, the Markdown and `report`; a run file is checked on load, field by field, so a
hand-edited or forged one is one line and exit 2; compare does not call a head that cannot be compared
"no regression"."""
import json
import re

import pytest

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
    assert r.exit_code == 1 and "RuntimeError" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
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


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A passing run file of forward and backward, made once for the damage below."""
    path = tmp_path_factory.mktemp("run") / "good.json"
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "6", "--device", "cpu", "--no-db", "--no-isolate",
            "--dtype", "fp32", "--json", path)
    assert r.exit_code == 0, r.stderr[-2000:]
    return path


def _summary(d):
    return d["kernels"][0]["summary"]


@pytest.mark.parametrize("damage,message", [
    (lambda d: _summary(d).update(passed=-5), "summary.passed must be a count (an integer >= 0), got -5"),
    (lambda d: _summary(d).update(passed=_summary(d)["passed"] + 3), "add up to"),
    (lambda d: _summary(d).update(crashed=1), "more crashed and timed out cases than failed"),
    (lambda d: _summary(d).pop("seconds"), "summary is missing a field the schema requires: seconds"),
    (lambda d: _summary(d).update(regimes={"normal": {"cases": "3", "failed": 0}}),
     "summary.regimes['normal'].cases must be a count"),
    (lambda d: _summary(d).update(fp8={"e4m3": {"cases": 1, "failed": 0}}), "which is not 3 words"),
    (lambda d: d["kernels"][0]["stats"][0].pop("max_abs"), "stats[0] is missing a field the schema requires: max_abs"),
    (lambda d: d["kernels"][0]["stats"][0].update(max_abs=None), "stats[0].max_abs must be a number, got None"),
    (lambda d: d["kernels"][0]["gradcheck"][0].pop("allowed"), "gradcheck[0] is missing a field"),
    (lambda d: d["environment"].update(gpus=[{"name": 5}]), "environment.gpus[0] is missing a field"),
    (lambda d: d.pop("command"), "the file is missing a field the schema requires: command"),
])
def test_a_damaged_run_file_is_one_line_and_exit_2_wherever_it_is_read(good, tmp_path, damage, message):
    data = read_json(good)
    damage(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    for command in (("report", tmp_path / "bad.json"), ("report", tmp_path / "bad.json", "--format", "md"),
                    ("compare", good, tmp_path / "bad.json")):
        r = cli(*command)
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], (command, r.stderr)
        assert "own error" not in r.stderr


@pytest.mark.parametrize("damage", [
    lambda rows: [r for r in rows if r["tensor"] != "dq"],  # a tensor the head no longer checks
    lambda rows: [{**r, **{s: "nan" for s in ("usage_max", "max_abs", "mean_abs")}} for r in rows],  # no values
])
def test_compare_with_a_head_that_cannot_give_the_bases_statistics_is_not_a_pass(good, tmp_path, damage):
    data = read_json(good)
    data["kernels"][0]["stats"] = damage(data["kernels"][0]["stats"])
    (tmp_path / "head.json").write_text(json.dumps(data))
    r = cli("compare", good, tmp_path / "head.json")
    assert r.exit_code == 2 and r.stdout.startswith("NOT COMPARED: no regression among the rows compared, but "), \
        r.stdout[:500]
    assert "could not give): the head is not shown to be no worse" in r.stderr, r.stderr
    assert cli("compare", good, good).exit_code == 0
