"""Crash isolation: a subject that kills its process or hangs is a failing case, and the run finishes."""
import dataclasses
import json
import time

import pytest

from faverify.cases.case import Case
from faverify.run.isolation import Worker
from faverify.run.plan import Judging
from property_tests.cli_helpers import cli, read_json


def test_a_faulting_subject_is_a_crash_and_the_run_goes_on(tmp_path):
    """Each crash costs a new worker (seconds to import torch): 6 cases, half of them causal, 2 shrink steps."""
    r = cli("fuzz", "--kernel", "property_tests.planted:segfaults", "--iters", "6", "--device", "cpu",
            "--shrink-budget", "2", "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    run = read_json(tmp_path / "run.json")["kernels"][0]
    assert run["summary"]["cases"] == 6  # every case ran, before and after the crashes
    assert run["summary"]["crashed"] >= 1 and run["summary"]["passed"] >= 1
    assert run["summary"]["worker_restarts"] >= 1
    crash = [f for f in run["failures"] if f["signature"] == "crash"][0]
    assert "died" in crash["minimal"]["reason"] and crash["minimal"]["case"]["causal"]


@pytest.mark.parametrize("isolate", [True, False])
def test_a_fault_that_surfaces_in_faverifys_code_is_the_subjects_crash(tmp_path, isolate):
    """A kernel's CUDA fault is reported at the next call that synchronizes, often faverify's own after the
    subject returned: it is the subject's crash, never faverify's error, and the process that lost its
    context runs nothing more (a fresh worker goes on; in one process, the cases after it are skipped)."""
    r = cli("fuzz", "--kernel", "property_tests.planted:faults_late", "--iters", "6", "--device", "cpu",
            "--shrink-budget", "2", *([] if isolate else ["--no-isolate"]), "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    run = read_json(tmp_path / "run.json")["kernels"][0]
    summary = run["summary"]
    assert summary["errors"] == 0 and summary["crashed"] >= 1, summary
    crash = [f for f in run["failures"] if f["signature"] == "crash"][0]
    assert crash["minimal"]["case"]["causal"]
    assert "CUDA context lost (the fault surfaced in faverify's code" in crash["minimal"]["reason"]
    if isolate:
        assert summary["passed"] >= 1 and summary["worker_restarts"] >= 1
    else:
        assert summary["passed"] + summary["crashed"] + summary["skipped"] == 6 and summary["skipped"] >= 1
        assert all("context was lost on an earlier case" in reason for reason in summary["skip_reasons"])


def test_a_subject_that_cannot_load_in_a_worker_for_the_machines_reason_stops_with_exit_2(tmp_path):
    """A missing toolchain in the workers is the machine's problem: one clear line and exit 2, never a crash
    of the kernel on every case."""
    r = cli("fuzz", "--kernel", "property_tests.planted_worker_load:correct", "--iters", "4", "--device", "cpu",
            "--no-db")
    assert r.exit_code == 2 and "could not load in a worker process" in r.stderr and "gcc" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "crash" not in r.stderr, r.stderr


def test_a_hanging_subject_times_out_and_the_run_goes_on(tmp_path):
    """Each hang costs the timeout and a new worker: 4 cases (2 of them hang) and one shrink step."""
    r = cli("fuzz", "--kernel", "property_tests.planted:hangs", "--iters", "4", "--device", "cpu",
            "--max-seqlen", "200", "--timeout", "2", "--shrink-budget", "1", "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    run = read_json(tmp_path / "run.json")["kernels"][0]
    assert run["summary"]["cases"] == 4 and 1 <= run["summary"]["timed_out"] < 4
    hang = [f for f in run["failures"] if f["signature"] == "timeout"][0]
    assert hang["minimal"]["case"]["seqlen_q"] > 100 and "no result within 2 s" in hang["minimal"]["reason"]


def test_worker_results_match_in_process_results():
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve
    case = Case(2, 33, 17, 4, 2, 40, dtype="fp16", causal=True, seed=3)
    w = Worker("sdpa-math", "cpu", Judging(timeout=60))
    try:
        start = time.monotonic()
        remote = w.evaluate(case)
        again = w.evaluate(case)
        round_trip = time.monotonic() - start
    finally:
        w.stop()
    local = evaluate(resolve("sdpa-math"), case, "cpu")
    assert remote.status == local.status == "pass"
    # the round trip beyond the worker's own time on the case is the case's "transfer" phase
    assert 0 < again.phases["transfer"] and again.phases["transfer"] + again.seconds < round_trip
    assert "transfer" not in local.phases
    # a case's time per phase: the FP64 reference, the naive baseline and the metrics each their own
    assert {"inputs", "subject", "reference", "baseline", "metrics"} <= set(local.phases) <= set(remote.phases)
    assert json.dumps({t: m.max_abs for t, m in remote.metrics.items()}) == \
        json.dumps({t: m.max_abs for t, m in local.metrics.items()})


def test_parallel_workers_give_the_same_cases_as_one(tmp_path):
    """In parallel mode the set of cases depends on the seed only, not on the number of workers (one worker
    runs the sequential mode, which also steers toward the tolerance edge and so draws differently)."""
    stats = []
    for workers in (2, 3):
        cli("fuzz", "--kernel", "sdpa-math", "--iters", "24", "--device", "cpu", "--no-db", "--seed", "3",
            "--workers", str(workers), "--gradcheck-every", "0", "--max-seqlen", "32",
            "--json", tmp_path / f"{workers}.json")
        kernel = read_json(tmp_path / f"{workers}.json")["kernels"][0]
        stats.append(sorted((r["dtype"], r["tensor"], r["cases"], r["max_abs"]) for r in kernel["stats"]))
        assert kernel["summary"]["ms_per_case"]["draw"] > 0  # the drawing thread's time, a phase of its own
    assert stats[0] == stats[1]


def test_interrupted_runs_still_write_their_results(tmp_path, monkeypatch):
    from faverify.run import fuzz

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(fuzz, "fuzz_subject", interrupted)
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "5", "--device", "cpu", "--no-isolate",
            "--json", tmp_path / "run.json")
    assert r.exit_code == 2 and "interrupted" in r.stderr
    assert read_json(tmp_path / "run.json")["settings"]["interrupted"] is True


def test_an_interrupted_parallel_run_still_lists_its_failures(tmp_path, monkeypatch):
    from faverify.run.scheduler import Pool
    original = Pool.map

    def map_some_then_interrupt(self, items, on_result):
        original(self, list(items)[:20], on_result)
        raise KeyboardInterrupt
    monkeypatch.setattr(Pool, "map", map_some_then_interrupt)
    r = cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "60", "--device", "cpu",
            "--workers", "2", "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    run = read_json(tmp_path / "run.json")["kernels"][0]
    assert run["summary"]["cases"] == 20 and run["summary"]["seconds"] > 0
    assert run["failures"] and all("interrupted" in f["note"] for f in run["failures"])


def test_warm_up_runs_cases_unjudged_in_the_workers():
    """Warm-up cases (parallel.warm_up) run in the workers without a verdict: a clean run is a skip marked
    warm-up, a raising one a failure that names the warm-up (the parent discards both)."""
    from faverify.run.isolation import Task, case_workers
    from faverify.run.scheduler import Pool
    pool = Pool(case_workers("property_tests.planted:raises_type_error", ["cpu"], 2, Judging(timeout=60)))
    got = {}
    cases = [Case(1, 9, 9, 2, 1, 16, causal=c, seed=i) for i, c in enumerate((False, True, False))]
    try:
        pool.map(((i, Task(c, warm=True)) for i, c in enumerate(cases)), lambda i, r: got.__setitem__(i, r))
    finally:
        pool.close()
    assert [(got[i].status, got[i].reason[:26]) for i in range(3)] == [
        ("skip", "warm-up"), ("fail", "warm-up raised TypeError: "), ("skip", "warm-up")]
    assert not got[0].metrics  # nothing judged


def test_workers_that_run_at_once_share_the_cores_between_their_threads(monkeypatch):
    """Each worker's torch would take a thread per core; workers side by side then fight over the cores
    (two sdpa-math workers on the 2-core CPU spent 25x one worker's time on the reference). A pool's
    workers take cores / workers threads each, at least one and at most OMP_NUM_THREADS where it is set;
    unset here, so a lone worker takes every core (this suite's workers fork from a server whose torch
    has the one thread conftest.py gives it)."""
    from faverify.run.isolation import Task, case_workers, thread_share
    from faverify.run.scheduler import Pool, cores
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert thread_share(1) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert thread_share(1) == cores() and thread_share(cores() + 5) == 1
    assert thread_share(2) == max(1, cores() // 2)
    for n in (1, 2):
        pool = Pool(case_workers("property_tests.planted:names_its_threads", ["cpu"], n, Judging(timeout=60)))
        got = {}
        try:
            pool.map(((i, Task(Case(1, 4, 4, 1, 1, 16, seed=i))) for i in range(n)),
                     lambda i, r: got.__setitem__(i, r))
        finally:
            pool.close()
        assert [got[i].reason.split("threads=")[-1] for i in range(n)] == [str(thread_share(n))] * n, got


def test_parallel_fuzz_warms_up_before_its_cases():
    from faverify.cases.strategies import limits_for
    from faverify.reports.case_result import CaseResult
    from faverify.reports.collector import KernelStats
    from faverify.run.parallel import Found, evaluate_drawn
    from faverify.run.plan import FuzzPlan

    class Recording:
        calls = []

        def retain(self, per_device):
            self.calls.append(("retain", per_device))

        def map(self, items, on_result):
            items = list(items)
            warm = all(task.warm for _, task in items)
            self.calls.append((warm, [task.case for _, task in items]))
            for i, task in items:
                on_result(i, CaseResult("x", task.case, "skip" if task.warm else "pass"))

    warm = [Case(1, 5, 5, 1, 1, 16), Case(1, 5, 5, 1, 1, 32)]
    stats = KernelStats("x")
    plan = FuzzPlan(iters=7, seed=1, dtypes=("fp16",), limits=limits_for("cpu"), database=None)
    evaluate_drawn(plan, Recording(), stats, Found(), warmup=warm, keep=3)
    assert [(w, len(c)) if w != "retain" else (w, c) for w, c in Recording.calls] == [
        (True, 2), ("retain", 3), (False, 7)]  # the warm-up's extra workers stop before the cases
    assert Recording.calls[0][1] == warm
    assert stats.cases == 7 and stats.summary()["warmup"]["cases"] == 2  # warm-up cases are not counted


def _warm_up_of(cases, plan):
    """The warm-up cases of a run of a subject whose warm-up is `cases(dtypes, features)`, under `plan`."""
    from faverify.run.request import SubjectPlan
    from faverify.subjects.base import Capabilities, Subject

    subject = Subject("x", fn=None, caps=Capabilities.of(dtypes=("bf16", "fp16", "fp32")), warmup=cases)
    return SubjectPlan(subject, plan).warmup_cases()


def test_warm_up_covers_the_gradient_checks_dtype():
    """The gradient check runs the subject in fp32 where it can: a fuzz of bf16 and fp16 that checks
    gradients also meets the fp32 variants, so its warm-up must compile them."""
    from faverify.cases.strategies import limits_for
    from faverify.run.plan import FuzzPlan

    def cases(dtypes, features):
        return [Case(1, 8, 8, 1, 1, 16, dtype=d) for d in dtypes]
    plan = FuzzPlan(iters=1, seed=0, dtypes=("bf16", "fp16"), limits=limits_for("cpu"), database=None)
    assert [c.dtype for c in _warm_up_of(cases, plan)] == ["bf16", "fp16", "fp32"]
    assert [c.dtype for c in _warm_up_of(cases, dataclasses.replace(plan, gradcheck_every=0))] == ["bf16", "fp16"]


def test_the_warm_up_is_asked_for_the_features_the_plan_draws():
    """A build for a feature the fuzz does not draw is compiled for nothing (a dense fuzz, or a mutant
    narrowed to one feature, paid for every variant's): the subject's warm-up gets the plan's features,
    narrowed where the plan narrows them."""
    from faverify.cases.strategies import limits_for
    from faverify.run.plan import FuzzPlan

    asked = []

    def cases(dtypes, features):
        return asked.append(features) or []
    plan = FuzzPlan(iters=1, seed=0, dtypes=("bf16",), limits=limits_for("cpu"), database=None, gradcheck_every=0)
    _warm_up_of(cases, plan)
    _warm_up_of(cases, dataclasses.replace(plan, features=("window", "bias")))
    _warm_up_of(cases, dataclasses.replace(plan, features=("window", "bias"), narrow={"features": ("window",)}))
    assert asked == [(), ("window", "bias"), ("window",)]


def test_cases_streamed_from_a_thread_are_the_seeds_cases():
    """A parallel fuzz takes its cases from Hypothesis drawing in a thread while workers run: the same
    cases in the same order as drawn in this thread (the shrink replays that order, parallel.shrink_by_replay)."""
    from faverify.cases.strategies import limits_for
    from faverify.run.draw import draw_cases, stream_cases
    from faverify.run.plan import FuzzPlan
    plan = FuzzPlan(iters=150, seed=11, dtypes=("bf16", "fp32"), limits=limits_for("cuda"), database=None)
    streamed = list(stream_cases(plan))
    assert len(streamed) == 150 and streamed == draw_cases(plan)
    first = next(iter(stream_cases(plan)))  # a consumer that stops early: no hang, the same first case
    assert first == streamed[0]


def test_a_signal_while_the_workers_stop_loses_nothing(tmp_path, monkeypatch):
    """SIGTERM (a CI timeout) that lands after the cases, while the workers are being stopped, is held:
    the run is written whole and marked interrupted, not lost with its results."""
    import os
    import signal

    from faverify.run.scheduler import Pool
    original = Pool.close

    def close_under_a_signal(self):
        os.kill(os.getpid(), signal.SIGTERM)
        original(self)
    monkeypatch.setattr(Pool, "close", close_under_a_signal)
    r = cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "8", "--device", "cpu",
            "--workers", "2", "--shrink-budget", "2", "--json", tmp_path / "run.json")
    run = read_json(tmp_path / "run.json")
    assert run["settings"]["interrupted"] is True and run["kernels"][0]["summary"]["cases"] == 8
    assert r.exit_code == 1 and "== Failures" in r.stdout  # the failures found, reported as usual


def test_sigterm_to_the_process_group_stops_a_long_parallel_fuzz_within_seconds(tmp_path):
    """As `timeout` sends it: to the CLI and its workers at once, while the seed's draw has far to go. The
    draw stops with the consumer (left drawing, it holds the interpreter's lock) and the CLI leaves
    without the interpreter's teardown once its results are written."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading
    import time

    out = tmp_path / "run.json"
    p = subprocess.Popen([sys.executable, "-m", "faverify", "fuzz", "--kernel", "sdpa-math", "--iters", "100000",
                          "--device", "cpu", "--workers", "2", "--no-db", "--json", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, text=True)
    lines: list = []
    def read() -> None:
        for line in p.stderr:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # the workers start and run cases: the first progress line (every 10 s, cli.common._Lines) counts some.
    # A fixed wait saw none within 15 s once, with the background compiles holding both cores of CI's machine
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(re.search(r"sdpa-math: [1-9]\d*/100000 cases", ln) for ln in lines):
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGTERM)
    start = time.monotonic()
    try:
        p.wait(timeout=20)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert time.monotonic() - start < 10, "the fuzz took more than 10 s to stop"
    reader.join(timeout=5)
    err = "".join(lines)
    assert p.returncode == 2 and "the results so far were written" in err, err[-2000:]
    run = read_json(out)
    assert run["settings"]["interrupted"] is True and 0 < run["kernels"][0]["summary"]["cases"] < 100000


def test_held_signals_are_recorded_not_raised():
    import os
    import signal

    from faverify.run.signals import held, sigterm_interrupts
    with sigterm_interrupts():
        with held() as received:
            os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
        with pytest.raises(KeyboardInterrupt):  # outside the held block SIGTERM interrupts again
            os.kill(os.getpid(), signal.SIGTERM)


def test_failures_shrunk_at_once_match_those_shrunk_one_by_one(tmp_path, monkeypatch):
    """shrink.shrink_all shrinks each distinct failure in a thread with a worker of its own; the minimal
    cases are the ones a one-at-a-time shrink finds."""
    from faverify.run import shrink
    found = {}
    monkeypatch.setattr(shrink, "cores", lambda: 64)  # as on a GPU host (this machine has 2)
    for parallel in (1, 64):
        monkeypatch.setattr(shrink, "MAX_PARALLEL_SHRINKS", parallel)
        cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "30", "--device", "cpu", "--no-db",
            "--workers", "3", "--shrink-budget", "25", "--gradcheck-every", "0", "--all-failures",
            "--max-seqlen", "32", "--json", tmp_path / "r.json")
        failures = read_json(tmp_path / "r.json")["kernels"][0]["failures"]
        found[parallel] = [(f["signature"], f["minimal"]["case"], f["shrink_steps"], f["note"]) for f in failures]
    assert len(found[64]) >= 3  # several signatures: out and the gradients
    assert all(note == "" and steps > 0 for _, _, steps, note in found[64])
    assert found[64] == found[1]


def test_failures_are_listed_in_drawing_order_whatever_order_the_workers_finish(tmp_path, monkeypatch):
    """The workers return cases as they finish. Failures are listed by the case that first showed them,
    then by tensor within that case, so a loaded machine gives the same report (a CI run under load once
    swapped dk and dv here)."""
    from faverify.run.scheduler import Pool
    original = Pool.map

    def finish_backwards(self, items, on_result):
        done = []
        original(self, items, lambda i, r: done.append((i, r)))
        for i, r in reversed(done):
            on_result(i, r)

    listed = [[f["signature"] for f in run["failures"]] for run in _planted_runs(tmp_path, monkeypatch,
                                                                                 finish_backwards)]
    assert len(listed[0]) >= 3 and listed[0] == listed[1]


def _planted_runs(tmp_path, monkeypatch, patched_map) -> list:
    """A 12-case fuzz of a planted bug on 2 workers, as it is and then with scheduler.Pool.map replaced by
    patched_map: each run's entry for the subject in its run file."""
    from faverify.run.scheduler import Pool
    runs = []
    for patch in (None, patched_map):
        if patch:
            monkeypatch.setattr(Pool, "map", patch)
        # short sequences: what is checked is the scheduling, and the cases' sizes only cost time
        cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "12", "--all-failures", "--device",
            "cpu", "--no-db", "--max-seqlen", "32",
            "--workers", "2", "--shrink-budget", "0", "--gradcheck-every", "0", "--json", tmp_path / "r.json")
        runs.append(read_json(tmp_path / "r.json")["kernels"][0])
    return runs


def _report_environment(conn, name):
    conn.send(__import__("os").environ.get(name))


def test_a_worker_gets_the_environment_of_the_moment_it_starts(monkeypatch):
    """Workers fork from a server started once (processes.start): a variable set after the server started
    still reaches the next worker, and one removed is gone from it."""
    import multiprocessing as mp

    from faverify.run import processes

    def ask(name):
        parent, child = mp.Pipe()
        process = processes.start(_report_environment, (child, name))
        child.close()
        answer = parent.recv()
        process.join(30)
        assert process.exitcode == 0
        return answer

    monkeypatch.setenv("FAVERIFY_TEST_PROBE", "before")
    assert ask("FAVERIFY_TEST_PROBE") == "before"  # the server runs from here on
    monkeypatch.setenv("FAVERIFY_TEST_PROBE", "after")
    assert ask("FAVERIFY_TEST_PROBE") == "after"
    monkeypatch.delenv("FAVERIFY_TEST_PROBE")
    assert ask("FAVERIFY_TEST_PROBE") is None


def test_cases_skipped_for_memory_beside_other_workers_run_again_alone(tmp_path, monkeypatch):
    """A case that found too little memory free while other workers ran (a shared GPU) runs again at the
    end, on one worker per device: its second verdict counts, and the run says how many ran again. Here
    every third case's first result is turned into such a skip; the run's verdicts are then the same as a
    run without them."""
    import dataclasses

    from faverify.reports.case_result import skipped_for_memory
    from faverify.run.scheduler import Pool
    original = Pool.map
    first_seen: set = set()

    def crowded(self, items, on_result):
        def maybe_skipped(i, r):
            if r.status in ("pass", "fail") and i % 3 == 0 and i not in first_seen:
                first_seen.add(i)
                r = dataclasses.replace(r, status="skip", reason="out of memory making the inputs (OutOfMemoryError)",
                                        metrics={}, signatures=[])
                assert skipped_for_memory(r)
            on_result(i, r)
        original(self, items, maybe_skipped)

    plain, crowded_run = _planted_runs(tmp_path, monkeypatch, crowded)
    assert len(first_seen) == 4
    assert crowded_run["summary"]["memory_retried"] == 4 and plain["summary"]["memory_retried"] == 0
    for key in ("cases", "passed", "failed", "skipped", "skip_reasons"):
        assert crowded_run["summary"][key] == plain["summary"][key], key
    assert [f["signature"] for f in crowded_run["failures"]] == [f["signature"] for f in plain["failures"]]


def test_a_worker_is_given_the_judging_of_its_run_and_a_reproducer_carries_what_differs_from_repros_own():
    from faverify.judge.verdict import parse_tolerance
    judging = Judging("fwd", parse_tolerance("out=3", None, "dq=0.5"), 2, ("batch",), 60.0)
    assert Judging.from_dict(json.loads(json.dumps(judging.to_dict()))) == judging  # through the worker's pipe
    assert judging.flags("gradcheck") == ("--mode", "fwd", "--factor", "out=3", "--tight", "dq=0.5", "--gradcheck",
                                          "--repeat", "2", "--timeout", "60")
    assert Judging().flags("out:nan") == () and Judging(measure=("batch",)).flags("dq:nan") == ()


@pytest.mark.parametrize("mode", [("--workers", "2"), ("--no-isolate",)])
def test_a_fuzz_looks_each_subject_up_once_in_its_own_process(tmp_path, monkeypatch, mode):
    """The subject is looked up once, where the run is prepared (request.SubjectPlan); only the workers look
    it up by name again, in their own processes."""
    from faverify.subjects import registry
    made = []
    factory = registry._BUILTIN["sdpa-math"]
    monkeypatch.setitem(registry._BUILTIN, "sdpa-math", lambda: made.append(1) or factory())
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "4", "--device", "cpu", "--no-db", "--gradcheck-every", "0",
            "--seed", "2", *mode)
    assert r.exit_code == 0 and len(made) == 1, (r.stderr, len(made))
