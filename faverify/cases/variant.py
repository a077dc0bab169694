"""Variant: what a case adds to dense attention, in tensors: the window, softcap, ALiBi slopes, sinks,
mask, bias and score_mod that the inputs build from a case and the reference and the subjects read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Variant:
    """What a case adds to dense attention (VARIANTS.md's semantics, in this order): softcap c > 0 turns
    the scaled logit s into c * tanh(s / c); ALiBi adds -slope_h * |i + sk - sq - j|; the keys row i sees
    are those with diag - left <= j <= diag + right (diag = i + sk - sq, None: unbounded; causal is
    right = 0); a sink z_h is one more logit in each row's softmax, with no value."""
    left: int | None = None
    right: int | None = None
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None  # fp32 [h] or [b, h]
    sinks: torch.Tensor | None = None  # fp32 [h]
    sinks_learned: bool = True  # False: a fixed logit (the off-by-one sink), whose gradient nobody asks
    offset: int | None = None  # row i's diagonal key is i + offset; None: sk - sq (bottom-right)
    alibi_form: str = "flash"  # or "relative": + slope * (j - diagonal) (conventions.ALIBI_FORMS)
    # masks.py: a bool keep-mask and an additive bias, [B, H, SQ, SK] broadcasting over [b, h, sq, sk]
    # (the bias added after ALiBi, the mask with causal and windows), and a FlexAttention score_mod applied
    # to the logit after the bias. Keys no row may see may hold NaN in k and v: read as 0.
    mask: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    score_mod: Callable | None = None
    # log of how many times each key is listed (sparse indices, "each": a key listed twice weighs twice),
    # [B, H, SQ, SK]: added to the logits as a bias is, but a weight, not a logit (the max logit leaves it out)
    multiplicity: torch.Tensor | None = None

    @classmethod
    def dense(cls, causal: bool) -> "Variant":
        return cls(right=0 if causal else None)
