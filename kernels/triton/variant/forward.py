"""Flash forward of the variants in Triton: windows, softcap, ALiBi, sinks, v's own head dim, varlen
batches and paged KV caches with split-KV partials, and the split combine.

The algorithm and its numerics are dense/forward.py's (FlashAttention-2, raw logits, the max subtracted before
the scale); this kernel adds, each behind a compile-time switch so that what a launch does not use costs
it nothing:
- Masks as one window [i + diag - left, i + diag + right] (diag = seqlen_k - seqlen_q; causal is right
  = 0; no bound is common.NO_BOUND). Key tiles wholly outside it are skipped, tiles wholly inside run
  unmasked, only those that cross a bound are masked (visible_tiles).
- Softcap and ALiBi transform the raw logits (variant_scores), in the order of the FP64 reference:
  scale, cap, bias, mask.
- Sinks enter at the end, in the normalization: one more logit z_h with no value, so l' = l e^(m - M) +
  e^(z - M) with M = max(m, z); a row that saw no key gives out 0 and lse z_h.
- v's head dim is its own (BLOCK_DV), so out has it.
- VARLEN: the sequence b is tokens [cu_seqlens[b], cu_seqlens[b + 1]) of the packed q, k and v; a
  program whose query tile starts past its sequence's end returns at once, and no load reaches past a
  sequence (loads are masked by its own length).
- PAGED: key t of sequence b is slot t % page_size of page block_table[b, t // page_size] (gathered per
  key, so any page size works, 1 and non-powers of two included); offsets in int64, since a pool holds
  more than 2^31 elements.
- BIAS: an additive bias [b|1, h|1, sq|1, sk] (strides 0 where it broadcasts; a bool attn_mask comes as
  a bias of 0 and -inf), added after ALiBi to the scaled logits: with a bias the kernel works in the
  softmax's units, not raw q.k (a finfo.min bias divided by a scale below 1 would overflow fp32).
- BLOCKS: a block mask [b|1, h|1, ceil(sq / n), ceil(sk / n)] of block size n: element (i, j) reads
  block (i // n, j // n); a key tile none of whose elements is kept is skipped.
- SPLIT_BLOCK > 0: program axis 2 is the split; split s takes keys [s * per, (s + 1) * per), per = ceil(
  ceil(seqlen_k / SPLIT_BLOCK) / num_splits) * SPLIT_BLOCK (flash-attn's cut), and writes its own
  normalized out and lse (fp32), which _combine merges.
"""
import triton
import triton.language as tl

from faverify.kernels.triton.common import (
    LN2,
    LOG2E,
    alibi_distance,
    alibi_row,
    alibi_scores,
    alibi_split,
    cast,
    generic_args,
    load_rows,
    mm,
    streamed_args,
    tanh_slope,
)

LOG2E_ = tl.constexpr(LOG2E)  # a global a kernel may read (Triton takes only constexpr globals)


@triton.jit
def extra_scores(s, i, j, seqlen_q, seqlen_k, bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn,
                 mask_block, BIAS: tl.constexpr, BLOCKS: tl.constexpr):
    """The bias and the block mask on logits s (i, j: query and key indices broadcast to s's shape; bias and
    blocks: their (batch, head)'s base pointers). With a bias the raw logits are scaled first (bias_scale is
    the softmax scale; variant.args.KernelVariant.raw says why), and every later step works in those units."""
    if BIAS:
        ok = (i < seqlen_q) & (j < seqlen_k)
        add = tl.load(bias + i.to(tl.int64) * stride_bm + j * stride_bn, mask=ok, other=0.0).to(tl.float32)
        s = s * bias_scale + add
    if BLOCKS:
        keep = block_keep(blocks, stride_km, stride_kn, i, j, seqlen_q, seqlen_k, mask_block)
        s = tl.where(keep != 0, s, float("-inf"))
    return s


