"""Flash forward in Triton (FlashAttention-2: tiles of queries stay on chip, keys stream past them).

For a tile of BLOCK_M query rows, over key tiles of BLOCK_N:
    s   = q k^T                                 raw logits, fp32
    m'  = max(m, rowmax(s))                     running max, in raw units
    p   = exp2((s - m') * c), alpha = exp2((m - m') * c),   c = scale * log2(e)
                                                (guarded: never (-inf) - (-inf))
    l   = l * alpha + rowsum(p)                 running sum
    acc = acc * alpha + p.to(dtype) @ v         P is rounded to the input dtype only as this operand
out = acc / l and lse = (m + log2 l) * ln 2; a row that saw no key has l == 0: out 0, lse -inf.
The running max starts at `init` (-inf or -1e30, a runtime value); both guards are always on, so the two
starts give the same bits.

Causal is bottom-right aligned (query i sees key j iff j <= i + seqlen_k - seqlen_q). Key tiles that
every row of the query tile sees run without a mask; the diagonal tiles and the seqlen_k tail run with
one; tiles above the diagonal are skipped.

Loads: on sm_90 and later, with 16-byte aligned bases and strides, through tensor descriptors (TMA), one
per (batch, head) bounded by the sequence and the head dim, so the copy engine zero-fills the tails and the
head-dim padding (TMA=True, chosen by interface._use_tma); elsewhere through masked pointer loads. Both give
the same bits (a test checks it). On sm_90 itself, 16-bit inputs with padded head dim 64 or 128 and
aligned strides go to the warp-specialized Hopper forward instead (hopper/forward.py, same numerics).

Why subtract before scaling: written as s * c - m' (m' the max of the rounded products s * c), the compiler
contracts it into fma(s, c, -m'), which is the rounding error of s * c, not 0, for the maximal logit: at
logits of 1e11 (every element 133120 in bf16) that is +-4096, exp2 overflows and out is NaN. A difference
of equal numbers is exactly 0, and a product that no add follows cannot be contracted.
"""
import triton
import triton.language as tl

from faverify.kernels.triton.common import LN2, cast, generic_args, key_ranges, load_rows, mask_scores, mm


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_vs,  #
               lo, hi, offs_m, offs_n, mask_dk, mask_dv, seqlen_k, diag, qk_scale,  #
               MASK: tl.constexpr, CAUSAL: tl.constexpr,  #
               BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, INTERPRETED: tl.constexpr, IEEE: tl.constexpr,
               TMA: tl.constexpr):
    # k_src, v_src: tensor descriptors when TMA (the copy engine zero-fills rows past seqlen_k and the
    # head-dim padding), else pointer tiles loaded with masks
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if TMA:
            k = k_src.load([start_n, 0]).T
        else:
            k = load_rows(k_src + start_n * stride_ks, cols, seqlen_k, mask_dk, ROWS_ALONG_0=False, MASK_ROWS=MASK,
                          EVEN_D=EVEN_D)
        # s = q k^T (raw: scaled only after the max is subtracted, see the module docstring)
        qk = mm(q, k, INTERPRETED, IEEE)  # [mutant site: qk]
        if MASK:
            qk = mask_scores(qk, offs_m, cols, seqlen_k, diag, CAUSAL)  # [mutant site: mask]
        # m' = max(m, rowmax(s))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # Started at -inf, a row that has seen only masked keys keeps m' = -inf, and s - m' would be NaN.
        # Started at -1e30, m' stays finite and exp2(-inf - m') is 0. One select per row makes both right.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # [mutant site: neg-inf-guard]
        p = tl.math.exp2((qk - m_use[:, None]) * qk_scale)
        alpha = tl.math.exp2((m_i - m_use) * qk_scale)  # [mutant site: rescale]
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA:
            v = v_src.load([start_n, 0])
        else:
            v = load_rows(v_src + start_n * stride_vs, cols, seqlen_k, mask_dv, ROWS_ALONG_0=True, MASK_ROWS=MASK,
                          EVEN_D=EVEN_D)
        # acc = acc * alpha + P V, P rounded to the input dtype as the matmul operand
        # [mutant site: pv-accumulate]
        acc = acc * alpha[:, None] + mm(cast(p, v.dtype, INTERPRETED), v, INTERPRETED, IEEE)
        m_i = m_new
    return acc, l_i, m_i


