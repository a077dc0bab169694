"""Stand-ins for flash_attn.cute and flashinfer with their documented calling conventions (argument names,
layouts, window and sink forms, lse base and layout), computed in fp32 on any device. They check the
adapters' translation of a case on the CPU against FP64; the libraries' own kernels run only on a GPU.
"""
from __future__ import annotations

import math
import types

import torch


def _attend(q, k, v, scale, causal, left, right, softcap=0.0, sink=None):
    """One sequence: q [sq, h, d], k [sk, hk, d], v [sk, hk, dv]; bounds None where unbounded, bottom-right
    aligned. (out [sq, h, dv], natural lse [h, sq])."""
    sq, h, _ = q.shape
    sk, hk, dv = v.shape
    g = h // hk
    kf, vf = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    s = torch.einsum("ihd,jhd->hij", q.float(), kf) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if causal:
        right = 0 if right is None else min(right, 0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if right is not None:
        keep &= j <= i + right
    if left is not None:
        keep &= j >= i - left
    s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float()[:, None, None].expand(h, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    p = p[..., :sk]
    out = torch.einsum("hij,jhd->ihd", p, vf)
    return out.to(q.dtype), lse


def flash_attn_cute(calls: list) -> types.ModuleType:
    """flash_attn.cute: flash_attn_func and flash_attn_varlen_func (cu_seqlens, or page_table with
    seqused_k), window_size with None for no bound, learnable_sink, return_lse; lse [b, h, sq] or varlen
    [h, total]. Each call's keywords are appended to `calls`."""
    def scale_of(q, softmax_scale):
        return softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0, return_lse=False, **rest):
        calls.append(dict(kind="dense", window_size=window_size, causal=causal, **rest))
        res = [_attend(q[b], k[b], v[b], scale_of(q, softmax_scale), causal, *window_size, softcap, learnable_sink)
               for b in range(q.shape[0])]
        out, lse = torch.stack([r[0] for r in res]), torch.stack([r[1] for r in res])
        return (out, lse) if return_lse else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                               seqused_k=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, return_lse=False, **rest):
        calls.append(dict(kind="paged" if page_table is not None else "varlen", window_size=window_size, **rest))
        scale = scale_of(q, softmax_scale)
        if page_table is not None:
            page = k.shape[1]
            outs, lses = [], []
            for b in range(q.shape[0]):
                n = int(seqused_k[b])
                t = torch.arange(n, device=q.device)
                rows = page_table[b, t // page].long()
                o, lse = _attend(q[b], k[rows, t % page], v[rows, t % page], scale, causal, *window_size, softcap,
                                 learnable_sink)
                outs.append(o)
                lses.append(lse)
            out, lse = torch.stack(outs), torch.stack(lses)
        else:
            out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
            lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
            for b in range(len(cu_seqlens_q) - 1):
                (q0, q1), (k0, k1) = ((int(c[b]), int(c[b + 1])) for c in (cu_seqlens_q, cu_seqlens_k))
                o, l_ = _attend(q[q0:q1], k[k0:k1], v[k0:k1], scale, causal, *window_size, softcap, learnable_sink)
                out[q0:q1], lse[:, q0:q1] = o, l_
        return (out, lse) if return_lse else out

    module = types.ModuleType("flash_attn.cute")
    module.flash_attn_func, module.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    module.__version__ = "fake"
    return module


def flashinfer(calls: list, lse_base: float = 2.0) -> types.ModuleType:
    """flashinfer.single_prefill_with_kv_cache: NHD [tokens, heads, d], sm_scale, window_left (left bound
    only), logits_soft_cap, return_lse with lse [tokens, heads] in base lse_base (FlashInfer's is 2)."""
    def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", sm_scale=None, window_left=-1,
                                     logits_soft_cap=None, return_lse=False, **rest):
        assert kv_layout == "NHD" and q.dim() == 3
        calls.append(dict(window_left=window_left, causal=causal, logits_soft_cap=logits_soft_cap, **rest))
        scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
        out, lse = _attend(q, k, v, scale, causal, window_left if window_left >= 0 else None, None,
                           logits_soft_cap or 0.0)
        lse = (lse / math.log(lse_base)).transpose(0, 1)
        return (out, lse) if return_lse else out

    module = types.ModuleType("flashinfer")
    module.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    module.__version__ = "fake"
    return module
