"""A subject that compiles per configuration (Subject.compile_key, Subject.compiles): the report counts its
compiles beside the configurations the cases needed."""
import pytest

from faverify.cases.case import Case
from faverify.reports.case_result import CaseResult
from faverify.reports.collector import KernelStats
from faverify.subjects import resolve
from faverify.subjects.flex import compile_key
from property_tests.cli_helpers import cli, read_json


def test_the_compile_key_names_what_flex_compiles_on_the_cpu():
    """Static sizes on the CPU: each call's batch and lengths, a varlen case's one per sequence; on a GPU the
    sizes are dynamic. New values compile nothing; another layout (strides) or scale does."""
    case = Case(2, 9, 13, 4, 2, 16, dtype="bf16")
    assert compile_key(case, "cpu") == compile_key(Case(2, 9, 13, 4, 2, 16, dtype="bf16", seed=5), "cpu")
    for other in (Case(2, 10, 13, 4, 2, 16, dtype="bf16"), Case(2, 9, 13, 4, 2, 16, dtype="bf16", layout="strided"),
                  Case(2, 9, 13, 4, 2, 16, dtype="bf16", softmax_scale=2.0)):
        assert compile_key(case, "cpu") != compile_key(other, "cpu")
    assert compile_key(case, "cuda") == compile_key(Case(2, 10, 13, 4, 2, 16, dtype="bf16"), "cuda")
    # a ragged case's sequences padded to a power of 4 (flex_sequence): 9x13 and 3x5 share 16, 3x40 is 64
    assert len(compile_key(Case.of(2, 9, 13, 4, 2, 16, seqlens=((9, 13), (3, 5))), "cpu")) == 1
    assert len(compile_key(Case.of(2, 9, 40, 4, 2, 16, seqlens=((9, 13), (3, 40))), "cpu")) == 2
    # softcap, ALiBi and windows compile nothing new; a mask's shape does
    assert compile_key(Case(2, 9, 13, 4, 2, 16, softcap=5.0, alibi="head"), "cpu") == compile_key(
        Case(2, 9, 13, 4, 2, 16), "cpu")
    assert resolve("flex").compile_key is compile_key and resolve("sdpa-math").compile_key is None


def test_the_report_counts_compiles_and_the_configurations_and_a_merge_unites_them():
    stats, other = KernelStats(kernel="flex"), KernelStats(kernel="flex")
    for s, keys, compiles in ((stats, ["a"], 1), (stats, ["a"], 0), (stats, ["b", "c"], 2), (other, ["c", "d"], 1)):
        s.add(CaseResult("flex", Case(1, 4, 4, 1, 1, 8), "pass", compiles=compiles, compile_keys=keys))
    summary = stats.summary()
    assert summary["compiles"] == 3 and summary["configurations"] == ["a", "b", "c"]
    from faverify.reports.merge import _merged_kernel
    from faverify.reports.results import Run
    runs = [(label, Run.from_stats("fuzz", {}, {}, {}, [s])) for label, s in (("0/2", stats), ("1/2", other))]
    for _, run in runs:
        for row in run.kernels[0]["stats"]:
            row["series"] = {}
    merged = _merged_kernel("flex", runs).summary()
    assert merged["compiles"] == 4 and merged["configurations"] == ["a", "b", "c", "d"]


