"""What a subject starts ends with its worker: no process of the kernel's outlives the run."""
import os
import subprocess
import sys
import time

from property_tests.cli_helpers import cli, end_marked, marked


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


def test_a_daemon_the_subject_starts_in_a_session_of_its_own_ends_with_the_run(tmp_path):
    """A double fork into a new session leaves the worker's process group; the worker adopts it, so it ends
    with the worker, and the forkserver and the resource tracker, whose pipes it held, end with the run."""
    mark = f"FAVERIFY_TEST_MARK=daemon-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1],
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    try:
        with open(tmp_path / "out.txt", "w") as out:  # a file, not a pipe: the daemon holds it open, a pipe's
            r = subprocess.run([sys.executable, "-m", "faverify", "fuzz", "--kernel",  # reader would wait
                                "property_tests.planted_trust:leaves_a_daemon", "--iters", "2", "--device", "cpu",
                                "--no-db", "--mode", "fwd"], env=env, cwd=tmp_path, stdout=out,
                               stderr=subprocess.STDOUT, timeout=300)
        assert r.returncode == 0, (tmp_path / "out.txt").read_text()[-2000:]
        deadline = time.monotonic() + 10
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:80] for pid in marked(mark)]
        assert left == [], left
    finally:
        end_marked(mark)
