"""The relations a subject promises (run/relations.py) are checked bit for bit, and a broken one fails."""
from faverify.cases.case import Case
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_trust"


def test_a_batch_entry_that_differs_alone_fails_the_batch_relation():
    case = Case(3, 9, 7, 2, 1, 16, dtype="bf16", causal=True, seed=1)
    r = evaluate(resolve(f"{PLANTED}:batch_dependent"), case, "cpu", mode="fwd")
    assert r.status == "fail" and r.signatures == ["relation:batch"], (r.signatures, r.reason)
    assert "out of batch entry" in r.reason and r.relations["batch"]["checked"] == 1
    good = evaluate(resolve(f"{PLANTED}:relations_kept"), case, "cpu", mode="fwd")
    assert good.status == "pass" and good.relations["batch"] == {"checked": 1, "equal": True, "max_diff": 0.0,
                                                                 "where": ""}, good.relations


def test_a_last_row_that_differs_decoded_alone_fails_the_decode_relation():
    case = Case(2, 9, 7, 2, 1, 16, dtype="fp16", causal=True, seed=2)
    r = evaluate(resolve(f"{PLANTED}:decode_dependent"), case, "cpu", mode="fwd")
    assert r.status == "fail" and r.signatures == ["relation:decode"], (r.signatures, r.reason)
    assert "out of the last query row" in r.reason, r.reason
    good = evaluate(resolve(f"{PLANTED}:relations_kept"), case, "cpu", mode="fwd")
    assert good.status == "pass" and good.relations["decode"]["equal"], good.relations


def test_the_batch_relation_holds_for_the_gradients_of_a_correct_kernel():
    """sdpa-math's entries alone, forward and backward, against its own batched call: no false alarm.
    (Its decode relation does not hold bit for bit on the CPU: a one-row matmul sums in another order.)"""
    import dataclasses

    from faverify.subjects.base import Capabilities
    math = resolve("sdpa-math")
    promised = dataclasses.replace(math, caps=Capabilities(**{**math.caps.to_dict(), "relations": ["batch"]}))
    for case in (Case(2, 9, 7, 2, 1, 16, dtype="fp32", causal=True, seed=3), Case(3, 5, 5, 2, 2, 8, seed=4)):
        r = evaluate(promised, case, "cpu")
        assert r.status == "pass" and r.relations["batch"]["equal"], (r.reason, r.relations)


def test_a_case_the_relation_cannot_cut_is_not_checked():
    r = evaluate(resolve(f"{PLANTED}:batch_dependent"), Case(1, 9, 7, 2, 1, 16, seed=1), "cpu", mode="fwd")
    assert r.status == "pass" and r.relations["batch"] == {"checked": 0}


def test_a_fuzz_counts_the_relation_and_fails_a_broken_promise(tmp_path):
    args = ("--iters", "30", "--device", "cpu", "--no-db", "--mode", "fwd", "--features", "none")
    r = cli("fuzz", "--kernel", f"{PLANTED}:batch_dependent", *args, "--json", tmp_path / "bad.json")
    assert r.exit_code == 1 and "relation:batch" in r.stderr, r.stderr
    r = cli("fuzz", "--kernel", f"{PLANTED}:relations_kept", *args, "--json", tmp_path / "good.json")
    assert r.exit_code == 0, r.stderr
    checked = read_json(tmp_path / "good.json")["kernels"][0]["summary"]["relations"]["batch"]
    assert checked["checked"] > 0 and checked["equal"] == checked["checked"], checked
    assert f"batch {checked['equal']} of {checked['checked']} equal" in r.stderr, r.stderr
