"""The finite-difference check's calls of a subject: its forward at the quantized inputs and at each end of
each step, its backward along the direction of its own gradient (judge/gradcheck.py holds the check: its
steps, the FP64 reference's share of the quotient's error, and the verdict).
"""
from __future__ import annotations

import math

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.dtypes import TORCH
from faverify.errors import Unsupported
from faverify.judge.gradcheck import (
    SETTINGS,
    GradCheck,
    along,
    checked_case,
    dense_form,
    dtype_for,
    quantize,
    quotient_errors,
    signs,
    skip,
    verdict,
)
from faverify.subjects.base import Subject


def directional(subject: Subject, case: Case, device: torch.device) -> GradCheck:
    dtype = dtype_for(subject.caps.dtypes)
    if dtype is None or not subject.caps.backward_on(torch.device(device).type):
        return skip(dtype or "-", "subject has no backward here or no supported dtype")
    if dense_form(case) and not subject.caps.ragged.dense:
        return skip(dtype, "the finite-difference check runs on dense cases; the subject takes none")
    h, clamp, allowed = SETTINGS[dtype]
    c = checked_case(case, dtype)
    why = subject.unsupported(c, device)
    if why:
        return skip(dtype, why)
    x = make_inputs(c, device)
    tdtype = TORCH[dtype]
    g = torch.Generator(device=device).manual_seed(case.seed + 1)
    base = [quantize(t, h, clamp).to(tdtype) for t in x.tensors()]
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
            return skip(dtype, "the subject's output has no autograd graph")
        grads = torch.autograd.grad(out, ins, x.dout.to(tdtype), allow_unused=True)
        grads = [torch.zeros_like(t) if gr is None else gr for gr, t in zip(grads, base)]
        direction = [signs(gr, g) for gr in grads]
        total = sum((gr.double().abs()).sum() for gr in grads)
        quotients = []  # (what a correct subject may err by, step, fd, analytic, truncation, rounding)
        for step in (h, h / 4, h / 16):  # shorter steps cut the truncation by 16 and let the rounding grow by 4
            ends = [[t + sign * step * e for t, e in zip(base, direction)] for sign in (1, -1)]
            with torch.no_grad():
                plus, minus = (loss(end)[0] for end in ends)
            # what the step's verdict reads from the device, in one transfer
            read = [total, (plus - minus) / (2 * step), along(grads, ends, step),
                    *quotient_errors(subject.caps.conventions, c, x, base, ends, w, step)]
            magnitude, fd, analytic, *raw = torch.stack(read).tolist()
            errors = [e / magnitude if magnitude > 0 else 0.0 for e in raw]
            quotients.append((sum(errors), step, fd, analytic, *errors))
            if sum(errors) <= allowed / 8:  # resolved well enough: the shorter steps cost calls and add nothing
                break
        _, step, fd, analytic, truncation, rounding = min(quotients)  # the best-resolved quotient
    except (Unsupported, ValueError, NotImplementedError) as e:
        return skip(dtype, f"{type(e).__name__}: {e}")
    except (MemoryError, torch.OutOfMemoryError) as e:  # workers beside this one took it, as in evaluate._evaluate
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return skip(dtype, f"out of memory for the check ({type(e).__name__})")
    except Exception as e:  # the subject's failure in the check's dtype (flex: no kernel fits in fp32 at d192)
        return GradCheck(dtype, h, 0.0, 0.0, math.inf, allowed, False, False,
                         f"{dtype}: the subject raised {type(e).__name__}: {e}", error=type(e).__name__)
    return verdict(dtype, step, fd, analytic, magnitude, truncation, rounding)
