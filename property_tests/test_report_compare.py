"""report and compare, and the CI example of docs/ci.md."""
import json
import re
import shlex
from pathlib import Path

import pytest

from property_tests.cli_helpers import assert_commands_exist, cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    for name, kernel in (("good", "sdpa-math"), ("again", "sdpa-math"), ("bad",
                                                                         "property_tests.planted:top_left_mask")):
        cli("fuzz", "--kernel", kernel, "--iters", "40", "--device", "cpu", "--no-db", "--seed", "4",
            "--no-isolate", "--json", d / f"{name}.json")
    return d


def test_report_renders_markdown_and_tables(runs):
    md = cli("report", runs / "good.json", "--format", "md")
    assert md.exit_code == 0
    assert "| sdpa-math" in md.stdout and "## Error statistics" in md.stdout and "tolerance:" in md.stdout
    assert re.search(r"^\|:-+\|-+:\|", md.stdout, re.M)  # pipe table: text left, numbers right aligned
    table = cli("report", runs / "bad.json")
    assert table.exit_code == 0 and "faverify repro --kernel property_tests.planted:top_left_mask" in table.stdout


def test_the_report_starts_with_the_verdict_and_the_first_failures_reproducer(runs, tmp_path):
    bad = cli("report", runs / "bad.json", "--format", "md").stdout.splitlines()
    assert bad[0].startswith("**FAIL**: ") and "distinct failure" in bad[0] and "top_left_mask" in bad[0]
    assert " sq" in bad[0] and " sk" in bad[0]  # the minimal case in words
    assert bad[1].startswith("reproduce: `faverify repro --kernel property_tests.planted:top_left_mask")
    good = cli("report", runs / "good.json").stdout.splitlines()
    assert good[0] == "PASS: 40 cases of sdpa-math within tolerance of the FP64 reference"
    cli("fuzz", "--kernel", "property_tests.planted:declines_fp32", "--dtype", "fp32", "--iters", "3", "--device",
        "cpu", "--no-db", "--no-isolate", "--json", tmp_path / "none.json")
    assert cli("report", tmp_path / "none.json").stdout.startswith("NOTHING RAN: every case of")


def test_the_report_splits_the_allowed_error_into_floor_and_baseline(runs):
    data = json.loads((runs / "bad.json").read_text())
    rows = data["kernels"][0]["stats"]
    assert all(0 <= float(r["floor_share_p50"]) <= 1 for r in rows if r["cases"] > r["waived"])
    minimal = data["kernels"][0]["failures"][0]["minimal"]["metrics"]["out"]
    assert 0 < minimal["floor"] <= minimal["allowed"]
    text = cli("report", runs / "bad.json").stdout
    assert "floor share p50" in text and "floor share" in text.split("== Failures")[1]  # the failure's table


def _as_version_1(data: dict) -> dict:
    """A run file as version 1 wrote it: no floor split, no tight floor."""
    data["version"] = 1
    data["tolerance"].pop("tight")
    for k in data["kernels"]:
        for r in k["stats"]:
            r.pop("floor_share_p50")
        for f in k["failures"]:
            for which in ("first", "minimal"):
                for m in f[which]["metrics"].values():
                    m.pop("floor")
    return data


def test_version_1_run_files_are_still_read(runs, tmp_path):
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(_as_version_1(json.loads((runs / "bad.json").read_text()))))
    r = cli("report", old)
    assert r.exit_code == 0 and "top_left_mask" in r.stdout
    r = cli("compare", old, runs / "bad.json")
    assert r.exit_code in (0, 1) and "version" not in r.stderr


def test_two_runs_of_the_same_kernel_compare_clean(runs):
    r = cli("compare", runs / "good.json", runs / "again.json")
    assert r.exit_code == 0 and r.stdout.startswith("no regression: the head is not worse (0 newly failing (!), "
                                                    "0 worse (+);")


