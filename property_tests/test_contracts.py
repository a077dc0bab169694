"""The contract as a user reads it: what a kernel that follows it documents gets, and what it must give back,
judged where it was not before (the gradients' varlen tail rows), taken where it crashed faverify (a varlen
subject with split-KV partials)."""
import pytest

from faverify.case import Case
from faverify.runner import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_trust"
VARLEN = Case(3, 17, 33, 2, 1, 16, dtype="fp32", causal=True, seqlens=((5, 9), (17, 33), (0, 4)), tail=7, seed=2)


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
    r = evaluate(resolve(f"{PLANTED}:varlen_splits"), Case(2, 9, 40, 2, 2, 16, dtype="fp32", seqlens=((9, 40), (3, 0)),
                                                            tail=1, splits=3, seed=1), "cpu")
    assert r.status == "pass" and {"out_splits", "lse_splits"} <= set(r.metrics), (r.status, r.reason)
    r = cli("fuzz", "--kernel", f"{PLANTED}:varlen_splits", "--iters", "40", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert r.exit_code == 0 and summary["features"].get("splits", 0) > 0, r.stderr


def test_faverify_s_own_error_is_its_own_not_the_subject_s(tmp_path, monkeypatch):
    """An exception of faverify's own code on a case is neither a pass nor the subject's failure: the run goes
    on, writes its results, names the error and exits 2."""
    from faverify import runner
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


def test_a_worker_reports_faverify_s_own_error_apart_from_a_crash(monkeypatch):
    """The worker's loop (isolation._serve) run here, its evaluate broken: the case comes back as an error."""
    import multiprocessing as mp

    from faverify import isolation
    from faverify.runner import CaseResult
    from faverify.verdict import Tolerance

    def broken(*args, **kwargs):
        raise KeyError("planted")
    monkeypatch.setattr("faverify.runner.evaluate", broken)
    parent, child = mp.Pipe()
    parent.send((Case(1, 2, 2, 1, 1, 8).to_dict(), False, None, False))
    parent.send(None)
    isolation._serve(child, "sdpa-math", "cpu", "both", Tolerance().to_dict())
    assert parent.recv()[0] == "ready"
    kind, payload = parent.recv()
    result = CaseResult.from_dict(payload)
    assert result.status == "error" and not result.failed and "KeyError" in result.reason, result.reason


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
    case = Case(1, 17, 1, 1, 1, 16, dtype="fp32", mask="block", mask_shape="keys", mask_block=16, mask_rate=50, seed=1)
    r = evaluate(resolve(f"{PLANTED}:block_mask_as_documented"), case, "cpu")
    assert r.status == "pass", r.reason
    r = cli("fuzz", "--kernel", f"{PLANTED}:block_mask_as_documented", "--iters", "60", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json")
    masks = read_json(tmp_path / "run.json")["kernels"][0]["summary"]["masks"]
    assert r.exit_code == 0 and masks, r.stderr
