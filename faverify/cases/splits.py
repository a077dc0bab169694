"""The split-KV combine: how the partial results of a split case's key ranges (Case.split_ranges) make
the whole attention. The reference judges partials through it, and the `combine` subject runs it."""
from __future__ import annotations

import torch


def combine(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype | None = None) -> tuple:
    """The split-KV combine: lse = logsumexp_s lse_s, out = sum_s exp(lse_s - lse) out_s, with the
    empty-partial identity (all partials (0, -inf) give (0, -inf)). outs [S, b, sq, h, dv], lses
    [S, b, h, sq]; computed in lses' dtype, out rounded to `dtype` (default outs')."""
    m = lses.amax(0)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # never (-inf) - (-inf)
    w = torch.exp(lses - safe)
    total = w.sum(0)
    seen = total > 0
    lse = torch.where(seen, safe + torch.log(torch.where(seen, total, torch.ones_like(total))), m)
    weight = torch.where(seen, w / torch.where(seen, total, torch.ones_like(total)), torch.zeros_like(w))
    out = (weight.permute(0, 1, 3, 2).unsqueeze(-1) * outs.to(weight.dtype)).sum(0)
    return out.to(dtype or outs.dtype), lse