@triton.jit
def block_keep(blocks, stride_km, stride_kn, i, j, seqlen_q, seqlen_k, mask_block):
    """The block mask's entry of each (query i, key j): element (i, j) reads block (i // n, j // n); 0 past
    the sequences' ends."""
    ok = (i < seqlen_q) & (j < seqlen_k)
    # [mutant site: block-size]
    return tl.load(blocks + (i // mask_block) * stride_km + (j // mask_block) * stride_kn, mask=ok, other=0)


@triton.jit
def any_block(blocks, stride_km, stride_kn, i, j, seqlen_q, seqlen_k, mask_block):
    """Whether a tile of queries i and keys j keeps any element under the block mask."""
    keep = block_keep(blocks, stride_km, stride_kn, i, j, seqlen_q, seqlen_k, mask_block)
    return tl.max(keep.to(tl.int32)) > 0


@triton.jit
def visible_tiles(start, SIZE, lo_off, hi_off, length, TILE: tl.constexpr):
    """For the block of SIZE indices x from `start`, each seeing the indices y in [x + lo_off, x + hi_off]
    of [0, length): (lo, full_lo, full_hi, hi), tiles of TILE from lo. Tiles in [lo, full_lo) and
    [full_hi, hi) are seen by some x of the block (masked); [full_lo, full_hi) by every x, whole (no mask);
    nothing outside [lo, hi) is seen. The forward and dq ask for the keys a query tile sees (lo_off =
    diag - left, hi_off = diag + right), dk/dv for the queries that see a key tile (-hi_off, -lo_off)."""
    lo = tl.maximum(start + lo_off, 0) // TILE * TILE  # [mutant site: window-tiles]
    hi = tl.minimum(start + SIZE + hi_off, length)
    hi = tl.maximum(hi, lo)
    # every x of the block sees y from start + SIZE - 1 + lo_off up to start + hi_off
    full_lo = (tl.maximum(start + SIZE - 1 + lo_off, 0) + TILE - 1) // TILE * TILE
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(start + hi_off + 1, length) // TILE * TILE
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def variant_scores(qk, i, j, seqlen_k, diag, left, right, slope, signed, key_local, pos, cap_scale, inv_cap_scale,
                   MASK: tl.constexpr, SOFTCAP: tl.constexpr, FP32_DIST: tl.constexpr, IEEE: tl.constexpr,
                   ALIBI_SPLIT: tl.constexpr = True):
    """The variants' logits in raw q.k units (the kernels scale after subtracting the max, as dense/forward.py
    does): softcap (cap / scale) tanh(qk scale / cap), then ALiBi - (slope / scale) |i + diag - j| (the
    slope comes divided by the scale), then the masks: keys of the sequence, inside the window. i, j: query
    and key indices broadcast to qk's shape (the forward and dq pass [M, 1] and [1, N], dk/dv the
    transpose); pos: each query's position i + diag, broadcast as i (its ALiBi distance is to it). Returns
    (s, softcap's derivative 1 - tanh^2), the second for the backward (common.tanh_slope says how it keeps
    its precision where the cap saturates, and near 0: to fp32's in the fp32 builds, IEEE).
    ALiBi, with ALIBI_SPLIT (one slope for the tile, split by alibi_split): the column term signed *
    key_local (key_local: the keys' offsets in the tile, as fp32) when signed != 0, else the distance
    when slope != 0; the caller adds the row term. Neither without ALiBi (both slopes 0). Without
    ALIBI_SPLIT (the decode's rows, each its head's slope) the distance, always (common.alibi_distance says
    which way FP32_DIST computes it)."""
    dcap = qk
    if SOFTCAP:
        th, dcap = tanh_slope(qk * cap_scale, PRECISE=IEEE)
        qk = th * inv_cap_scale
    if ALIBI_SPLIT:
        qk = alibi_scores(qk, slope, signed, key_local, pos, j, FP32_DIST)
    else:
        qk = qk - slope * alibi_distance(pos, j, FP32_DIST)
    if MASK:
        keep = (j < seqlen_k) & (j >= i + diag - left) & (j <= i + diag + right)  # [mutant site: window-bound]
        qk = tl.where(keep, qk, float("-inf"))
    return qk, dcap


@triton.jit
def key_offsets(cols, seqlen_k, table, page_size, stride_kp, stride_ks, stride_vp, stride_vs):
    """Element offsets (int64: a pool holds more than 2^31 elements) of keys `cols` in the k and v pools:
    slots of the pages the block table row `table` names."""
    page = tl.load(table + cols // page_size, mask=cols < seqlen_k, other=0).to(tl.int64)  # [mutant site: page-gather]
    slot = (cols % page_size).to(tl.int64)
    return page * stride_kp + slot * stride_ks, page * stride_vp + slot * stride_vs


@triton.jit
def _inner(acc, l_i, m_i, q, k_base, v_base, table, page_size, stride_kp, stride_ks, stride_vp, stride_vs,  #
           lo, hi, offs_m, offs_n, offs_d, offs_dv, head_dim, head_dim_v, seqlen_q, seqlen_k, diag, left, right,  #
           slope, qk_scale, cap_scale, inv_cap_scale,  #
           bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block,  #
           MASK: tl.constexpr, SOFTCAP: tl.constexpr, PAGED: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr,  #
           BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, ROW_SLOPES: tl.constexpr,  #
           INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    """Key tiles [lo, hi) of the online softmax. ROW_SLOPES: slope is [M, 1], each row its own head's (the
    decode), and ALiBi takes the distance on every tile, as fp32 does (IEEE: there the split's row term
    spilled 368-592 bytes on sm_90); else the tile's one slope is split (alibi_split) and its row term
    enters the row max: the logits of the tile are s + row, and p = 2^((s - (m - row)) c)."""
    pos = offs_m + diag  # each query's position: its ALiBi distances are to it  [mutant site: alibi-offset]
    key_local = offs_n.to(tl.float32)[None, :]
    pos_first = tl.min(pos, 0)
    pos_last = tl.max(pos, 0)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        run = True
        if BLOCKS:  # a tile the block mask hides wholly is skipped
            run = any_block(blocks, stride_km, stride_kn, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k,
                            mask_block)
        if run:
            if PAGED:  # gathered key by key through the block table
                k_off, v_off = key_offsets(cols, seqlen_k, table, page_size, stride_kp, stride_ks, stride_vp,
                                           stride_vs)
                k_ptrs = k_base + k_off[None, :] + offs_d[:, None]
                v_ptrs = v_base + v_off[:, None] + offs_dv[None, :]
            else:  # k_base, v_base: the pointer tiles of keys 0..BLOCK_N-1, moved along (as dense/forward.py does)
                k_ptrs = k_base + start_n * stride_ks
                v_ptrs = v_base + start_n * stride_vs
            k = load_rows(k_ptrs, cols, seqlen_k, (offs_d < head_dim)[:, None], ROWS_ALONG_0=False, MASK_ROWS=MASK,
                          EVEN_D=EVEN_D)
            if ROW_SLOPES or IEEE:
                signed = 0.0
                general = slope
                row = 0.0
            else:
                signed, general = alibi_split(slope, pos_first, pos_last, start_n, start_n + BLOCK_N - 1, left,
                                              right)
                row = alibi_row(signed, start_n, pos, bias_scale, BIAS)
            s, _ = variant_scores(mm(q, k, INTERPRETED, IEEE), offs_m[:, None], cols[None, :], seqlen_k, diag, left,
                                  right, general, signed, key_local, pos[:, None], cap_scale, inv_cap_scale, MASK=MASK,
                                  SOFTCAP=SOFTCAP, FP32_DIST=True, IEEE=IEEE, ALIBI_SPLIT=not (ROW_SLOPES or IEEE))
            s = extra_scores(s, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k, bias, stride_bm, stride_bn,
                             bias_scale, blocks, stride_km, stride_kn, mask_block, BIAS=BIAS, BLOCKS=BLOCKS)
            m_new = tl.maximum(m_i, tl.max(s, 1) + row)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # dense/forward.py: never (-inf) - (-inf)
            p = tl.math.exp2((s - (m_use - row)[:, None]) * qk_scale)
            alpha = tl.math.exp2((m_i - m_use) * qk_scale)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = load_rows(v_ptrs, cols, seqlen_k, (offs_dv < head_dim_v)[None, :], ROWS_ALONG_0=True,
                          MASK_ROWS=MASK, EVEN_D=EVEN_DV)
            acc = acc * alpha[:, None] + mm(cast(p, v.dtype, INTERPRETED), v, INTERPRETED, IEEE)
            m_i = m_new
    return acc, l_i, m_i


@triton.jit
def split_keys(lo, full_lo, full_hi, hi, split, seqlen_k, num_splits, SPLIT_BLOCK: tl.constexpr):
    """visible_tiles' ranges cut to split `split`'s keys [split * per, (split + 1) * per), per = ceil(
    ceil(seqlen_k / SPLIT_BLOCK) / num_splits) * SPLIT_BLOCK (flash-attn's cut, whole blocks)."""
    per = tl.maximum(1, tl.cdiv(tl.cdiv(seqlen_k, SPLIT_BLOCK), num_splits)) * SPLIT_BLOCK  # [mutant site: split-cut]
    lo = tl.minimum(tl.maximum(lo, split * per), (split + 1) * per)
    hi = tl.maximum(tl.minimum(hi, (split + 1) * per), lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def finish_rows(acc, l_i, m_i, z_raw, qk_scale, BIAS: tl.constexpr):
    """The rows' normalization, with each row's sink z_raw (raw units; -inf without sinks): (out, lse,
    log2 l for the backward's P = exp2((s - m) c - log2l), whether the row saw a key).

    The sink z enters here: l' = l e^(m - M) + e^(z - M), M = max(m, z). Kept in raw units (z / scale),
    each difference taken before the scale, as in the loop: m c - M c could be contracted into an fma
    that leaves m's rounding error, 2^17 at logits of 1e12, and 2^that is inf. Without sinks z is -inf,
    M = m, and every step is exact (l * 1, + 0, acc * 1): the bits of a plain softmax."""
    seen = l_i > 0.0
    m_raw = tl.where(seen, m_i, float("-inf"))
    top = tl.maximum(m_raw, z_raw)
    top = tl.where(top == float("-inf"), 0.0, top)
    to_top = tl.math.exp2((m_raw - top) * qk_scale)
    keys = tl.where(seen, l_i * to_top, 0.0)
    total = keys + tl.math.exp2((z_raw - top) * qk_scale)  # [mutant site: sink-in-sum]
    some = total > 0.0
    out = acc * to_top[:, None] / tl.where(some, total, 1.0)[:, None]
    log2_total = tl.math.log2(tl.where(some, total, 1.0))
    if BIAS:  # top * qk_scale overflows for a row of finfo.min biases; qk_scale * LN2 is 1 in these units
        lse = tl.where(some, top * (qk_scale * LN2) + log2_total * LN2, float("-inf"))
    else:
        lse = tl.where(some, (top * qk_scale + log2_total) * LN2, float("-inf"))
    log2l = log2_total + (top - m_raw) * qk_scale
    return out, lse, log2l, seen


@triton.jit
def _visible(acc, l_i, m_i, q, k_base, v_base, table, page_size, stride_kp, stride_ks, stride_vp, stride_vs,  #
             lo, full_lo, full_hi, hi, offs_m, offs_n, offs_d, offs_dv, head_dim, head_dim_v, seqlen_q, seqlen_k,  #
             diag, left, right, slope, qk_scale, cap_scale, inv_cap_scale,  #
             bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block,  #
             SOFTCAP: tl.constexpr, PAGED: tl.constexpr, BIAS: tl.constexpr, BLOCKS: tl.constexpr,  #
             BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, ROW_SLOPES: tl.constexpr,  #
             INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    """_inner over visible_tiles' ranges: the tiles that cross the lower bound (masked), those inside the
    window (unmasked), those that cross the upper bound or hold the seqlen_k tail (masked)."""
    for r in tl.static_range(3):
        start = lo if r == 0 else full_lo if r == 1 else full_hi
        end = full_lo if r == 0 else full_hi if r == 1 else hi
        acc, l_i, m_i = _inner(acc, l_i, m_i, q, k_base, v_base, table, page_size, stride_kp, stride_ks, stride_vp,
                               stride_vs, start, end, offs_m, offs_n, offs_d, offs_dv, head_dim, head_dim_v, seqlen_q,
                               seqlen_k, diag, left, right, slope, qk_scale, cap_scale, inv_cap_scale, bias,
                               stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn, mask_block,
                               MASK=r != 1, SOFTCAP=SOFTCAP, PAGED=PAGED, BIAS=BIAS, BLOCKS=BLOCKS, BLOCK_N=BLOCK_N,
                               EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, ROW_SLOPES=ROW_SLOPES, INTERPRETED=INTERPRETED,
                               IEEE=IEEE)
    return acc, l_i, m_i


# kernel body: one program's rows from their sequence's bounds to their stores, each switch compiled out
# where off (test_sizes allows a kernel body 120 lines)
def _fwd(Q, K, V, Out, Lse, Rowmax, Log2l, CuQ, CuK, BlockTable, CacheSeqlens, Alibi, Sinks, Bias, Blocks,  #
         stride_qb, stride_qs, stride_qh,  #
         stride_kb, stride_ks, stride_kh,  # paged: stride_kb is the page's
         stride_vb, stride_vs, stride_vh,  #
         stride_ob, stride_os, stride_oh, stride_osplit,  #
         stride_lb, stride_lh, stride_lsplit,  # lse and the row statistics: [b, h, s] or varlen [h, total]
         stride_ab, stride_tb,  # alibi slopes' batch stride (0: per head), the block table's row
         stride_bb, stride_bh, stride_bm, stride_bn,  # the bias's (0 where it broadcasts)
         stride_kmb, stride_kmh, stride_km, stride_kn, mask_block, bias_scale,  # the block mask's, and its block size
         nheads, group, seqlen_q, seqlen_k, head_dim, head_dim_v, page_size, num_splits,  #
         qk_scale, init, left, right, cap_scale, inv_cap_scale, bias_unit,  #
         SOFTCAP: tl.constexpr, VARLEN: tl.constexpr,  #
         PAGED: tl.constexpr, SPLIT_BLOCK: tl.constexpr, STATS: tl.constexpr, BIAS: tl.constexpr,  #
         BLOCKS: tl.constexpr,  #
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,  #
         EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    split = tl.program_id(2)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    off_hk = off_h // group  # GQA/MQA
    bos_q = 0
    bos_k = 0
    if VARLEN:
        bos_q = tl.load(CuQ + off_b).to(tl.int64)
        seqlen_q = (tl.load(CuQ + off_b + 1) - bos_q).to(tl.int32)
        bos_k = tl.load(CuK + off_b).to(tl.int64)
        seqlen_k = (tl.load(CuK + off_b + 1) - bos_k).to(tl.int32)  # [mutant site: varlen-keys]
    if PAGED:
        seqlen_k = tl.load(CacheSeqlens + off_b)
    if start_m * BLOCK_M >= seqlen_q:  # past this sequence's end: nothing to do
        return

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + off_b * stride_qb + (bos_q + offs_m[:, None]) * stride_qs + off_h * stride_qh + offs_d[None, :]
    q = load_rows(q_ptrs, offs_m, seqlen_q, (offs_d < head_dim)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True,
                  EVEN_D=EVEN_D)
    if PAGED:  # key offsets come from the block table: the bases are the pools'
        k_base = K + off_hk * stride_kh
        v_base = V + off_hk * stride_vh
        table = BlockTable + off_b * stride_tb
    else:
        k_base = K + off_b * stride_kb + bos_k * stride_ks + off_hk * stride_kh + offs_n[None, :] * stride_ks \
            + offs_d[:, None]
        v_base = V + off_b * stride_vb + bos_k * stride_vs + off_hk * stride_vh + offs_n[:, None] * stride_vs \
            + offs_dv[None, :]
        table = BlockTable
    slope = tl.load(Alibi + off_b * stride_ab + off_h) * bias_unit  # 0 without ALiBi
    bias = Bias + off_b * stride_bb + off_h * stride_bh
    blocks = Blocks + off_b * stride_kmb + off_h * stride_kmh

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + init
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = visible_tiles(start_m * BLOCK_M, BLOCK_M, diag - left, diag + right, seqlen_k, BLOCK_N)
    if SPLIT_BLOCK > 0:  # this split's keys only (whole blocks of SPLIT_BLOCK, a multiple of BLOCK_N)
        lo, full_lo, full_hi, hi = split_keys(lo, full_lo, full_hi, hi, split, seqlen_k, num_splits, SPLIT_BLOCK)
    acc, l_i, m_i = _visible(acc, l_i, m_i, q, k_base, v_base, table, page_size, stride_kb, stride_ks, stride_vb,
                             stride_vs, lo, full_lo, full_hi, hi, offs_m, offs_n, offs_d, offs_dv, head_dim,
                             head_dim_v, seqlen_q, seqlen_k, diag, left, right, slope, qk_scale, cap_scale,
                             inv_cap_scale, bias, stride_bm, stride_bn, bias_scale, blocks, stride_km, stride_kn,
                             mask_block, SOFTCAP=SOFTCAP, PAGED=PAGED, BIAS=BIAS, BLOCKS=BLOCKS, BLOCK_N=BLOCK_N,
                             EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, ROW_SLOPES=False, INTERPRETED=INTERPRETED, IEEE=IEEE)
    out, lse, log2l, seen = finish_rows(acc, l_i, m_i, tl.load(Sinks + off_h), qk_scale, BIAS=BIAS)
    rows = split * stride_lsplit + off_b * stride_lb + off_h * stride_lh + bos_q + offs_m
    in_seq = offs_m < seqlen_q
    if STATS:  # the backward's row statistics (dense/backward.py says why m and log2 l, not lse)
        tl.store(Rowmax + rows, tl.where(seen, m_i, 0.0), mask=in_seq)
        tl.store(Log2l + rows, tl.where(seen, log2l, float("inf")), mask=in_seq)
    tl.store(Lse + rows, lse, mask=in_seq)
    o_ptrs = (Out + split * stride_osplit + off_b * stride_ob + (bos_q + offs_m[:, None]) * stride_os
              + off_h * stride_oh + offs_dv[None, :])
    o_ok = in_seq[:, None]
    if not EVEN_DV:
        o_ok = o_ok & (offs_dv < head_dim_v)[None, :]
    tl.store(o_ptrs, cast(out, Out.dtype.element_ty, INTERPRETED), mask=o_ok)


def _combine(OutSplits, LseSplits, Out, Lse,  #
             stride_ss, stride_sb, stride_sm, stride_sh,  # out_splits [splits, b, s, h, dv]
             stride_ls, stride_lb, stride_lh,  # lse_splits [splits, b, h, s]
             stride_ob, stride_om, stride_oh, stride_eb, stride_eh,  # out [b, s, h, dv], lse [b, h, s]
             nheads, seqlen_q, head_dim_v, num_splits,  #
             BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, INTERPRETED: tl.constexpr):
    """lse = logsumexp_s lse_s, out = sum_s e^(lse_s - lse) out_s for one row (program (row, b * h));
    partials that saw no key (lse_s = -inf, out_s = 0) weigh nothing, and a row no split saw gives out 0,
    lse -inf. BLOCK_S splits are read at once: a decode step's row has up to MAX_SPLITS partials, and
    read one after another each would wait its own memory latency."""
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    off_m = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < head_dim_v
    lse_base = LseSplits + off_b * stride_lb + off_h * stride_lh + off_m
    out_base = OutSplits + off_b * stride_sb + off_m * stride_sm + off_h * stride_sh + offs_dv[None, :]
    top = float("-inf")
    for s0 in range(0, num_splits, BLOCK_S):
        top = tl.maximum(top, tl.max(tl.load(lse_base + (s0 + offs_s) * stride_ls, mask=s0 + offs_s < num_splits,
                                             other=float("-inf")), 0))
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = s0 + offs_s < num_splits
        w = tl.math.exp2((tl.load(lse_base + (s0 + offs_s) * stride_ls, mask=s_ok, other=float("-inf")) - top)
                         * LOG2E_)
        parts = tl.load(out_base + (s0 + offs_s)[:, None] * stride_ss, mask=s_ok[:, None] & dv_ok[None, :], other=0.0)
        acc += tl.sum(w[:, None] * parts, 0)
        weight += tl.sum(w, 0)
    out = acc / tl.where(weight > 0.0, weight, 1.0)  # [mutant site: combine-empty]
    lse = tl.where(weight > 0.0, top + tl.math.log2(tl.where(weight > 0.0, weight, 1.0)) * LN2, float("-inf"))
    tl.store(Out + off_b * stride_ob + off_m * stride_om + off_h * stride_oh + offs_dv,
             cast(out, Out.dtype.element_ty, INTERPRETED), mask=dv_ok)
    tl.store(Lse + off_b * stride_eb + off_h * stride_eh + off_m, lse)


# Two builds per set of compile-time switches: the generic one specialized on no runtime value
# (common.generic_args: the variants' shapes, windows and page sizes vary case by case and must not each
# cost a compile), and the fast one, specialized only on the streamed tensors' alignment
# (common.streamed_args), for head dims that fill their padding (variant.interface.fast_build).
_fwd_kernel = triton.jit(do_not_specialize=generic_args(_fwd))(_fwd)
_fwd_kernel_fast = triton.jit(do_not_specialize=streamed_args(_fwd))(_fwd)
_combine_kernel = triton.jit(do_not_specialize=generic_args(_combine))(_combine)
