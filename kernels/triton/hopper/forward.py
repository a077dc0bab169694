"""Flash forward for Hopper (sm_90) in Gluon: warp-specialized, in FlashAttention-3's structure.

The Triton forward (dense/forward.py) keeps one warpgroup per block, and Triton 3.6 waits for each q k^T right
after issuing it: the tensor cores idle while the softmax runs. Here the roles get warps of their own:
    producer   (1 warp):   TMA loads: q once per block, then k and v tiles into a ring of STAGES buffers
    consumer c (4 warps):  query rows [64 c, 64 c + 64) of the block, over the same key tiles:
                           s = q k^T, online softmax, acc += p v
Two consumers at head dim 128 (block_m 128), three at 64 (block_m 192; configs.HOPPER says why). Within a consumer,
the softmax of key tile j runs while the tensor cores do p_{j-1} v_{j-1} (FlashAttention-3's intra-warpgroup
overlap); across consumers, the warp schedulers interleave one's softmax with another's wgmmas. A k (v) stage is
free again when every consumer has arrived on its `empty` barrier: k right after its q k^T, v after its p v. With
the causal mask, a consumer skips the key tiles past its own last row's diagonal (it only frees their stages); a
consumer whose rows all lie past seqlen_q skips every tile.

q, k, v and out come as descriptors made on the host over their [b, s, h, d] tensors (boxes of one head), so no
block spends its start making four on the device. Blocks follow _schedule: heads in groups of HEAD_GROUP (their
key/value tiles stay in L2), causal blocks longest first. A program can run several blocks in turn (persistent: the
next block's q and first key tiles load while this one's epilogue runs; the ring's position and the barrier phases
carry over); the launcher gives each block its own program, which measured faster (grid).

The numerics are the Triton forward's, line for line (dense/forward.py's docstring says why): raw logits, the
running max in raw units, p = exp2((s - m') * c) with the -inf guard, l summed from the fp32 p, P rounded to the
input dtype as the matmul operand, the same outputs (out, lse, row max, log2 l) and the same convention for rows
that see no key. Masks: key tiles at or past `full` (the causal diagonal and the seqlen_k tail) are masked; the
descriptors' bounds make the copy engine zero-fill everything past seqlen_q, seqlen_k and head_dim. A skipped tile
is one whose every logit the mask would make -inf: the result has the same bits.

Applies to 16-bit inputs on sm_90 with 16-byte aligned strides and padded head dim 64 or 128 (interface._use_hopper,
configs.hopper_forward). Gluon does not run under the interpreter: the CPU never takes this path; the GPU tests, the
fuzz run and the mutants of kernels/mutants check it there, and CI compiles it for sm_90 (build/aot.py).

Tried on the H200 and not kept, with the numbers: docs/measurements.md, "Forward".
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from faverify.kernels.triton.common import LN2
from faverify.kernels.triton.hopper.layouts import (
    HALF,
    PRODUCER_REGS,
    _box,
    _mma_layout,
    _schedule,
    _smem_layout,
    tanh_approx,
)


@gluon.jit
def _key_tiles(row0, seqlen_k, diag, left, right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """(lo, full_lo, full_hi, hi) in key tiles for the query rows [row0, row0 + BLOCK_M) (a block's, or one
    consumer's): tiles [full_lo, full_hi) are seen whole by every row; [lo, full_lo) and [full_hi, hi) are
    masked; the rest are skipped. Without WINDOW, lo = full_lo = 0 and causal skips the tiles past the
    diagonal (common.key_ranges, in tiles); with it, the window [i + diag - left, i + diag + right] of
    variant.forward.visible_tiles bounds both ends (causal is right = 0 there)."""
    if WINDOW:
        lo = gl.maximum(row0 + diag - left, 0) // BLOCK_N  # [mutant site: window-lo]
        end = gl.maximum(gl.minimum(row0 + BLOCK_M + diag + right, seqlen_k), lo * BLOCK_N)
        hi = (end + BLOCK_N - 1) // BLOCK_N
        # every row sees keys from its last row's lower bound up to its first row's upper bound
        full_lo = (gl.maximum(row0 + BLOCK_M - 1 + diag - left, 0) + BLOCK_N - 1) // BLOCK_N
        full_lo = gl.minimum(gl.maximum(full_lo, lo), hi)
        full_hi = gl.minimum(row0 + diag + right + 1, seqlen_k) // BLOCK_N
        full_hi = gl.maximum(gl.minimum(full_hi, hi), full_lo)
        return lo, full_lo, full_hi, hi
    else:
        if CAUSAL:
            full = gl.minimum(gl.maximum(row0 + diag + 1, 0), seqlen_k)
            hi = gl.minimum(gl.maximum(row0 + BLOCK_M + diag, 0), seqlen_k)
        else:
            full = seqlen_k
            hi = seqlen_k
        n_full = full // BLOCK_N  # [mutant site: full-tiles]
        return 0, 0, n_full, (hi + BLOCK_N - 1) // BLOCK_N  # [mutant site: key-tiles-end]


@gluon.jit
def _producer(load, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr, GROUP: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    q_desc, k_desc, v_desc, smem, bars, seqlen_k, diag, left, right, nheads, group, n_m, n_bh = load
    q_smem, k_smem, v_smem, o_smem = smem
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    it = 0  # key tiles loaded so far, over all of this program's query blocks: the ring's position
    done = 0  # query blocks so far
    for t in range(gl.program_id(0), n_m * n_bh, gl.num_programs(0)):
        mb, bh = _schedule(t, n_m, n_bh, GROUP, CAUSAL)
        off_b = bh // nheads
        off_h = bh % nheads
        row0 = mb * BLOCK_M
        lo, _, _, hi = _key_tiles(row0, seqlen_k, diag, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        # q of this block goes where the last block's was, once every consumer is past its last q k^T
        # (a fresh barrier counts as having completed phase 1: the first wait passes)
        mbarrier.wait(q_empty, (done & 1) ^ 1)
        mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
        for i in gl.static_range(CONSUMERS):
            tma.async_copy_global_to_shared(q_desc, [off_b, row0 + i * HALF, off_h, 0], q_ready,
                                            _box(q_smem.index(i), HALF, BLOCK_D))
        for j in range(lo, hi):
            stage = it % STAGES
            empty_phase = ((it // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(stage), empty_phase)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [off_b, j * BLOCK_N, off_h // group, 0], k_ready.index(stage),
                                            _box(k_smem.index(stage), BLOCK_N, BLOCK_D))
            mbarrier.wait(v_empty.index(stage), empty_phase)
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [off_b, j * BLOCK_N, off_h // group, 0], v_ready.index(stage),
                                            _box(v_smem.index(stage), BLOCK_N, BLOCK_D))
            it += 1
        done += 1


@gluon.jit
def _softmax(s, m_i, l_i, j, full_lo, full_hi, first, offs_m, offs_n, seqlen_k, diag, left, right, qk_scale, cap_scale,
             inv_cap_scale, slope, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr,
             SOFTCAP: gl.constexpr, ALIBI: gl.constexpr):
    """One key tile j of the online softmax, dense/forward.py's numerics (with variant.forward.variant_scores'
    softcap, ALiBi and window): returns p, alpha, l and the new max. first: the consumer's first row."""
    if SOFTCAP:  # in raw units, as variant_scores: (cap / scale) tanh(s scale / cap)
        s = tanh_approx(s * cap_scale) * inv_cap_scale  # [mutant site: softcap]
    if ALIBI:  # - (slope / scale) |i + diag - j|, split as variant.forward.alibi_split splits it
        pos = offs_m + diag  # each query's position: its distances are to it  [mutant site: hopper-alibi]
        k0 = j * BLOCK_N
        row = gl.zeros_like(m_i)
        if CAUSAL:  # every visible key at or before its row's position: a column and a row term
            s = s + slope * offs_n.to(gl.float32)[None, :]
            row = slope * (k0 - pos).to(gl.float32)
        else:
            below = (k0 + BLOCK_N - 1 <= first + diag) | (right <= 0)
            above = (k0 >= first + HALF - 1 + diag) | (left <= 0)
            if below | above:
                signed = slope * (2.0 * below.to(gl.float32) - 1.0)
                s = s + signed * offs_n.to(gl.float32)[None, :]
                row = signed * (k0 - pos).to(gl.float32)
            else:  # the tile crosses the diagonal: the distance, positions converted per row and per column
                s = s - slope * gl.abs(pos.to(gl.float32)[:, None] - (k0 + offs_n).to(gl.float32)[None, :])
    if WINDOW:
        if (j < full_lo) | (j >= full_hi):  # tiles that cross a window bound or hold the seqlen_k tail
            cols = j * BLOCK_N + offs_n
            lower = offs_m[:, None] + diag - left
            keep = (cols[None, :] < seqlen_k) & (cols[None, :] >= lower)  # [mutant site: window-left]
            keep = keep & (cols[None, :] <= offs_m[:, None] + diag + right)
            s = gl.where(keep, s, float("-inf"))
    elif j >= full_hi:  # the diagonal and the seqlen_k tail (TMA filled keys past seqlen_k with zeros)
        cols = j * BLOCK_N + offs_n
        keep = cols[None, :] < seqlen_k
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
        s = gl.where(keep, s, float("-inf"))
    if ALIBI:  # the tile's logits are s + row: the max and p take the row term
        m_new = gl.maximum(m_i, gl.max(s, 1) + row)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2((s - (m_use - row)[:, None]) * qk_scale)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # as in dense/forward.py  [mutant site: neg-inf-guard]
        p = gl.exp2((s - m_use[:, None]) * qk_scale)
    alpha = gl.exp2((m_i - m_use) * qk_scale)
    return p, alpha, l_i * alpha + gl.sum(p, 1), m_new


