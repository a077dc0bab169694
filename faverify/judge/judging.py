"""Judge a subject's tensors: the FP64 reference and the naive baseline for the case (or per sequence for a
ragged one, or a golden file's stored values), the metrics of each tensor, and the verdict under the
tolerance; split-KV partials judged against the attention over their keys."""
from __future__ import annotations

import math

import torch

from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.conventions import Conventions
from faverify.cases.fp8 import dequantized
from faverify.cases.inputs import Inputs, variant_of
from faverify.cases.large import BOUNDARY, judged_entries
from faverify.dtypes import FLOOR_UNIT
from faverify.judge import fp8
from faverify.judge.flash_bound import FP8_DOT, FP32_DOT
from faverify.judge.metrics import error_stats
from faverify.judge.partial import narrowed, renumbered
from faverify.judge.reference import naive, reference, value_hull
from faverify.judge.sequences import split_yardsticks, yardsticks
from faverify.judge.verdict import FLUSHED, Tolerance, judge_all


def no_lap(phase: str) -> None:
    """judge's lap where nobody times the phases."""


def judge_splits(case: Case, x: Inputs, splits, tolerance: Tolerance, caps, lap=no_lap) -> dict:
    """The split-KV partials, each against the FP64 attention over its split's keys (empty ones must be
    out 0, lse -inf): metrics "out_splits" and "lse_splits", judged as out and lse are. lap: as judge's."""
    with torch.no_grad():
        ref, scales, base, empty = split_yardsticks(case, x, caps.conventions, caps.ragged.split_block)
        lap("reference")
        out, lse = splits
        if case.kind == "varlen":  # the tail cut off, as out's and lse's are
            out, lse = out[:, :case.total_q], lse[:, :, :case.total_q]
        got = {"out": out.reshape(ref["out"].shape), "lse": lse.reshape(ref["lse"].shape)}
        metrics = _judged(case, got, (ref, scales, base, empty), tolerance, ("out", "lse"), caps.conventions)
    for m in metrics.values():
        m.tensor += "_splits"
    return {m.tensor: m for m in metrics.values()}


def judge(case: Case, x: Inputs, got: dict, tolerance: Tolerance, tensors: tuple, given=None,
          conventions: Conventions = DEFAULT_CONVENTIONS, baseline: dict | None = None, lap=no_lap,
          keep: dict | None = None, boundary: int = BOUNDARY) -> dict:
    """Judge a subject's tensors (any of out, lse, dq, dk, dv, dsinks) for `case` against the FP64
    reference (computed here, or `given` as (reference tensors, scales), from a golden file), under the
    subject's conventions: the reference's masks align as it declares and its lse is in the declared base,
    with the declared value where a row sees no key. baseline: tensors that stand for the naive
    baseline's (a combine's). lap(phase): called as the FP64 reference ("reference") and the naive
    baseline ("baseline") are done, for a case's time per phase (a ragged case's baseline is computed with
    its reference, sequence by sequence: one phase); what follows is the metrics'. keep: a dict that gets
    the reference's tensors, of a dense case, as "reference". A dense case whose offsets cross `boundary`
    (cases/large.py) is judged on the batch entries around it alone (partial.py)."""
    q, k, v = (t.detach() for t in x.tensors())
    if case.fp8 is not None:  # the values the e4m3 tensors stand for, exactly: the attention is judged on them
        q, k, v = (dequantized(t, d) for t, d in zip((q, k, v), (x.q_descale, x.k_descale, x.v_descale)))
    backward = any(got.get(t) is not None for t in ("dq", "dk", "dv"))
    dout = x.dout if backward else None
    if case.kind != "dense":
        return _judge_ragged(case, x, got, tolerance, tensors, backward, conventions, baseline, lap)
    entries = judged_entries(case, boundary) if given is None and baseline is None else None
    if entries is not None:
        part = narrowed(case, x, got, entries)
        return renumbered(judge(*part, tolerance, tensors, conventions=conventions, lap=lap), entries, case.batch,
                          boundary)
    variant = variant_of(case, x, conventions)
    # a loss on lse in the declared base: d loss / d lse_e = dlse * (lse_declared / lse_e)
    dlse = x.dlse * conventions.lse_scale if backward and x.dlse is not None else None
    empty = case.empty_rows(variant.offset)
    empty_mask = None
    if given is not None and (conventions.causal, conventions.alibi) != (DEFAULT_CONVENTIONS.causal,
                                                                         DEFAULT_CONVENTIONS.alibi):
        given = None  # a golden file holds the reference under the default masks: computed here instead
    if given is not None and case.max_logit and "max_logit" not in given[0]:
        given = None  # a file without the max logit: the reference computed here
    with torch.no_grad():
        if given is None:
            ref, scales = reference(q, k, v, dout, causal=case.causal, scale=case.scale, variant=variant, dlse=dlse,
                                    max_logit=case.max_logit, dot=FP8_DOT if case.fp8 is not None else FP32_DOT)
        else:
            ref, scales = given
        lap("reference")
        if case.fp8 is not None:
            base = fp8.naive(case, *(t.detach() for t in x.tensors()), (x.q_descale, x.k_descale, x.v_descale))
        else:
            base = naive(q, k, v, dout, causal=case.causal, scale=case.scale, variant=variant, dlse=dlse,
                         max_logit=case.max_logit)
        lap("baseline")
        if baseline is not None:
            base = {**base, **baseline}
        if variant.mask is not None:  # the rows the mask leaves without a key, from the reference itself
            empty_mask = (ref["lse"] == -torch.inf) if x.sinks is None else torch.zeros_like(ref["lse"],
                                                                                             dtype=torch.bool)
        if conventions != DEFAULT_CONVENTIONS:
            ref, scales, base = _declared(ref, scales, base, conventions)
        if case.max_logit and conventions.max_logit == "head":  # the largest over the batch and every row
            ref, base = ({**t, "max_logit": t["max_logit"].amax(dim=(0, 2))} for t in (ref, base))
        stats = error_stats(got, ref, base, scales, tensors=tensors, empty_rows=empty, empty_mask=empty_mask,
                            sinks=x.sinks is not None, empty_lse=conventions.empty_lse_value)
    if keep is not None:  # the reference the tensors were judged against (`repro --plot` draws the errors)
        keep["reference"] = ref
    metrics = judge_all(stats, case.dtype, tolerance)
    lse = metrics.get("lse")
    if lse is not None and not lse.passed and not lse.nan:
        hint = _lse_base_hint(got["lse"], ref["lse"], lse.allowed, conventions)
        if hint:
            lse.reason += f"; {hint}"
    out = metrics.get("out")
    if out is not None and out.waived and out.passed:
        _within_hull(out, got["out"], (q, k, v), case, variant)
    return metrics


