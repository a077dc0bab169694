"""Finite-difference check of a subject's backward against its own forward (its calls of the subject are
run/gradcheck.py's).

Comparing gradients with the FP64 reference says whether they are right; this says whether they are the
derivative of what the subject's forward computes, which catches a backward that is consistent with the
reference only by accident (a dk that misses the softmax scale where the forward also got it wrong).

L(x) = sum(w * forward(x)) along a direction e in (q, k, v) of +-1 per element:
    fd       = (L(x+) - L(x-)) / 2h, x+- = x +- h e rounded to the dtype
    analytic = <grad L, x+ - x-> / 2h  (the subject's backward with grad_output w)
e is the sign of the subject's own gradient (random where it is 0), so analytic is about sum |grad L|: a
backward off by a factor shows its whole error, where a random direction would let the terms cancel to
about 1/sqrt(n) of it. In fp32 where the subject supports it; otherwise fp16, then bf16. Inputs are
quantized to multiples of h and clamped so that x +- h e is exact at the step h; at h/4 and h/16 it may
round (fp16 past 2 at h/16), and the gradient is taken along the step the inputs actually moved.

Two errors separate fd from the derivative of a correct subject, beside the dtype's allowance below. The
difference quotient's truncation, which no fixed allowance can bound where the function is steep
(softcap 0.05 at scale 2 makes tanh bend within one step): the FP64 reference measures it between the same
points, |fd64 - analytic64|. And the forward's rounding over 2h, which grows as the step shrinks: the
naive baseline in the dtype measures what a correct forward may err at both ends. The check allows twice
each, tries the steps h, h/4 and h/16 (shorter steps cut the truncation by 16 while the rounding grows by
4) and keeps the one where they add up least.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import variant_of
from faverify.cases.large import judged_entries
from faverify.cases.vocabulary import FP8_OWN_REGIMES
from faverify.errors import printable
from faverify.judge.reference import naive, reference

# step h, clamp |x| so that x +- h is exact in the dtype, allowed relative discrepancy
SETTINGS = {"fp32": (2.0**-10, 64.0, 1e-3), "fp16": (2.0**-6, 16.0, 0.05), "bf16": (2.0**-5, 3.9, 0.25)}


@dataclass
class GradCheck:
    dtype: str
    step: float
    analytic: float
    fd: float
    rel_err: float  # |fd - analytic| / sum |grad| |e|
    allowed: float  # the relative discrepancy allowed: the dtype's, plus twice truncation and rounding below
    passed: bool
    skipped: bool
    reason: str
    error: str = ""  # the exception's type where the subject raised in the check
    truncation: float = 0.0  # |fd64 - analytic64| / sum |grad| |e|: the FP64 reference's own quotient error
    rounding: float = 0.0  # sum |w| |naive - ref| at both ends / 2h / sum |grad| |e|: a correct forward's share

    def __post_init__(self):  # the reason may quote what the subject raised
        self.reason, self.error = printable(self.reason), printable(self.error)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def dtype_for(dtypes: tuple) -> str | None:
    """The dtype the check runs a subject in: the most precise of those it supports."""
    return next((d for d in ("fp32", "fp16", "bf16") if d in dtypes), None)


def verdict(dtype: str, step: float, fd: float, analytic: float, magnitude: float, truncation: float,
            rounding: float) -> GradCheck:
    """The check's verdict on the best-resolved quotient: |fd - analytic| relative to sum |grad| |e|
    (magnitude), within the dtype's allowance plus twice the truncation and twice the rounding."""
    allowed = SETTINGS[dtype][2] + 2 * truncation + 2 * rounding
    rel = abs(fd - analytic) / magnitude if magnitude > 0 else (0.0 if abs(fd) < 1e-12 else math.inf)
    passed = math.isfinite(rel) and rel <= allowed
    reason = "" if passed else (f"{dtype}: directional derivative of the forward {fd:.6g} vs backward "
                                f"{analytic:.6g} (relative {rel:.3g} > {allowed:.3g}, of which "
                                f"{2 * truncation:.3g} for the difference quotient's truncation and "
                                f"{2 * rounding:.3g} for the forward's rounding)")
    return GradCheck(dtype, step, analytic, fd, rel, allowed, passed, False, reason, truncation=truncation,
                     rounding=rounding)


