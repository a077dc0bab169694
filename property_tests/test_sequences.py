"""Call sequences (`faverify fuzz --sequence N`): drawn step by step, every call judged, a failure reproduced
by the sequence that makes it fail in a fresh process."""
import dataclasses
import json
import shlex

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings

from faverify.cases.calls import sequences
from faverify.cases.case import Case
from faverify.cases.checks import MAX_CALLS
from faverify.cases.strategies import CPU_LIMITS
from faverify.errors import UsageError
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_trust"


def _draw(count: int, **args) -> list:
    drawn = []

    @seed(3)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(sequences(**args))
    def collect(case):
        drawn.append(case)
    collect()
    return drawn


def _step(a: Case, b: Case) -> str:
    """Which step of calls.STEPS took a to b, from what changed."""
    changed = {f.name for f in dataclasses.fields(Case) if getattr(a, f.name) != getattr(b, f.name)} - {"before"}
    named = {frozenset(): "repeat", frozenset({"seed"}): "refill", frozenset({"layout"}): "layout",
             frozenset({"dtype"}): "dtype", frozenset({"batch"}): "batch", frozenset({"regime"}): "extreme"}
    if frozenset(changed) in named:
        return named[frozenset(changed)]
    if changed <= {"causal", "seqlen_q"} and b.causal and b.seqlen_q > b.seqlen_k:
        return "empty-rows"
    return "new"


def test_each_step_derives_a_call_from_the_one_before_it():
    """Every step of calls.STEPS is drawn, each making the neighbour of the call before it that state carried
    between calls gets wrong; the sequences run from one call to N."""
    drawn = _draw(300, calls=6, limits=CPU_LIMITS, features=())
    lengths = {1 + len(c.before) for c in drawn}
    assert lengths == set(range(1, 7)), lengths
    steps = set()
    for case in drawn:
        calls = case.before + (dataclasses.replace(case, before=()),)
        steps.update(_step(a, b) for a, b in zip(calls, calls[1:]))
    assert steps == {"new", "repeat", "refill", "layout", "dtype", "batch", "extreme", "empty-rows"}, steps
    assert all(not c.before or all(not e.before for e in c.before) for c in drawn)


def test_a_sequence_is_json_and_a_bad_one_is_refused():
    one = Case(1, 4, 4, 1, 1, 8, seed=1)
    seq = dataclasses.replace(one, layout="transposed", before=(one, dataclasses.replace(one, dtype="fp32")))
    assert Case.from_json(seq.to_json()) == seq
    assert "before" not in json.loads(one.to_json())  # a single call's JSON is as it always was
    assert seq.short().startswith("after 2 calls: ")
    with pytest.raises(UsageError, match="before"):
        dataclasses.replace(one, before=(seq,))  # an earlier call with calls of its own
    with pytest.raises(UsageError, match=f"at most {MAX_CALLS} calls"):
        dataclasses.replace(one, before=(one,) * MAX_CALLS)
    with pytest.raises(UsageError, match="list of cases"):
        Case.from_json('{"batch":1,"seqlen_q":1,"seqlen_k":1,"nheads":1,"nheads_k":1,"head_dim":8,"before":3}')
    with pytest.raises(UsageError, match="--sequence"):
        _draw(1, calls=0)


def test_an_earlier_call_that_fails_ends_the_sequence_there():
    """Every call is judged: the first that fails is the result, its case the sequence cut after it."""
    wrong = resolve("property_tests.planted:wrong_scale")
    one = Case(1, 8, 8, 1, 1, 16, dtype="fp32", seed=2)
    r = evaluate(wrong, dataclasses.replace(one, before=(one, one)), torch.device("cpu"), mode="fwd")
    assert r.failed and r.case == one and not r.case.before, r.case
    right = resolve("sdpa-math")
    r = evaluate(right, dataclasses.replace(one, before=(one, dataclasses.replace(one, seed=3))),
                 torch.device("cpu"))
    assert r.status == "pass" and len(r.case.before) == 2


def _fuzz(tmp_path, kernel: str, *flags: str):
    r = cli("fuzz", "--kernel", kernel, "--device", "cpu", "--no-db", "--dtype", "bf16,fp32",
            "--json", tmp_path / "run.json", *flags)
    return r, read_json(tmp_path / "run.json")


