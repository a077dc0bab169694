"""The yardstick of an FP8 case: the naive attention with FP8 numerics, which sets what a correct FP8 kernel
may err by (the same-dtype baseline of every other case).

As flash-attn 3 computes it: S = (q8 k8^T) in fp32 times q_descale * k_descale * softmax_scale; P = exp(S -
rowmax) in fp32, its row sum l from those fp32 values; P quantized to e4m3 after scaling its row onto e4m3's
range (the row max gives P = 1, scaled to 448; for e5m2 inputs P is e5m2, scaled to 57344), so small weights
keep their precision instead of flushing;
O = (P8 v8) / 448 * v_descale / l in fp32, rounded to the output's bf16. A row that sees no key gives
out 0 and lse -inf.
"""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.cases.fp8 import TORCH_FP8
from faverify.cases.vocabulary import FP8_BLOCK, FP8_FORMATS

# The unit roundoff of P quantized to each format (3 and 2 significand bits). Divided by l from the unrounded
# weights, as flash-attn 3 does, an FP8 kernel's weights sum to 1 only within it: its out may leave its values'
# hull by that share of their size.
P_UNIT = {"e4m3": 2.0**-4, "e5m2": 2.0**-3}


def naive(case: Case, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, descales: tuple) -> dict:
    """{"out": [b, sq, h, dv] bf16, "lse": [b, h, sq] fp32} of the FP8 inputs and their descales ([b, hk], or
    for k and v per block of keys [b, hk, blocks], applied to the logits' and P's columns)."""
    group = case.nheads // case.nheads_k
    sk = k8.shape[1]
    qd, kd, vd = (_columns(d, group, sk) for d in descales)
    q, k, v = (t.float().transpose(1, 2) for t in (q8, k8, v8))  # exact: e4m3 values are fp32 values
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (qd * kd * case.scale)
    if case.causal:
        sq = s.shape[-2]
        rows, cols = torch.arange(sq, device=s.device)[:, None], torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(cols > rows + sk - sq, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    seen = torch.isfinite(m)
    m = torch.where(seen, m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    top = FP8_FORMATS[case.fp8.format]  # P in the inputs' format: e5m2's P is coarser, and so is its baseline
    p8 = (p * top).to(TORCH_FP8[case.fp8.format]).float()
    if vd.shape[-1] == 1:
        out = (p8 @ v) / top * vd
    else:  # a block's v descale scales its columns of P, as a kernel scales each block's partial product
        out = ((p8 * vd) @ v) / top
    out = out / torch.where(seen, total, torch.ones_like(total))
    out = torch.where(seen, out, torch.zeros_like(out))
    lse = torch.where(seen, m + torch.log(total), torch.full_like(m, float("-inf"))).squeeze(-1)
    return {"out": out.transpose(1, 2).to(torch.bfloat16), "lse": lse}


def _columns(descale: torch.Tensor, group: int, sk: int) -> torch.Tensor:
    """A descale as a factor over [b, h, sq, sk] logits: [b, h, 1, 1], or [b, h, 1, sk] per block of keys."""
    d = descale.float().repeat_interleave(group, dim=1)
    if d.dim() == 2:
        return d[:, :, None, None]
    return d.repeat_interleave(FP8_BLOCK, dim=2)[:, :, None, :sk]