def _fwd(Q, K, V, Out, Lse, Rowmax, Log2l,  #
                stride_qb, stride_qs, stride_qh,  #
                stride_kb, stride_ks, stride_kh,  #
                stride_vb, stride_vs, stride_vh,  #
                stride_ob, stride_os, stride_oh,  #
                nheads, group, seqlen_q, seqlen_k, head_dim, qk_scale, init,  #
                CAUSAL: tl.constexpr,  #
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,  #
                INTERPRETED: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr = False):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // nheads).to(tl.int64)
    off_h = (off_bh % nheads).to(tl.int64)
    off_hk = off_h // group  # query head h reads kv head h // group (GQA/MQA)

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    if TMA:
        # One descriptor per (batch, head): its bounds are the sequence and the head dim, so the copy
        # engine masks the tails. Needs 16-byte aligned bases and strides (the launcher checks).
        q_desc = tl.make_tensor_descriptor(Q + off_b * stride_qb + off_h * stride_qh, [seqlen_q, head_dim],
                                           [stride_qs, 1], [BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(K + off_b * stride_kb + off_hk * stride_kh, [seqlen_k, head_dim],
                                          [stride_ks, 1], [BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(V + off_b * stride_vb + off_hk * stride_vh, [seqlen_k, head_dim],
                                          [stride_vs, 1], [BLOCK_N, BLOCK_D])
        q = q_desc.load([start_m * BLOCK_M, 0])
    else:
        q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
        q = load_rows(q_ptrs, offs_m, seqlen_q, mask_d[None, :], ROWS_ALONG_0=True, MASK_ROWS=True, EVEN_D=EVEN_D)
        # k is read transposed: a [BLOCK_D, BLOCK_N] tile
        k_src = K + off_b * stride_kb + off_hk * stride_kh + offs_n[None, :] * stride_ks + offs_d[:, None]
        v_src = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + init
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    diag = seqlen_k - seqlen_q  # bottom-right alignment: row i sees keys j <= i + diag  [mutant site: causal-diagonal]
    full, hi = key_ranges(start_m, seqlen_k, diag, CAUSAL, BLOCK_M, BLOCK_N)
    # key tiles every row sees whole, then the diagonal tiles and the seqlen_k tail, masked
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_vs,  #
                               0, full, offs_m, offs_n, mask_d[:, None], mask_d[None, :], seqlen_k, diag, qk_scale,
                               MASK=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D,  #
                               INTERPRETED=INTERPRETED, IEEE=IEEE, TMA=TMA)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_vs,  #
                               full, hi, offs_m, offs_n, mask_d[:, None], mask_d[None, :], seqlen_k, diag, qk_scale,
                               MASK=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, EVEN_D=EVEN_D,  #
                               INTERPRETED=INTERPRETED, IEEE=IEEE, TMA=TMA)

    # out = acc / l, lse = ln 2 * (m c + log2 l); a row that saw no key (l == 0) gives 0 and -inf
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]  # [mutant site: final-division]
    log2l = tl.math.log2(tl.where(seen, l_i, 1.0))
    lse = tl.where(seen, (m_i * qk_scale + log2l) * LN2, float("-inf"))  # [mutant site: lse]
    # For the backward, m (raw) and log2 l kept apart: P = exp2((s - m) c - log2 l) needs no difference
    # of huge numbers, where exp2(s c - lse log2 e) loses everything at logits of 1e9 (lse's ulp is
    # thousands there). A row that saw no key keeps m = 0, log2 l = +inf: its P is exactly 0.
    rows = off_bh.to(tl.int64) * seqlen_q + offs_m
    tl.store(Rowmax + rows, tl.where(seen, m_i, 0.0), mask=offs_m < seqlen_q)
    tl.store(Log2l + rows, tl.where(seen, log2l, float("inf")), mask=offs_m < seqlen_q)
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    if TMA:
        o_desc = tl.make_tensor_descriptor(Out + off_b * stride_ob + off_h * stride_oh, [seqlen_q, head_dim],
                                           [stride_os, 1], [BLOCK_M, BLOCK_D])
        o_desc.store([start_m * BLOCK_M, 0], cast(out, Out.dtype.element_ty, INTERPRETED))
    elif EVEN_D:
        tl.store(o_ptrs, cast(out, Out.dtype.element_ty, INTERPRETED), mask=offs_m[:, None] < seqlen_q)
    else:
        tl.store(o_ptrs, cast(out, Out.dtype.element_ty, INTERPRETED), mask=(offs_m[:, None] < seqlen_q) & mask_d[None,
                                                                                                                  :])
    tl.store(Lse + rows, lse, mask=offs_m < seqlen_q)


_fwd_kernel = triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "head_dim", "nheads", "group"])(_fwd)
_fwd_kernel_generic = triton.jit(do_not_specialize=generic_args(_fwd))(_fwd)
