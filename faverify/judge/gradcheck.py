"""Finite-difference check of a subject's backward against its own forward.

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
from faverify.cases.inputs import make_inputs, variant_of
from faverify.cases.large import judged_entries
from faverify.cases.vocabulary import FP8_OWN_REGIMES
from faverify.dtypes import TORCH
from faverify.errors import Unsupported, printable
from faverify.judge.reference import naive, reference
from faverify.subjects.base import Subject

# step h, clamp |x| so that x +- h is exact in the dtype, allowed relative discrepancy
_SETTINGS = {"fp32": (2.0**-10, 64.0, 1e-3), "fp16": (2.0**-6, 16.0, 0.05), "bf16": (2.0**-5, 3.9, 0.25)}


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


def dtype_for(subject: Subject) -> str | None:
    """The dtype the check runs the subject in: the most precise it supports."""
    return next((d for d in ("fp32", "fp16", "bf16") if d in subject.caps.dtypes), None)


def directional(subject: Subject, case: Case, device: torch.device) -> GradCheck:
    dtype = dtype_for(subject)
    if dtype is None or not subject.caps.backward_on(torch.device(device).type):
        return _skip(dtype or "-", "subject has no backward here or no supported dtype")
    if _dense_form(case) and not subject.caps.dense:
        return _skip(dtype, "the finite-difference check runs on dense cases; the subject takes none")
    h, clamp, allowed = _SETTINGS[dtype]
    c = checked_case(case, dtype)
    why = subject.unsupported(c, device)
    if why:
        return _skip(dtype, why)
    x = make_inputs(c, device)
    tdtype = TORCH[dtype]
    g = torch.Generator(device=device).manual_seed(case.seed + 1)
    base = [_quantize(t, h, clamp).to(tdtype) for t in x.tensors()]
    w = x.dout.to(torch.float64)
    # the case's slopes, sinks and bias held fixed (a mask_mod or score_mod is a function: as it is)
    extras = {name: t.detach() if isinstance(t, torch.Tensor) else t for name, t in x.extras().items()}

    def loss(tensors, grad=False):
        ins = [t.clone().requires_grad_(grad) for t in tensors]
        out, _ = subject(*ins, c, extras)
        value = (out.to(torch.float64) * w).sum()
        return value, ins, out

    try:
        _, ins, out = loss(base, grad=True)
        if not out.requires_grad:  # as the case itself was: judged on its forward alone
            return _skip(dtype, "the subject's output has no autograd graph")
        grads = torch.autograd.grad(out, ins, x.dout.to(tdtype), allow_unused=True)
        grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, base)]
        direction = [_signs(gr, g) for gr in grads]
        total = sum((gr.double().abs()).sum() for gr in grads)
        quotients = []  # (what a correct subject may err by, step, fd, analytic, truncation, rounding)
        for step in (h, h / 4, h / 16):  # shorter steps cut the truncation by 16 and let the rounding grow by 4
            ends = [[t + sign * step * e for t, e in zip(base, direction)] for sign in (1, -1)]
            with torch.no_grad():
                plus, minus = (loss(end)[0] for end in ends)
            # what the step's verdict reads from the device, in one transfer
            read = [total, (plus - minus) / (2 * step), _along(grads, ends, step),
                    *_quotient_errors(subject, c, x, base, ends, w, step)]
            magnitude, fd, analytic, *raw = torch.stack(read).tolist()
            errors = [e / magnitude if magnitude > 0 else 0.0 for e in raw]
            quotients.append((sum(errors), step, fd, analytic, *errors))
            if sum(errors) <= allowed / 8:  # resolved well enough: the shorter steps cost calls and add nothing
                break
        _, step, fd, analytic, truncation, rounding = min(quotients)  # the best-resolved quotient
    except (Unsupported, ValueError, NotImplementedError) as e:
        return _skip(dtype, f"{type(e).__name__}: {e}")
    except (MemoryError, torch.OutOfMemoryError) as e:  # workers beside this one took it, as in evaluate._evaluate
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return _skip(dtype, f"out of memory for the check ({type(e).__name__})")
    except Exception as e:  # the subject's failure in the check's dtype (flex: no kernel fits in fp32 at d192)
        return GradCheck(dtype, h, 0.0, 0.0, math.inf, allowed, False, False,
                         f"{dtype}: the subject raised {type(e).__name__}: {e}", error=type(e).__name__)
    allowed = allowed + 2 * truncation + 2 * rounding
    rel = abs(fd - analytic) / magnitude if magnitude > 0 else (0.0 if abs(fd) < 1e-12 else math.inf)
    passed = math.isfinite(rel) and rel <= allowed
    reason = "" if passed else (f"{dtype}: directional derivative of the forward {fd:.6g} vs backward "
                                f"{analytic:.6g} (relative {rel:.3g} > {allowed:.3g}, of which "
                                f"{2 * truncation:.3g} for the difference quotient's truncation and "
                                f"{2 * rounding:.3g} for the forward's rounding)")
    return GradCheck(dtype, step, analytic, fd, rel, allowed, passed, False, reason, truncation=truncation,
                     rounding=rounding)


def _dense_form(case: Case) -> bool:
    """Whether the check runs on another case than this one: the dense case of its longest sequences, a
    large case's first batch entry."""
    return case.kind != "dense" or case.splits > 1 or judged_entries(case) is not None


