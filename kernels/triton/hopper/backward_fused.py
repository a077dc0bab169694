"""The fused backward for Hopper (sm_90) in Gluon: dQ, dK and dV in one pass, five matmuls a tile pair.

hopper/backward.py computes dK and dV, and dQ in a second pass that recomputes S and dP (seven matmuls a
pair of tiles), or adds dQ by per-element atomics. Here a program owns a key tile of CONSUMERS x HALF keys,
as there, and each pair of it with a query tile of BLOCK_M rows takes five wgmmas a consumer:
    producer   (1 warp):   the key tile's k and v once, then q and dO of each query tile that sees it
                           (every query head of its GQA group) into a ring of STAGES (hopper/backward.py's)
    consumer c (4 warps):  keys [64 c, 64 c + 64): S = q k^T and dP = dO v^T issued back to back; P into
                           shared memory, dV += P^T dO; dS = P (dP - D) into shared memory, dK += dS^T q;
                           then dQ's columns [c DQ_COLS, (c + 1) DQ_COLS) = dS k over the tile's keys
                           (both consumers' dS), in fp32 into shared memory
    reducer    (1 warp):   each query tile's dQ (both consumers' columns) added into an fp32 buffer in
                           global memory by the copy engine's bulk tensor reduce (cp.reduce.async.bulk
                           .tensor .add.f32, hopper.layouts.reduce_add); at the end dK and dV stored by the copy
                           engine
S has the queries along its rows, so each thread holds two rows' statistics (S^T would spread 16 a thread,
and the d128 consumers spilled); P^T and dS^T reach the tensor cores from shared memory. dK and dV stay in
registers across the query tiles. k is one tile of the key tile's rows (k_layout): S reads a consumer's
rows of it, dQ a consumer's columns of every row. (Two tiles of 64 rows would not do: a tile wider than
its swizzle is stored a column span at a time, so the two tiles are not one [128, d] tile.)

Barriers, beside the ring's: ds_ready (a slot's dS of both consumers is in), dq_ready (both consumers' dQ
columns are in; one more phase at the end: their dK and dV), dq_empty (the reducer's reduce has read the dQ
tile). dS and P have DS_SLOTS slots each: a consumer writes a slot two tiles after both consumers' dQ
wgmmas read it, which its wait on dq_empty the tile before ensures. The dQ tile has one buffer a consumer
(the bytes of its dK/dV tile), written once the last reduce has read it.

The numerics are hopper/backward.py's: P from the forward's row max and log2 l, dS clamped into fp16's
range before it is rounded, every sum fp32, dK scaled once at the end; dK and dV are the same bits every
run. dQ is the fp32 sum of each key tile's share, added in an order that varies from run to run, then
scaled and rounded (finish_dq): its last bits may vary.

Masks: the causal diagonal on the query tiles that cross a consumer's keys. A consumer computes every query
tile of its program, masked ones too: the other consumer's dQ reads its dS, zeros there. The copy engine
zero-fills keys past seqlen_k (their dK and dV rows are clipped at the store; they reach dQ through their
zero rows of k) and queries past seqlen_q (which read log2 l = +inf: P = 0; the reduce clips their rows).

Applies where hopper/backward.py does (16-bit, sm_90, TMA-aligned, padded head dim 64 or 128, dense),
only when a Launch asks for it (fused_backward=True). Gluon does not run under the interpreter; CI compiles
it for sm_90 and reads its machine code (property_tests/test_fused_backward.py).
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

from faverify.kernels.triton.common import LOG2E
from faverify.kernels.triton.hopper.backward import (
    BLOCK_M,
    CONSUMERS,
    STAGES,
    _load_queries,
    _query_tiles,
    _ring_barriers,
    _ring_tiles,
    dq_buffer,
    finish_dq,
    grid,
)
from faverify.kernels.triton.hopper.backward import descriptors as _kv_descriptors
from faverify.kernels.triton.hopper.layouts import (
    HALF,
    PRODUCER_REGS,
    _box,
    _mma_layout,
    _smem_layout,
    reduce_add,
    registers,
)

# globals a kernel reads must be constexpr; BLOCK_M (query rows a tile), CONSUMERS (key rows CONSUMERS x
# HALF a program) and STAGES (q and dO) are hopper/backward.py's, whose producer loads the same tiles
DS_SLOTS = gl.constexpr(2)  # dS (and P) slots: a consumer writes one while the other's dQ may read the other
# one block per SM (hopper.layouts.registers): 168 a thread at launch (12 warps x 32 x 168 <= 64K), then 24 for the
# producer's and the reducer's warpgroup and 240 for each consumer: dK and dV (128 at d128), S and dP (32
# each, both in flight), then dQ's columns (32, in S's and dP's registers); what is left (48) holds the
# addresses, statistics and indices, with little to spare at d128 (test_fused_backward reads the spills)
MAXNREG, _CONSUMER_REGS = registers(2)
CONSUMER_REGS = gl.constexpr(_CONSUMER_REGS)
OPTIONS = dict(num_warps=4, maxnreg=MAXNREG)


def dq_cols(block_d: int) -> int:
    """dQ's columns a consumer computes: half of the padded head dim each."""
    return block_d // CONSUMERS.value


