"""The contract as a user reads it: what a kernel that follows it documents gets, and what it must give back,
judged where it was not before (the gradients' varlen tail rows), taken where it crashed faverify (a varlen
subject with split-KV partials)."""
import os

import pytest

from faverify.cases.case import Case
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_trust"
VARLEN = Case.of(3, 17, 33, 2, 1, 16, dtype="fp32", causal=True, seqlens=((5, 9), (17, 33), (0, 4)), tail=7, seed=2)


@pytest.mark.parametrize("subject,signatures", [
    ("tail_grads_nan", {"dq:tail", "dk:tail", "dv:tail"}),
    ("tail_grads_ones", {"dq:tail", "dk:tail", "dv:tail"}),
    ("tail_grads_ones_declared", set()),
    ("tail_grads_zero", set()),
])
def test_the_gradients_tail_rows_are_judged(subject, signatures):
    """Past the last sequence the loss does not depend on the tokens: their gradient is 0, or finite where
    the subject declares it leaves them (varlen_tail_grads: finite)."""
    r = evaluate(resolve(f"{PLANTED}:{subject}"), VARLEN, "cpu")
    assert set(r.signatures) == signatures, (r.signatures, r.reason)
    assert r.status == ("fail" if signatures else "pass"), r.reason
    if signatures:
        assert "7 rows past the last sequence" in r.reason, r.reason


