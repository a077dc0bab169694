"""dK and dV for Hopper (sm_90) in Gluon: warp-specialized, in FlashAttention-3's backward structure.

dense/backward.py's _bwd_dkdv keeps one warpgroup per key tile and waits on each wgmma. Here the roles get
warps of their own:
    producer   (1 warp):   TMA loads: the key tile's k and v once, then q and dO of each query tile that
                           sees it (every query head of its GQA group) into a ring of STAGES buffers
    consumer c (4 warps):  keys [64 c, 64 c + 64) of the tile, over the same query tiles:
                           S^T = k q^T, P^T, dV += P^T dO, dP^T = v dO^T, dS^T = P^T (dP^T - D), dK += dS^T q
Computing S^T and dP^T (keys along the rows) lets dV and dK take P^T and dS^T as the wgmma's A operand
straight from registers; dK and dV stay in registers until the end. A q/dO stage is free again when both
consumers have arrived on its `empty` barrier, after their dK wgmma.

The numerics are dense/backward.py's: P recomputed from the forward's row max and log2 l, P = exp2(min((s - m) c,
0) - log2 l) (0 on rows that saw no key: log2 l = +inf), dS = P (dP - D) clamped into fp16's range before
it is rounded (common.saturate), every sum fp32, dK scaled once at the end; no atomics, so the same bits on
every run. dQ is dense/backward.py's _bwd_dq, which reads the same rows (interface.backward); or, in the fast mode
(FUSED_DQ, Launch(deterministic=False)), each consumer's dS k added into an fp32 buffer by atomics (_add_dq),
whose order, and so dq's last bits, may vary from run to run.

Masks: the causal diagonal, on the query tiles that cross it (query tiles wholly before a consumer's keys
are skipped by it, their stages freed). Keys past seqlen_k are zero-filled by the copy engine: their own
rows of dK and dV are all they reach, and those are not stored; queries past seqlen_q read m = 0 and log2
l = +inf, so their P is 0.

Applies to 16-bit inputs on sm_90 with 16-byte aligned strides and padded head dim 64 or 128, dense
attention (no variant), and only when a Launch asks for it (hopper_backward=True): on the H200 it gives
the Triton dK/dV's bits at 0.93-1.10x its speed (docs/measurements.md), not yet the gain that would make it
the default; the fast mode has not run on a GPU. Gluon does not run under the interpreter; CI compiles both
modes for sm_90 (build/aot.py).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from faverify.kernels.triton.hopper.layouts import HALF, PRODUCER_REGS, _box, _mma_layout, _smem_layout, box_layout

# globals a kernel reads must be constexpr
BLOCK_M = gl.constexpr(64)  # query rows a stage: one wgmma N for S^T and dP^T, one K for dV and dK
CONSUMERS = gl.constexpr(2)  # key rows 2 x 64 a program
STAGES = gl.constexpr(2)
# one block per SM: 3 warpgroups x 128 threads x 168 registers <= 64K; setmaxnreg gives the producer 24
# and each consumer (3 x 168 - 24) / 2 = 240: dK and dV (2 x 64 x BLOCK_D fp32 over 128 threads, 128
# registers at d128), S^T and dP^T (2 x 32), P^T and dS^T as operands (2 x 16)
MAXNREG = 168
CONSUMER_REGS = gl.constexpr(240)
# dQ's columns a wgmma of the fused dQ (FUSED_DQ) computes: its fp32 accumulator, BLOCK_M x DQ_COLS over a
# warpgroup, is 32 registers beside dK's and dV's 128 at d128 (a whole d128 row would be 64 and spill)
DQ_COLS = gl.constexpr(64)


def box_rows() -> tuple:
    """Rows of the q, k, v and dO boxes: a stage's BLOCK_M queries, a consumer's HALF keys."""
    return BLOCK_M.value, HALF.value, HALF.value, BLOCK_M.value


def descriptors(q, k, v, dout, block_d: int) -> tuple:
    """Host-made TMA descriptors of q, k, v and dO ([b, s, h, d] with their own strides), boxes of one head's
    box_rows by block_d, zero-filled past each dimension's end."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dtype = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16}[str(q.dtype)]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, block_d],
                                  box_layout(rows, block_d, dtype))
                 for t, rows in zip((q, k, v, dout), box_rows()))


