"""FP8 inputs: q, k and v in float8_e4m3fn (or e5m2) with descale factors, as flash-attn 3 and 4 take them.

A case's values are drawn in fp32 as any case's are, then each tensor is scaled so its largest magnitude
(over the whole tensor, per batch entry and kv head, or per block of keys) lands on the format's largest
value (448 for e4m3), and rounded to the format. The descale is that scale: the tensor the attention sees is
the FP8 values times their descale, exactly (in FP64), and that is what the reference takes. The
quantization of the user's inputs is theirs; faverify judges the attention of what the kernel was given.
"""
from __future__ import annotations

import math

import torch

from faverify.cases.case import Case
from faverify.cases.vocabulary import FP8_BLOCK, FP8_FORMATS

E4M3 = torch.float8_e4m3fn
TORCH_FP8 = {"e4m3": E4M3, "e5m2": torch.float8_e5m2}
TAIL_GAP = 10 * math.log(2.0)  # the tail keys' logits below the row's max: a weight of 2^-10 each


def quantize(case: Case, t: torch.Tensor, heads_k: int, keys: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in the case's FP8 format, its descale in fp32) for a [b, s, h, d] tensor whose heads fall into
    heads_k groups (q's query heads by their kv head): each scaled group's largest magnitude on the format's.
    The descale is [batch, heads_k], or for k and v (keys) of a "block" case [batch, heads_k, blocks], one per
    FP8_BLOCK keys."""
    b, s, h, d = t.shape
    grouped = t.reshape(b, s, heads_k, h // heads_k, d)
    if case.fp8.granularity == "block" and keys:
        blocks = -(-s // FP8_BLOCK)
        padded = torch.nn.functional.pad(grouped.abs(), (0, 0, 0, 0, 0, 0, 0, blocks * FP8_BLOCK - s))
        amax = padded.reshape(b, blocks, FP8_BLOCK, heads_k, -1).amax(dim=(2, 4)).transpose(1, 2)
    elif case.fp8.granularity in ("head", "block"):
        amax = grouped.abs().amax(dim=(1, 3, 4))
    else:
        amax = t.abs().amax().expand(b, heads_k)
    top = FP8_FORMATS[case.fp8.format]
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax)).float().contiguous()
    q8 = (grouped / per_position(scale, s)).clamp(-top, top).to(TORCH_FP8[case.fp8.format])
    return q8.reshape(b, s, h, d), scale


def per_position(descale: torch.Tensor, s: int) -> torch.Tensor:
    """A descale as a [b, s, heads_k, 1, 1] factor over a grouped [b, s, heads_k, group, d] tensor: [b, hk]
    for every position alike, [b, hk, blocks] per FP8_BLOCK positions."""
    if descale.dim() == 2:
        return descale[:, None, :, None, None]
    return descale.repeat_interleave(FP8_BLOCK, dim=2)[:, :, :s].transpose(1, 2)[..., None, None]


def dequantized(t: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """The values an FP8 tensor [b, s, h, d] stands for, in FP64: exact (4 or 3 significant bits times 24)."""
    b, s, h, d = t.shape
    heads_k = descale.shape[1]
    wide = t.to(torch.float64).reshape(b, s, heads_k, h // heads_k, d)
    return (wide * per_position(descale.to(torch.float64), s)).reshape(b, s, h, d)


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


def limits(g: torch.Generator, *tensors: torch.Tensor) -> tuple:
    """The "limits" regime: each element keeps its sign and becomes 1, the format's largest value once scaled,
    or, one time in two, a multiple of 2^-16 up to 7 of them, among the format's subnormals once scaled
    (e4m3's start below 2^-6 of 448). A kernel that flushes those moves its output by less than one bf16
    rounding of the tensor's scale, within the tolerance; one that sums products of two 448s in fp16 does not."""
    out = []
    for t in tensors:
        small = torch.randint(1, 8, t.shape, generator=g, device=t.device).float() * 2.0**-16
        pick = torch.rand(t.shape, generator=g, device=t.device) < 0.5
        out.append(torch.where(pick, small, torch.ones_like(t)) * torch.where(t < 0, -1.0, 1.0))
    return tuple(out)


def block_spread(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """The "block-spread" regime: k and v times 2^-10 in every other block of FP8_BLOCK keys, from the first:
    per-block scales 2^10 apart, and a row's largest logits in a later block than its first."""
    sk = k.shape[1]
    small = (torch.arange(sk, device=k.device) // FP8_BLOCK) % 2 == 0
    factor = torch.where(small, 2.0**-10, 1.0)[None, :, None, None]
    return k * factor, v * factor
