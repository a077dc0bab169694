"""Every edge of every feature a subject declares is drawn (edges.py): a bug that lives there cannot hide
behind a draw that never reaches it. Counted in each run's summary, and held here at seeds 0-3."""
import collections

import pytest

from faverify.cases.edges import EDGE_CASES, edges_of, listed, predicate
from faverify.cases.strategies import CPU_LIMITS
from faverify.run.draw import draw_cases
from faverify.run.plan import FuzzPlan
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

FEW = 2  # every listed edge at least this often in EDGE_CASES cases
# the triggers of three held-out bugs that escaped 150 CPU cases when their edges were not drawn
TRIGGERS = ("varlen: a sequence with no key, not causal", "mask: a mask per batch element and head, several of each",
            "bias: a min bias, batch or heads >= 2")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_default_cpu_run_of_sdpa_math_draws_every_edge(tmp_path, seed):
    """The CPU's own mode (one worker, Hypothesis steering the last cases): counted in the run's summary."""
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", str(EDGE_CASES), "--seed", str(seed), "--device", "cpu",
            "--no-db", "--json", tmp_path / "run.json")
    edges = read_json(tmp_path / "run.json")["kernels"][0]["summary"]["edges"]
    assert r.exit_code == 0 and set(edges) == set(listed(resolve("sdpa-math").caps.features())), r.stderr
    assert {e: n for e, n in edges.items() if n < FEW} == {}
    assert {e: edges[e] for e in TRIGGERS if edges[e] < 3} == {}


@pytest.mark.parametrize("kernel", ["triton", "flex", "triton-varlen", "triton-paged", "combine", "sdpa-math"])
def test_the_parallel_draw_reaches_every_edge(kernel):
    """The draw of several workers and of shards, up front, at seeds 0-3."""
    subject = resolve(kernel)
    features = subject.caps.features()
    for seed in range(4):
        plan = FuzzPlan(iters=EDGE_CASES, seed=seed, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                        narrow=subject.caps.draw() or None, features=features)
        drawn = draw_cases(plan)
        counts = collections.Counter(e for case in drawn for e in edges_of(case))
        assert {e: counts[e] for e in listed(features) if counts[e] < FEW} == {}, seed
        assert len({c.to_json() for c in drawn}) >= EDGE_CASES - 5  # each case drawn afresh, not a copy


def test_the_run_file_counts_each_edge_of_the_cases_that_ran(tmp_path):
    """Two workers run the seed's up-front draw: the summary's counts are those of the drawn cases."""
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "24", "--device", "cpu", "--no-db", "--mode", "fwd",
            "--workers", "2", "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert r.exit_code == 0 and summary["skipped"] == 0, r.stderr
    caps = resolve("sdpa-math").caps
    features = caps.features()
    plan = FuzzPlan(iters=24, seed=0, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None, features=features,
                    narrow=caps.draw() or None)
    counts = collections.Counter(e for case in draw_cases(plan) for e in edges_of(case))
    assert summary["edges"] == {e: counts[e] for e in listed(features)}
    assert "edges drawn fewer than" in r.stdout


def test_an_edge_is_told_by_its_predicate():
    from faverify.cases.case import Case
    assert predicate("varlen: a sequence with no key, not causal")(
        Case.of(2, 3, 5, 1, 1, 8, seqlens=((3, 0), (1, 5))))
    assert not predicate("varlen: a sequence with no key, not causal")(
        Case.of(2, 3, 5, 1, 1, 8, causal=True, seqlens=((3, 0), (1, 5))))
