"""Stand-ins for flash_attn.cute and flashinfer with their documented calling conventions (argument names,
layouts, window and sink forms, lse base and layout), computed in fp32 on any device. They check the
adapters' translation of a case on the CPU against FP64; the libraries' own kernels run only on a GPU.
"""
from __future__ import annotations

import math
import types

import torch


def _attend(q, k, v, scale, causal, left, right, softcap=0.0, sink=None, alibi=None):
    """One sequence: q [sq, h, d], k [sk, hk, d], v [sk, hk, dv]; bounds None where unbounded, bottom-right
    aligned; alibi: slopes [h], a bias -slope |i + sk - sq - j| after the softcap. (out [sq, h, dv], natural
    lse [h, sq])."""
    sq, h, _ = q.shape
    sk, hk, dv = v.shape
    g = h // hk
    kf, vf = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    s = torch.einsum("ihd,jhd->hij", q.float(), kf) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    if alibi is not None:
        s = s - alibi.float()[:, None, None] * (i - j).abs()
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
    """flashinfer's single_prefill_with_kv_cache, BatchPrefillWithRaggedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper and BatchDecodeWithPagedKVCacheWrapper: NHD [tokens, heads, d],
    sm_scale, window_left (left bound only), logits_soft_cap, causal bottom-right per request, return_lse
    with lse [tokens, heads] in base lse_base (FlashInfer's is 2); a paged cache read only through the CSR
    page table the wrapper was planned with (indptr, indices, last page's length). Each call's keywords are
    appended to `calls`, with the API's name as "api"."""
    def to_base(lse):
        return (lse / math.log(lse_base)).transpose(0, 1)

    def attend(q, k, v, plan):
        left = plan.get("window_left", -1)
        out, lse = _attend(q, k, v, plan.get("sm_scale") or q.shape[-1] ** -0.5, plan.get("causal", False),
                           left if left >= 0 else None, None, plan.get("logits_soft_cap") or 0.0)
        return out, to_base(lse)

    def single_prefill_with_kv_cache(q, k, v, causal=False, kv_layout="NHD", sm_scale=None, window_left=-1,
                                     logits_soft_cap=None, return_lse=False, **rest):
        assert kv_layout == "NHD" and q.dim() == 3
        calls.append(dict(api="single prefill", window_left=window_left, causal=causal,
                          logits_soft_cap=logits_soft_cap, **rest))
        out, lse = attend(q, k, v, dict(causal=causal, sm_scale=sm_scale, window_left=window_left,
                                        logits_soft_cap=logits_soft_cap))
        return (out, lse) if return_lse else out

    def page_rows(plan, r):
        """Request r's keys as (page, slot) pairs of the pools, from the CSR page table alone."""
        pages = plan["indices"][int(plan["indptr"][r]):int(plan["indptr"][r + 1])].long()
        n = (len(pages) - 1) * plan["page_size"] + int(plan["last_page_len"][r])
        assert 1 <= int(plan["last_page_len"][r]) <= plan["page_size"]
        t = torch.arange(n)
        return pages[t // plan["page_size"]], t % plan["page_size"]

    class _Wrapper:
        def __init__(self, workspace, kv_layout="NHD", **rest):
            assert kv_layout == "NHD" and workspace.dtype == torch.uint8
            self.plan_args = None

        def _planned(self, api, **plan):
            calls.append(dict(api=api, **plan))
            self.plan_args = plan

    class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
                 causal=False, window_left=-1, logits_soft_cap=None, sm_scale=None, **rest):
            assert qo_indptr.dtype == kv_indptr.dtype == torch.int32
            self._planned("batch prefill ragged", qo_indptr=qo_indptr, kv_indptr=kv_indptr, causal=causal,
                          window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, **rest)

        def run(self, q, k, v, return_lse=False):
            p = self.plan_args
            assert q.shape[0] == int(p["qo_indptr"][-1]), "q must hold qo_indptr[-1] tokens"
            out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
            lse = torch.full((q.shape[0], q.shape[1]), float("-inf"), device=q.device)
            for r in range(len(p["qo_indptr"]) - 1):
                (q0, q1), (k0, k1) = ((int(c[r]), int(c[r + 1])) for c in (p["qo_indptr"], p["kv_indptr"]))
                out[q0:q1], lse[q0:q1] = attend(q[q0:q1], k[k0:k1], v[k0:k1], p)
            return (out, lse) if return_lse else out

    class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, causal=False, window_left=-1,
                 logits_soft_cap=None, sm_scale=None, **rest):
            self._planned("batch prefill paged", qo_indptr=qo_indptr, indptr=paged_kv_indptr,
                          indices=paged_kv_indices, last_page_len=paged_kv_last_page_len, page_size=page_size,
                          causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap,
                          sm_scale=sm_scale, **rest)

        def run(self, q, paged_kv_cache, return_lse=False):
            p, (k_pool, v_pool) = self.plan_args, paged_kv_cache
            out = q.new_zeros(q.shape[0], q.shape[1], v_pool.shape[3])
            lse = torch.full((q.shape[0], q.shape[1]), float("-inf"), device=q.device)
            for r in range(len(p["qo_indptr"]) - 1):
                q0, q1 = int(p["qo_indptr"][r]), int(p["qo_indptr"][r + 1])
                pages, slots = page_rows(p, r)
                out[q0:q1], lse[q0:q1] = attend(q[q0:q1], k_pool[pages, slots], v_pool[pages, slots], p)
            return (out, lse) if return_lse else out

    class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs):
            self._planned("batch decode paged", indptr=indptr, indices=indices, last_page_len=last_page_len,
                          page_size=page_size, **kwargs)

        def run(self, q, paged_kv_cache, return_lse=False):
            p, (k_pool, v_pool) = self.plan_args, paged_kv_cache
            assert q.dim() == 3, "decode takes q [batch, heads, d]"
            outs, lses = [], []
            for r in range(q.shape[0]):
                pages, slots = page_rows(p, r)
                o, lse = attend(q[r:r + 1], k_pool[pages, slots], v_pool[pages, slots], dict(p, causal=False))
                outs.append(o[0])
                lses.append(lse[0])
            out, lse = torch.stack(outs), torch.stack(lses)
            return (out, lse) if return_lse else out

    module = types.ModuleType("flashinfer")
    module.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    module.BatchPrefillWithRaggedKVCacheWrapper = BatchPrefillWithRaggedKVCacheWrapper
    module.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    module.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    module.__version__ = "fake"
    return module


