"""What a command prints: the report on stdout, progress and warnings on stderr, the files asked for written
before the report, and a stream nobody can write costing nothing else (faverify/streams.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from property_tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parent.parent
FAST = ("--iters", "3", "--seed", "1", "--device", "cpu", "--no-db", "--dtype", "fp32")


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` in bash, the venv's faverify first on PATH, the planted subjects importable."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}
    return subprocess.run(["bash", "-c", "set -o pipefail; " + command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_report_goes_to_stdout_and_the_progress_to_stderr(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:correct", *FAST, "--no-isolate", "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("PASS: 3 cases") and "== Summary" in r.stdout, r.stdout[:500]
    assert "PASS" not in r.stderr and "cases/s" in r.stderr, r.stderr  # the progress line of _Lines


@pytest.mark.slow
@pytest.mark.parametrize("redirect", ["2>/dev/full", "2>&-", "2>&1 | head -n 1", ">/dev/full", ">&-", "| true"])
def test_a_stream_nobody_can_write_loses_neither_the_run_file_nor_the_exit_code(tmp_path, redirect):
    """A correct kernel's fuzz, its stderr or stdout full, closed, or a pipe whose reader has gone: exit 0,
    and the run file whole; a full stdout is told on stderr."""
    r = shell("faverify fuzz --kernel property_tests.planted:correct " + " ".join(FAST) + " --json run.json "
              + redirect + (" 2>err.txt" if redirect.startswith((">", "|")) else ""), tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["kernels"][0]["summary"]["passed"] == 3
    if redirect == ">/dev/full":
        assert "the report could not be written to stdout (No space left on device)" in \
            (tmp_path / "err.txt").read_text()


def test_fuzz_writes_its_files_before_it_prints_the_report(tmp_path, monkeypatch):
    """When the report is printed, the run file and the Markdown are already whole on disk."""
    from faverify.cli import fuzz
    seen = []

    def show(text):
        seen.append(((tmp_path / "r.json").exists(), (tmp_path / "r.md").exists()))
    monkeypatch.setattr(fuzz, "show", show)
    r = cli("fuzz", "--kernel", "property_tests.planted:correct", *FAST, "--no-isolate", "--json", tmp_path / "r.json",
            "--markdown", tmp_path / "r.md")
    assert r.exit_code == 0 and seen == [(True, True)], (seen, r.stderr)


@pytest.mark.slow
def test_the_reproduce_line_pasted_into_a_shell_runs_the_reproducer_and_exits_1(tmp_path):
    """The line after `reproduce: ` is a command and nothing else; the hint about --plot is a line of its own."""
    r = shell("faverify fuzz --kernel property_tests.planted:wrong_scale --iters 30 --seed 1 --device cpu --no-db "
              "--dtype fp32 >out.txt 2>err.txt", tmp_path)
    assert r.returncode == 1, (tmp_path / "err.txt").read_text()[-2000:]
    report = (tmp_path / "out.txt").read_text()
    line = next(line for line in report.splitlines() if line.startswith("reproduce: "))
    assert any(line.startswith("to see where its error sits") and "--plot" in line for line in report.splitlines())
    again = shell(line.removeprefix("reproduce: "), tmp_path)
    assert again.returncode == 1 and "verdict: fail" in again.stdout, (line, again.stdout[-1000:], again.stderr[-1000:])
