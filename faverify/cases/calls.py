"""Call sequences (`faverify fuzz --sequence N`): up to N calls of a subject in one process, each a case
derived from the one before it by a step that state carried between calls gets wrong.

The bugs that live between calls need the right call before the failing one: a compile cache keyed by
shape alone hits on the same shapes in another layout or dtype; a cache keyed by pointer hits on the
same addresses holding new values; a scratch buffer or a running max kept from a call whose logits
overflowed leaks into the next call's masked rows. Each step below makes one such neighbour of the call
before it. Hypothesis shrinks a sequence to fewer calls (the count shrinks to 1), to simpler steps ("new"
is the simplest) and to smaller cases, keeping only what still fails.
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from faverify.cases.case import Case
from faverify.cases.checks import MAX_CALLS
from faverify.cases.strategies import cases
from faverify.errors import UsageError

# regimes whose logits or values overflow inside a kernel: softmax's running max at +-inf, exp of Inf
EXTREME = ("bf16-scale", "large", "outliers")
# the steps a call can take from the one before it, simplest first (sampled_from shrinks to the first)
STEPS = {
    "new": "a case of its own",
    "repeat": "the same case again: the same values, in the addresses the allocator hands out again",
    "refill": "the same shapes with new values (inputs rewritten in place, or freed and reallocated)",
    "layout": "the same shapes and values in another layout (other strides, stride 0, an offset)",
    "dtype": "the same shapes in another dtype",
    "batch": "another batch size, each sequence's shapes the same",
    "extreme": "the same shapes with logits that overflow inside the kernel",
    "empty-rows": "the same keys under bottom-right causality with more queries than keys: rows that see no key",
}


@st.composite
def sequences(draw, *, calls: int, **case_args) -> Case:
    """A Case whose `before` holds the calls made ahead of it (0 to calls - 1 of them). case_args are
    strategies.cases' (the subject's dtypes, layouts, regimes, features): every call is one of its
    cases, or a step from the call before it that keeps to them."""
    if not 1 <= calls <= MAX_CALLS:
        raise UsageError("--sequence", calls, f"must be 1..{MAX_CALLS} calls")
    drawn = cases(**case_args)
    count = draw(st.integers(1, calls))
    made = [draw(drawn)]
    for _ in range(count - 1):
        step = draw(st.sampled_from(tuple(STEPS)))
        fresh = draw(drawn)  # drawn whatever the step, so a step that shrinks to "new" keeps its case
        made.append(_step(draw, step, made[-1], fresh, case_args))
    return dataclasses.replace(made[-1], before=tuple(made[:-1]))


def _step(draw, step: str, prev: Case, fresh: Case, case_args: dict) -> Case:
    """The call after `prev` for `step`, or `fresh` where the step does not apply to it (or would leave the
    subject's choices: a regime or layout it was not drawn with)."""
    changes = {
        "repeat": {},
        "refill": {"seed": fresh.seed},
        "layout": {"layout": fresh.layout},
        "dtype": {"dtype": fresh.dtype},
        "batch": {"batch": fresh.batch} if prev.kind == "dense" and (prev.mask is None or prev.mask.lengths is None)
        else None,
        "extreme": _extreme(draw, case_args),
        "empty-rows": _empty_rows(prev, case_args),
    }.get(step)
    if changes is None:
        return fresh
    try:
        return dataclasses.replace(prev, **changes)
    except UsageError:  # the step makes a case no call could mean (checks.check): a case of its own instead
        return fresh


def _extreme(draw, case_args: dict) -> dict | None:
    allowed = [r for r in EXTREME if r in case_args.get("regimes", EXTREME)]
    return {"regime": draw(st.sampled_from(allowed))} if allowed else None


def _empty_rows(prev: Case, case_args: dict) -> dict | None:
    """More query rows than keys, causal: the first rows see no key (out 0, lse -inf)."""
    if prev.kind != "dense" or case_args.get("causal") is False or prev.mask is not None or prev.score_mod != "off":
        return None
    if case_args.get("equal_seqlens") or case_args.get("seqlen_multiple", 1) > 1:  # lengths it does not take
        return None
    most = case_args["limits"].max_seqlen if "limits" in case_args else prev.seqlen_k + prev.seqlen_q
    if prev.seqlen_k >= most:
        return None
    return {"causal": True, "seqlen_q": min(prev.seqlen_k + prev.seqlen_q, most)}