def descriptors(q, k, v, dout, dk, dv, total, block_d: int) -> tuple:
    """Host-made TMA descriptors: q, v, dO, dK and dV with boxes of 64 rows (hopper/backward.py's), k with
    boxes of the whole key tile (k_layout), and the fp32 dQ buffer (dq_buffer, [b, h, s, block_d]) seen as
    [b h, s, block_d], boxes of BLOCK_M rows by one consumer's columns."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    b, h, s, _ = total.shape
    flat = total.view(b * h, s, block_d)
    dtype = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16}[str(q.dtype)]
    keys = [1, CONSUMERS.value * HALF.value, 1, block_d]
    k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), keys, k_layout(block_d, dtype, 4))
    q_desc, _, v_desc, do_desc = _kv_descriptors(q, k, v, dout, block_d)
    dk_desc, dv_desc = _kv_descriptors(dk, dv, dk, dv, block_d)[:2]  # boxes of 64 rows, as q's and k's there
    return q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, TensorDescriptor(
        flat, list(flat.shape), list(flat.stride()), [1, BLOCK_M.value, dq_cols(block_d)], dq_box_layout())


@gluon.constexpr_function
def k_layout(block_d, dtype, rank):
    """The shared layout of the key tile's k, [CONSUMERS x HALF, block_d] (rank 2; rank 4: its box): swizzled
    in spans of one consumer's dQ columns, so that the column half dQ's wgmma reads starts a span (a
    128-byte span at d128, 64 bytes at d64). Each consumer's S reads its rows."""
    span = min(128, block_d // CONSUMERS.value * dtype.primitive_bitwidth // 8)
    return gl.NVMMASharedLayout(swizzle_byte_width=span, element_bitwidth=dtype.primitive_bitwidth, rank=rank)


@gluon.constexpr_function
def dq_box_layout():
    """The shared layout of dQ's fp32 tiles and of the buffer's boxes: no swizzle, so that a thread's
    stores take one address register and offsets (a swizzled tile kept four, and the d128 consumers
    spilled)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def run(q, k, v, dout, dq, dk, dv, rows: tuple, delta, scale: float, causal: bool, block_d: int):
    """Launch the fused kernel on a dense case (interface.backward checked it applies): dK and dV into dk
    and dv, dQ through the fp32 buffer into dq; returns (dq, dk, dv)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    total = dq_buffer(q, block_d)
    kernel[grid(sk, b, hk)](*descriptors(q, k, v, dout, dk, dv, total, block_d), *rows, delta, sq, sk, hk, h // hk,
                            scale, scale * LOG2E, CAUSAL=causal, BLOCK_D=block_d, **OPTIONS)
    return finish_dq(total, dq, scale), dk, dv


@gluon.jit
def _producer(load, BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr):
    """hopper/backward.py's producer but for k: the key tile's k in one box (k_layout), each consumer's v, then
    the ring of q and dO (_load_queries)."""
    q_desc, k_desc, v_desc, do_desc, smem, bars, seqlen_q, diag, nheads_k, group = load
    q_smem, do_smem, k_smem, v_smem = smem
    kv_ready, ready, empty = bars
    off_b = gl.program_id(1) // nheads_k
    off_hk = gl.program_id(1) % nheads_k
    key0 = gl.program_id(0) * (CONSUMERS * HALF)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + CONSUMERS * v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [off_b, key0, off_hk, 0], kv_ready,
                                    k_smem._reinterpret(k_smem.dtype, [1, CONSUMERS * HALF, 1, BLOCK_D],
                                                        k_desc.layout))
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(v_desc, [off_b, key0 + c * HALF, off_hk, 0], kv_ready,
                                        _box(v_smem.index(c), HALF, BLOCK_D))
    _load_queries(q_desc, do_desc, q_smem, do_smem, ready, empty, off_b, off_hk, key0, seqlen_q, diag, group,
                  BLOCK_D, CAUSAL)