def checked_case(case: Case, dtype: str) -> Case:
    """The case the check runs the subject on, in `dtype`: a ragged, split or large case's dense form over its
    longest sequences (and first batch entry), an FP8 case unquantized, in the contiguous layout, with normal
    values."""
    if _dense_form(case):
        case = dataclasses.replace(case, batch=1, seqlens=None, tail=0, cache_seqlens=None, page_size=0,
                                   pages="in-order", pool=0, splits=1)
    if case.fp8 != "off":  # FP8 inputs are forward-only: the backward is checked on the same case unquantized
        case = dataclasses.replace(case, fp8="off", fp8_format="e4m3",
                                   regime="normal" if case.regime in FP8_OWN_REGIMES else case.regime)
    # a finfo.min bias leaves a difference quotient nothing to see (s + h rounds to s next to 3.4e38, while the
    # softmax still depends on s), and NaN keys would make every quotient NaN: the check takes normal ones.
    # A sink far above every logit leaves each key a weight of e^-30 of it or less, near and under fp32's
    # smallest normal, which a GPU flushes to zero (ex2.approx.ftz): terms that appear and vanish between
    # x - he and x + he. The sink "around" the rows' log-sum-exp keeps it in the softmax with normal weights.
    # a loss on out alone: the check follows the forward's out (the FP64 judge has the loss on lse)
    return dataclasses.replace(case, dtype=dtype, regime="normal", layout="contiguous", mask_nan=False,
                               lse_grad="off", bias="normal" if case.bias == "min" else case.bias,
                               sinks="around" if case.sinks == "above" else case.sinks)


def _signs(grad: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """+-1 per element: the gradient's sign, a random one where it is 0 (or not finite)."""
    coin = torch.randint(0, 2, grad.shape, generator=g, device=grad.device) * 2 - 1
    sign = torch.sign(grad.detach().float()).nan_to_num(nan=0.0)
    return torch.where(sign != 0, sign, coin.float()).to(grad.dtype)


def _along(grads: list, ends: list, h: float) -> torch.Tensor:
    """<grad, x+ - x-> / 2h: the directional derivative along the step the quotient took. Where x +- h e is
    not exact in the dtype (|x| past 2^p h at the shorter steps) that step is not 2h e, and comparing the
    quotient with <grad, e> would count the rounding of the inputs as the backward's error."""
    plus, minus = ends
    along = sum((gr.double() * (p.double() - m.double())).sum() for gr, p, m in zip(grads, plus, minus))
    return along / (2 * h)


def _quotient_errors(subject: Subject, case: Case, x, base: list, ends: list, w, h: float) -> tuple:
    """(truncation, rounding) of the quotient between the two points, under the subject's conventions, as
    FP64 scalars on the device.
    truncation: |fd64 - analytic64|, how far the FP64 reference's own quotient lies from its exact
    derivative at the same inputs along the same step (the points sit off centre where an end rounded).
    rounding: sum |w| |naive - ref| at each end, over 2h: what a correct forward in the dtype (the naive
    baseline, rounding after every operation) may add to the quotient. It grows as the step shrinks."""
    variant = variant_of(case, x, subject.caps.conventions)
    kwargs = dict(causal=case.causal, scale=case.scale, variant=variant)
    with torch.no_grad():
        ref, _ = reference(*(t.to(torch.float64) for t in base), w, **kwargs)
        exact = _along([ref[n] for n in ("dq", "dk", "dv")], ends, h)
        values, rounding = [], 0.0
        for end in ends:
            out = reference(*(t.to(torch.float64) for t in end), **kwargs)[0]["out"]
            values.append((out * w).sum())
            rounding = rounding + (w.abs() * (naive(*end, **kwargs)["out"].to(torch.float64) - out).abs()).sum()
        quotient = (values[0] - values[1]) / (2 * h)
    return (quotient - exact).abs(), rounding / (2 * h)


def _quantize(t: torch.Tensor, h: float, clamp: float) -> torch.Tensor:
    return (t.float() / h).round().clamp(-(clamp / h) + 1, clamp / h - 1) * h


def _skip(dtype: str, reason: str) -> GradCheck:
    return GradCheck(dtype, 0.0, 0.0, 0.0, 0.0, 0.0, True, True, reason)
