"""The paged decode in Triton: a paged cache's few query rows with a GQA group packed into one tile's rows
(variant.interface.packs_decode), split-KV partials written for every split. Its scores, masks and
ending are variant/forward.py's helpers, so its numerics are the variant forward's.
"""
import triton
import triton.language as tl

from faverify.kernels.triton.common import cast, generic_args, load_rows, streamed_args
from faverify.kernels.triton.variant.forward import (
    _visible,
    finish_rows,
    split_keys,
    visible_tiles,
)


def _decode(Q, K, V, Out, Lse, BlockTable, CacheSeqlens, Alibi, Sinks,  #
            stride_qb, stride_qs, stride_qh,  #
            stride_kb, stride_ks, stride_kh,  # the pools': stride_kb is the page's
            stride_vb, stride_vs, stride_vh,  #
            stride_ob, stride_os, stride_oh, stride_osplit,  #
            stride_lb, stride_lh, stride_lsplit,  #
            stride_ab, stride_tb,  #
            nheads_k, group, seqlen_q, head_dim, head_dim_v, page_size, num_splits,  #
            qk_scale, init, left, right, cap_scale, inv_cap_scale, bias_unit,  #
            SOFTCAP: tl.constexpr, SPLIT_BLOCK: tl.constexpr,  #
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,  #
            EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    """Decode against a paged cache with the query heads of one kv head packed into a tile's rows: row r
    of program (row block, (b, kv head hk), split) is query i = r % seqlen_q of head hk * group + r //
    seqlen_q. Each key tile is read once for the whole GQA group, where _fwd reads it once per query head
    (group times) and fills 1 of its 16 rows at seqlen_q 1. The numerics are _fwd's, row by row: the
    same logits (variant_scores with each row's query index and ALiBi slope), the same running softmax
    (_inner), the same normalization with each row's sink (finish_rows). No bias or block mask: a paged
    cache takes none."""
    off_bh = tl.program_id(1)
    split = tl.program_id(2)
    off_b = (off_bh // nheads_k).to(tl.int64)
    off_hk = (off_bh % nheads_k).to(tl.int64)
    seqlen_k = tl.load(CacheSeqlens + off_b)
    n_rows = group * seqlen_q
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = offs_r < n_rows
    offs_i = offs_r % seqlen_q  # each row's query index, and its head [mutant site: decode-rows]
    offs_h = off_hk * group + tl.minimum(offs_r, n_rows - 1) // seqlen_q  # row-major: a head's queries together
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + off_b * stride_qb + offs_i[:, None] * stride_qs + offs_h[:, None] * stride_qh + offs_d[None, :]
    q = load_rows(q_ptrs, offs_r, n_rows, (offs_d < head_dim)[None, :], ROWS_ALONG_0=True, MASK_ROWS=True,
                  EVEN_D=EVEN_D)
    k_base = K + off_hk * stride_kh
    v_base = V + off_hk * stride_vh
    table = BlockTable + off_b * stride_tb
    slope = tl.load(Alibi + off_b * stride_ab + offs_h) * bias_unit  # 0 without ALiBi
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + init
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    diag = seqlen_k - seqlen_q
    # the keys some row sees, and those every row sees, of queries 0 .. seqlen_q - 1 (whatever their head)
    lo, full_lo, full_hi, hi = visible_tiles(0, seqlen_q, diag - left, diag + right, seqlen_k, BLOCK_N)
    if SPLIT_BLOCK > 0:
        lo, full_lo, full_hi, hi = split_keys(lo, full_lo, full_hi, hi, split, seqlen_k, num_splits, SPLIT_BLOCK)
    acc, l_i, m_i = _visible(acc, l_i, m_i, q, k_base, v_base, table, page_size, stride_kb, stride_ks, stride_vb,
                             stride_vs, lo, full_lo, full_hi, hi, offs_i, offs_n, offs_d, offs_dv, head_dim,
                             head_dim_v, seqlen_q, seqlen_k, diag, left, right, slope[:, None], qk_scale, cap_scale,
                             inv_cap_scale, Alibi, 0, 0, 1.0, Alibi, 0, 0, 1, SOFTCAP=SOFTCAP, PAGED=True, BIAS=False,
                             BLOCKS=False, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D, EVEN_DV=EVEN_DV, ROW_SLOPES=True,
                             INTERPRETED=INTERPRETED, IEEE=IEEE)
    z_raw = tl.load(Sinks + offs_h)
    out, lse, _, _ = finish_rows(acc, l_i, m_i, z_raw, qk_scale, BIAS=False)
    tl.store(Lse + split * stride_lsplit + off_b * stride_lb + offs_h * stride_lh + offs_i, lse, mask=in_rows)
    o_ptrs = (Out + split * stride_osplit + off_b * stride_ob + offs_i[:, None] * stride_os
              + offs_h[:, None] * stride_oh + offs_dv[None, :])
    o_ok = in_rows[:, None]
    if not EVEN_DV:
        o_ok = o_ok & (offs_dv < head_dim_v)[None, :]
    tl.store(o_ptrs, cast(out, Out.dtype.element_ty, INTERPRETED), mask=o_ok)


# the generic and the fast build, as variant/forward.py's kernels have them
_decode_kernel = triton.jit(do_not_specialize=generic_args(_decode))(_decode)
_decode_kernel_fast = triton.jit(do_not_specialize=streamed_args(_decode))(_decode)