@gluon.jit
def _reducer(red, BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr):
    dq_desc, dk_desc, dv_desc, o_smem, ds_smem, bars, seqlen_q, diag, nheads_k, group = red
    _, _, _, ds_ready, dq_ready, dq_empty = bars  # ds_ready: what the mutant fused-bwd-reduce-before-dq waits on
    cols: gl.constexpr = dq_desc.block_type.shape[2]
    off_b = gl.program_id(1) // nheads_k
    off_hk = gl.program_id(1) % nheads_k
    key0 = gl.program_id(0) * (CONSUMERS * HALF)
    lo, hi = _query_tiles(key0, seqlen_q, diag, CAUSAL)
    it = 0
    for g in range(0, group):
        bh = (off_b * nheads_k + off_hk) * group + g
        for m in range(lo, hi):
            mbarrier.wait(dq_ready, it & 1)  # both consumers' columns are in  [mutant site: fused-dq-ready]
            for c in gl.static_range(CONSUMERS):
                tile = o_smem.index(c)._reinterpret(gl.float32, [1, BLOCK_M, cols], dq_desc.layout)
                reduce_add(dq_desc, [bh, m * BLOCK_M, c * cols], tile)
            tma.store_wait(pendings=0)  # the copy engine has read the tile: the consumers may write it again
            mbarrier.arrive(dq_empty, count=1)
            it += 1
    # one more phase of the same barrier: each consumer's dV and dK rounded into shared memory (_consumer)
    mbarrier.wait(dq_ready, it & 1)
    for c in gl.static_range(CONSUMERS):
        coord = [off_b, key0 + c * HALF, off_hk, 0]  # clipped at seqlen_k and head_dim by the copy engine
        tma.async_copy_shared_to_global(dv_desc, coord, _box(o_smem.index(c), HALF, BLOCK_D))
        tma.async_copy_shared_to_global(dk_desc, coord, _box(ds_smem.index(c).slice(0, BLOCK_D, dim=1), HALF,
                                                             BLOCK_D))
    tma.store_wait(pendings=0)


@gluon.jit
def _scores(s, stats, offs_k, offs_q, bound, qk_scale, CAUSAL: gl.constexpr):
    """P from S (queries along the rows): the causal mask where a row sees fewer than all of the tile's keys
    (row i sees key j when j <= i + diag; in offsets within the tile, offs_k <= offs_q + bound, bound =
    query0 + diag - first), then exp2(min((s - m) c, 0) - log2 l): 0 where masked and in rows that saw no
    key."""
    rowmax, log2l = stats
    if CAUSAL:
        if bound < HALF - 1:
            s = gl.where(offs_k[None, :] <= offs_q[:, None] + bound, s, float("-inf"))
    return gl.exp2(gl.minimum((s - rowmax[:, None]) * qk_scale, 0.0) - log2l[:, None])


