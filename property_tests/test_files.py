"""The files faverify reads and writes: only regular files are read, and at most files.READ_LIMIT bytes of
them; every file is written whole or not at all, through no planted link, and a write the system refuses
is one line naming the path and the errno, exit 2, with nothing left behind."""
import json
import os
import resource
import subprocess
import sys

import pytest

from faverify.cases.case import Case
from property_tests.cli_helpers import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = Case(1, 3, 5, 1, 1, 8, dtype="fp32", seed=1).to_json()


def _faverify(*args, cwd, file_size=None, seconds=120):
    """faverify in a process of its own: a write past `file_size` bytes fails as on a full disk (EFBIG;
    Python ignores SIGXFSZ), and the process may hold at most 4 GiB, so a read without bound ends."""
    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    return subprocess.run([sys.executable, "-m", "faverify", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=seconds, preexec_fn=limits, env={**os.environ, "PYTHONPATH": ROOT})


def _one_line_exit_2(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (r.returncode, r.stderr)
    assert "own error" not in r.stderr


@pytest.mark.parametrize("args", [("report", "/dev/zero"), ("repro", "--kernel", "sdpa-math", "--device", "cpu",
                                                            "--case", "@/dev/zero")])
def test_a_device_given_as_a_file_is_refused_not_read(tmp_path, args):
    _one_line_exit_2(_faverify(*args, cwd=tmp_path, seconds=60), "/dev/zero", "is not a regular file")


def test_a_fifo_given_as_a_run_file_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "run.json")
    _one_line_exit_2(_faverify("report", tmp_path / "run.json", cwd=tmp_path, seconds=60), "is not a regular file")


def test_a_file_past_the_read_limit_is_refused(tmp_path, monkeypatch):
    from faverify import files
    (tmp_path / "big.json").write_text(json.dumps({"schema": "faverify.run", "pad": "x" * 5000}))
    monkeypatch.setattr(files, "READ_LIMIT", 4096)
    r = cli("report", tmp_path / "big.json")
    assert r.exit_code == 2 and "is larger than 4,096 bytes" in r.stderr, r.stderr


def test_repro_standalone_writes_its_inputs_through_no_planted_link(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    os.symlink(outside, tmp_path / "sa.pt")
    r = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--no-isolate", "--case", CASE, "--standalone",
            tmp_path / "sa.py")
    assert r.exit_code == 0, r.stderr
    assert outside.read_text() == "keep" and not (tmp_path / "sa.pt").is_symlink()
    assert (tmp_path / "sa.pt").stat().st_size > 0 and "def main" in (tmp_path / "sa.py").read_text()


def test_repro_standalone_whose_inputs_path_is_a_directory_is_refused_before_it_runs(tmp_path):
    (tmp_path / "sa.pt").mkdir()
    r = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--no-isolate", "--case", CASE, "--standalone",
            tmp_path / "sa.py")
    assert r.exit_code == 2 and "sa.pt" in r.stderr and "is a directory" in r.stderr, r.stderr
    assert "verdict" not in r.stderr and not (tmp_path / "sa.py").exists()


def test_golden_record_over_an_index_it_cannot_read_keeps_it(tmp_path):
    (tmp_path / "index.json").write_text("not an index")
    r = cli("golden", "record", "--dir", tmp_path, "--only", "one-key")
    assert r.exit_code == 2 and "index.json: not valid JSON" in r.stderr, r.stderr
    assert (tmp_path / "index.json").read_text() == "not an index" and not (tmp_path / "cases").exists()


def _left_behind(directory) -> list:
    """Files a failed write left: temporaries, and empty or partial outputs."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_a_write_the_disk_refuses_is_one_line_naming_the_file_and_the_errno(tmp_path):
    r = _faverify("golden", "record", "--dir", tmp_path / "golden", "--only", "one-key", cwd=tmp_path,
                  file_size=1000)
    _one_line_exit_2(r, "one-key.npz", "cannot be written", "EFBIG")
    assert _left_behind(tmp_path / "golden") == []
    r = _faverify("repro", "--kernel", "sdpa-math", "--device", "cpu", "--no-isolate", "--case", CASE,
                  "--standalone", tmp_path / "out" / "sa.py", cwd=tmp_path, file_size=1000)
    assert r.returncode == 2 and "sa.pt: cannot be written (File too large, EFBIG)" in r.stderr, r.stderr
    assert "own error" not in r.stderr and _left_behind(tmp_path / "out") == []


def test_a_directory_where_golden_record_writes_a_file_is_exit_2(tmp_path):
    (tmp_path / "cases" / "one-key.npz").mkdir(parents=True)
    r = cli("golden", "record", "--dir", tmp_path, "--only", "one-key")
    assert r.exit_code == 2 and "one-key.npz: cannot be written (Is a directory, EISDIR)" in r.stderr, r.stderr
    assert "own error" not in r.stderr and _left_behind(tmp_path) == []