@pytest.mark.slow
def test_flex_counts_each_configuration_compiled_once_in_one_worker(tmp_path):
    """flex compiles each new configuration on the CPU (seconds each): in its one worker each one its cases
    need compiles once, and the count says so. A key without the scale or the layout counted 5 compiles for
    2 configurations on these cases: dynamo specializes on both."""
    r = cli("fuzz", "--kernel", "flex", "--iters", "6", "--device", "cpu", "--no-db", "--features", "none",
            "--shapes", "2", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stderr
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert summary["shapes"] == 2 and summary["compiles"] == len(summary["configurations"]) > 0
    assert "configurations, cases drawn from 2 shapes" in r.stdout


class _Instant:
    """A worker that finishes each item at once and remembers what it ran."""

    def __init__(self):
        import multiprocessing
        self.ran, self.item = [], None
        self._ready, sender = multiprocessing.Pipe(duplex=False)
        sender.send(None)  # always readable: the pool's wait returns at once
        self._sender = sender

    def submit(self, item):
        self.item = item

    def collect(self):
        item, self.item = self.item, None
        self.ran.append(item)
        return item

    def waitables(self):
        return [self._ready]

    def stop(self):
        pass


def test_an_affinity_queue_keeps_each_compile_key_with_the_worker_that_ran_it():
    """A free worker takes the next item of a key it ran, else one of a key nobody ran, else the next: each
    configuration compiles in one worker where a first-in-first-out queue hands it to whichever is free."""
    from faverify.run.scheduler import Affinity, Pool
    keys = list("abacbadaebc")
    for queue in (Affinity, None):
        workers = [_Instant(), _Instant()]
        items = [(i, (i, k)) for i, k in enumerate(keys)]
        done = []
        Pool(workers).map(Affinity(items, key=lambda item: item[1]) if queue else items,
                          lambda tag, result: done.append(tag))
        assert sorted(done) == list(range(len(keys)))
        owners = [{k for _, k in w.ran} for w in workers]
        if queue:
            assert not owners[0] & owners[1], owners  # no key ran on both
        else:
            assert owners[0] & owners[1]  # first in, first out: the same key on both workers


def test_a_sequence_counts_the_compiles_and_configurations_of_every_call():
    """A sequence's earlier calls compile too: its result sums their compiles and unites their keys."""
    import torch

    from faverify.run.evaluate import evaluate
    from faverify.subjects.base import Capabilities, Subject
    from property_tests.planted import correct
    counted = []

    def compiling(q, k, v, *, causal, softmax_scale):
        counted.append(1)
        return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    s = Subject("compiling", compiling, Capabilities.of(), compiles=lambda: counted.pop() if counted else 0,
                compile_key=lambda case, kind: ((case.seqlen_q,),))
    one, two = Case(1, 4, 4, 1, 1, 8, dtype="fp32"), Case(1, 6, 4, 1, 1, 8, dtype="fp32")
    r = evaluate(s, Case(1, 4, 4, 1, 1, 8, dtype="fp32", before=(one, two)), torch.device("cpu"), mode="fwd")
    assert r.status == "pass" and r.compiles == 3 and r.compile_keys == ["(4,)", "(6,)"], (r.compiles, r.compile_keys)


def test_a_subject_that_compiles_draws_under_a_shape_budget_unless_the_run_names_one():
    """COMPILE_SHAPES for flex where --shapes is not given, none for sdpa-math; --shapes 0 lifts it. Under
    the budget a dense case's sizes, dtype, causal, layout and softmax scale are those of a pooled shape."""
    from faverify.cases.strategies import CPU_LIMITS, SHAPE_FIELDS
    from faverify.run.draw import draw_cases
    from faverify.run.plan import COMPILE_SHAPES, FuzzPlan
    from faverify.run.request import subject_plan
    plan = FuzzPlan(iters=60, seed=0, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None, shapes=None)
    flex = subject_plan(resolve("flex"), plan).plan
    assert flex.shapes == COMPILE_SHAPES and subject_plan(resolve("sdpa-math"), plan).plan.shapes == 0
    assert subject_plan(resolve("flex"), FuzzPlan(**{**plan.__dict__, "shapes": 0})).plan.shapes == 0
    pool = flex.narrow["shapes"]
    dense = [c for c in draw_cases(flex) if c.kind == "dense"]
    assert len(pool) == COMPILE_SHAPES and dense
    assert all({f: getattr(c, f) for f in SHAPE_FIELDS} in pool for c in dense)
