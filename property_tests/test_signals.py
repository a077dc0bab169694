"""A stop by any of the signals a machine sends loses nothing: SIGHUP as SIGTERM, a stop before the first
case, a stop of a repro whose kernel hangs."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from faverify.cases.case import Case
from property_tests.cli_helpers import end_marked, marked


def _start(*args, cwd):
    return subprocess.Popen([sys.executable, "-m", "faverify", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, start_new_session=True,
                            env={**os.environ,
                                 "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})


def _wait_for(path, seconds=60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.05)
    return path.exists()


def _catches(pid: int, signum: int, seconds: float = 60.0) -> bool:
    """Wait until the process has a handler for `signum` (its SigCgt mask in /proc), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return False
        if caught >> (signum - 1) & 1:
            return True
        time.sleep(0.001)
    return False


def test_sighup_stops_a_fuzz_and_its_run_is_written(tmp_path):
    out = tmp_path / "run.json"
    p = _start("fuzz", "--kernel", "sdpa-math", "--iters", "100000", "--device", "cpu", "--no-db", "--json", str(out),
               cwd=tmp_path)
    time.sleep(8)  # imported, running cases
    p.send_signal(signal.SIGHUP)
    p.wait(timeout=120)
    run = json.loads(out.read_text())
    assert run["settings"]["interrupted"] is True and p.returncode in (1, 2), p.stderr.read()


def test_a_stop_in_the_first_moment_still_writes_the_run(tmp_path):
    """SIGTERM while faverify is still importing and loading the kernel: an empty run, marked interrupted."""
    out = tmp_path / "run.json"
    p = _start("fuzz", "--kernel", "sdpa-math", "--iters", "5", "--device", "cpu", "--no-db", "--json", str(out),
               cwd=tmp_path)
    # as soon as it catches SIGTERM (record_early, its first step): before that no Python program can, and a
    # fixed delay lands there when a loaded machine starts the interpreter slowly
    assert _catches(p.pid, signal.SIGTERM), "faverify never set a SIGTERM handler"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    stderr = p.stderr.read()
    assert out.exists() and json.loads(out.read_text())["settings"]["interrupted"] is True, stderr
    assert "Traceback" not in stderr


def _marked(mark: str) -> list:
    """The processes whose environment carries the mark: the CLI, its forkserver and the workers it forked."""
    return marked(mark)


def _stop_a_hanging_kernel(args: list, mark: str, stop: int, tmp_path) -> tuple:
    """Run `faverify ARGS` with the mark, wait until its worker runs the hanging kernel, send it `stop`, and
    return its exit code and stderr once every process it started has ended (the test fails if any is
    left)."""
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1],
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    p = subprocess.Popen([sys.executable, "-m", "faverify", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 120
        # the CLI, the resource tracker, the forkserver, the worker
        while time.monotonic() < deadline and len(_marked(mark)) < 4:
            time.sleep(0.2)
        assert len(_marked(mark)) >= 4
        time.sleep(2)  # inside the kernel's sleep
        p.send_signal(stop)
        p.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _marked(mark):
            time.sleep(0.2)
        left = [open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:80] for pid in _marked(mark)]
        assert left == [], left
        return p.returncode, p.stderr.read()
    finally:
        p.kill()
        end_marked(mark)


def test_sigterm_to_a_repro_of_a_hanging_kernel_ends_its_worker(tmp_path):
    mark = f"FAVERIFY_TEST_MARK=repro-{os.getpid()}-{time.monotonic_ns()}"
    _stop_a_hanging_kernel(["repro", "--kernel", "property_tests.planted:hangs", "--device", "cpu", "--case",
                            Case(1, 128, 4, 1, 1, 8).to_json()], mark, signal.SIGTERM, tmp_path)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_of_golden_verify_ends_its_worker_the_forkserver_and_the_resource_tracker(tmp_path, stop):
    mark = f"FAVERIFY_TEST_MARK=golden-{os.getpid()}-{time.monotonic_ns()}"
    code, stderr = _stop_a_hanging_kernel(["golden", "verify", "--kernel", "property_tests.planted:hangs",
                                           "--device", "cpu", "--only", "masked-rows-203x113"], mark, stop, tmp_path)
    assert code == 128 + stop and f"stopped by {signal.Signals(stop).name}" in stderr, stderr
    assert "Traceback" not in stderr


def test_a_stop_whose_keyboard_interrupt_was_lost_still_stops_the_run():
    """Python drops a KeyboardInterrupt raised inside a garbage-collector callback (Hypothesis keeps one):
    the stop is recorded, and the run stops after the case in progress, marked interrupted."""
    from faverify.cases.strategies import limits_for
    from faverify.run import signals
    from faverify.run.fuzz import run
    from faverify.run.plan import FuzzPlan, Judging
    from faverify.run.request import FuzzRun, subject_plan
    from faverify.subjects import resolve

    seen = []

    def progress_factory(name):
        def progress(result):
            seen.append(result)
            if len(seen) == 2:
                signals._requested.set()  # the handler ran; its KeyboardInterrupt went nowhere
        return progress

    plan = FuzzPlan(iters=30, seed=0, dtypes=("fp32",), limits=limits_for("cpu"), database=None,
                    gradcheck_every=0)
    with signals.sigterm_interrupts():
        signals._requested.clear()
        doc = run(FuzzRun("test", plan, (subject_plan(resolve("sdpa-math"), plan),), ["cpu"], Judging(mode="fwd"),
                          isolate=False), progress_factory)
    assert doc.settings["interrupted"] is True and len(seen) == 2
    assert doc.kernels[0]["summary"]["cases"] == 2


def test_a_dropped_stop_prints_no_traceback(monkeypatch):
    """Python reports an exception it had to drop (in a garbage-collector callback) through
    sys.unraisablehook, as a traceback: for the stop's KeyboardInterrupt, recorded already, it says nothing;
    anything else goes to the hook as before."""
    import types

    from faverify.run import signals

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: reported.append(report.exc_type))
    with signals.sigterm_interrupts():
        signals._requested.set()
        for kind in (KeyboardInterrupt, ValueError):
            sys.unraisablehook(types.SimpleNamespace(exc_type=kind, exc_value=kind(), exc_traceback=None,
                                                     err_msg="Exception ignored in", object=None))
    assert reported == [ValueError]


