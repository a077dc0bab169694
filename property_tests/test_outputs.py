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
    """The disk fills up after the check: the Markdown is still written, the report is printed, and the
    error names the file that could not be written; the old file is left whole."""
    (tmp_path / "run.json").write_text("old")
    real = os.replace

    def full(src, dst):
        if str(dst).endswith("run.json"):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", full)
    r = cli("fuzz", *FAST, "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md")
    assert r.exit_code == 2 and "could not write --json" in r.stderr and "No space left" in r.stderr, r.stderr
    assert r.stdout.startswith("PASS:")
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


def test_golden_record_and_the_example_store_write_through_no_planted_link(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    golden = tmp_path / "golden"
    (golden / "cases").mkdir(parents=True)
    os.symlink(outside, golden / "cases" / "one-key.npz")
    os.symlink(outside, golden / "index.json")
    r = cli("golden", "record", "--dir", golden, "--only", "one-key")
    assert r.exit_code == 0 and outside.read_text() == "keep", r.stderr
    assert not (golden / "index.json").is_symlink() and json.loads((golden / "index.json").read_text())["cases"]
    store = tmp_path / "db"
    store.mkdir()
    from faverify.cases.case import Case
    from faverify.run import examples
    path = examples._file(store, "k")
    os.symlink(outside, path)
    examples.save(store, "k", [Case(1, 1, 1, 1, 1, 8)])
    assert outside.read_text() == "keep" and examples.load(store, "k") == [Case(1, 1, 1, 1, 1, 8)]


@pytest.mark.parametrize("file", ["../../outside/x.npz", "/etc/passwd"])
def test_a_golden_index_naming_a_file_outside_its_folder_is_refused(tmp_path, file):
    golden = tmp_path / "golden"
    assert cli("golden", "record", "--dir", golden, "--only", "one-key").exit_code == 0
    index = json.loads((golden / "index.json").read_text())
    index["cases"][0]["file"] = file
    (golden / "index.json").write_text(json.dumps(index))
    r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", golden)
    assert r.exit_code != 0 and "inside" in (r.stderr + r.stdout) and "Traceback" not in r.stderr, r.stderr


def test_two_runs_sharing_a_store_keep_each_others_cases(tmp_path):
    from faverify.cases.case import Case
    from faverify.run import examples
    a, b = Case(1, 1, 2, 1, 1, 8), Case(1, 2, 2, 1, 1, 8)
    examples.save(tmp_path, "k", [a])
    examples.save(tmp_path, "k", [b])  # a run that did not replay a: a stays
    assert set(examples.load(tmp_path, "k")) == {a, b}
    examples.save(tmp_path, "k", [], passed=[a])  # a run that replayed a and saw it pass: a leaves
    assert examples.load(tmp_path, "k") == [b]
    (tmp_path / examples._file(tmp_path, "k").name).write_text("[" * 5000 + "\n" + b.to_json() + "\n")
    assert examples.load(tmp_path, "k") == [b]  # a line too deep to be a case is passed over


@pytest.mark.parametrize("mutate", [
    lambda d: d["kernels"][0]["summary"].update(skip_reasons=5),
    lambda d: d["kernels"][0]["summary"].update(per_device=[1, 2]),
    lambda d: d["kernels"][0]["stats"][0].update(series=7),
    lambda d: d.update(version=5),
])
def test_merging_shards_with_fields_of_the_wrong_type_is_exit_2(tmp_path, mutate):
    for i in range(2):
        cli("fuzz", "--kernel", "sdpa-math", "--iters", "4", "--device", "cpu", "--no-db", "--mode", "fwd",
            "--shard", f"{i}/2", "--json", tmp_path / f"s{i}.json")
    data = json.loads((tmp_path / "s1.json").read_text())
    mutate(data)
    (tmp_path / "s1.json").write_text(json.dumps(data))
    r = cli("merge", tmp_path / "s0.json", tmp_path / "s1.json")
    assert r.exit_code == 2 and "Traceback" not in r.stderr and "own error" not in r.stderr, r.stderr


def test_a_run_file_nested_too_deeply_is_exit_2(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    r = cli("report", tmp_path / "deep.json")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
