"""The autograd Function the bundled dense kernels share: a forward that returns out, lse and the rows'
statistics (row max, log2 l), and a backward that recomputes the softmax from those statistics."""
from __future__ import annotations

from typing import Callable

import torch


def row_stats_function(name: str, forward: Callable, backward: Callable, lse_grad: bool = False) -> type:
    """A torch.autograd.Function named `name`, applied as (q, k, v, causal, softmax_scale, init, how):
    forward(q, k, v, softmax_scale, causal, init, how) -> (out, lse, (row max, log2 l)); backward(dout, q, k,
    v, out, rows, softmax_scale, causal, how[, dlse]) -> (dq, dk, dv). `how` is the launcher's own choice (a
    Launch, a CUDA variant). lse_grad: a loss on lse reaches the inputs (backward takes dlse); else lse has
    no gradient, marked so: a loss on it raises rather than being dropped. Applied, it returns out, lse and
    the row statistics, which have no gradient (a max logit is read from them: max_logits)."""
    def run_forward(ctx, q, k, v, causal, softmax_scale, init, how):
        out, lse, (rowmax, log2l) = forward(q, k, v, softmax_scale, causal, init, how)
        ctx.save_for_backward(q, k, v, out, rowmax, log2l)
        ctx.scale, ctx.causal, ctx.how = softmax_scale, causal, how
        ctx.mark_non_differentiable(rowmax, log2l)
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        return out, lse, rowmax, log2l

    def run_backward(ctx, dout, dlse, _drowmax, _dlog2l):
        q, k, v, out, rowmax, log2l = ctx.saved_tensors
        extra = {"dlse": dlse} if lse_grad else {}
        dq, dk, dv = backward(dout, q, k, v, out, (rowmax, log2l), ctx.scale, ctx.causal, ctx.how, **extra)
        return dq, dk, dv, None, None, None, None

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(run_forward),
                                                    "backward": staticmethod(run_backward)})


def max_logits(rowmax: torch.Tensor, log2l: torch.Tensor, raw: float) -> torch.Tensor:
    """The largest logit each row sees, fp32 [b, h, sq], from a forward's row statistics: the running max of
    the logits in the kernels' raw units (raw times it is the softmax's logit; the sinks never enter it),
    -inf for a row that sees no key, whose statistics are (0, +inf). A row that saw keys may have log2 l
    +inf too, where a sink far above them overflows it (a finfo.min bias beside a sink of 1): its max is
    not 0 then, unless the sink were 2^127 above a max of exactly 0. One rounding, raw times the max."""
    seen = torch.isfinite(log2l) | (rowmax != 0)
    return torch.where(seen, rowmax * raw, torch.full_like(rowmax, float("-inf")))