def dense_form(case: Case) -> bool:
    """Whether the check runs on another case than this one: the dense case of its longest sequences, a
    large case's first batch entry."""
    return case.kind != "dense" or case.splits > 1 or judged_entries(case) is not None


def checked_case(case: Case, dtype: str) -> Case:
    """The case the check runs the subject on, in `dtype`: a ragged, split or large case's dense form over its
    longest sequences (and first batch entry), an FP8 case unquantized, in the contiguous layout, with normal
    values."""
    if dense_form(case):
        case = dataclasses.replace(case, batch=1, varlen=None, paged=None, splits=1)
    if case.fp8 is not None:  # FP8 inputs are forward-only: the backward is checked on the same case unquantized
        case = dataclasses.replace(case, fp8=None, regime="normal" if case.regime in FP8_OWN_REGIMES else case.regime)
    # a finfo.min bias leaves a difference quotient nothing to see (s + h rounds to s next to 3.4e38, while the
    # softmax still depends on s), and NaN keys would make every quotient NaN: the check takes normal ones.
    # A sink far above every logit leaves each key a weight of e^-30 of it or less, near and under fp32's
    # smallest normal, which a GPU flushes to zero (ex2.approx.ftz): terms that appear and vanish between
    # x - he and x + he. The sink "around" the rows' log-sum-exp keeps it in the softmax with normal weights.
    # a loss on out alone: the check follows the forward's out (the FP64 judge has the loss on lse)
    mask = None if case.mask is None else dataclasses.replace(case.mask, nan=False)
    bias = case.bias
    if bias is not None and bias.values == "min":
        bias = dataclasses.replace(bias, values="normal")
    return dataclasses.replace(case, dtype=dtype, regime="normal", layout="contiguous", mask=mask, lse_grad="off",
                               bias=bias, sinks="around" if case.sinks == "above" else case.sinks)


def signs(grad: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """+-1 per element: the gradient's sign, a random one where it is 0 (or not finite)."""
    coin = torch.randint(0, 2, grad.shape, generator=g, device=grad.device) * 2 - 1
    sign = torch.sign(grad.detach().float()).nan_to_num(nan=0.0)
    return torch.where(sign != 0, sign, coin.float()).to(grad.dtype)


def along(grads: list, ends: list, h: float) -> torch.Tensor:
    """<grad, x+ - x-> / 2h: the directional derivative along the step the quotient took. Where x +- h e is
    not exact in the dtype (|x| past 2^p h at the shorter steps) that step is not 2h e, and comparing the
    quotient with <grad, e> would count the rounding of the inputs as the backward's error."""
    plus, minus = ends
    along = sum((gr.double() * (p.double() - m.double())).sum() for gr, p, m in zip(grads, plus, minus))
    return along / (2 * h)


def quotient_errors(conventions, case: Case, x, base: list, ends: list, w, h: float) -> tuple:
    """(truncation, rounding) of the quotient between the two points, under the subject's conventions, as
    FP64 scalars on the device.
    truncation: |fd64 - analytic64|, how far the FP64 reference's own quotient lies from its exact
    derivative at the same inputs along the same step (the points sit off centre where an end rounded).
    rounding: sum |w| |naive - ref| at each end, over 2h: what a correct forward in the dtype (the naive
    baseline, rounding after every operation) may add to the quotient. It grows as the step shrinks."""
    variant = variant_of(case, x, conventions)
    kwargs = dict(causal=case.causal, scale=case.scale, variant=variant)
    with torch.no_grad():
        ref, _ = reference(*(t.to(torch.float64) for t in base), w, **kwargs)
        exact = along([ref[n] for n in ("dq", "dk", "dv")], ends, h)
        values, rounding = [], 0.0
        for end in ends:
            out = reference(*(t.to(torch.float64) for t in end), **kwargs)[0]["out"]
            values.append((out * w).sum())
            rounding = rounding + (w.abs() * (naive(*end, **kwargs)["out"].to(torch.float64) - out).abs()).sum()
        quotient = (values[0] - values[1]) / (2 * h)
    return (quotient - exact).abs(), rounding / (2 * h)


def quantize(t: torch.Tensor, h: float, clamp: float) -> torch.Tensor:
    return (t.float() / h).round().clamp(-(clamp / h) + 1, clamp / h - 1) * h


def skip(dtype: str, reason: str) -> GradCheck:
    return GradCheck(dtype, 0.0, 0.0, 0.0, 0.0, 0.0, True, True, reason)
