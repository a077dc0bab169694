"""Controls: outputs a careless comparator lets through, each of which the judge must fail.

Zeros, a copy of V, the mean of V over the keys, NaN everywhere, +Inf everywhere, the right values on
another device, and zeros in a tensor subclass that answers every comparison with "equal". `faverify
doctor` runs each on cases of every dtype, among them the regimes whose outputs are tiny or whose tolerance
is widest: a control that passes any of them is a hole in the judge (or in a tolerance given on the command
line), and the doctor fails.
"""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.judge.reference import reference
from faverify.subjects.base import Capabilities, Subject


def _right(q, k, v, causal, softmax_scale):
    """The attention in FP64, cast back: what a correct kernel returns."""
    return reference(q, k, v, causal=causal, scale=softmax_scale)[0]["out"].to(q.dtype)


def _zeros(q, v):
    return torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)


def zeros(q, k, v, *, causal, softmax_scale):
    return _zeros(q, v)


def copy_of_v(q, k, v, *, causal, softmax_scale):
    """Row i of each head is the value of key i (the last key past them), as if each row saw its own key
    alone."""
    group = q.shape[2] // k.shape[2]
    rows = torch.arange(q.shape[1], device=q.device).clamp(max=max(k.shape[1] - 1, 0))
    return v[:, rows].repeat_interleave(group, dim=2).to(q.dtype)


def mean_of_v(q, k, v, *, causal, softmax_scale):
    """Each row the mean of the values over every key, whatever the logits and the mask."""
    group = q.shape[2] // k.shape[2]
    mean = v.float().mean(dim=1, keepdim=True).repeat_interleave(group, dim=2)
    return mean.expand(-1, q.shape[1], -1, -1).to(q.dtype)


def nan(q, k, v, *, causal, softmax_scale):
    return _zeros(q, v).fill_(float("nan"))


def inf(q, k, v, *, causal, softmax_scale):
    return _zeros(q, v).fill_(float("inf"))


def elsewhere(q, k, v, *, causal, softmax_scale):
    """The right values, on another device than the inputs': on the CPU for CUDA inputs, on the meta device
    (shapes without values) for CPU ones."""
    out = _right(q, k, v, causal, softmax_scale)
    return out.cpu() if q.is_cuda else out.to("meta")


class Agreeable(torch.Tensor):
    """A tensor that says it matches whatever it is compared with: every difference 0, nothing NaN."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("sub", "__sub__", "abs", "ne", "__ne__") and isinstance(result, torch.Tensor):
            return torch.zeros_like(result.as_subclass(torch.Tensor))
        if name in ("isnan", "isinf") and isinstance(result, torch.Tensor):
            return torch.zeros_like(result.as_subclass(torch.Tensor), dtype=torch.bool)
        return result


def agreeable_zeros(q, k, v, *, causal, softmax_scale):
    return _zeros(q, v).as_subclass(Agreeable)


CONTROLS = {"zeros": zeros, "copy of v": copy_of_v, "mean of v": mean_of_v, "nan": nan, "inf": inf,
            "right values elsewhere": elsewhere, "agreeing subclass": agreeable_zeros}


# Where a control is the right answer: under "tiny" q and k are tiny too, every row's attention is uniform
# to within rounding, and the mean of v over the keys is what a correct kernel returns
RIGHT_IN = {"mean of v": ("tiny",)}


def cases(dtype: str, control: str = "") -> list:
    """Cases of one dtype on which the control is wrong: two keys or more, values that differ from key to
    key. The regimes with the widest tolerance and the tiniest outputs among them: tiny values, logits far
    below zero, large values (a baseline nearly as wrong as zeros), a row that sees one key, GQA, causal
    rows that see no key beside rows that do."""
    return [c for c in _all_cases(dtype) if c.regime not in RIGHT_IN.get(control, ())]


def _all_cases(dtype: str) -> list:
    return [Case(1, 16, 16, 2, 2, 32, dtype=dtype, seed=1),
            Case(1, 16, 16, 2, 2, 32, dtype=dtype, regime="tiny", seed=2),
            Case(1, 16, 16, 2, 2, 32, dtype=dtype, regime="negative", seed=3),
            Case(1, 128, 128, 2, 2, 64, dtype=dtype, regime="large", seed=4),
            Case(1, 8, 8, 2, 2, 32, dtype=dtype, causal=True, regime="lone-key", seed=5),
            Case(2, 24, 9, 4, 2, 16, dtype=dtype, causal=True, regime="outliers", seed=6)]


def subject(name: str) -> Subject:
    return Subject(f"control: {name}", CONTROLS[name], Capabilities.of(backward=False))