def test_a_varlen_subject_with_split_partials_is_judged_not_crashed(tmp_path):
    """flash-attn 3's varlen function takes num_splits: a subject declaring varlen and splits returns its
    partials packed as out and lse are, and a fuzz of the right one passes."""
    case = Case.of(2, 9, 40, 2, 2, 16, dtype="fp32", seqlens=((9, 40), (3, 0)), tail=1, splits=3, seed=1)
    r = evaluate(resolve(f"{PLANTED}:varlen_splits"), case, "cpu")
    assert r.status == "pass" and {"out_splits", "lse_splits"} <= set(r.metrics), (r.status, r.reason)
    r = cli("fuzz", "--kernel", f"{PLANTED}:varlen_splits", "--iters", "40", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert r.exit_code == 0 and summary["features"].get("splits", 0) > 0, r.stderr


def test_faverify_s_own_error_is_its_own_not_the_subject_s(tmp_path, monkeypatch):
    """An exception of faverify's own code on a case is neither a pass nor the subject's failure: the run goes
    on, writes its results, names the error and exits 2."""
    from faverify.run import evaluate as runner
    original = runner.judge

    def broken(case, *args, **kwargs):
        if case.seqlen_q > 1:
            raise IndexError("planted in faverify's judge")
        return original(case, *args, **kwargs)
    monkeypatch.setattr(runner, "judge", broken)
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "12", "--device", "cpu", "--no-db", "--no-isolate",
            "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert r.exit_code == 2 and "faverify's own code raised" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert summary["errors"] > 0 and summary["failed"] == 0 and "IndexError" in summary["error_reasons"][0]
    # the headline claims no pass for the cases nobody judged
    assert "PASS" not in r.stdout and f"INCOMPLETE: faverify's own code raised on {summary['errors']} of 12" \
        in r.stdout, r.stdout


def test_a_worker_reports_faverify_s_own_error_apart_from_a_crash(monkeypatch):
    """The worker's loop (isolation._work) run here, its evaluate broken: the case comes back as an error.
    The loop leaves its process as it found it: the test's process group, and the processes it started
    (the suite's background compiles), outlive it."""
    import multiprocessing as mp
    import subprocess
    import sys

    from faverify.reports.case_result import CaseResult
    from faverify.run import isolation
    from faverify.run.plan import Judging

    def broken(*args, **kwargs):
        raise KeyError("planted")
    monkeypatch.setattr(isolation, "evaluate", broken)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    group = os.getpgid(0)
    try:
        parent, child = mp.Pipe()
        parent.send((Case(1, 2, 2, 1, 1, 8).to_dict(), False, None, False))
        parent.send(None)
        isolation._work(child, "sdpa-math", "cpu", Judging())
        assert parent.recv()[0] == "ready"
        kind, payload = parent.recv()
        result = CaseResult.from_dict(payload)
        assert result.status == "error" and not result.failed and "KeyError" in result.reason, result.reason
        assert bystander.poll() is None and os.getpgid(0) == group
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("raised", ["GeneratorExit", "class Custom(BaseException): pass\nraise Custom"])
def test_a_subject_raising_a_base_exception_fails_its_own_case(tmp_path, monkeypatch, raised):
    module = f"raises_base_{abs(hash(raised))}"
    body = raised if "\n" not in raised else raised.replace("\n", "\n    ")
    (tmp_path / f"{module}.py").write_text(
        "def attn(q, k, v, *, causal, softmax_scale):\n    " + (f"raise {body}" if "\n" not in raised else body) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for isolate in ("--isolate", "--no-isolate"):
        r = cli("fuzz", "--kernel", f"{module}:attn", "--iters", "3", "--device", "cpu", "--no-db", isolate,
                "--json", tmp_path / "run.json")
        failures = read_json(tmp_path / "run.json")["kernels"][0]["failures"]
        assert r.exit_code == 1 and failures and failures[0]["signature"].startswith("error:"), (isolate, r.stderr)


def test_a_kernel_reading_the_block_mask_as_documented_passes_every_shape(tmp_path):
    """A key mask ("keys", [b, 1, 1, sk]) drawn as blocks reaches the kernel with a row of blocks for every
    query block, as the contract's [b|1, h|1, ceil(sq / n), ceil(sk / n)] says."""
    case = Case.of(1, 17, 1, 1, 1, 16, dtype="fp32", mask="block", mask_shape="keys", mask_block=16, mask_rate=50,
                   seed=1)
    r = evaluate(resolve(f"{PLANTED}:block_mask_as_documented"), case, "cpu")
    assert r.status == "pass", r.reason
    r = cli("fuzz", "--kernel", f"{PLANTED}:block_mask_as_documented", "--iters", "60", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json")
    masks = read_json(tmp_path / "run.json")["kernels"][0]["summary"]["masks"]
    assert r.exit_code == 0 and masks, r.stderr


def test_a_tensor_subclass_is_refused_before_anything_reads_it():
    r = evaluate(resolve(f"{PLANTED}:agreeable_zeros"), Case(1, 8, 8, 2, 2, 16, dtype="bf16", seed=1), "cpu")
    assert r.status == "fail" and r.signatures == ["contract"] and "subclass of torch.Tensor" in r.reason, r.reason


@pytest.mark.gpu
def test_an_output_computed_on_a_stream_the_caller_never_waits_for_fails():
    """Read on the caller's stream, as a caller would: the race shows; the control waits and passes."""
    case = Case(1, 128, 128, 2, 2, 64, dtype="bf16", seed=1)
    # the first call's allocations on the side stream (cudaMalloc) synchronize the device, so its race does not
    # show (seen on the H200: the first of three passed); the calls after it allocate from the cache
    evaluate(resolve(f"{PLANTED}:side_stream_unsynced"), case, "cuda")
    bad = [evaluate(resolve(f"{PLANTED}:side_stream_unsynced"), case, "cuda") for _ in range(3)]
    assert all(r.status == "fail" for r in bad), [r.reason for r in bad]
    good = evaluate(resolve(f"{PLANTED}:side_stream_synced"), case, "cuda")
    assert good.status == "pass", good.reason


@pytest.mark.parametrize("subject,case", [
    (subject, case) for case in (
        Case(1, 128, 128, 2, 2, 64, dtype="bf16", regime="large", seed=1),  # a baseline nearly as wrong as zeros
        Case(1, 16, 16, 2, 2, 32, dtype="bf16", regime="bf16-scale", seed=1),  # ill-conditioned: every v 133120
        Case(1, 16, 16, 2, 2, 32, dtype="fp16", regime="bf16-scale", seed=1),
        Case(1, 8, 8, 2, 2, 32, dtype="bf16", causal=True, regime="lone-key", seed=3),  # a row sees one key
    ) for subject in ("zeros", "mean_of_v") if not (subject == "mean_of_v" and case.regime == "bf16-scale")
], ids=lambda x: x if isinstance(x, str) else f"{x.dtype}-{x.regime}")  # every v alike: their mean is right
def test_zeros_and_the_mean_of_v_fail_where_the_tolerance_is_widest(subject, case):
    """Forward-only subjects without lse are judged on out alone: a large regime's baseline allowed them, and
    a waived case checked nothing; out is now capped by its own size and held to the hull of its values."""
    r = evaluate(resolve(f"{PLANTED}:{subject}"), case, "cpu", mode="fwd")
    assert r.status == "fail" and "out:" in " ".join(r.signatures), (r.status, r.reason)
    right = evaluate(resolve("sdpa-math"), case, "cpu", mode="fwd")
    assert right.status == "pass", right.reason


@pytest.mark.parametrize("body", ["import os\nos._exit(0)", "import posix\nposix._exit(0)", "import sys\nsys.exit(0)"])
def test_a_module_that_exits_while_it_is_imported_is_exit_2(tmp_path, monkeypatch, body):
    module = f"exits_at_import_{abs(hash(body))}"
    (tmp_path / f"{module}.py").write_text(body + "\ndef attn(q, k, v, *, causal, softmax_scale):\n    return q\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for command in (("fuzz", "--iters", "2"), ("repro", "--case", Case(1, 1, 1, 1, 1, 8).to_json())):
        r = cli(*command, "--kernel", f"{module}:attn", "--device", "cpu",
                *(("--no-db",) if command[0] == "fuzz" else ()))
        assert r.exit_code == 2 and "cannot import module" in r.stderr, (command, r.stderr)


def test_a_declared_lse_is_required(tmp_path, monkeypatch):
    (tmp_path / "declares_lse.py").write_text(
        "from property_tests.planted import correct\n"
        "def attn(q, k, v, *, causal, softmax_scale):\n"
        "    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)\n"
        "attn.faverify_capabilities = {'lse': True}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = evaluate(resolve("declares_lse:attn"), Case(1, 4, 4, 1, 1, 8, seed=1), "cpu")
    assert r.status == "fail" and r.signatures == ["contract"] and "declares lse" in r.reason, r.reason


def test_the_timeout_is_the_subjects_alone_not_faverifys_reference():
    """A kernel that returns at once in a worker whose judging takes 3 s: judged (zeros fail on their values),
    not timed out; --timeout counts the subject's time only."""
    from faverify.run.isolation import Worker
    from faverify.run.plan import Judging
    from property_tests.planted_slow_judge import JUDGING_SECONDS
    timeout = 1.0
    assert JUDGING_SECONDS > timeout + 1
    worker = Worker("property_tests.planted_slow_judge:zeros", "cpu", Judging(mode="fwd", timeout=timeout))
    try:
        r = worker.evaluate(Case(1, 17, 33, 2, 1, 16, dtype="bf16", seed=1))
    finally:
        worker.stop()
    assert r.status == "fail" and "out:" in " ".join(r.signatures), (r.status, r.reason)
    assert r.seconds > JUDGING_SECONDS, r.seconds  # the judging did take longer than the timeout


@pytest.mark.parametrize("subject", ["detached", "zero_gradients"])
def test_gradients_asked_for_are_judged(subject):
    """Under --mode both the gradients through an out without an autograd graph are zero, and judged so: they
    fail where the true gradients are not, saying why; zero gradients fail as wrong values. Neither passes on
    its forward alone."""
    r = evaluate(resolve(f"property_tests.planted_gradients:{subject}"), Case(1, 9, 7, 2, 1, 16, seed=1), "cpu")
    assert r.status == "fail" and {"dq:tolerance", "dk:tolerance", "dv:tolerance"} <= set(r.signatures), r.reason
    assert ("contract" in r.signatures and "no autograd graph" in r.reason) == (subject == "detached"), r.reason


def test_an_out_without_a_graph_passes_where_every_gradient_is_zero():
    """A sequence with no key: out is 0 whatever the inputs, so no graph is needed and zeros are its gradients."""
    case = Case.of(1, 1, 0, 1, 1, 16, seqlens=((1, 0),), seed=0)
    r = evaluate(resolve("sdpa-math"), case, "cpu")
    assert r.status == "pass", r.reason


def test_a_kernel_that_detaches_on_causal_cases_alone_fails_a_fuzz(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted_gradients:detached_when_causal", "--iters", "30",
            "--seed", "3", "--device", "cpu", "--no-db", "--features", "none", "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr
    failures = read_json(tmp_path / "run.json")["kernels"][0]["failures"]
    assert any("contract" in (f["signature"], *f["companions"]) for f in failures), r.stderr
