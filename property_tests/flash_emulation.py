"""The FlashAttention-2 algorithm in plain torch, in the case's dtype: a test subject whose roundings are a
flash kernel's, not the naive attention's, with seeded bugs a verifier must still catch.

Forward, over blocks of BLOCK_K keys: S = Q K^T in fp32 from the input-dtype operands; the logits in log2
units, x = s log2(e) (softcap: s = c tanh(S scale / c); ALiBi and masks after it); an online softmax with
exp2, m and l rescaled when the row max moves; P rounded to the input dtype as the operand of P V; out = acc / l
rounded; lse = (m + log2 l) ln 2 stored in fp32. A sink enters l after the last block.

Backward, as FlashAttention-2's: S recomputed (`recompute="split"` sums head_dim in steps of 16, another order
than the forward's, as a kernel that tiles head_dim or pre-scales q does; "same" repeats the forward's own
products bit for bit), P = exp2(min(x - m, 0) - log2 l) from the forward's fp32 row max and sum (as the bundled
Triton backward does; `p_from="lse"`: exp2(x - lse log2 e) from the stored fp32 lse, as flash-attn's kernels do,
which at logits past 2^23 cannot hold log l beside m), D = rowsum(dO O) from O in the input dtype,
dS = P (dP - D + dlse), softcap's derivative as 1 - tanh^2, dS rounded (saturated) to the input dtype as the
operand of dQ = dS K and dK = dS^T Q, dV = P^T dO with P rounded.

Bugs (`bug=`), each a few parts in a thousand or a rounding no flash kernel needs:
- "d-off": D off by 2^-10 of itself;
- "l-not-rescaled": l not rescaled when the row max moves between key blocks;
- "k-scaled-in-dtype": Triton's tutorial backward, K times scale log2(e) rounded to the input dtype before S.
"""
from __future__ import annotations

import math

import torch

from property_tests.planted import hidden_keys

BLOCK_K = 32
SPLIT = 16  # the head_dim step of the "split" recompute
LOG2E = 1.0 / math.log(2.0)
CAPABILITIES = {"dtypes": ["bf16", "fp16", "fp32"], "window": True, "softcap": True, "alibi": True, "sinks": True,
                "head_dim_v": True, "lse": True, "lse_grad": True}


class _Setup:
    """The call's inputs per query head ([b, h, s, e], fp32 holding input-dtype values) and its logits'
    ingredients: what the forward and the backward both read."""

    def __init__(self, q, k, v, causal, scale, window, softcap, alibi, sinks):
        b, sq, h, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
        self.dtype, self.scale, self.cap = q.dtype, scale, softcap
        self.q = q.detach().transpose(1, 2).float()
        self.k = k.detach().transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
        self.v = v.detach().transpose(1, 2).float().repeat_interleave(h // hk, dim=1)
        self.hidden = hidden_keys(sq, sk, causal, window, q.device)
        diag = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        distance = (diag - torch.arange(sk, device=q.device)[None, :]).abs()
        self.alibi = None if alibi is None else alibi.float().reshape(-1, h, 1, 1) * distance
        self.sink2 = None if sinks is None else sinks.detach().float().reshape(1, h, 1, 1) * LOG2E
        self.b, self.h, self.sq, self.sk, self.hk = b, h, sq, sk, hk

    def logits(self, j0: int, j1: int, recompute: str = "same", bug: str | None = None) -> tuple:
        """Keys j0..j1's logits in log2 units (hidden keys -inf), and tanh of the softcapped ones."""
        k = self.k[:, :, j0:j1]
        if recompute == "split":
            S = torch.zeros(self.b, self.h, self.sq, j1 - j0, device=k.device)
            for d0 in range(0, k.shape[-1], SPLIT):
                S = S + self.q[..., d0:d0 + SPLIT] @ k[..., d0:d0 + SPLIT].transpose(-1, -2)
        else:
            S = self.q @ k.transpose(-1, -2)
        if bug == "k-scaled-in-dtype":  # the tutorial's backward: S from K scale log2 e rounded to the input dtype
            c = self.scale * LOG2E
            S = (self.q @ (k * c).to(self.dtype).float().transpose(-1, -2)) / c
        if self.cap > 0:
            t = torch.tanh(S * (self.scale / self.cap))
            s = self.cap * t
        else:
            t, s = None, S * self.scale
        if self.alibi is not None:
            s = s - self.alibi[..., j0:j1]
        x = s * LOG2E
        return x.masked_fill(self.hidden[:, j0:j1], -math.inf), t


def _forward(st: _Setup, bug: str | None) -> tuple:
    """out ([b, sq, h, dv], input dtype), lse ([b, h, sq], fp32, natural log) and the row statistics the
    backward reads, (m, log2 l) in fp32 [b, h, sq, 1], by the online softmax over key blocks."""
    shape = (st.b, st.h, st.sq, 1)
    m = torch.full(shape, -math.inf, device=st.q.device)
    l = torch.zeros(shape, device=st.q.device)
    acc = torch.zeros(st.b, st.h, st.sq, st.v.shape[-1], device=st.q.device)
    for j0 in range(0, st.sk, BLOCK_K):
        j1 = min(st.sk, j0 + BLOCK_K)
        x, _ = st.logits(j0, j1)
        m_new = torch.maximum(m, x.amax(-1, keepdim=True))
        base = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)  # never (-inf) - (-inf)
        alpha = torch.exp2(m - base)
        p = torch.exp2(x - base)
        l = (l if bug == "l-not-rescaled" else l * alpha) + p.sum(-1, keepdim=True)
        acc = acc * alpha + p.to(st.dtype).float() @ st.v[:, :, j0:j1]
        m = m_new
    if st.sink2 is not None:  # one more logit in the softmax, with no value
        m_new = torch.maximum(m, st.sink2)
        alpha = torch.exp2(m - m_new)
        l, acc, m = l * alpha + torch.exp2(st.sink2 - m_new), acc * alpha, m_new
    seen = l > 0
    out = torch.where(seen, acc / torch.where(seen, l, torch.ones_like(l)), torch.zeros_like(acc))
    log2_l = torch.where(seen, torch.log2(torch.where(seen, l, torch.ones_like(l))), math.inf)  # P = 0 where none
    lse = torch.where(seen, (m + log2_l) / LOG2E, -math.inf)
    m = torch.where(seen, m, torch.zeros_like(m))  # never (-inf) - (-inf) in the backward's exponent
    return out.to(st.dtype).transpose(1, 2).contiguous(), lse.squeeze(-1), torch.stack([m, log2_l])


