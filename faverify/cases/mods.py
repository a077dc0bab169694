"""Named score_mods of the FlexAttention signature, score_mod(score, b, h, q_idx, kv_idx) -> score.

Each is built for one case from parameters drawn from the seed (on the masks' generator, after the mask
and bias): the callable a Flex-like subject compiles is the one the FP64 reference applies, elementwise on
index grids, and differentiates (the reference takes its derivative by autograd, so a new mod needs no
hand-written gradient). The score a mod sees is the scaled logit, softmax_scale * q.k, as in FlexAttention.
"""
from __future__ import annotations

from typing import Callable

import torch

from faverify.cases.case import Case

RELATIVE_REACH = 16  # "relative": one learned bias per head for each distance in -16..16, clamped beyond
SOFTCAPS = (1.0, 5.0, 30.0)


def score_mod(case: Case, device, g: torch.Generator) -> Callable | None:
    if case.score_mod == "off":
        return None
    h, offset = case.nheads, case.seqlen_k - case.seqlen_q
    if case.score_mod == "relative":
        table = torch.randn(h, 2 * RELATIVE_REACH + 1, generator=g, device=device)

        def relative(score, b, h, i, j):
            distance = (j - i - offset).clamp(-RELATIVE_REACH, RELATIVE_REACH) + RELATIVE_REACH
            return score + table[h, distance].to(score.dtype)
        return relative
    if case.score_mod == "alibi":
        slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device, dtype=torch.float32) / h)
        slopes = slopes * (0.5 + 1.5 * torch.rand(h, generator=g, device=device))

        def alibi(score, b, h, i, j):
            return score - slopes[h].to(score.dtype) * (i + offset - j).abs().to(score.dtype)
        return alibi
    cap = SOFTCAPS[int(torch.randint(len(SOFTCAPS), (1,), generator=g, device=device))]

    def softcap(score, b, h, i, j):
        return cap * torch.tanh(score / cap)
    return softcap


def sech2(u):
    """softcap's derivative d tanh(u) / du = 4 e^-2|u| / (1 + e^-2|u|)^2: 1 - tanh^2 cancels where tanh
    rounds to 1 (past |u| = 19 in FP64), which made the reference's dq and dk exactly 0 where the derivative
    is still e^-38 and more."""
    e = torch.exp(-2 * u.abs())
    return 4 * e / ((1 + e) * (1 + e))
