"""A reproducer is printed only once it was seen to fail, and it carries what the failure needs: the gradient
check, the mode, the tolerance. A failure that needs earlier calls in the same process says so instead."""
import json
import shlex

import pytest

from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_trust"


def _fuzz(tmp_path, kernel: str, *flags: str):
    r = cli("fuzz", "--kernel", kernel, "--device", "cpu", "--no-db", "--json", tmp_path / "run.json", *flags)
    run = read_json(tmp_path / "run.json") if (tmp_path / "run.json").exists() else None
    return r, run


def _run_reproducer(line: str):
    words = shlex.split(line)
    assert words[:2] == ["faverify", "repro"], line
    return cli(*words[1:])


@pytest.mark.parametrize("kernel,flags,needs", [
    (f"{PLANTED}:fp32_backward_off", ("--iters", "4", "--gradcheck-every", "1", "--dtype", "bf16"), "--gradcheck"),
    (f"{PLANTED}:forward_only_wrong", ("--iters", "30"), None),
    (f"{PLANTED}:rounds_p", ("--iters", "10", "--factor", "0.1", "--atol", "0", "--tight", "0", "--mode", "fwd"),
     "--tight"),
])
def test_every_printed_reproducer_fails_when_run(tmp_path, kernel, flags, needs):
    r, run = _fuzz(tmp_path, kernel, *flags)
    assert r.exit_code == 1, r.stderr
    failures = run["kernels"][0]["failures"]
    assert failures and all(f["replayed"] == "failed" for f in failures), [f["replay_reason"] for f in failures]
    for f in failures:
        if needs:
            assert needs in shlex.split(f["reproducer"]), f["reproducer"]
        again = _run_reproducer(f["reproducer"])
        assert again.exit_code == 1, (f["reproducer"], again.stderr)
        assert f["reproducer"] in r.stdout
    if needs:  # without the flags the same case passes: they are what makes it fail
        assert _run_reproducer(shlex.join(_without(shlex.split(failures[0]["reproducer"]), needs))).exit_code == 0


def _without(words: list, needs: str) -> list:
    """The reproducer's words without the flag (--gradcheck), or without every tolerance option (--tight)."""
    if needs == "--gradcheck":
        return [w for w in words if w != needs]
    kept, skip = [], False
    for w in words:
        if w in ("--factor", "--atol", "--tight"):
            skip = True
        elif skip:
            skip = False
        else:
            kept.append(w)
    return kept


@pytest.mark.parametrize("control", [f"{PLANTED}:fp32_backward_right", f"{PLANTED}:forward_only_right"])
def test_the_controls_pass(tmp_path, control):
    flags = ("--iters", "4", "--gradcheck-every", "1", "--dtype", "bf16") if "backward" in control else ("--iters",
                                                                                                         "10")
    r, run = _fuzz(tmp_path, control, *flags)
    assert r.exit_code == 0, r.stderr
    assert run["kernels"][0]["summary"]["passed"] == run["kernels"][0]["summary"]["cases"]


def test_a_forward_only_subject_is_judged_on_its_forward_under_the_default_mode(tmp_path):
    """backward: false under --mode both is judged on the forward, and says so; under --mode bwd every case
    is skipped and the run's error names the way out."""
    r, run = _fuzz(tmp_path, f"{PLANTED}:forward_only_right", "--iters", "6")
    partial = run["kernels"][0]["summary"]["partial_reasons"]
    assert r.exit_code == 0 and any("declares no backward" in reason for reason in partial), partial
    r = cli("fuzz", "--kernel", f"{PLANTED}:forward_only_right", "--iters", "3", "--device", "cpu", "--no-db",
            "--mode", "bwd")
    assert r.exit_code == 2 and "--mode fwd" in r.stderr, r.stderr


def test_a_failure_that_needs_earlier_calls_is_reproduced_after_them(tmp_path):
    """A scratch buffer kept across calls: the minimal case passes alone in a fresh process. The worker's
    earlier cases, replayed before it in one fresh worker and cut to the fewest that still make it fail,
    are the reproducer's call sequence (the case's `before`): that line fails when run, where the
    one-case line passes."""
    r, run = _fuzz(tmp_path, f"{PLANTED}:stale_scratch", "--iters", "40", "--dtype", "fp32")
    assert r.exit_code == 1, r.stderr
    failures = run["kernels"][0]["failures"]
    assert failures and all(f["replayed"] == "failed" and f["sequence"] for f in failures), failures
    assert "earlier call(s) in one process" in r.stdout and '"before":' in r.stdout, r.stdout
    first = failures[0]
    assert len(first["sequence"]["before"]) == 1  # one earlier call leaves the scratch dirty: cut to it
    again = _run_reproducer(first["reproducer"])
    assert again.exit_code == 1 and "earlier call 1 of 1" in again.stdout + again.stderr, again.stderr
    alone = {k: v for k, v in first["sequence"].items() if k != "before"}
    assert cli("repro", "--kernel", f"{PLANTED}:stale_scratch", "--device", "cpu",
               "--case", json.dumps(alone)).exit_code == 0  # the case alone passes
    r, _ = _fuzz(tmp_path, f"{PLANTED}:cleared_scratch", "--iters", "40", "--dtype", "fp32")
    assert r.exit_code == 0, r.stderr


def test_a_history_that_does_not_make_the_case_fail_again_gives_no_sequence():
    """A failure whose case passes alone and after its worker's history too (a flaky one): no sequence, and
    the report says it passed alone."""
    from faverify.cases.case import Case
    from faverify.reports.case_result import CaseResult
    from faverify.reports.collector import Failure
    from faverify.run.confirm import earlier_calls
    from faverify.run.plan import Judging
    case = Case(1, 4, 4, 1, 1, 8, dtype="fp32", seed=1)
    first = CaseResult("sdpa-math", case, "fail", "planted", signatures=["out:tolerance"], history=(case,))
    f = Failure("sdpa-math", "out:tolerance", first, first)
    assert earlier_calls(f, "sdpa-math", "cpu", Judging(mode="fwd", timeout=60.0)) is None


def test_reproducer_words_are_quoted_for_the_shell():
    from faverify.cases.case import Case
    from faverify.reports.collector import repro_command
    line = repro_command("k:f;touch PWNED;#", Case(1, 1, 1, 1, 1, 8).to_json(), "cpu", ("--tight", "out=0"))
    words = shlex.split(line)
    assert words[3] == "k:f;touch PWNED;#" and words[-2] == "--case" and ";" not in line.replace("'k:f;touch PWNED;#'",
                                                                                                 "")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_one_bug_is_one_failure_with_its_companions(tmp_path, workers):
    """A wrong scale fails out, dq, dk and dv on the same cases: one failure is shrunk, the other signatures
    listed with it; --all-failures shrinks each apart."""
    kernel = "property_tests.planted:wrong_scale"
    r, run = _fuzz(tmp_path, kernel, "--iters", "30", "--workers", workers)
    failures = run["kernels"][0]["failures"]
    assert r.exit_code == 1 and len(failures) == 1, [f["signature"] for f in failures]
    found = {failures[0]["signature"], *failures[0]["companions"]}
    assert {"out:tolerance", "dq:tolerance", "dk:tolerance"} <= found, found
    assert "with it on the same cases: " in r.stdout
    r, run = _fuzz(tmp_path, kernel, "--iters", "30", "--workers", workers, "--all-failures")
    assert len(run["kernels"][0]["failures"]) >= 2