@gluon.jit
def _release(k_ready, k_empty, v_ready, v_empty, it, STAGES: gl.constexpr):
    """Free the ring's stage of key tile `it` (the ring's position) without reading it: once loaded, so
    that the arrive counts toward that load's phase."""
    stage = it % STAGES
    mbarrier.wait(k_ready.index(stage), (it // STAGES) & 1)
    mbarrier.arrive(k_empty.index(stage), count=1)
    mbarrier.wait(v_ready.index(stage), (it // STAGES) & 1)
    mbarrier.arrive(v_empty.index(stage), count=1)


@gluon.jit
def _write_rows(acc, l_i, m_i, bh, offs_m, first, seqlen_q, nheads, qk_scale, Sinks, Rowmax, Log2l, Lse, o, o_desc,
                o_rows: gl.constexpr, dtype: gl.constexpr, BLOCK_D: gl.constexpr, SINKS: gl.constexpr):
    """A consumer's rows done: lse and the backward's row statistics stored, out normalized and stored."""
    seen = l_i > 0.0
    if SINKS:  # the sink z enters the normalization, as variant.forward._fwd's ending, in raw units
        m_raw = gl.where(seen, m_i, float("-inf"))
        z_raw = gl.load(Sinks + bh % nheads)
        top = gl.maximum(m_raw, z_raw)
        top = gl.where(top == float("-inf"), 0.0, top)
        to_top = gl.exp2((m_raw - top) * qk_scale)
        total = gl.where(seen, l_i * to_top, 0.0) + gl.exp2((z_raw - top) * qk_scale)  # [mutant site: hopper-sink]
        some = total > 0.0
        log2_total = gl.log2(gl.where(some, total, 1.0))
        lse = gl.where(some, (top * qk_scale + log2_total) * LN2, float("-inf"))
        log2l = log2_total + (top - m_raw) * qk_scale
        scale_rows = to_top / gl.where(some, total, 1.0)
    else:
        log2l = gl.log2(gl.where(seen, l_i, 1.0))
        lse = gl.where(seen, (m_i * qk_scale + log2l) * LN2, float("-inf"))
    rows = bh.to(gl.int64) * seqlen_q + offs_m
    in_q = offs_m < seqlen_q
    gl.store(Rowmax + rows, gl.where(seen, m_i, 0.0), mask=in_q)
    gl.store(Log2l + rows, gl.where(seen, log2l, float("inf")), mask=in_q)
    gl.store(Lse + rows, lse, mask=in_q)
    if SINKS:
        out = acc * gl.convert_layout(scale_rows, o_rows)[:, None]
    else:
        out = acc / gl.convert_layout(gl.where(seen, l_i, 1.0), o_rows)[:, None]
    # out stages through shared memory for the TMA store, which clips at the bounds; the store of the
    # last block may still be reading it, and runs while this block computed
    tma.store_wait(pendings=0)
    o.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [bh // nheads, first, bh % nheads, 0], _box(o, HALF, BLOCK_D))


# kernel body: a consumer's loop holds its accumulators in registers across the key tiles; split, they
# would pass through a call's arguments (test_sizes allows a kernel body 120 lines)
@gluon.jit
def _consumer(run, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
              CONSUMERS: gl.constexpr, GROUP: gl.constexpr, WHICH: gl.constexpr, WINDOW: gl.constexpr,
              SOFTCAP: gl.constexpr, ALIBI: gl.constexpr, SINKS: gl.constexpr):
    smem, bars, o_desc, Lse, Rowmax, Log2l, seqlen_q, seqlen_k, diag, nheads, n_m, n_bh, qk_scale, init, \
        left, right, cap_scale, inv_cap_scale, Alibi, Sinks, stride_ab, bias_unit = run
    q_smem, k_smem, v_smem, o_smem = smem
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    dtype: gl.constexpr = q_smem.dtype
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, dtype)
    o_layout: gl.constexpr = _mma_layout(BLOCK_D, dtype)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=32 // dtype.primitive_bitwidth)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    q = q_smem.index(WHICH)
    o = o_smem.index(WHICH)

    it = 0  # the ring's position, as the producer's
    done = 0
    for t in range(gl.program_id(0), n_m * n_bh, gl.num_programs(0)):
        mb, bh = _schedule(t, n_m, n_bh, GROUP, CAUSAL)
        row0 = mb * BLOCK_M
        lo, _, _, hi = _key_tiles(row0, seqlen_k, diag, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        n_blocks = hi - lo  # the tiles the block loads
        first = row0 + WHICH * HALF  # [mutant site: consumer-rows]
        # this consumer's rows see fewer with the causal mask: tiles past its last row's diagonal are masked
        # for all of them, and skipped; its first row's diagonal ends the tiles it sees whole (full_hi), one
        # tile later than the block's first row's for the third consumer. A window also bounds them below:
        # the tiles before its first row's lower bound are skipped too. Its own tiles are [lo + skip,
        # lo + skip + n_mine) of the block's, clamped into them.
        mine_lo, full_lo, full_hi, mine_hi = _key_tiles(first, seqlen_k, diag, left, right, HALF, BLOCK_N, CAUSAL,
                                                        WINDOW)
        skip = 0
        if WINDOW:
            mine_lo = gl.minimum(gl.maximum(mine_lo, lo), hi)
            mine_hi = gl.minimum(gl.maximum(mine_hi, mine_lo), hi)
            skip = mine_lo - lo
        n_mine = mine_hi - mine_lo
        # a consumer whose rows all lie past seqlen_q (in the last query block) computes nothing: its tiles
        # are skipped too, which leaves the SM's tensor cores to the consumers with rows
        n_mine = gl.where(first < seqlen_q, n_mine, 0)  # [mutant site: idle-consumer]
        slope = 0.0
        if ALIBI:  # the head's slope in raw units (variant.args.KernelVariant.runtime's bias_unit: 1 / scale)
            slope = gl.load(Alibi + (bh // nheads) * stride_ab + bh % nheads) * bias_unit
        offs_m = first + gl.arange(0, HALF, layout=s_rows)
        m_i = gl.zeros([HALF], gl.float32, s_rows) + init
        l_i = gl.zeros([HALF], gl.float32, s_rows)
        acc = gl.zeros([HALF, BLOCK_D], gl.float32, o_layout)

        mbarrier.wait(q_ready, done & 1)
        if WINDOW:  # the tiles before this consumer's window: freed once loaded, as the skipped ones below
            for j in range(0, skip):
                _release(k_ready, k_empty, v_ready, v_empty, it + j, STAGES)
            it += skip
        # FlashAttention-3's intra-warpgroup overlap: the softmax of key tile j runs on the CUDA cores while
        # the tensor cores do p_{j-1} v_{j-1}; acc is rescaled once that product is in (it then holds the
        # tiles before j at the max of tile j). The other consumers' wgmmas fill the gaps that remain.
        if n_mine > 0:
            stage = it % STAGES
            mbarrier.wait(k_ready.index(stage), (it // STAGES) & 1)
            s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(k_empty.index(stage), count=1)
            p, alpha, l_i, m_i = _softmax(s, m_i, l_i, mine_lo, full_lo, full_hi, first, offs_m, offs_n, seqlen_k, diag,
                                          left, right, qk_scale, cap_scale, inv_cap_scale, slope, CAUSAL, BLOCK_N,
                                          WINDOW, SOFTCAP, ALIBI)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, n_mine):
                stage = (it + j) % STAGES
                prev = (it + j - 1) % STAGES
                mbarrier.wait(k_ready.index(stage), ((it + j) // STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
                s = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # q k^T in; p v may still run
                mbarrier.arrive(k_empty.index(stage), count=1)
                p, alpha, l_i, m_i = _softmax(s, m_i, l_i, mine_lo + j, full_lo, full_hi, first, offs_m, offs_n,
                                              seqlen_k, diag, left, right, qk_scale, cap_scale, inv_cap_scale, slope,
                                              CAUSAL, BLOCK_N, WINDOW, SOFTCAP, ALIBI)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                mbarrier.arrive(v_empty.index(prev), count=1)
                acc = acc * gl.convert_layout(alpha, o_rows)[:, None]  # [mutant site: rescale]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            last = (it + n_mine - 1) % STAGES
            mbarrier.wait(v_ready.index(last), ((it + n_mine - 1) // STAGES) & 1)
            acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(last), count=1)
        # the skipped tiles: the stages are freed as the other consumers' are, once loaded (so that each
        # arrive counts toward that load's phase)
        for j in range(n_mine, n_blocks - skip):
            _release(k_ready, k_empty, v_ready, v_empty, it + j, STAGES)
        mbarrier.arrive(q_empty, count=1)  # this block's q is read by no wgmma any more: the next one may load
        it += n_blocks - skip
        done += 1

        _write_rows(acc, l_i, m_i, bh, offs_m, first, seqlen_q, nheads, qk_scale, Sinks, Rowmax, Log2l, Lse, o,
                    o_desc, o_rows, dtype, BLOCK_D, SINKS)
    tma.store_wait(pendings=0)


def _fwd_source(q_desc, k_desc, v_desc, o_desc, Lse, Rowmax, Log2l, Alibi, Sinks,  #
                n_bh, nheads, group, seqlen_q, seqlen_k, qk_scale, init, left, right, cap_scale, inv_cap_scale,  #
                stride_ab, bias_unit,  # ALiBi slopes' batch stride (0: per head), and 1 / scale
                CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
                CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, GROUP: gl.constexpr,
                WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = False, ALIBI: gl.constexpr = False,
                SINKS: gl.constexpr = False):
    """q, k, v, out through host-made descriptors of their [b, s, h, d] tensors (boxes [1, rows, 1, BLOCK_D],
    zero-filled past seqlen and head_dim). Persistent: program p runs query blocks p, p + grid, ... of the
    launch's _schedule, so the next block's q and first key tiles load while this one's epilogue runs."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_M: gl.constexpr = CONSUMERS * HALF
    layout: gl.constexpr = _smem_layout(HALF, BLOCK_D, dtype)  # each consumer's q and out
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], layout)
    o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], layout)
    kv_layout: gl.constexpr = _smem_layout(BLOCK_N, BLOCK_D, dtype)  # the ring's k and v tiles
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=CONSUMERS)  # one arrive per consumer
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    smem = (q_smem, k_smem, v_smem, o_smem)
    bars = (q_ready, q_empty, k_ready, v_ready, k_empty, v_empty)
    n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
    diag = seqlen_k - seqlen_q  # [mutant site: causal-diagonal]

    # the default partition (num_warps = 4) is consumer 0; workers: the other consumers, then the producer
    run = (smem, bars, o_desc, Lse, Rowmax, Log2l, seqlen_q, seqlen_k, diag, nheads, n_m, n_bh, qk_scale, init,
           left, right, cap_scale, inv_cap_scale, Alibi, Sinks, stride_ab, bias_unit)
    load = (q_desc, k_desc, v_desc, smem, bars, seqlen_k, diag, left, right, nheads, group, n_m, n_bh)
    # (tuples in variables: constexprs stay out of them, Gluon 3.6 would make them tensors)
    if CONSUMERS == 2:
        gl.warp_specialize([(_consumer, (run, CAUSAL, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, 0, WINDOW, SOFTCAP,
                                        ALIBI, SINKS)),
                            (_consumer, (run, CAUSAL, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, 1, WINDOW, SOFTCAP,
                                        ALIBI, SINKS)),
                            (_producer, (load, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, CAUSAL, WINDOW))],
                           [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer, (run, CAUSAL, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, 0, WINDOW, SOFTCAP,
                                        ALIBI, SINKS)),
                            (_consumer, (run, CAUSAL, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, 1, WINDOW, SOFTCAP,
                                        ALIBI, SINKS)),
                            (_consumer, (run, CAUSAL, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, 2, WINDOW, SOFTCAP,
                                        ALIBI, SINKS)),
                            (_producer, (load, BLOCK_N, BLOCK_D, STAGES, CONSUMERS, GROUP, CAUSAL, WINDOW))],
                           [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


# Two builds of one kernel, as dense/forward.py's fast and generic ones. Triton compiles a kernel again for each
# pattern of integer arguments equal to 1 or divisible by 16: up to 3^5 patterns of these five sizes per
# variant, which a fuzz run meets case after case, at seconds a compile (it halved the GPU fuzz rate).
# Leaving all five unspecialized cost 7-9% at d64 causal 4096 on the H200, all of it from the seqlens
# (`git show 0e6d4fa:devtools/hopper_specialize.py`, 2026-11-30; docs/measurements.md). So seqlens both multiples of
# 16 take a build specialized on them (one pattern), any other pair the build specialized on nothing.
_HEADS = ["n_bh", "nheads", "group", "left", "right", "stride_ab", "Alibi", "Sinks"]  # and the window's
# bounds, the ALiBi slopes' batch stride and the slopes' and sinks' pointers: runtime values, as in variant/forward.py
ALIGNED = ("seqlen_q", "seqlen_k")  # the sizes _fwd_hopper_aligned is specialized on (build/aot.py declares them)
_fwd_hopper_aligned = gluon.jit(do_not_specialize=_HEADS)(_fwd_source)
_fwd_hopper = gluon.jit(do_not_specialize=_HEADS + list(ALIGNED))(_fwd_source)


def kernel(seqlen_q: int, seqlen_k: int):
    """The build a launch takes (the comment above)."""
    return _fwd_hopper_aligned if seqlen_q % 16 == 0 and seqlen_k % 16 == 0 else _fwd_hopper
