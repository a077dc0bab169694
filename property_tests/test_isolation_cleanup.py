"""What a subject starts ends with its worker: no process of the kernel's outlives the run."""
import subprocess
import time

from property_tests.cli_helpers import cli


def _left() -> list:
    found = subprocess.run(["pgrep", "-f", "sleep 301.7"], capture_output=True, text=True)
    return found.stdout.split()


def test_a_subjects_child_processes_end_with_the_run():
    r = cli("fuzz", "--kernel", "property_tests.planted_trust:leaves_a_child", "--iters", "3", "--device", "cpu",
            "--no-db", "--mode", "fwd")
    assert r.exit_code == 0, r.stderr
    deadline = time.monotonic() + 5
    while _left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _left() == []
