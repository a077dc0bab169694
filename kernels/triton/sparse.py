"""Token-level sparse attention by key indices in Triton (cases/sparse.py's semantics), forward and backward.

One program per (BLOCK_T query tokens, batch entry, kv head): its rows are the query heads of that kv head's
group, which share each token's indices (FlashMLA's sparse layout), so each tile of BLOCK_N listed keys is
gathered once per token and multiplied by the whole group:

    idx = indices[b, t, hk, n0:n0 + BLOCK_N]       an index < 0 or >= seqlen_k names no key: its logit -inf
    K_n = k[b, idx], V_n = v[b, idx]               gathered rows (a key listed twice is gathered twice)
    S   = q K_n^T (raw units), online softmax over the tiles in base 2, as dense/forward.py's

The backward recomputes P from the forward's row max and log2 l, adds dq = scale dS K_n in the program, and
scatters dk = scale dS^T q and dv = P^T dO into fp32 buffers by atomics: the listed keys of different tokens
overlap, and a key listed twice in one tile takes both of its terms.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from faverify.kernels.triton.common import INTERPRET, LAUNCHED, LN2, block_d, cast, generic_args, mm, with_dlse

LOG2E = 1.4426950408889634
BLOCK_N = 16
# Tokens a program takes, each with its own indices (a batched matmul over them): one on the GPU, as
# FlashMLA's sparse kernels; 64 under the interpreter, whose cost is per operation, not per element
BLOCK_T = 64 if INTERPRET else 1


@triton.jit
def _slots(idx_rows, n0, topk, seqlen_k, in_tok, BLOCK_N: tl.constexpr):
    """The tile's indices [T, BLOCK_N] of the program's tokens and which of them name a key (safe to address:
    a slot that names none reads row 0, masked)."""
    n = n0 + tl.arange(0, BLOCK_N)
    listed = in_tok[:, None] & (n < topk)[None, :]
    idx = tl.load(idx_rows[:, None] + n[None, :], mask=listed, other=-1)
    ok = listed & (idx >= 0) & (idx < seqlen_k)  # [mutant site: sparse-valid]
    idx = tl.where(ok, tl.maximum(idx, 0), 0)
    return idx, ok


@triton.jit
def _gather(base, idx, ok, stride_s, offs_d, head_dim):
    """Rows idx [T, N] of a [seqlen, head_dim] slice, [T, N, BLOCK_D]; 0 where a slot names no key."""
    ptrs = base + idx.to(tl.int64)[:, :, None] * stride_s + offs_d[None, None, :]
    return tl.load(ptrs, mask=ok[:, :, None] & (offs_d < head_dim)[None, None, :], other=0.0)


@triton.jit
def _rows(X, b, toks, heads, offs, stride_b, stride_s, stride_h, ok, width):
    """The [T, M, BLOCK] rows of q, dO or out for the program's tokens and heads: their pointers and mask."""
    ptrs = X + b * stride_b + toks.to(tl.int64)[:, None, None] * stride_s + heads[None, :, None] * stride_h \
        + offs[None, None, :]
    return ptrs, ok[:, :, None] & (offs < width)[None, None, :]


@triton.jit
def _program(Q, K, V, Idx, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ib,
             stride_is, stride_ih, seqlen_q, group, head_dim, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_D: tl.constexpr):
    """What a program works on: its tokens, batch entry and kv head; the group's query heads (its rows) and
    which (token, head) rows are real; their q [T, M, BLOCK_D]; the bases of its k, v and indices."""
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1).to(tl.int64)
    hk = tl.program_id(2).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    heads = hk * group + rows
    in_tok = toks < seqlen_q
    ok = in_tok[:, None] & (rows < group)[None, :]
    q_ptrs, q_ok = _rows(Q, b, toks, heads, tl.arange(0, BLOCK_D), stride_qb, stride_qs, stride_qh, ok, head_dim)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    idx_rows = Idx + b * stride_ib + toks.to(tl.int64) * stride_is + hk * stride_ih
    return toks, b, hk, heads, in_tok, ok, q, K + b * stride_kb + hk * stride_kh, V + b * stride_vb + hk * stride_vh, \
        idx_rows


@triton.jit
def _tile(q, k_base, v_base, idx_rows, n0, topk, seqlen_k, in_tok, stride_ks, stride_vs, head_dim, head_dim_v,
          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, INTERPRETED: tl.constexpr,
          IEEE: tl.constexpr):
    """One tile of listed keys: their indices and which name a key, the gathered k [T, N, BLOCK_D] and v, and
    the logits S = q K^T [T, M, N] in raw units, -inf where a slot names no key."""
    idx, listed = _slots(idx_rows, n0, topk, seqlen_k, in_tok, BLOCK_N)
    k = _gather(k_base, idx, listed, stride_ks, tl.arange(0, BLOCK_D), head_dim)
    v = _gather(v_base, idx, listed, stride_vs, tl.arange(0, BLOCK_DV), head_dim_v)
    s = tl.where(listed[:, None, :], mm(q, tl.permute(k, (0, 2, 1)), INTERPRETED, IEEE), float("-inf"))
    return idx, listed, k, v, s


