"""A report's first lines: the verdict, the failure that is worst, and what a run that skipped most of its
cases did not check (reports/report.py, verdict_lines)."""
from faverify.cases.case import Case
from faverify.judge.metrics import TensorMetrics
from faverify.reports.case_result import CaseResult
from faverify.reports.collector import REPLAY_FAILED, Failure, KernelStats
from faverify.reports.report import render
from faverify.reports.results import Run

SMALL, LARGER = Case(1, 1, 2, 1, 1, 16), Case(1, 2, 2, 1, 1, 16)


def _metrics(tensor: str, usage: float) -> TensorMetrics:
    """A tensor's metrics whose error is `usage` times the error allowed."""
    return TensorMetrics(tensor, max_abs=usage, mean_abs=usage / 2, rmse=usage / 2, max_rel=usage, ref_max=1.0,
                         max_ulp=1.0, nan=0, inf=0, masked_bad=0, baseline_max_abs=1.0, ratio=usage, scale=1.0,
                         allowed=1.0, floor=0.5, waived=False, worst_index=[0, 0, 0, 0], passed=usage <= 1,
                         reason=f"max error {usage} > allowed 1" if usage > 1 else "")


def _failing(case: Case, **usages) -> CaseResult:
    metrics = {t: _metrics(t, u) for t, u in usages.items()}
    failing = [t for t, m in metrics.items() if not m.passed]
    return CaseResult("k", case, "fail", "; ".join(metrics[t].reason for t in failing), metrics,
                      [f"{t}:tolerance" for t in failing], device="cpu")


def _run(*failures: Failure, cases: tuple) -> Run:
    stats = KernelStats("k")
    for r in cases:
        stats.add(r)
    stats.failures = list(failures)
    return Run.from_stats("fuzz --kernel k", {}, {}, {}, [stats])


def test_the_headline_names_the_largest_error_over_allowed_not_the_first_failure_found():
    """dk 10% off was found first, on a case whose out is right; out 88 times off came later."""
    dk_only, both = _failing(SMALL, out=0.5, dk=1.1), _failing(LARGER, out=88.0, dk=1.1)
    apart = _run(Failure("k", "dk:tolerance", dk_only, dk_only, replayed=REPLAY_FAILED),
                 Failure("k", "out:tolerance", both, both, replayed=REPLAY_FAILED), cases=(dk_only, both))
    headline, reproduce = render(apart).splitlines()[:2]
    assert "the worst, k out:tolerance, up to 88 times the allowed error; minimal case b1 sq2 sk2" in headline, \
        headline
    assert reproduce.startswith("reproduce: ") and '"seqlen_q":2' in reproduce, reproduce
    # one root: out's error among the companions of the dk failure it was found with
    together = _run(Failure("k", "dk:tolerance", dk_only, dk_only, replayed=REPLAY_FAILED,
                            companions=("out:tolerance",)), cases=(dk_only, both))
    headline = render(together).splitlines()[0]
    assert "the worst, k dk:tolerance with out:tolerance, up to 88 times the allowed error; minimal case b1 sq1" \
        in headline, headline


def test_nan_outranks_any_finite_error():
    both = _failing(LARGER, out=88.0)
    nan = CaseResult("k", SMALL, "fail", "dq: 3 NaN", {"dq": _metrics("dq", float("nan"))}, ["dq:nan"], device="cpu")
    run = _run(Failure("k", "out:tolerance", both, both, replayed=REPLAY_FAILED),
               Failure("k", "dq:nan", nan, nan, replayed=REPLAY_FAILED), cases=(both, nan))
    headline = render(run).splitlines()[0]
    assert "the worst, k dq:nan; minimal case b1 sq1" in headline, headline