def dq_buffer(q, block_d: int):
    """The fused dQ's fp32 accumulator of q ([b, s, h, d]), [b, h, s, block_d] zeros: the kernel adds each
    key tile's share into it (FUSED_DQ); 4 bytes a padded element, O(seqlen) like dQ itself."""
    import torch
    b, s, h, _ = q.shape
    return torch.zeros((b, h, s, block_d), dtype=torch.float32, device=q.device)


def finish_dq(total, dq, softmax_scale: float):
    """dQ from the fused accumulator: scaled once, as the unfused _bwd_dq scales its sum, rounded into dq
    ([b, s, h, d], the input dtype) and returned."""
    return dq.copy_((total[..., :dq.shape[-1]] * softmax_scale).transpose(1, 2))


def grid(seqlen_k: int, batch: int, nheads_k: int) -> tuple:
    """One program per key tile of CONSUMERS x HALF keys, per batch and kv head."""
    return (-(-seqlen_k // (CONSUMERS.value * HALF.value)), batch * nheads_k)


@gluon.jit
def _query_tiles(key0, seqlen_q, diag, CAUSAL: gl.constexpr):
    """The query tiles [lo, hi) that see some key at or after key0: causal rows i see keys j <= i + diag."""
    lo = 0
    if CAUSAL:
        lo = gl.maximum(key0 - diag, 0) // BLOCK_M
    return lo, (seqlen_q + BLOCK_M - 1) // BLOCK_M


@gluon.jit
def _producer(load, BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr):
    q_desc, k_desc, v_desc, do_desc, smem, bars, seqlen_q, diag, nheads_k, group = load
    q_smem, do_smem, k_smem, v_smem, _ = smem
    kv_ready, ready, empty = bars
    off_b = gl.program_id(1) // nheads_k
    off_hk = gl.program_id(1) % nheads_k
    key0 = gl.program_id(0) * (CONSUMERS * HALF)
    mbarrier.expect(kv_ready, CONSUMERS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(k_desc, [off_b, key0 + c * HALF, off_hk, 0], kv_ready,
                                        _box(k_smem.index(c), HALF, BLOCK_D))
        tma.async_copy_global_to_shared(v_desc, [off_b, key0 + c * HALF, off_hk, 0], kv_ready,
                                        _box(v_smem.index(c), HALF, BLOCK_D))
    _load_queries(q_desc, do_desc, q_smem, do_smem, ready, empty, off_b, off_hk, key0, seqlen_q, diag, group,
                  BLOCK_D, CAUSAL)


@gluon.jit
def _load_queries(q_desc, do_desc, q_smem, do_smem, ready, empty, off_b, off_hk, key0, seqlen_q, diag, group,
                  BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr):
    """The producer's ring: q and dO of each query tile that sees the key tile at key0, every query head of
    the kv head's group in turn, into STAGES stages as the consumers free them."""
    lo, hi = _query_tiles(key0, seqlen_q, diag, CAUSAL)
    it = 0  # the ring's position
    for g in range(0, group):
        off_h = off_hk * group + g
        for m in range(lo, hi):
            stage = it % STAGES
            # a fresh barrier passes the first wait
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)  # [mutant site: bwd-stage-free]
            mbarrier.expect(ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [off_b, m * BLOCK_M, off_h, 0], ready.index(stage),
                                            _box(q_smem.index(stage), BLOCK_M, BLOCK_D))
            tma.async_copy_global_to_shared(do_desc, [off_b, m * BLOCK_M, off_h, 0], ready.index(stage),
                                            _box(do_smem.index(stage), BLOCK_M, BLOCK_D))
            it += 1


@gluon.jit
def _consumer(run, BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr, WHICH: gl.constexpr, FUSED_DQ: gl.constexpr):
    smem, bars, DK, DV, DQsum, Rowmax, Log2l, Delta, stride_kb, stride_ks, stride_kh, seqlen_q, seqlen_k, diag, \
        nheads_k, group, head_dim, softmax_scale, qk_scale = run
    q_smem, do_smem, k_smem, v_smem, ds_smem = smem
    kv_ready, ready, empty = bars
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(BLOCK_M, dtype)  # S^T, dP^T: [HALF keys, BLOCK_M queries]
    o_layout: gl.constexpr = _mma_layout(BLOCK_D, dtype)  # dK, dV: [HALF keys, BLOCK_D]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=32 // dtype.primitive_bitwidth)
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)  # a query per column
    off_b = gl.program_id(1) // nheads_k
    off_hk = gl.program_id(1) % nheads_k
    key0 = gl.program_id(0) * (CONSUMERS * HALF)
    first = key0 + WHICH * HALF  # this consumer's first key
    keys = first + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    offs_q = gl.arange(0, BLOCK_M, layout=cols)
    s_zero = gl.zeros([HALF, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([HALF, BLOCK_D], gl.float32, o_layout)
    dv = gl.zeros([HALF, BLOCK_D], gl.float32, o_layout)
    k = k_smem.index(WHICH)
    v = v_smem.index(WHICH)
    lo, hi = _query_tiles(key0, seqlen_q, diag, CAUSAL)
    mine, _ = _query_tiles(first, seqlen_q, diag, CAUSAL)  # before it every row is masked for these keys
    mbarrier.wait(kv_ready, 0)
    it = 0
    for g in range(0, group):
        row = (off_b * nheads_k * group + off_hk * group + g).to(gl.int64) * seqlen_q
        for m in range(lo, hi):
            stage = it % STAGES
            mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
            if m >= mine:
                q = q_smem.index(stage)
                do = do_smem.index(stage)
                queries = m * BLOCK_M + offs_q
                in_q = queries < seqlen_q
                rowmax = gl.load(Rowmax + row + queries, mask=in_q, other=0.0)
                log2l = gl.load(Log2l + row + queries, mask=in_q, other=float("inf"))
                delta = gl.load(Delta + row + queries, mask=in_q, other=0.0)
                sT = warpgroup_mma(k, q.permute((1, 0)), s_zero, use_acc=False)
                if CAUSAL:  # a tile that crosses this consumer's diagonal: keys j see rows i >= j - diag
                    if m * BLOCK_M + diag < first + HALF - 1:
                        keep = keys[:, None] <= queries[None, :] + diag
                        sT = gl.where(keep, sT, float("-inf"))
                pT = gl.exp2(gl.minimum((sT - rowmax[None, :]) * qk_scale, 0.0) - log2l[None, :])
                dv = warpgroup_mma(gl.convert_layout(pT.to(dtype), a_layout), do, dv)
                dpT = warpgroup_mma(v, do.permute((1, 0)), s_zero, use_acc=False)
                dsT = pT * (dpT - delta[None, :])
                if dtype == gl.float16:  # common.saturate: an fp16 operand past 65504 would be inf
                    dsT = gl.minimum(gl.maximum(dsT, -65504.0), 65504.0)
                dsT = dsT.to(dtype)
                dk = warpgroup_mma(gl.convert_layout(dsT, a_layout), q, dk)
                if FUSED_DQ:
                    _add_dq(DQsum, dsT, ds_smem.index(WHICH), k, row, m * BLOCK_M, seqlen_q, BLOCK_D)
            mbarrier.arrive(empty.index(stage), count=1)
            it += 1
    dk = dk * softmax_scale  # [mutant site: bwd-dk-scale]
    rows_o = first + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))
    cols_o = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, o_layout))
    offs = off_b.to(gl.int64) * stride_kb + rows_o[:, None].to(gl.int64) * stride_ks + off_hk * stride_kh \
        + cols_o[None, :]
    ok = (rows_o[:, None] < seqlen_k) & (cols_o[None, :] < head_dim)
    gl.store(DK + offs, dk.to(dtype), mask=ok)
    gl.store(DV + offs, dv.to(dtype), mask=ok)