def _reproduce(line: str):
    words = shlex.split(line)
    assert words[:2] == ["faverify", "repro"], line
    return cli(*words[1:])


@pytest.mark.parametrize("bug, control", [("shape_keyed_cache", "keyed_cache"), ("stale_scratch", "cleared_scratch")])
def test_a_bug_between_calls_fails_a_sequence_and_its_reproducer_fails_again(tmp_path, bug, control):
    """A compile cache keyed by shape alone (the same shapes in another layout or dtype reuse the first
    call's kernel) and a scratch buffer never cleared each fail within 100 sequences; every reproducer is a
    call sequence that fails again when run, in a fresh process. The controls, the same code without the
    bug, pass."""
    r, run = _fuzz(tmp_path, f"{PLANTED}:{bug}", "--sequence", "4", "--iters", "100")
    assert r.exit_code == 1, r.stderr
    summary, failures = run["kernels"][0]["summary"], run["kernels"][0]["failures"]
    assert run["settings"]["sequence"] == 4 and summary["calls"] > summary["cases"] == 100
    assert failures and all(f["replayed"] == "failed" for f in failures), failures
    assert any(f["sequence"] or f["minimal"]["case"].get("before") for f in failures)
    for f in failures:
        again = _reproduce(f["reproducer"])
        assert again.exit_code == 1, (f["reproducer"], again.stdout)
    assert "sequences," in r.stdout and "calls" in r.stdout
    r, run = _fuzz(tmp_path, f"{PLANTED}:{control}", "--sequence", "4", "--iters", "100")
    assert r.exit_code == 0, r.stderr


def test_merged_shards_of_a_sequence_run_count_every_call(tmp_path):
    runs = []
    for i in (0, 1):
        r = cli("fuzz", "--kernel", "sdpa-math", "--device", "cpu", "--no-db", "--iters", "12", "--sequence", "3",
                "--shard", f"{i}/2", "--json", tmp_path / f"s{i}.json")
        assert r.exit_code == 0, r.stderr
        runs.append(read_json(tmp_path / f"s{i}.json")["kernels"][0]["summary"])
    merged = cli("merge", tmp_path / "s0.json", tmp_path / "s1.json", "--json", tmp_path / "all.json")
    assert merged.exit_code == 0, merged.stderr
    summary = read_json(tmp_path / "all.json")["kernels"][0]["summary"]
    assert summary["calls"] == sum(s["calls"] for s in runs) > summary["cases"]


def test_a_sequence_option_out_of_range_is_refused():
    r = cli("fuzz", "--kernel", "sdpa-math", "--device", "cpu", "--no-db", "--sequence", str(MAX_CALLS + 1))
    assert r.exit_code == 2 and "--sequence" in r.stderr, r.stderr


def test_a_sequence_whose_last_call_fails_alone_is_reported_without_its_earlier_calls():
    """The shrink keeps earlier calls where dropping one would change the last (each call is drawn from the
    one before it). A failure the last call shows alone is reported as that call alone: the smaller input."""
    from faverify.reports.collector import REPLAY_FAILED, Failure
    from faverify.run.confirm import confirm
    from faverify.run.plan import Judging

    kernel = "property_tests.planted:top_left_mask"  # fails causal cases with seqlen_q < seqlen_k, alone too
    earlier = Case(1, 3, 5, 1, 1, 8, dtype="fp32", seed=1)
    case = Case(1, 4, 6, 1, 1, 8, dtype="fp32", causal=True, seed=2, before=(earlier,))
    found = evaluate(resolve(kernel), case, "cpu", mode="fwd")
    assert found.failed and found.case.before == (earlier,), found.reason
    f = Failure(kernel, found.signatures[0], found, found)
    confirm([f], kernel, torch.device("cpu"), Judging(mode="fwd", timeout=60.0))
    assert f.replayed == REPLAY_FAILED and f.minimal.case == dataclasses.replace(case, before=()), f.minimal.case
    assert '"before"' not in f.reproducer and f.earlier_calls == 0, f.reproducer
