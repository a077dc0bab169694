"""Flash backward of the variants in Triton: dense/backward.py's recomputation (P from the forward's row max and
log2 l; dV = P^T dO, dS = P (dP - D), dK = scale dS^T Q, dQ = scale dS K; no atomics), with the
variant forward's switches:
- windows: dk/dv visits only the query tiles that see its key tile, dq only the key tiles its query tile
  sees, and masks only the tiles that cross a bound (variant.forward.visible_tiles);
- softcap: dS is taken through the cap, times its derivative 1 - tanh^2;
- ALiBi: a constant bias, no factor in dS; split as the forward splits it (variant.forward.alibi_split), its row
  term taken off the stored row max;
- sinks: already in log2 l (the forward's); their own gradient, -sum_i p_sink_i D_i, is a reduction over
  rows the launcher computes from lse and D;
- v's own head dim; VARLEN's packed sequences, as in the forward;
- the bias and the block mask (BIAS, BLOCKS) recomputed into P as the forward adds them; DBIAS: dq's
  kernel, which meets each (row, key) of a head once, writes dS (the gradient of the logit the bias was
  added to: before softcap's derivative and the scale) to an fp32 [b, h, sq, sk] buffer, which the
  launcher sums over the dimensions the bias broadcasts over.
"""
import triton
import triton.language as tl

from faverify.kernels.triton.common import (
    alibi_row,
    alibi_split,
    cast,
    generic_args,
    load_rows,
    mm,
    row_stats,
    saturate,
    streamed_args,
)
from faverify.kernels.triton.variant.forward import extra_scores, variant_scores, visible_tiles


@triton.jit
def _sequence(Cu, off_b, length, VARLEN: tl.constexpr):
    """(first token, length) of sequence off_b: packed at Cu[b] (varlen), else its own batch row."""
    if VARLEN:
        bos = tl.load(Cu + off_b).to(tl.int64)
        return bos, (tl.load(Cu + off_b + 1) - bos).to(tl.int32)
    else:
        return off_b * 0, length


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, m_ptr, l2_ptr, delta_ptr, stride_qs, stride_ds,  #
                lo, hi, offs_m0, offs_n, offs_d, offs_dv, head_dim, head_dim_v, seqlen_q, seqlen_k, diag,
                left, right, slope, qk_scale, cap_scale, inv_cap_scale,  #
                bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block,  #
                MASK: tl.constexpr, SOFTCAP: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr,  #
                BLOCK_M: tl.constexpr,  #
                EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    key_first = tl.min(offs_n, 0)  # ALiBi's split (variant.forward.alibi_split) about the tile's first key
    key_local = (offs_n - key_first).to(tl.float32)[:, None]
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        pos = offs_m + diag
        signed, general = alibi_split(slope, start_m + diag, start_m + BLOCK_M - 1 + diag, key_first,
                                      tl.max(offs_n, 0), left, right)
        row = alibi_row(signed, key_first, pos, bias_scale, BIAS)
        qT = load_rows(q_base + start_m * stride_qs, offs_m, seqlen_q,
                       (offs_d < head_dim)[:, None], ROWS_ALONG_0=False, MASK_ROWS=MASK, EVEN_D=EVEN_D)
        do = load_rows(do_base + start_m * stride_ds, offs_m, seqlen_q,
                       (offs_dv < head_dim_v)[None, :], ROWS_ALONG_0=True, MASK_ROWS=MASK, EVEN_D=EVEN_DV)
        m, l2, delta = row_stats(m_ptr, l2_ptr, delta_ptr, offs_m, seqlen_q, MASK)
        sT, dcapT = variant_scores(mm(k, qT, INTERPRETED, IEEE), offs_m[None, :], offs_n[:, None], seqlen_k, diag,
                                   left, right, general, signed, key_local, pos[None, :], cap_scale, inv_cap_scale,
                                   MASK=MASK, SOFTCAP=SOFTCAP, FP32_DIST=False, IEEE=IEEE)
        sT = extra_scores(sT, offs_m[None, :], offs_n[:, None], seqlen_q, seqlen_k, bias, stride_bm, stride_bn,
                          bias_scale, blocks, stride_km, stride_kn, mask_block, BIAS=BIAS, BLOCKS=BLOCKS)
        pT = tl.math.exp2(tl.minimum((sT - (m - row)[None, :]) * qk_scale, 0.0) - l2[None, :])
        dv += mm(cast(pT, do.dtype, INTERPRETED), do, INTERPRETED, IEEE)
        dsT = pT * (mm(v, tl.trans(do), INTERPRETED, IEEE) - delta[None, :])
        if SOFTCAP:
            dsT = dsT * dcapT  # [mutant site: softcap-derivative]
        dk += mm(cast(saturate(dsT, qT.dtype), qT.dtype, INTERPRETED), tl.trans(qT), INTERPRETED, IEEE)
    return dk, dv