@gluon.jit
def _add_dq(DQsum, dsT, ds, k, row, query0, seqlen_q, BLOCK_D: gl.constexpr):
    """dQ's share of this consumer's keys, dS k (unscaled), added to the fp32 accumulator DQsum ([b, h, seqlen_q,
    BLOCK_D], rows from `row`) by atomics: dS^T goes through shared memory, where the wgmma reads it
    transposed as its A operand, and k is already there; DQ_COLS columns a wgmma keep its accumulator small."""
    dq_layout: gl.constexpr = _mma_layout(DQ_COLS, dsT.dtype)
    ds.store(dsT)
    fence_async_shared()  # the wgmma reads through the async proxy what the threads wrote  [mutant site: bwd-ds-fence]
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    cols = gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))
    in_q = query0 + rows < seqlen_q  # [mutant site: bwd-dq-rows]
    tile = DQsum + (row + query0) * BLOCK_D  # one 64-bit base; 32-bit offsets within the tile
    offs = rows[:, None] * BLOCK_D + cols[None, :]
    zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout)
    for part in gl.static_range(BLOCK_D // DQ_COLS):
        dq = warpgroup_mma(ds.permute((1, 0)), k.slice(part * DQ_COLS, DQ_COLS, dim=1), zero, use_acc=False)
        gl.atomic_add(tile + part * DQ_COLS + offs, dq, mask=in_q[:, None], sem="relaxed")


@gluon.jit
def _ring_tiles(dtype: gl.constexpr, BLOCK_D: gl.constexpr):
    """The ring the producer fills (_load_queries): STAGES q and dO tiles."""
    q_layout: gl.constexpr = _smem_layout(BLOCK_M, BLOCK_D, dtype)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_D], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_D], q_layout)
    return q_smem, do_smem