def _backward(st: _Setup, out, lse, rows, dout, dlse, recompute: str, p_from: str, bug: str | None) -> tuple:
    """dq, dk, dv (input dtype) and dsinks (fp32) as a FlashAttention-2 backward computes them."""
    dt = st.dtype
    do = dout.detach().transpose(1, 2).float()
    o = out.transpose(1, 2).float()
    m, log2_l = rows
    lse2 = (lse * LOG2E).unsqueeze(-1)
    lse2 = torch.where(lse2 == -math.inf, torch.full_like(lse2, math.inf), lse2)  # a row without a key: P = 0
    D = (do * o).sum(-1, keepdim=True)
    if bug == "d-off":
        D = D * (1 + 2.0**-10)
    g = dlse.unsqueeze(-1).float() if dlse is not None else 0.0
    blocks = [st.logits(j0, min(st.sk, j0 + BLOCK_K), recompute, bug) for j0 in range(0, st.sk, BLOCK_K)]
    x = torch.cat([x for x, _ in blocks], -1) if blocks else torch.zeros_like(o[..., :0]).expand(-1, -1, -1, 0)
    t = torch.cat([t for _, t in blocks], -1) if blocks and blocks[0][1] is not None else None
    p = torch.exp2(x - lse2) if p_from == "lse" else torch.exp2(torch.clamp(x - m, max=0.0) - log2_l)
    ds = p * (do @ st.v.transpose(-1, -2) - D + g)
    if t is not None:
        ds = ds * (1 - t * t)
    top = torch.finfo(dt).max  # saturated to the dtype's range, as the bundled kernels round dS
    ds = ds.clamp(-top, top).to(dt).float()  # the operand of both matmuls below
    dq = (ds @ st.k) * st.scale
    dk = (ds.transpose(-1, -2) @ st.q) * st.scale
    dv = p.to(dt).float().transpose(-1, -2) @ do
    group = st.h // st.hk
    dk = dk.reshape(st.b, st.hk, group, st.sk, -1).sum(2)
    dv = dv.reshape(st.b, st.hk, group, st.sk, -1).sum(2)
    dsinks = None
    if st.sink2 is not None:
        p_sink = torch.exp2(st.sink2 - lse2) if p_from == "lse" else torch.exp2(st.sink2 - m - log2_l)
        dsinks = (p_sink * (g - D)).sum(dim=(0, 2, 3))
    return dq.transpose(1, 2).to(dt), dk.transpose(1, 2).to(dt), dv.transpose(1, 2).to(dt), dsinks


class _Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, causal, scale, window, softcap, alibi, recompute, p_from, bug):
        st = _Setup(q, k, v, causal, scale, window, softcap, alibi, sinks)
        out, lse, rows = _forward(st, bug)
        ctx.st, ctx.how, ctx.has_sinks = st, (recompute, p_from, bug), sinks is not None
        ctx.save_for_backward(out, lse, rows)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        out, lse, rows = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, dsinks = _backward(ctx.st, out, lse, rows, dout, dlse, *ctx.how)
        return dq, dk, dv, (dsinks.to(torch.float32) if ctx.has_sinks else None), *([None] * 8)


def flash(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
          recompute: str = "split", p_from: str = "rows", bug: str | None = None):
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return _Flash.apply(q, k, v, sinks, causal, scale, tuple(window_size), float(softcap or 0.0), alibi_slopes,
                        recompute, p_from, bug)


def _subject(recompute: str, bug: str | None, p_from: str = "rows"):
    def fn(q, k, v, *, causal, softmax_scale, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None):
        return flash(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                     alibi_slopes=alibi_slopes, sinks=sinks, recompute=recompute, p_from=p_from, bug=bug)
    fn.__doc__ = (f"The FlashAttention-2 emulation, S recomputed {recompute}, P from {p_from}"
                  + (f", with the bug {bug}" if bug else ""))
    fn.faverify_capabilities = CAPABILITIES
    return fn


control = _subject("split", None)  # the backward's S in another order than the forward's: the harder control
control_same_order = _subject("same", None)
control_p_from_lse = _subject("split", None, "lse")  # flash-attn's P
d_off = _subject("split", "d-off")
l_not_rescaled = _subject("split", "l-not-rescaled")
k_scaled_in_dtype = _subject("split", "k-scaled-in-dtype")