def test_a_stopped_fuzz_has_the_entry_point_leave_without_the_teardown(tmp_path, monkeypatch):
    """A fuzz stopped after its run was written returns its exit code as a Stopped, which cli.main ends the
    process with at once (an interrupt can leave a lock held inside a library, on which the interpreter's
    teardown would wait for ever); a run that was not stopped returns a plain code."""
    from faverify.cli import app
    from faverify.cli.app import Stopped
    from faverify.run import fuzz

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    args = ["fuzz", "--kernel", "sdpa-math", "--iters", "3", "--seed", "1", "--device", "cpu", "--no-isolate",
            "--no-db", "--json", str(tmp_path / "run.json")]
    assert type(app(args, standalone_mode=False)) is int
    monkeypatch.setattr(fuzz, "fuzz_subject", stopped)
    code = app(args, standalone_mode=False)
    assert isinstance(code, Stopped) and code == 2
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["interrupted"] is True


def test_a_run_goes_through_its_stages_in_order_and_a_stop_skips_those_that_measure(tmp_path, monkeypatch):
    """run(request, progress): start, replay the stored examples, draw and evaluate, group, shrink, confirm,
    then save. A stop in the draw skips the grouping, the shrink and the replays of the failures, and the
    store is still saved."""
    import inspect

    from faverify.cli import app
    from faverify.run import examples, fuzz

    assert list(inspect.signature(fuzz.run).parameters) == ["fuzz", "progress"]
    ran, stage, save = [], fuzz.Stop.stage, examples.save

    def recording(self, step, *args):
        ran.append((step.__name__, self.stopped))
        return stage(self, step, *args)
    monkeypatch.setattr(fuzz.Stop, "stage", recording)
    monkeypatch.setattr(examples, "save", lambda *a, **k: ran.append(("save", None)) or save(*a, **k))
    args = ["fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "6", "--seed", "1", "--device",
            "cpu", "--no-isolate", "--dtype", "fp32", "--gradcheck-every", "0", "--shrink-budget", "4", "--db",
            str(tmp_path / "db"), "--json", str(tmp_path / "run.json")]
    assert app(args, standalone_mode=False) == 1
    stages = ["start", "replay", "draw_and_evaluate", "group", "shrink", "confirm"]
    assert ran == [(s, False) for s in stages] + [("save", None)], ran
    ran.clear()

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(fuzz, "fuzz_subject", stopped)
    app(args, standalone_mode=False)
    assert ran == [(s, s not in stages[:3]) for s in stages] + [("save", None)], ran