@gluon.jit
def _ring_barriers():
    """The producer's barriers, initialized: k and v loaded; a stage loaded (ready); a stage read by every
    consumer (empty)."""
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)  # one arrive per consumer
    return kv_ready, ready, empty


def _dkdv_source(q_desc, k_desc, v_desc, do_desc, DK, DV, DQsum, Rowmax, Log2l, Delta,  #
                 stride_kb, stride_ks, stride_kh,  # dK's and dV's (allocated alike)
                 seqlen_q, seqlen_k, nheads_k, group, head_dim, softmax_scale, qk_scale,  #
                 CAUSAL: gl.constexpr, BLOCK_D: gl.constexpr, FUSED_DQ: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem, do_smem = _ring_tiles(dtype, BLOCK_D)
    kv_layout: gl.constexpr = _smem_layout(HALF, BLOCK_D, dtype)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], kv_layout)
    if FUSED_DQ:  # each consumer's dS^T, [HALF keys, BLOCK_M queries]
        ds_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_M], _smem_layout(HALF, BLOCK_M, dtype))
    else:
        ds_smem = k_smem  # not read
    kv_ready, ready, empty = _ring_barriers()
    smem = (q_smem, do_smem, k_smem, v_smem, ds_smem)
    bars = (kv_ready, ready, empty)
    diag = seqlen_k - seqlen_q
    run = (smem, bars, DK, DV, DQsum, Rowmax, Log2l, Delta, stride_kb, stride_ks, stride_kh, seqlen_q, seqlen_k, diag,
           nheads_k, group, head_dim, softmax_scale, qk_scale)
    load = (q_desc, k_desc, v_desc, do_desc, smem, bars, seqlen_q, diag, nheads_k, group)
    # the default partition (num_warps = 4) is consumer 0; workers: consumer 1, then the producer
    gl.warp_specialize([(_consumer, (run, BLOCK_D, CAUSAL, 0, FUSED_DQ)),
                        (_consumer, (run, BLOCK_D, CAUSAL, 1, FUSED_DQ)),
                        (_producer, (load, BLOCK_D, CAUSAL))],
                       [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# Sizes and strides stay unspecialized (as hopper/forward.py's generic build): one build per dtype, head dim
# and causal, whatever the shapes a fuzz draws
_SIZES = ["stride_kb", "stride_ks", "stride_kh", "seqlen_q", "seqlen_k", "nheads_k", "group", "head_dim"]
kernel = gluon.jit(do_not_specialize=_SIZES)(_dkdv_source)
OPTIONS = dict(num_warps=4, maxnreg=MAXNREG)
