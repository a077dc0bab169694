"""Flash backward in Triton by recomputation (FlashAttention-2): only lse is stored by the forward.

    D   = rowsum(dO * O)                                    _bwd_preprocess, fp32
    P   = exp2(min((q k^T - m) * c, 0) - log2 l)            recomputed from the forward's row max m and
                                                            log2 l (c = scale log2 e); 0 where masked and
                                                            in rows that saw no key (log2 l = +inf)
    dV  = P^T dO                                            _bwd_dkdv: one program per key tile, looping
    dP  = dO V^T                                              over the query tiles that see it, and over
    dS  = P * (dP - D)                                        the query heads of its GQA group, so dk and
    dK  = scale * dS^T Q                                      dv are summed without atomics
    dQ  = scale * dS K                                      _bwd_dq: one program per query tile
P and dS are rounded to the input dtype only as matmul operands (dS clamped into fp16's range first:
common.saturate says which cases reach past it); every sum is fp32. No atomics anywhere:
the backward gives the same bits on every run. Why m and log2 l, not lse: at logits of 1e9 lse's fp32 ulp
is in the thousands, and exp(s - lse) is then 1 for every key of a row: the gradients blow up (to Inf in
fp16). With m and l, and (s - m) clamped at 0 (the recomputed s may differ from the forward's by an ulp),
every P_ij <= 1 / l_i: the gradients stay bounded even where the logits carry no information.

ALIBI: the forward's bias -slope |i + diag - j| on the recomputed logits, split per tile as the variant
forward splits it (common.alibi_split: a column term an element, a row term off the row max), so that
ALiBi, with sinks or alone, takes these kernels (variant.args.KernelVariant.backward_is_dense).
"""
import triton
import triton.language as tl

from faverify.kernels.triton.common import (
    NO_BOUND,
    alibi_row,
    alibi_scores,
    alibi_split,
    cast,
    generic_args,
    key_ranges,
    load_rows,
    mask_scores,
    mm,
    row_stats,
    saturate,
)

_NO_BOUND = tl.constexpr(NO_BOUND)  # a global a kernel may read


