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
    good = evaluate(resolve(f"{PLANTED}:batch_invariant"), case, "cpu", mode="fwd")
    assert good.status == "pass" and good.relations["batch"] == {"checked": 1, "equal": True, "max_diff": 0.0,
                                                                 "where": ""}, good.relations


def test_a_case_the_relation_cannot_cut_is_not_checked():
    r = evaluate(resolve(f"{PLANTED}:batch_dependent"), Case(1, 9, 7, 2, 1, 16, seed=1), "cpu", mode="fwd")
    assert r.status == "pass" and r.relations["batch"] == {"checked": 0}


def test_a_fuzz_counts_the_relation_and_fails_a_broken_promise(tmp_path):
    args = ("--iters", "30", "--device", "cpu", "--no-db", "--mode", "fwd", "--features", "none")
    r = cli("fuzz", "--kernel", f"{PLANTED}:batch_dependent", *args, "--json", tmp_path / "bad.json")
    assert r.exit_code == 1 and "relation:batch" in r.stderr, r.stderr
    r = cli("fuzz", "--kernel", f"{PLANTED}:batch_invariant", *args, "--json", tmp_path / "good.json")
    assert r.exit_code == 0, r.stderr
    checked = read_json(tmp_path / "good.json")["kernels"][0]["summary"]["relations"]["batch"]
    assert checked["checked"] > 0 and checked["equal"] == checked["checked"], checked
    assert f"batch {checked['equal']} of {checked['checked']} equal" in r.stderr, r.stderr
