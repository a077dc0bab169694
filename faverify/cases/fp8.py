"""FP8 inputs: q, k and v in float8_e4m3fn with descale factors, as flash-attn 3 and 4 take them.

A case's values are drawn in fp32 as any case's are, then each tensor is scaled so its largest magnitude
(over the whole tensor, or per batch entry and kv head) lands on e4m3's 448, and rounded to e4m3. The
descale is that scale: the tensor the attention sees is the e4m3 values times their descale, exactly (in
FP64), and that is what the reference takes. The quantization of the user's inputs is theirs; faverify
judges the attention of what the kernel was given.
"""
from __future__ import annotations

import math

import torch

from faverify.cases.case import Case
from faverify.cases.vocabulary import FP8_FORMATS

E4M3 = torch.float8_e4m3fn
TORCH_FP8 = {"e4m3": E4M3, "e5m2": torch.float8_e5m2}
TAIL_GAP = 10 * math.log(2.0)  # the tail keys' logits below the row's max: a weight of 2^-10 each


def quantize(case: Case, t: torch.Tensor, heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in the case's FP8 format, its descale [batch, heads_k] in fp32) for a [b, s, h, d] tensor whose heads
    fall into heads_k groups (q's query heads by their kv head): its largest magnitude on the format's."""
    b, s, h, d = t.shape
    grouped = t.reshape(b, s, heads_k, h // heads_k, d)
    if case.fp8 == "head":
        amax = grouped.abs().amax(dim=(1, 3, 4))
    else:
        amax = t.abs().amax().expand(b, heads_k)
    top = FP8_FORMATS[case.fp8_format]
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax)).float()
    q8 = (grouped / scale[:, None, :, None, None]).clamp(-top, top).to(TORCH_FP8[case.fp8_format])
    return q8.reshape(b, s, h, d), scale.contiguous()


def dequantized(t: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """The values an FP8 tensor [b, s, h, d] stands for, in FP64: exact (4 or 3 significant bits times 24)."""
    b, s, h, d = t.shape
    heads_k = descale.shape[1]
    wide = t.to(torch.float64).reshape(b, s, heads_k, h // heads_k, d)
    return (wide * descale.to(torch.float64)[:, None, :, None, None]).reshape(b, s, h, d)


def tail_mass(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """q, k, v of the "tail-mass" regime: along the first head-dim column, q is 1 and key 0 is 0, every
    other key -TAIL_GAP / scale, so key 0 holds each row's max logit and the others sit TAIL_GAP below it;
    v is 0 at key 0 and 1 elsewhere. The other columns carry the drawn values times 2^-12, which moves no
    logit by more than a fraction of a weight's rounding."""
    small = 2.0**-12
    q, k, v = q * small, k * small, v * small
    q[..., 0] = 1.0
    k[..., 0] = -TAIL_GAP / case.scale
    k[:, 0, :, 0] = 0.0
    v[...] = 1.0
    v[:, 0] = 0.0
    return q, k, v