def _within_hull(m, out, qkv: tuple, case: Case, variant) -> None:
    """Where the weights are not determined (a waived case) out is still a convex combination of the values
    each row sees: fail m for the elements outside their hull, past twice the floor unit of the values' size
    (the fp32 sum of the weighted values rounds too: 3 ulps past 133120 over 33 keys, sdpa-math), and for FP8
    inputs past the share their quantized weights may sum away from 1 (fp8.P_UNIT: one entry of 334 on the
    H100, triton-fp8 at b2 sq1583 sk105 d128 large)."""
    with torch.no_grad():
        lo, hi = value_hull(*qkv, causal=case.causal, variant=variant)
        units = 2 * FLOOR_UNIT[case.dtype] + (fp8.P_UNIT[case.fp8.format] if case.fp8 is not None else 0.0)
        slack = units * torch.maximum(lo.abs(), hi.abs()) + FLUSHED
        got = out.detach().double()
        outside = int(((got < lo - slack) | (got > hi + slack)).sum())
    if outside:
        m.passed = False
        m.reason = (f"{outside} entries outside the least and largest values their row sees (out is a convex "
                    "combination of them, whatever the weights of this ill-conditioned case)")


def _judge_ragged(case: Case, x: Inputs, got: dict, tolerance: Tolerance, tensors: tuple, backward: bool,
                  conventions: Conventions, baseline: dict | None, lap=no_lap) -> dict:
    """judge() of a varlen or paged case: its references sequence by sequence (sequences.py), the
    subject's varlen tensors without their tail, as one packed batch."""
    with torch.no_grad():
        ref, scales, base, empty = yardsticks(case, x, backward, conventions)
        lap("reference")
        if baseline is not None:
            base = {**base, **baseline}
        if case.kind == "varlen":
            got = _unpadded(case, got)
        return _judged(case, got, (ref, scales, base, empty), tolerance, tensors, conventions)


def _judged(case: Case, got: dict, yardsticks: tuple, tolerance: Tolerance, tensors: tuple,
            conventions: Conventions) -> dict:
    """The verdict on tensors against (reference, scales, baseline, rows without a key) computed per
    sequence or per split, in the declared conventions."""
    ref, scales, base, empty = yardsticks
    if conventions != DEFAULT_CONVENTIONS:
        ref, scales, base = _declared(ref, scales, base, conventions)
    stats = error_stats(got, ref, base, scales, tensors=tensors, empty_mask=empty,
                        empty_lse=conventions.empty_lse_value)
    return judge_all(stats, case.dtype, tolerance)


def _unpadded(case: Case, got: dict) -> dict:
    """A varlen subject's tensors without the tail, as a batch of one: [1, total, ...], lse [1, h, total]."""
    total_q, total_k = case.total_q, case.total_k
    out = {}
    for name, t in got.items():
        if t is None or name == "dsinks":
            out[name] = t
        elif name == "lse":
            out[name] = t[:, :total_q].unsqueeze(0)
        else:
            out[name] = t[:total_k if name in ("dk", "dv") else total_q].unsqueeze(0)
    return out


def _declared(ref: dict, scales: dict, base: dict, conventions: Conventions) -> tuple:
    """The reference and the baseline's lse in the declared base, with the declared lse where a row sees
    no key."""
    def convert(lse):
        scaled = (lse.double() * conventions.lse_scale).to(lse.dtype)
        return torch.where(lse == -torch.inf, torch.full_like(scaled, conventions.empty_lse_value), scaled)
    ref, base, scales = dict(ref), dict(base), dict(scales)
    ref["lse"], base["lse"] = convert(ref["lse"]), convert(base["lse"])
    scales["lse"] = scales["lse"] * conventions.lse_scale
    return ref, scales, base


def _lse_base_hint(got, ref, allowed: float, conventions: Conventions) -> str:
    """Say so when a failing lse is right in the other base: the convention, not the arithmetic, is off."""
    fin = torch.isfinite(ref)
    if not fin.any():
        return ""
    other = "2" if conventions.lse_base == "e" else "e"
    into_other = (1 / math.log(2.0) if other == "2" else 1.0) / conventions.lse_scale
    err = (got.detach().double()[fin] - ref[fin] * into_other).abs().nan_to_num(nan=math.inf).amax().item()
    if err <= allowed * into_other:
        return f"lse is right in base {other}: the subject declares base {conventions.lse_base} (conventions)"
    return ""