def _preprocess(Out, DO, Delta,  #
                    stride_ob, stride_os, stride_oh,  #
                    stride_db, stride_ds, stride_dh,  #
                    nheads, seqlen_q, head_dim,  #
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    cols_ok = offs_d[None, :] < head_dim
    o = load_rows(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                  offs_m, seqlen_q, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    do = load_rows(DO + off_b * stride_db + off_h * stride_dh + offs_m[:, None] * stride_ds + offs_d[None, :],
                   offs_m, seqlen_q, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + off_bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, m_ptr, l2_ptr, delta_ptr, stride_qs, stride_ds,  #
                lo, hi, offs_m0, offs_n, cols_ok_t, cols_ok, seqlen_q, seqlen_k, diag, qk_scale, slope,  #
                MASK: tl.constexpr, CAUSAL: tl.constexpr, ALIBI: tl.constexpr, BLOCK_M: tl.constexpr,  #
                EVEN_D: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    key_first, key_last = tl.min(offs_n, 0), tl.max(offs_n, 0)
    key_local = (offs_n - key_first).to(tl.float32)[:, None]
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        # q^T tile [BLOCK_D, BLOCK_M] and dO tile [BLOCK_M, BLOCK_D]
        qT = load_rows(q_ptrs + start_m * stride_qs, offs_m, seqlen_q, cols_ok_t, ROWS_ALONG_0=False, MASK_ROWS=MASK,
                       EVEN_D=EVEN_D)
        do = load_rows(do_ptrs + start_m * stride_ds, offs_m, seqlen_q, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=MASK,
                       EVEN_D=EVEN_D)
        m, l2, delta = row_stats(m_ptr, l2_ptr, delta_ptr, offs_m, seqlen_q, MASK)
        # P^T = exp2(min((k q^T - m) c, 0) - log2 l)  [BLOCK_N, BLOCK_M]; masked logits -> -inf first
        # (a hidden logit can exceed m by far: exp2 of it would overflow before a mask zeroed it)
        sT = mm(k, qT, INTERPRETED, IEEE)
        if ALIBI:
            pos = offs_m + diag
            signed, general = alibi_split(slope, start_m + diag, start_m + BLOCK_M - 1 + diag, key_first, key_last,
                                          _NO_BOUND, 0 if CAUSAL else _NO_BOUND)
            sT = alibi_scores(sT, general, signed, key_local, pos[None, :], offs_n[:, None], FP32_DIST=False)
            m = m - alibi_row(signed, key_first, pos, 1.0, BIAS=False)
        if MASK:
            keep = (offs_m[None, :] < seqlen_q) & (offs_n[:, None] < seqlen_k)
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + diag)
            sT = tl.where(keep, sT, float("-inf"))
        pT = tl.math.exp2(tl.minimum((sT - m[None, :]) * qk_scale, 0.0) - l2[None, :])
        # dV += P^T dO
        dv += mm(cast(pT, do.dtype, INTERPRETED), do, INTERPRETED, IEEE)
        # dP^T = V dO^T, dS^T = P^T * (dP^T - D)
        dpT = mm(v, tl.trans(do), INTERPRETED, IEEE)
        dsT = pT * (dpT - delta[None, :])
        # dK += dS^T Q (the softmax scale is applied once at the end)
        dk += mm(cast(saturate(dsT, qT.dtype), qT.dtype, INTERPRETED), tl.trans(qT), INTERPRETED, IEEE)
    return dk, dv


def _dkdv(Q, K, V, DO, Rowmax, Log2l, Delta, DK, DV,  #
              stride_qb, stride_qs, stride_qh,  #
              stride_kb, stride_ks, stride_kh,  #
              stride_vb, stride_vs, stride_vh,  #
              stride_db, stride_ds, stride_dh,  #
              stride_dkb, stride_dks, stride_dkh,  #
              stride_dvb, stride_dvs, stride_dvh,  #
              nheads_k, group, seqlen_q, seqlen_k, head_dim, softmax_scale, qk_scale,  #
              Alibi, stride_ab, bias_unit,  # ALiBi's slopes, their batch stride (0: per head), and 1 / scale
              CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  #
              EVEN_D: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr, ALIBI: tl.constexpr = False):
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // nheads_k).to(tl.int64)
    off_hk = (off_bhk % nheads_k).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    cols_ok = offs_d[None, :] < head_dim
    k = load_rows(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                  offs_n, seqlen_k, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    v = load_rows(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                  offs_n, seqlen_k, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    diag = seqlen_k - seqlen_q  # query i sees key j iff i >= j - diag
    if CAUSAL:
        # rows that see some key of the tile start at start_n - diag; rows that see all of it at
        # start_n + BLOCK_N - 1 - diag (tile-aligned down / up)
        lo = tl.maximum(start_n - diag, 0) // BLOCK_M * BLOCK_M
        full = tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), seqlen_q)
        full = tl.minimum((full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, seqlen_q // BLOCK_M * BLOCK_M)
        full = tl.maximum(full, lo)
    else:
        lo = 0
        full = 0
    mid = seqlen_q // BLOCK_M * BLOCK_M  # tiles past this one hold the seqlen_q tail
    if start_n + BLOCK_N > seqlen_k:
        mid = full  # this key tile holds the seqlen_k tail: mask every query tile
    mid = tl.maximum(mid, full)
    for g in range(0, group):  # [mutant site: gqa-group]
        off_h = off_hk * group + g
        off_bh = off_b * (nheads_k * group) + off_h
        q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m0[None, :] * stride_qs + offs_d[:, None]
        do_ptrs = DO + off_b * stride_db + off_h * stride_dh + offs_m0[:, None] * stride_ds + offs_d[None, :]
        m_ptr = Rowmax + off_bh * seqlen_q
        l2_ptr = Log2l + off_bh * seqlen_q
        delta_ptr = Delta + off_bh * seqlen_q
        slope = 0.0
        if ALIBI:  # in raw units, as the forward's
            slope = tl.load(Alibi + off_b * stride_ab + off_h) * bias_unit
        # diagonal tiles (masked), then tiles every row of which sees the whole key tile, then the tail
        # (static_range unrolls one call per span, as three calls would be)
        for span in tl.static_range(3):
            span_lo = lo if span == 0 else full if span == 1 else mid
            span_hi = full if span == 0 else mid if span == 1 else seqlen_q
            dk, dv = _dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, m_ptr, l2_ptr, delta_ptr, stride_qs, stride_ds, span_lo,
                                 span_hi, offs_m0, offs_n, tl.trans(cols_ok), cols_ok, seqlen_q, seqlen_k, diag,
                                 qk_scale, slope, MASK=span != 1, CAUSAL=CAUSAL, ALIBI=ALIBI, BLOCK_M=BLOCK_M,
                                 EVEN_D=EVEN_D, INTERPRETED=INTERPRETED, IEEE=IEEE)
    dk = dk * softmax_scale  # [mutant site: dk-scale]
    out_ok = offs_n[:, None] < seqlen_k
    if not EVEN_D:
        out_ok = out_ok & cols_ok
    tl.store(DK + off_b * stride_dkb + off_hk * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
             cast(dk, DK.dtype.element_ty, INTERPRETED), mask=out_ok)
    tl.store(DV + off_b * stride_dvb + off_hk * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :],
             cast(dv, DV.dtype.element_ty, INTERPRETED), mask=out_ok)


@triton.jit
def _dq_inner(dq, q, do, m, l2, delta, k_ptrs, v_ptrs, stride_ks, stride_vs,  #
              lo, hi, offs_m, offs_n0, cols_ok_t, seqlen_k, diag, qk_scale, slope, pos,  #
              MASK: tl.constexpr, CAUSAL: tl.constexpr, ALIBI: tl.constexpr, BLOCK_N: tl.constexpr,  #
              EVEN_D: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    pos_first, pos_last = tl.min(pos, 0), tl.max(pos, 0)
    key_local = offs_n0.to(tl.float32)[None, :]
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n0
        kT = load_rows(k_ptrs + start_n * stride_ks, cols, seqlen_k, cols_ok_t, ROWS_ALONG_0=False, MASK_ROWS=MASK,
                       EVEN_D=EVEN_D)
        vT = load_rows(v_ptrs + start_n * stride_vs, cols, seqlen_k, cols_ok_t, ROWS_ALONG_0=False, MASK_ROWS=MASK,
                       EVEN_D=EVEN_D)
        s = mm(q, kT, INTERPRETED, IEEE)
        m_tile = m
        if ALIBI:
            signed, general = alibi_split(slope, pos_first, pos_last, start_n, start_n + BLOCK_N - 1, _NO_BOUND,
                                          0 if CAUSAL else _NO_BOUND)
            s = alibi_scores(s, general, signed, key_local, pos[:, None], cols[None, :], FP32_DIST=False)
            m_tile = m - alibi_row(signed, start_n, pos, 1.0, BIAS=False)
        if MASK:
            s = mask_scores(s, offs_m, cols, seqlen_k, diag, CAUSAL)  # [mutant site: dq-mask]
        p = tl.math.exp2(tl.minimum((s - m_tile[:, None]) * qk_scale, 0.0) - l2[:, None])
        dp = mm(do, vT, INTERPRETED, IEEE)
        ds = p * (dp - delta[:, None])
        # dQ += dS K
        dq += mm(cast(saturate(ds, kT.dtype), kT.dtype, INTERPRETED), tl.trans(kT), INTERPRETED, IEEE)
    return dq


def _dq(Q, K, V, DO, Rowmax, Log2l, Delta, DQ,  #
            stride_qb, stride_qs, stride_qh,  #
            stride_kb, stride_ks, stride_kh,  #
            stride_vb, stride_vs, stride_vh,  #
            stride_db, stride_ds, stride_dh,  #
            stride_dqb, stride_dqs, stride_dqh,  #
            nheads, group, seqlen_q, seqlen_k, head_dim, softmax_scale, qk_scale,  #
            Alibi, stride_ab, bias_unit,  # as _dkdv's
            CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  #
            EVEN_D: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr, ALIBI: tl.constexpr = False):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    off_hk = off_h // group
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    cols_ok = offs_d[None, :] < head_dim
    q = load_rows(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                  offs_m, seqlen_q, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    do = load_rows(DO + off_b * stride_db + off_h * stride_dh + offs_m[:, None] * stride_ds + offs_d[None, :],
                   offs_m, seqlen_q, cols_ok, ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    row = off_bh.to(tl.int64) * seqlen_q + offs_m
    m = tl.load(Rowmax + row, mask=offs_m < seqlen_q, other=0.0)
    l2 = tl.load(Log2l + row, mask=offs_m < seqlen_q, other=float("inf"))
    delta = tl.load(Delta + row, mask=offs_m < seqlen_q, other=0.0)
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n0[None, :] * stride_ks + offs_d[:, None]
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n0[None, :] * stride_vs + offs_d[:, None]
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    diag = seqlen_k - seqlen_q
    slope = 0.0
    if ALIBI:
        slope = tl.load(Alibi + off_b * stride_ab + off_h) * bias_unit
    pos = offs_m + diag  # each query's position: its ALiBi distances are to it  [mutant site: dq-alibi-offset]
    full, hi = key_ranges(start_m, seqlen_k, diag, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_inner(dq, q, do, m, l2, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, 0, full, offs_m, offs_n0,
                   tl.trans(cols_ok), seqlen_k, diag, qk_scale, slope, pos, MASK=False, CAUSAL=CAUSAL, ALIBI=ALIBI,
                   BLOCK_N=BLOCK_N,  #
                   EVEN_D=EVEN_D, INTERPRETED=INTERPRETED, IEEE=IEEE)
    dq = _dq_inner(dq, q, do, m, l2, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, full, hi, offs_m, offs_n0,
                   tl.trans(cols_ok), seqlen_k, diag, qk_scale, slope, pos, MASK=True, CAUSAL=CAUSAL, ALIBI=ALIBI,
                   BLOCK_N=BLOCK_N,  #
                   EVEN_D=EVEN_D, INTERPRETED=INTERPRETED, IEEE=IEEE)
    dq = dq * softmax_scale
    out_ok = offs_m[:, None] < seqlen_q
    if not EVEN_D:
        out_ok = out_ok & cols_ok
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
             cast(dq, DQ.dtype.element_ty, INTERPRETED), mask=out_ok)


_SIZES = ["seqlen_q", "seqlen_k", "head_dim", "nheads", "nheads_k", "group", "stride_ab"]
_bwd_preprocess = triton.jit(do_not_specialize=[a for a in _SIZES
                                                if a in _preprocess.__code__.co_varnames])(_preprocess)
_bwd_dkdv = triton.jit(do_not_specialize=[a for a in _SIZES if a in _dkdv.__code__.co_varnames])(_dkdv)
_bwd_dq = triton.jit(do_not_specialize=[a for a in _SIZES if a in _dq.__code__.co_varnames])(_dq)
_bwd_preprocess_generic = triton.jit(do_not_specialize=generic_args(_preprocess))(_preprocess)
_bwd_dkdv_generic = triton.jit(do_not_specialize=generic_args(_dkdv))(_dkdv)
_bwd_dq_generic = triton.jit(do_not_specialize=generic_args(_dq))(_dq)