def _fwd(Q, K, V, Idx, Out, Lse, Rowmax, Log2l,  #
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                stride_ob, stride_os, stride_oh, stride_ib, stride_is, stride_ih,  #
                nheads, seqlen_q, seqlen_k, group, topk, head_dim, head_dim_v, qk_scale,  #
                BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    toks, b, hk, heads, in_tok, ok, q, k_base, v_base, idx_rows = _program(
        Q, K, V, Idx, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ib,
        stride_is, stride_ih, seqlen_q, group, head_dim, BLOCK_T, BLOCK_M, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_i = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for n0 in range(0, topk, BLOCK_N):
        idx, listed, k, v, s = _tile(q, k_base, v_base, idx_rows, n0, topk, seqlen_k, in_tok, stride_ks, stride_vs,
                                     head_dim, head_dim_v, BLOCK_N, BLOCK_D, BLOCK_DV, INTERPRETED, IEEE)
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # never (-inf) - (-inf)
        p = tl.math.exp2((s - m_use[:, :, None]) * qk_scale)
        alpha = tl.math.exp2((m_i - m_use) * qk_scale)
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + mm(cast(p, v.dtype, INTERPRETED), v, INTERPRETED, IEEE)
        m_i = m_new
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, :, None]
    log2l = tl.math.log2(tl.where(seen, l_i, 1.0))
    lse = tl.where(seen, (m_i * qk_scale + log2l) * LN2, float("-inf"))
    stat = (b * nheads + heads[None, :]) * seqlen_q + toks[:, None]  # [b, h, sq] row statistics
    tl.store(Lse + stat, lse, mask=ok)
    tl.store(Rowmax + stat, tl.where(seen, m_i, 0.0), mask=ok)
    tl.store(Log2l + stat, tl.where(seen, log2l, float("inf")), mask=ok)
    o_ptrs, o_ok = _rows(Out, b, toks, heads, offs_dv, stride_ob, stride_os, stride_oh, ok, head_dim_v)
    tl.store(o_ptrs, cast(out, Out.dtype.element_ty, INTERPRETED), mask=o_ok)


def _bwd(Q, K, V, Idx, DO, Rowmax, Log2l, Delta, DQ, DK, DV,  #
                stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                stride_ib, stride_is, stride_ih, stride_db, stride_ds, stride_dh, stride_gb, stride_gs, stride_gh,  #
                nheads, seqlen_q, seqlen_k, group, topk, head_dim, head_dim_v, softmax_scale, qk_scale,  #
                BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    """dq of the group's rows; dk and dv (fp32 [b, seqlen_k, nheads_k, d], contiguous) added by atomics."""
    toks, b, hk, heads, in_tok, ok, q, k_base, v_base, idx_rows = _program(
        Q, K, V, Idx, stride_qb, stride_qs, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ib,
        stride_is, stride_ih, seqlen_q, group, head_dim, BLOCK_T, BLOCK_M, BLOCK_D)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    nheads_k = tl.num_programs(2)
    do_ptrs, do_ok = _rows(DO, b, toks, heads, offs_dv, stride_db, stride_ds, stride_dh, ok, head_dim_v)
    do = tl.load(do_ptrs, mask=do_ok, other=0.0)
    stat = (b * nheads + heads[None, :]) * seqlen_q + toks[:, None]
    m = tl.load(Rowmax + stat, mask=ok, other=0.0)
    l2 = tl.load(Log2l + stat, mask=ok, other=float("inf"))
    delta = tl.load(Delta + stat, mask=ok, other=0.0)
    dk_base = DK + (b * seqlen_k * nheads_k + hk) * head_dim
    dv_base = DV + (b * seqlen_k * nheads_k + hk) * head_dim_v
    dq = tl.zeros([BLOCK_T, BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, topk, BLOCK_N):
        idx, listed, k, v, s = _tile(q, k_base, v_base, idx_rows, n0, topk, seqlen_k, in_tok, stride_ks, stride_vs,
                                     head_dim, head_dim_v, BLOCK_N, BLOCK_D, BLOCK_DV, INTERPRETED, IEEE)
        p = tl.math.exp2(tl.minimum((s - m[:, :, None]) * qk_scale, 0.0) - l2[:, :, None])
        dp = mm(do, tl.permute(v, (0, 2, 1)), INTERPRETED, IEEE)
        ds = p * (dp - delta[:, :, None])
        dq += mm(cast(ds, k.dtype, INTERPRETED), k, INTERPRETED, IEEE)
        dk = mm(tl.permute(cast(ds, q.dtype, INTERPRETED), (0, 2, 1)), q, INTERPRETED, IEEE) * softmax_scale
        dv = mm(tl.permute(cast(p, do.dtype, INTERPRETED), (0, 2, 1)), do, INTERPRETED, IEEE)
        key_rows = idx.to(tl.int64)[:, :, None] * nheads_k  # [T, N, 1]
        tl.atomic_add(dk_base + key_rows * head_dim + offs_d[None, None, :], dk,
                      mask=listed[:, :, None] & (offs_d < head_dim)[None, None, :])
        tl.atomic_add(dv_base + key_rows * head_dim_v + offs_dv[None, None, :], dv,
                      mask=listed[:, :, None] & (offs_dv < head_dim_v)[None, None, :])
    g_ptrs, g_ok = _rows(DQ, b, toks, heads, offs_d, stride_gb, stride_gs, stride_gh, ok, head_dim)
    tl.store(g_ptrs, cast(dq * softmax_scale, DQ.dtype.element_ty, INTERPRETED), mask=g_ok)



# Specialized on nothing at run time (common.generic_args): one build per dtype, padded head dims and group
# padding. Specialized, each divisibility of a size or stride a fuzz draws (topk, the group, the lengths)
# made a build of its own, which the warm-up could not list and every GPU worker compiled again.
_sparse_fwd = triton.jit(do_not_specialize=generic_args(_fwd))(_fwd)
_sparse_bwd = triton.jit(do_not_specialize=generic_args(_bwd))(_bwd)

def _tiles(q, v, group: int) -> dict:
    return dict(BLOCK_T=BLOCK_T, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N,
                BLOCK_D=block_d(q.shape[-1]), BLOCK_DV=block_d(v.shape[-1]), INTERPRETED=INTERPRET,
                IEEE=q.dtype == torch.float32)


def forward(q, k, v, indices, scale: float) -> tuple:
    """out [b, sq, h, dv], lse [b, h, sq] and the rows' (row max, log2 l) for the backward."""
    b, sq, h, d = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    out = torch.empty((b, sq, h, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    rowmax, log2l = torch.empty_like(lse), torch.empty_like(lse)
    LAUNCHED.append("fwd sparse")
    if out.numel() and lse.numel():
        grid = (triton.cdiv(sq, BLOCK_T), b, hk)
        _sparse_fwd[grid](q, k, v, indices, out, lse, rowmax, log2l, *q.stride()[:3], *k.stride()[:3],
                          *v.stride()[:3], *out.stride()[:3], *indices.stride()[:3],
                          h, sq, sk, h // hk, indices.shape[3], d, dv, scale * LOG2E, **_tiles(q, v, h // hk))
    return out, lse, (rowmax, log2l)


def backward(dout, q, k, v, out, indices, rows, scale: float, dlse=None) -> tuple:
    b, sq, h, d = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[3]
    delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # D = rowsum(dO * O), [b, h, sq]
    with_dlse(delta, dlse)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros((b, sk, hk, d), dtype=torch.float32, device=q.device)
    dv_ = torch.zeros((b, sk, hk, dv), dtype=torch.float32, device=q.device)
    LAUNCHED.append("bwd sparse")
    if q.numel() and k.shape[1]:
        grid = (triton.cdiv(sq, BLOCK_T), b, hk)
        _sparse_bwd[grid](q, k, v, indices, dout, *rows, delta, dq, dk, dv_, *q.stride()[:3],
                          *k.stride()[:3], *v.stride()[:3], *indices.stride()[:3], *dout.stride()[:3],
                          *dq.stride()[:3], h, sq, sk, h // hk, indices.shape[3], d, dv, scale, scale * LOG2E,
                          **_tiles(q, v, h // hk))
    else:
        dq.zero_()
    return dq, dk.to(k.dtype), dv_.to(v.dtype)


class SparseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, indices, scale):
        out, lse, rows = forward(q, k, v, indices, scale)
        ctx.save_for_backward(q, k, v, out, indices, *rows)
        ctx.scale = scale
        ctx.mark_non_differentiable(*rows)
        return out, lse, *rows

    @staticmethod
    def backward(ctx, dout, dlse, _drowmax, _dlog2l):
        q, k, v, out, indices, rowmax, log2l = ctx.saved_tensors
        dq, dk, dv = backward(dout.contiguous(), q, k, v, out, indices, (rowmax, log2l), ctx.scale, dlse)
        return dq, dk, dv, None, None


def attention(q, k, v, indices, scale: float, others: list) -> tuple:
    """SparseFunction on checked indices: out, lse, row max, log2 l. others: the variants and masks the call
    also asked for, which the sparse kernel does not take (a ValueError names them)."""
    if others:
        raise ValueError(f"indices: the sparse kernel takes no {', '.join(others)} beside them")
    want = (q.shape[0], q.shape[1], k.shape[2])
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32 or indices.dim() != 4 \
            or tuple(indices.shape[:3]) != want or indices.device != q.device:
        got = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise ValueError(f"indices: {got} must be int32 [batch, seqlen_q, nheads_k, topk] = "
                         f"[{', '.join(map(str, want))}, topk] on {q.device}")
    return SparseFunction.apply(q, k, v, indices.contiguous(), scale)