# kernel body: dK and dV live in registers across the query tiles, and five async wgmmas a tile share
# their waits; split into calls, the accumulators would pass through arguments (test_sizes allows 120)
@gluon.jit
def _consumer(run, BLOCK_D: gl.constexpr, CAUSAL: gl.constexpr, WHICH: gl.constexpr):
    smem, bars, Rowmax, Log2l, Delta, seqlen_q, diag, nheads_k, group, softmax_scale, qk_scale = run
    q_smem, do_smem, k_smem, v_smem, ds_smem, o_smem = smem
    kv_ready, ready, empty, ds_ready, dq_ready, dq_empty = bars
    dtype: gl.constexpr = q_smem.dtype
    DQ_COLS: gl.constexpr = BLOCK_D // CONSUMERS
    s_layout: gl.constexpr = _mma_layout(HALF, dtype)  # S, dP: [BLOCK_M queries, HALF keys]
    o_layout: gl.constexpr = _mma_layout(BLOCK_D, dtype)  # dK, dV: [HALF keys, BLOCK_D]
    q_layout: gl.constexpr = _mma_layout(DQ_COLS, dtype)  # dQ: [BLOCK_M queries, DQ_COLS]
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)  # a query per row: its statistics, two a thread
    off_b = gl.program_id(1) // nheads_k
    off_hk = gl.program_id(1) % nheads_k
    key0 = gl.program_id(0) * (CONSUMERS * HALF)
    first = key0 + WHICH * HALF  # this consumer's first key
    offs_k = gl.arange(0, HALF, layout=gl.SliceLayout(0, s_layout))
    offs_q = gl.arange(0, BLOCK_M, layout=rows)
    s_zero = gl.zeros([BLOCK_M, HALF], gl.float32, s_layout)
    q_zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, q_layout)
    dk = gl.zeros([HALF, BLOCK_D], gl.float32, o_layout)
    dv = gl.zeros([HALF, BLOCK_D], gl.float32, o_layout)
    k = k_smem.slice(WHICH * HALF, HALF, dim=0)  # this consumer's keys, for S
    v = v_smem.index(WHICH)
    k_cols = k_smem.slice(WHICH * DQ_COLS, DQ_COLS, dim=1)  # every key, this consumer's columns: dQ's B
    # dK's and dV's tile on their way out; until then, this consumer's dQ columns in fp32 (the same bytes)
    o_tile = o_smem.index(WHICH)
    dq_tile = o_tile._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], gl.NVMMASharedLayout(0, 32, rank=2))
    lo, hi = _query_tiles(key0, seqlen_q, diag, CAUSAL)
    mbarrier.wait(kv_ready, 0)
    m = lo
    row = ((off_b * nheads_k + off_hk) * group).to(gl.int64) * seqlen_q  # the head's first query row
    # one loop over the query tiles of every head of the group, in the producer's order: a loop inside a
    # loop over the heads kept more registers live (spills at d128)
    for it in range(0, group * (hi - lo)):
        stage = it % STAGES
        ds_all = ds_smem.index(it % DS_SLOTS)  # dS of both consumers: [BLOCK_M, CONSUMERS x HALF keys]
        ds_mine = ds_all.slice(WHICH * HALF, HALF, dim=1)
        p_tile = ds_smem.index(it % DS_SLOTS + DS_SLOTS).slice(WHICH * HALF, HALF, dim=1)
        q = q_smem.index(stage)
        do = do_smem.index(stage)
        queries = m * BLOCK_M + offs_q
        in_q = queries < seqlen_q
        stats = (gl.load(Rowmax + row + queries, mask=in_q, other=0.0),
                 gl.load(Log2l + row + queries, mask=in_q, other=float("inf")))
        delta = gl.load(Delta + row + queries, mask=in_q, other=0.0)
        mbarrier.wait(ready.index(stage), (it // STAGES) & 1)
        s = warpgroup_mma(q, k.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do, v.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        p = _scores(s, stats, offs_k, offs_q, m * BLOCK_M + diag - first, qk_scale, CAUSAL)
        p_tile.store(p.to(dtype))
        fence_async_shared()  # the tensor cores read P^T through the async proxy
        dv = warpgroup_mma(p_tile.permute((1, 0)), do, dv, is_async=True)  # [mutant site: fused-dv-acc]
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp, ))
        ds = p * (dp - delta[:, None])
        if dtype == gl.float16:  # common.saturate: an fp16 operand past 65504 would be inf
            ds = gl.minimum(gl.maximum(ds, -65504.0), 65504.0)
        ds_mine.store(ds.to(dtype))
        fence_async_shared()  # this consumer's dK wgmma and the other's dQ wgmma read it
        mbarrier.arrive(ds_ready.index(it % DS_SLOTS), count=1)
        dk = warpgroup_mma(ds_mine.permute((1, 0)), q, dk, is_async=True)
        mbarrier.wait(ds_ready.index(it % DS_SLOTS), (it // DS_SLOTS) & 1)  # the other consumer's dS is in
        dq = warpgroup_mma(ds_all, k_cols, q_zero, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
        mbarrier.arrive(empty.index(stage), count=1)  # q and dO are read: the producer may reload them
        mbarrier.wait(dq_empty, (it & 1) ^ 1)  # the last tile's reduce has read the dQ tile
        dq_tile.store(dq)
        fence_async_shared()  # the copy engine reads it through the async proxy
        mbarrier.arrive(dq_ready, count=1)
        m += 1
        if m == hi:  # the next head of the group
            m = lo
            row += seqlen_q
    # dK and dV leave through shared memory and the reducer's copies, once the last dQ has left: every dS
    # and P slot is free then; dV takes this consumer's dQ tile, dK a dS slot of its own
    mbarrier.wait(dq_empty, ((group * (hi - lo)) & 1) ^ 1)
    o_tile.store(dv.to(dtype))
    ds_smem.index(WHICH).slice(0, BLOCK_D, dim=1).store((dk * softmax_scale).to(dtype))
    fence_async_shared()
    mbarrier.arrive(dq_ready, count=1)


def _fused_source(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, Rowmax, Log2l, Delta,  #
                  seqlen_q, seqlen_k, nheads_k, group, softmax_scale, qk_scale,  #
                  CAUSAL: gl.constexpr, BLOCK_D: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_smem, do_smem = _ring_tiles(dtype, BLOCK_D)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS * HALF, BLOCK_D], k_layout(BLOCK_D, dtype, 2))
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], _smem_layout(HALF, BLOCK_D, dtype))
    # dS's slots, then P's (one layout: the stores of both take the same per-thread offsets)
    ds_smem = gl.allocate_shared_memory(dtype, [2 * DS_SLOTS, BLOCK_M, CONSUMERS * HALF],
                                        _smem_layout(BLOCK_M, CONSUMERS * HALF, dtype))
    # each consumer's dK and dV on their way out, and before that its dQ columns (fp32: the same bytes)
    o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, HALF, BLOCK_D], _smem_layout(HALF, BLOCK_D, dtype))
    kv_ready, ready, empty = _ring_barriers()
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_SLOTS, 1], mbarrier.MBarrierLayout())
    dq_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(DS_SLOTS):
        mbarrier.init(ds_ready.index(i), count=CONSUMERS)
    mbarrier.init(dq_ready, count=CONSUMERS)
    mbarrier.init(dq_empty, count=1)  # the reducer's
    smem = (q_smem, do_smem, k_smem, v_smem, ds_smem, o_smem)
    bars = (kv_ready, ready, empty, ds_ready, dq_ready, dq_empty)
    diag = seqlen_k - seqlen_q
    run = (smem, bars, Rowmax, Log2l, Delta, seqlen_q, diag, nheads_k, group, softmax_scale, qk_scale)
    load = (q_desc, k_desc, v_desc, do_desc, (q_smem, do_smem, k_smem, v_smem), (kv_ready, ready, empty), seqlen_q,
            diag, nheads_k, group)
    red = (dq_desc, dk_desc, dv_desc, o_smem, ds_smem, bars, seqlen_q, diag, nheads_k, group)
    # the default partition (num_warps = 4) is consumer 0; workers: consumer 1, the producer, the reducer
    gl.warp_specialize([(_consumer, (run, BLOCK_D, CAUSAL, 0)),
                        (_consumer, (run, BLOCK_D, CAUSAL, 1)),
                        (_producer, (load, BLOCK_D, CAUSAL)),
                        (_reducer, (red, BLOCK_D, CAUSAL))],
                       [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])


# unspecialized sizes, as hopper/backward.py's: one build per dtype, head dim and causal
_SIZES = ["seqlen_q", "seqlen_k", "nheads_k", "group"]
kernel = gluon.jit(do_not_specialize=_SIZES)(_fused_source)