def test_a_worse_kernel_is_marked_worse_and_newly_failing_and_those_lead(runs):
    r = cli("compare", runs / "good.json", runs / "bad.json", "--format", "md")
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0] == "### faverify: numerics comparison"
    assert lines[2].startswith("REGRESSION: the head is worse (")
    rows = [line for line in lines if line.startswith("| sdpa-math -> ")]
    marks = [line.rstrip("| ").split("|")[-1].strip() for line in rows]
    assert marks[0] == "!" and "+" in marks
    assert marks == sorted(marks, key=["!", "+", "-", "x", ""].index)  # newly failing, then worse, then better


def test_a_different_gpu_is_not_comparable(runs, tmp_path):
    other = json.loads((runs / "again.json").read_text())
    other["environment"]["gpus"] = [{"index": 0, "name": "Other GPU", "capability": "8.0", "memory_gib": 80}]
    (tmp_path / "other.json").write_text(json.dumps(other))
    r = cli("compare", runs / "good.json", tmp_path / "other.json")
    assert r.exit_code == 2 and "nothing was compared" in r.stderr, r.stderr  # a CI gate that compared nothing
    marks = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("sdpa-math ")]
    assert marks and set(marks) == {"x"}
    assert "GPUs: none -> Other GPU" in r.stdout


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(version=99), "run schema version 99"),
    (lambda d: d.update(schema="other"), "is not a faverify run file"),
    (lambda d: d.pop("kernels"), "missing a field"),
])
def test_malformed_or_wrong_version_files_exit_2(runs, tmp_path, mutate, message):
    data = json.loads((runs / "good.json").read_text())
    mutate(data)
    (tmp_path / "x.json").write_text(json.dumps(data))
    r = cli("compare", runs / "good.json", tmp_path / "x.json")
    assert r.exit_code == 2 and message in r.stderr
    (tmp_path / "broken.json").write_text("{not json")
    r = cli("report", tmp_path / "broken.json")
    assert r.exit_code == 2 and "not valid JSON" in r.stderr


def test_every_command_and_flag_of_the_ci_example_exists():
    text = (ROOT / "docs" / "ci.md").read_text()
    yaml = re.search(r"```yaml\n(.+?)\n```", text, re.S).group(1)
    calls = re.findall(r"faverify ([^&|>\n]+)", yaml)
    assert len(calls) >= 3
    assert_commands_exist(calls)


def test_the_ci_example_run_twice_in_one_directory_compares_clean(tmp_path, monkeypatch):
    """The example fuzzes base and head in one directory, so the second run finds the first one's example
    store. A kernel compared with itself must come out clean (exit 0): the seeded draw does not depend on
    the store, whose replayed cases are reported apart. The planted kernel fails, so the store is filled."""
    text = (ROOT / "docs" / "ci.md").read_text()
    yaml = re.search(r"```yaml\n(.+?)\n```", text, re.S).group(1)
    fuzzes = [shlex.split(c.strip()) for c in re.findall(r"faverify (fuzz [^&|>\n]+)", yaml)]
    compare = shlex.split(re.search(r"faverify (compare [^&|>\n]+)", yaml).group(1).split(">")[0])
    assert len(fuzzes) == 2
    monkeypatch.chdir(tmp_path)
    swap = {"--kernel": "property_tests.planted:wrong_scale", "--iters": "24", "--device": "cpu"}
    results = []
    for words in fuzzes:
        words = [swap.get(words[i - 1], w) if i else w for i, w in enumerate(words)]
        results.append(cli(*words, "--shrink-budget", "5"))
    assert all(r.exit_code == 1 for r in results), [r.stderr[-500:] for r in results]  # the planted bug
    assert "replayed first from the example store" in results[1].stdout
    assert any((tmp_path / ".faverify" / "examples").iterdir())
    r = cli(*compare)
    assert r.exit_code == 0 and "no regression" in r.stdout, r.stdout
