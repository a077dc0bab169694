"""The sequential mode of a fuzz (one worker): Hypothesis draws, steers toward large errors, and shrinks
each distinct failure once, until --iters cases have run.

Hypothesis stops at its first failure and shrinks it. A fuzz run should still report all its cases, so
the loop restarts Hypothesis after each shrink with the found signature marked as known: a known
signature is recorded and counted, but no longer stops the run. Distinct failures (per tensor and kind:
"out:nan", "dq:tolerance", "crash") are each shrunk to a minimal case.
"""
from __future__ import annotations

from typing import Callable

from hypothesis import Phase, given, seed, target
from hypothesis.errors import Flaky

from faverify.cases.case import Case
from faverify.reports.case_result import CaseResult
from faverify.reports.collector import Failure, KernelStats, Roots
from faverify.run.plan import Evaluate, FuzzPlan, hypothesis_settings, seed_only
from faverify.run.shrink import Interesting, Shrinker

STEERED = 0.2  # the share of the cases drawn under Hypothesis's steering toward the tolerance edge


def fuzz_subject(kernel: str, plan: FuzzPlan, evaluate: Evaluate, stats: KernelStats,
                 progress: Callable[[CaseResult], None] = lambda r: None) -> KernelStats:
    """Draw, evaluate, group and shrink as Hypothesis goes, until --iters cases have run: each result in
    stats, each root's failure, shrunk, in stats.failures (its companions with it)."""
    roots = Roots(plan.all_failures)
    generated = 0
    rounds = 0
    unsteered = plan.iters - max(1, int(plan.iters * STEERED))
    while generated < plan.iters:
        state = {"shrinker": None}
        steer = generated >= unsteered  # the last STEERED part of the cases is steered (below)
        end = plan.iters if steer else unsteered

        def run_one(case: Case) -> None:
            if _interesting(case):
                # one raise site: Hypothesis tells bugs apart by the line that raised
                raise Interesting(state["shrinker"].signature)

        def _interesting(case: Case) -> bool:
            nonlocal generated
            if state["shrinker"] is not None:  # shrinking: only the same signature counts
                return state["shrinker"].still_fails(case)
            if generated >= end:
                return False
            gc = plan.gradcheck_every > 0 and generated % plan.gradcheck_every == 0
            r = evaluate(case, gc)
            generated += 1
            stats.add(r)
            progress(r)
            for t, m in r.metrics.items():
                # steer toward the tolerance edge: error / allowed, per tensor. Waived
                # (ill-conditioned) cases have huge ratios that mean nothing; they get none.
                usage = m.max_abs / m.allowed if m.allowed > 0 and not m.waived else 0.0
                target(min(usage, 1e6) if usage == usage else 0.0, label=f"{t} error / allowed")
            root = roots.add(r.signatures)
            if root is not None:
                state["shrinker"] = Shrinker(plan, root, r, evaluate)
            return root is not None

        # no database and no reuse phase: the seeded draw is the same whatever the example store holds
        # (fuzz.replay runs the stored failures apart, first). Hypothesis's steering (its target phase) has
        # the last STEERED part of the cases: run from the start, its hill-climbing took half of them (it
        # optimises once, at half of max_examples, for as long as it improves), and 150 CPU cases of
        # sdpa-math left up to 9 of the edges edges.py lists under 3 cases
        phases = (Phase.explicit, Phase.generate) + ((Phase.target,) if steer else ()) + (Phase.shrink,)
        test = hypothesis_settings(examples=end - generated, database=None, phases=phases)(
            seed(plan.seed + rounds)(given(plan.strategy())(run_one)))
        before = generated
        note = ""
        try:
            with seed_only():
                test()
        except Interesting:
            pass
        except Flaky:
            note = "flaky: the shrunk case did not fail again when replayed"
        except KeyboardInterrupt:  # stopped while shrinking: the failure stays, as far as it was shrunk
            shrinker = state["shrinker"]
            if shrinker is not None:
                stats.failures.append(_failure(kernel, shrinker, roots, "not shrunk to the end: the run was "
                                                                        "interrupted while shrinking"))
            raise
        rounds += 1
        shrinker = state["shrinker"]
        if shrinker is not None:
            stats.failures.append(_failure(kernel, shrinker, roots, note))
            if plan.stop_at_first_failure:
                break
        elif generated == before or generated < end:
            break  # Hypothesis ran out of distinct cases: nothing more to draw
    # a root whose group met an earlier root's in a later case is that root's companion; the companions met
    # after a root was shrunk count too
    stats.failures[:] = [f for f in stats.failures if roots.primary(f.signature)]
    for f in stats.failures:
        f.companions = roots.companions(f.signature)
    return stats


def _failure(kernel: str, shrinker: Shrinker, roots: "Roots", note: str) -> Failure:
    return Failure(kernel=kernel, signature=shrinker.signature, first=shrinker.first, minimal=shrinker.best,
                   shrink_steps=shrinker.steps, note=note, companions=roots.companions(shrinker.signature))