def flash_attn_2_and_3(calls: list, version: int) -> types.ModuleType:
    """flash-attn 2's flash_attn package (version 2) or flash-attn 3's flash_attn_interface (3):
    flash_attn_func, flash_attn_varlen_func (lse [h, total]) and flash_attn_with_kvcache (flash-attn 2's
    block_table, flash-attn 3's page_table; return_softmax_lse). window_size -1 for no bound; alibi_slopes
    [h] or [b, h] (flash-attn 2). lse natural, +inf on a row that sees no key in flash-attn 2 (its
    convention), -inf in flash-attn 3. Each call's keywords are appended to `calls` with "api"."""
    def bounds(window_size):
        return tuple(None if w < 0 else w for w in window_size)

    def lse_of(lse):
        return lse.masked_fill(torch.isneginf(lse), float("inf")) if version == 2 else lse

    def slopes(alibi_slopes, b):
        if alibi_slopes is None:
            return None
        return alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes

    def scale_of(q, softmax_scale):
        return softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, deterministic=False, return_attn_probs=False):
        calls.append(dict(api="func", window_size=window_size, causal=causal))
        res = [_attend(q[b], k[b], v[b], scale_of(q, softmax_scale), causal, *bounds(window_size), softcap,
                       alibi=slopes(alibi_slopes, b)) for b in range(q.shape[0])]
        out, lse = torch.stack([r[0] for r in res]), lse_of(torch.stack([r[1] for r in res]))
        return (out, lse, None) if return_attn_probs else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False):
        calls.append(dict(api="varlen", window_size=window_size, causal=causal))
        outs, lses = [], []
        for b in range(len(cu_seqlens_q) - 1):
            (q0, q1), (k0, k1) = ((int(c[b]), int(c[b + 1])) for c in (cu_seqlens_q, cu_seqlens_k))
            o, lse = _attend(q[q0:q1], k[k0:k1], v[k0:k1], scale_of(q, softmax_scale), causal, *bounds(window_size),
                             softcap, alibi=slopes(alibi_slopes, b))
            outs.append(o)
            lses.append(lse)
        total = int(cu_seqlens_q[-1])
        out = torch.cat(outs + [q.new_zeros(q.shape[0] - total, q.shape[1], v.shape[2])])
        lse = torch.cat(lses + [torch.full((q.shape[1], q.shape[0] - total), float("-inf"), device=q.device)], dim=1)
        return (out, lse_of(lse), None) if return_attn_probs else out

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                                page_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                alibi_slopes=None, num_splits=0, return_softmax_lse=False, **rest):
        table = block_table if version == 2 else page_table
        assert table is not None and (block_table is None or version == 2) and (page_table is None or version == 3)
        calls.append(dict(api="with_kvcache", window_size=window_size, causal=causal))
        page = k_cache.shape[1]
        outs, lses = [], []
        for b in range(q.shape[0]):
            t = torch.arange(int(cache_seqlens[b]), device=q.device)
            rows = table[b, t // page].long()
            o, lse = _attend(q[b], k_cache[rows, t % page], v_cache[rows, t % page], scale_of(q, softmax_scale),
                             causal, *bounds(window_size), softcap, alibi=slopes(alibi_slopes, b))
            outs.append(o)
            lses.append(lse)
        out, lse = torch.stack(outs), lse_of(torch.stack(lses))
        return (out, lse) if return_softmax_lse else out

    module = types.ModuleType("flash_attn" if version == 2 else "flash_attn_interface")
    module.flash_attn_func, module.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    module.__version__ = "fake"
    return module
