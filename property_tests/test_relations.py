"""The relations a subject promises (run/relations.py) are checked value for value, and a broken one fails."""
import pytest
import torch

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
                                                                 "where": "", "promised": True}, good.relations


@pytest.mark.parametrize("relation, planted, case, where", [
    ("decode", "decode_dependent", Case(2, 9, 7, 2, 1, 16, dtype="fp16", causal=True, seed=2), "the last query row"),
    ("repeat", "run_dependent", Case(2, 9, 7, 2, 1, 16, dtype="bf16", seed=3), "the second call")])
def test_a_call_that_differs_from_its_relation_fails_it(relation, planted, case, where):
    """A last row that differs decoded alone; a call that differs when repeated. Their control keeps both."""
    r = evaluate(resolve(f"{PLANTED}:{planted}"), case, "cpu", mode="fwd")
    assert r.status == "fail" and r.signatures == [f"relation:{relation}"], (r.signatures, r.reason)
    assert f"out of {where}" in r.reason, r.reason
    good = evaluate(resolve(f"{PLANTED}:relations_kept"), case, "cpu", mode="fwd")
    assert good.status == "pass" and good.relations[relation]["equal"], good.relations


def test_relations_compare_values_not_bits():
    """Zeros of the other sign in a call of one entry or one row keep the promise; NaN beside NaN is the same
    value; a real difference is named with its size."""
    from faverify.run.relations import _differ
    case = Case(3, 9, 7, 2, 1, 16, dtype="bf16", causal=True, seed=1)  # rows 0 and 1 see no key: out 0
    r = evaluate(resolve(f"{PLANTED}:zero_signs_alone"), case, "cpu", mode="fwd")
    assert r.status == "pass" and r.relations["batch"]["equal"], (r.reason, r.relations)
    zeros, nans = torch.zeros(4), torch.full((4,), float("nan"))
    assert _differ({"out": -zeros, "dq": nans}, {"out": zeros, "dq": nans.neg()}) == (0.0, "")
    moved = torch.tensor([0.0, 1.0, -2.0, 4.0])
    assert _differ({"out": moved}, {"out": moved * torch.tensor([1.0, 1.0, 1.0, 1.5])}) == (2 / 6, "out")  # of max 6


def test_a_case_the_relation_cannot_cut_is_not_checked():
    r = evaluate(resolve(f"{PLANTED}:batch_dependent"), Case(1, 9, 7, 2, 1, 16, seed=1), "cpu", mode="fwd")
    assert r.status == "pass" and r.relations["batch"] == {"checked": 0, "promised": True}


def test_a_fuzz_counts_the_relation_and_fails_a_broken_promise(tmp_path):
    args = ("--iters", "30", "--device", "cpu", "--no-db", "--mode", "fwd", "--features", "none")
    r = cli("fuzz", "--kernel", f"{PLANTED}:batch_dependent", *args, "--json", tmp_path / "bad.json")
    assert r.exit_code == 1 and "relation:batch" in r.stdout, r.stdout
    r = cli("fuzz", "--kernel", f"{PLANTED}:relations_kept", *args, "--json", tmp_path / "good.json")
    assert r.exit_code == 0, r.stderr
    checked = read_json(tmp_path / "good.json")["kernels"][0]["summary"]["relations"]["batch"]
    assert checked["checked"] > 0 and checked["equal"] == checked["checked"], checked
    assert f"batch (promised) {checked['equal']} of {checked['checked']} equal" in r.stdout, r.stdout


def test_relations_asked_for_are_measured_on_a_subject_that_promises_none(tmp_path):
    """--relations checks every subject (forward and gradients, under the default --mode both), and fails none
    that did not promise: what sdpa-math does is counted and reported, not failed."""
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "60", "--device", "cpu", "--no-db", "--relations",
            "batch,decode", "--features", "none", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stderr
    measured = read_json(tmp_path / "run.json")["kernels"][0]["summary"]["relations"]
    assert set(measured) == {"batch", "decode"} and not any(m["promised"] for m in measured.values())
    assert all(0 <= m["equal"] <= m["checked"] and m["checked"] > 0 for m in measured.values()), measured
    assert "batch (measured)" in r.stdout and "decode (measured)" in r.stdout, r.stdout
    bad = cli("fuzz", "--kernel", "sdpa-math", "--iters", "1", "--device", "cpu", "--relations", "order")
    assert bad.exit_code == 2 and "--relations" in bad.stderr and "batch, decode, repeat, splits" in bad.stderr, \
        bad.stderr


def test_a_split_call_that_differs_from_one_split_fails_the_splits_relation():
    """Each call within tolerance of FP64, but N splits and one give other bits: a subject that promises
    the relation fails; its control, the same bits whatever the splits, passes; a case of one split is not
    checked."""
    case = Case(1, 5, 40, 2, 1, 16, dtype="bf16", splits=4, seed=4)
    r = evaluate(resolve(f"{PLANTED}:splits_dependent"), case, "cpu", mode="fwd")
    assert r.status == "fail" and r.signatures == ["relation:splits"], (r.signatures, r.reason)
    assert "of one split" in r.reason, r.reason
    good = evaluate(resolve(f"{PLANTED}:splits_kept"), case, "cpu", mode="fwd")
    assert good.status == "pass" and good.relations["splits"]["equal"], (good.reason, good.relations)
    one = evaluate(resolve(f"{PLANTED}:splits_kept"), Case(1, 5, 40, 2, 1, 16, seed=4), "cpu", mode="fwd")
    assert one.relations["splits"]["checked"] == 0


def test_relations_count_nan_beside_nan_the_same_and_a_nan_beside_a_number_apart():
    """A call that gives NaN in the same places twice keeps the promise (the NaN is the judge's to fail); a
    NaN beside a number is a difference, and infinitely large."""
    from faverify.run.relations import _differ
    t = torch.tensor([1.0, float("nan"), float("inf"), 0.0], dtype=torch.bfloat16)
    assert _differ({"out": t}, {"out": t.clone()}) == (0.0, "")
    other = t.clone()
    other[1] = 2.0
    assert _differ({"out": t}, {"out": other}) == (float("inf"), "out")