def _dkdv(Q, K, V, DO, Rowmax, Log2l, Delta, DK, DV, CuQ, CuK, Alibi, Bias, Blocks,  #
          stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,  #
          stride_db, stride_ds, stride_dh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
          stride_lb, stride_lh, stride_ab,  #
          stride_bb, stride_bh, stride_bm, stride_bn, stride_kmb, stride_kmh, stride_km, stride_kn,  #
          mask_block, bias_scale,  #
          nheads_k, group, seqlen_q, seqlen_k, head_dim, head_dim_v, softmax_scale, qk_scale,  #
          left, right, cap_scale, inv_cap_scale, bias_unit,  #
          SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr,  #
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,  #
          EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // nheads_k).to(tl.int64)
    off_hk = (off_bhk % nheads_k).to(tl.int64)
    bos_q, seqlen_q = _sequence(CuQ, off_b, seqlen_q, VARLEN)
    bos_k, seqlen_k = _sequence(CuK, off_b, seqlen_k, VARLEN)
    if start_n >= seqlen_k:  # past this sequence's keys: nothing to do
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_n = (bos_k + offs_n[:, None]).to(tl.int64)
    k = load_rows(K + off_b * stride_kb + rows_n * stride_ks + off_hk * stride_kh + offs_d[None, :], offs_n,
                  seqlen_k, (offs_d < head_dim)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    v = load_rows(V + off_b * stride_vb + rows_n * stride_vs + off_hk * stride_vh + offs_dv[None, :], offs_n,
                  seqlen_k, (offs_dv < head_dim_v)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    # the query rows that see key j: [j - diag - right, j - diag + left]
    # [mutant site: dkdv-rows]
    lo, full_lo, full_hi, hi = visible_tiles(start_n, BLOCK_N, -diag - right, -diag + left, seqlen_q, BLOCK_M)
    for g in range(0, group):
        off_h = off_hk * group + g
        slope = tl.load(Alibi + off_b * stride_ab + off_h) * bias_unit  # 0 without ALiBi
        bias = Bias + off_b * stride_bb + off_h * stride_bh
        blocks = Blocks + off_b * stride_kmb + off_h * stride_kmh
        # pointer tiles of query rows 0..BLOCK_M-1 (q transposed), moved along by the loop
        q_base = Q + off_b * stride_qb + bos_q * stride_qs + off_h * stride_qh + offs_m0[None, :] * stride_qs \
            + offs_d[:, None]
        do_base = DO + off_b * stride_db + bos_q * stride_ds + off_h * stride_dh + offs_m0[:, None] * stride_ds \
            + offs_dv[None, :]
        row = off_b * stride_lb + off_h * stride_lh + bos_q
        # the key (query) tiles in three spans: masked [lo, full_lo), whole [full_lo, full_hi), masked
        # [full_hi, hi); one call unrolled per span, as three calls would be
        for span in tl.static_range(3):
            span_lo = lo if span == 0 else full_lo if span == 1 else full_hi
            span_hi = full_lo if span == 0 else full_hi if span == 1 else hi
            dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, Rowmax + row, Log2l + row, Delta + row, stride_qs,
                                 stride_ds, span_lo, span_hi, offs_m0, offs_n, offs_d, offs_dv, head_dim, head_dim_v,
                                 seqlen_q, seqlen_k, diag, left, right, slope, qk_scale, cap_scale, inv_cap_scale, bias,
                                 stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block,
                                 MASK=span != 1, SOFTCAP=SOFTCAP, BIAS=BIAS, BLOCKS=BLOCKS, BLOCK_M=BLOCK_M,
                                 EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, INTERPRETED=INTERPRETED, IEEE=IEEE)
    dk = dk * softmax_scale
    ok = offs_n[:, None] < seqlen_k
    tl.store(DK + off_b * stride_dkb + rows_n * stride_dks + off_hk * stride_dkh + offs_d[None, :],
             cast(dk, DK.dtype.element_ty, INTERPRETED), mask=ok & (offs_d < head_dim)[None, :])
    tl.store(DV + off_b * stride_dvb + rows_n * stride_dvs + off_hk * stride_dvh + offs_dv[None, :],
             cast(dv, DV.dtype.element_ty, INTERPRETED), mask=ok & (offs_dv < head_dim_v)[None, :])


@triton.jit
def _dq_inner(dq, q, do, m, l2, delta, k_base, v_base, stride_ks, stride_vs,  #
              lo, hi, offs_m, offs_n0, offs_d, offs_dv, head_dim, head_dim_v, seqlen_k, diag, left, right,  #
              slope, qk_scale, cap_scale, inv_cap_scale, seqlen_q,  #
              bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block, dbias, stride_gm,  #
              MASK: tl.constexpr, SOFTCAP: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr,  #
              DBIAS: tl.constexpr, BLOCK_N: tl.constexpr,  #
              EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    pos = offs_m + diag  # ALiBi's split (variant.forward.alibi_split) about each key tile's first key
    pos_first, pos_last = tl.min(pos, 0), tl.max(pos, 0)
    key_local = offs_n0.to(tl.float32)[None, :]
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n0
        signed, general = alibi_split(slope, pos_first, pos_last, start_n, start_n + BLOCK_N - 1, left, right)
        row = alibi_row(signed, start_n, pos, bias_scale, BIAS)
        kT = load_rows(k_base + start_n * stride_ks, cols, seqlen_k,
                       (offs_d < head_dim)[:, None], ROWS_ALONG_0=False, MASK_ROWS=MASK, EVEN_D=EVEN_D)
        vT = load_rows(v_base + start_n * stride_vs, cols, seqlen_k,
                       (offs_dv < head_dim_v)[:, None], ROWS_ALONG_0=False, MASK_ROWS=MASK, EVEN_D=EVEN_DV)
        s, dcap = variant_scores(mm(q, kT, INTERPRETED, IEEE), offs_m[:, None], cols[None, :], seqlen_k, diag, left,
                                 right, general, signed, key_local, pos[:, None], cap_scale, inv_cap_scale, MASK=MASK,
                                 SOFTCAP=SOFTCAP, FP32_DIST=False, IEEE=IEEE)
        s = extra_scores(s, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, bias, stride_bm, stride_bn,
                         bias_scale, blocks, stride_km, stride_kn, mask_block, BIAS=BIAS, BLOCKS=BLOCKS)
        p = tl.math.exp2(tl.minimum((s - (m - row)[:, None]) * qk_scale, 0.0) - l2[:, None])
        ds = p * (mm(do, vT, INTERPRETED, IEEE) - delta[:, None])
        if DBIAS:  # the logit the bias was added to: dS before softcap's derivative
            tl.store(dbias + offs_m[:, None].to(tl.int64) * stride_gm + cols[None, :], ds,
                     mask=(offs_m[:, None] < seqlen_q) & (cols[None, :] < seqlen_k))
        if SOFTCAP:
            ds = ds * dcap
        dq += mm(cast(saturate(ds, kT.dtype), kT.dtype, INTERPRETED), tl.trans(kT), INTERPRETED, IEEE)
    return dq


def _dq(Q, K, V, DO, Rowmax, Log2l, Delta, DQ, CuQ, CuK, Alibi, Bias, Blocks, DBias,  #
        stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,  #
        stride_db, stride_ds, stride_dh, stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, stride_ab,  #
        stride_bb, stride_bh, stride_bm, stride_bn, stride_kmb, stride_kmh, stride_km, stride_kn,  #
        mask_block, bias_scale,  #
        stride_gb, stride_gh, stride_gm,  # dS's [b, h, sq, sk] buffer (DBIAS)
        nheads, group, seqlen_q, seqlen_k, head_dim, head_dim_v, softmax_scale, qk_scale,  #
        left, right, cap_scale, inv_cap_scale, bias_unit,  #
        SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr, DBIAS: tl.constexpr,  #
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,  #
        EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    off_hk = off_h // group
    bos_q, seqlen_q = _sequence(CuQ, off_b, seqlen_q, VARLEN)
    bos_k, seqlen_k = _sequence(CuK, off_b, seqlen_k, VARLEN)
    if start_m * BLOCK_M >= seqlen_q:
        return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows_m = (bos_q + offs_m[:, None]).to(tl.int64)
    q = load_rows(Q + off_b * stride_qb + rows_m * stride_qs + off_h * stride_qh + offs_d[None, :], offs_m, seqlen_q,
                  (offs_d < head_dim)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
    do = load_rows(DO + off_b * stride_db + rows_m * stride_ds + off_h * stride_dh + offs_dv[None, :], offs_m,
                   seqlen_q, (offs_dv < head_dim_v)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_DV)
    row = off_b * stride_lb + off_h * stride_lh + bos_q
    m, l2, delta = row_stats(Rowmax + row, Log2l + row, Delta + row, offs_m, seqlen_q, True)
    slope = tl.load(Alibi + off_b * stride_ab + off_h) * bias_unit  # 0 without ALiBi
    bias = Bias + off_b * stride_bb + off_h * stride_bh
    blocks = Blocks + off_b * stride_kmb + off_h * stride_kmh
    dbias = DBias + off_b * stride_gb + off_h * stride_gh
    # pointer tiles of keys 0..BLOCK_N-1 (transposed), moved along by the loop
    k_base = K + off_b * stride_kb + bos_k * stride_ks + off_hk * stride_kh + offs_n0[None, :] * stride_ks \
        + offs_d[:, None]
    v_base = V + off_b * stride_vb + bos_k * stride_vs + off_hk * stride_vh + offs_n0[None, :] * stride_vs \
        + offs_dv[:, None]
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = visible_tiles(start_m * BLOCK_M, BLOCK_M, diag - left, diag + right, seqlen_k, BLOCK_N)
    # the key (query) tiles in three spans: masked [lo, full_lo), whole [full_lo, full_hi), masked
    # [full_hi, hi); one call unrolled per span, as three calls would be
    for span in tl.static_range(3):
        span_lo = lo if span == 0 else full_lo if span == 1 else full_hi
        span_hi = full_lo if span == 0 else full_hi if span == 1 else hi
        dq = _dq_inner(dq, q, do, m, l2, delta, k_base, v_base, stride_ks, stride_vs, span_lo, span_hi, offs_m, offs_n0,
                       offs_d, offs_dv, head_dim, head_dim_v, seqlen_k, diag, left, right, slope, qk_scale, cap_scale,
                       inv_cap_scale, seqlen_q, bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn,
                       mask_block, dbias, stride_gm, MASK=span != 1, SOFTCAP=SOFTCAP, BIAS=BIAS, BLOCKS=BLOCKS,
                       DBIAS=DBIAS, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, INTERPRETED=INTERPRETED, IEEE=IEEE)
    dq = dq * softmax_scale
    tl.store(DQ + off_b * stride_dqb + rows_m * stride_dqs + off_h * stride_dqh + offs_d[None, :],
             cast(dq, DQ.dtype.element_ty, INTERPRETED), mask=(offs_m < seqlen_q)[:, None] & (offs_d < head_dim)[None,
                                                                                                                 :])


# the generic and the fast build of each (variant/forward.py's two builds)
_dkdv_kernel = triton.jit(do_not_specialize=generic_args(_dkdv))(_dkdv)
_dq_kernel = triton.jit(do_not_specialize=generic_args(_dq))(_dq)
_dkdv_kernel_fast = triton.jit(do_not_specialize=streamed_args(_dkdv))(_dkdv)
_dq_kernel_fast = triton.jit(do_not_specialize=streamed_args(_dq))(_dq)
