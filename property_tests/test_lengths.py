"""A subject that declares the sequence lengths it takes (Capabilities.seqlen_multiple, equal_seqlens) is
drawn only such lengths, dense and ragged; one that does not, and skips most of what it is drawn, is told so
in the headline."""
import pytest

from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS
from faverify.run.draw import draw_cases
from faverify.run.plan import FuzzPlan
from faverify.subjects.base import Capabilities
from property_tests.cli_helpers import cli, read_json

ONE_LENGTH = "property_tests.planted:one_length_128"


@pytest.mark.parametrize("limits", [CPU_LIMITS, GPU_LIMITS])
def test_the_draw_makes_only_the_lengths_declared_ragged_batches_too(limits):
    caps = Capabilities.of(equal_seqlens=True, seqlen_multiple=128, varlen=True, paged=True, splits=True)
    plan = FuzzPlan(iters=300, seed=0, dtypes=("bf16",), limits=limits, database=None, narrow=caps.draw(),
                    features=caps.features())
    drawn = draw_cases(plan)
    refused = [(c.short(), caps.lengths_refused(c)) for c in drawn if caps.lengths_refused(c)]
    assert refused == [], refused[:3]
    kinds = {c.kind for c in drawn}
    assert kinds == {"dense", "varlen", "paged"}, kinds
    # at the tile edges, counted in tiles: one tile and more, up to the longest the limits allow
    lengths = {sq for c in drawn for sq, _ in c.sequences}
    assert {128, 256} <= lengths and all(n % 128 == 0 for n in lengths), sorted(lengths)
    if limits is GPU_LIMITS:
        assert len(lengths - {0}) >= 6 and max(lengths) >= 1024, sorted(lengths)


def test_every_call_of_a_drawn_sequence_has_the_lengths_declared():
    """--sequence: no step between calls (more query rows than keys, for rows with no key) leaves them."""
    caps = Capabilities.of(equal_seqlens=True, seqlen_multiple=128)
    plan = FuzzPlan(iters=200, seed=0, dtypes=("bf16",), limits=CPU_LIMITS, database=None, narrow=caps.draw(),
                    features=caps.features(), sequence=4)
    calls = [c for case in draw_cases(plan) for c in (*case.before, case)]
    assert len(calls) > 300 and [c.short() for c in calls if caps.lengths_refused(c)] == []


def test_a_case_of_other_lengths_is_skipped_with_the_reason():
    from faverify.cases.case import Case
    caps = Capabilities.of(equal_seqlens=True, seqlen_multiple=128)
    assert "takes q and k of one length" in caps.lengths_refused(Case(1, 128, 256, 1, 1, 16))
    assert "multiples of 128" in caps.lengths_refused(Case(1, 100, 100, 1, 1, 16))
    assert caps.lengths_refused(Case(1, 256, 256, 1, 1, 16)) is None
    with pytest.raises(ValueError, match="seqlen_multiple"):
        Capabilities.of(seqlen_multiple=0)


def test_a_subject_declaring_one_length_a_multiple_of_128_runs_nine_in_ten_of_its_cases(tmp_path):
    r = cli("fuzz", "--kernel", ONE_LENGTH, "--iters", "60", "--seed", "3", "--device", "cpu", "--no-db",
            "--no-isolate", "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert r.exit_code == 0 and summary["skipped"] <= 0.1 * summary["cases"], (summary["skip_reasons"], r.stderr)
    assert "skipped" not in r.stdout.splitlines()[0]


def test_a_run_that_skipped_most_of_its_cases_says_so_in_its_headline(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:one_length_undeclared", "--iters", "100", "--seed", "3",
            "--device", "cpu", "--no-db", "--no-isolate", "--json", tmp_path / "run.json")
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert summary["skipped"] > summary["cases"] / 2 and summary["skipped"] < summary["cases"], summary
    headline = r.stdout.splitlines()[0]
    assert headline.startswith("PASS:") and \
        f"{summary['skipped']} of the {summary['cases']} cases drawn were skipped" in headline, headline


def test_a_longest_length_below_the_multiple_is_refused():
    r = cli("fuzz", "--kernel", ONE_LENGTH, "--max-seqlen", "64", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "--max-seqlen=64" in r.stderr and "multiples of 128" in r.stderr, r.stderr
