"""What the Hopper kernels (hopper/forward.py, hopper/backward.py, hopper/backward_fused.py) share, and the
forward's launch: the shared and wgmma layouts, the boxes of their TMA descriptors, the copy engine's
reduce, the registers and the grid."""
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin

# globals a kernel reads must be constexpr
HALF = gl.constexpr(64)  # query rows per consumer warpgroup: one wgmma M
PRODUCER_REGS = gl.constexpr(24)  # the fewest setmaxnreg allows: the producer only issues copies
# Heads per group of the schedule (hopper.forward._schedule): the programs running at once read the key/value tiles of
# about HEAD_GROUP heads, from L2 after the first.
HEAD_GROUP = 8


def registers(consumers: int) -> tuple:
    """(maxnreg, registers of each consumer) for one block per SM, which gets all 64K registers: the
    launch's maxnreg x 32 x the warps (the producer's warpgroup rounded up to 4), and setmaxnreg then gives
    the producer 24 and splits the rest among the consumers."""
    if consumers == 3:  # 4 warpgroups x 128 threads x 128 = 64K; (4 x 128 - 24) / 3, rounded down to 8s
        return 128, 160
    return 168, 240  # 3 warpgroups x 128 x 168 <= 64K; (3 x 168 - 24) / 2


def launch(tile, group: int = HEAD_GROUP) -> tuple:
    """(constants, options) of a configs.Tile with hopper=True: the compile-time constants besides CAUSAL
    and BLOCK_D, and the launch options. What interface.forward launches and the AOT report compiles;
    group: heads per group of the schedule (Launch.head_group)."""
    consumers = tile.block_m // HALF
    maxnreg, consumer_regs = registers(consumers)
    return (dict(BLOCK_N=tile.block_n, STAGES=tile.num_stages, CONSUMERS=consumers, CONSUMER_REGS=consumer_regs,
                 GROUP=group), dict(num_warps=tile.num_warps, maxnreg=maxnreg))


def box_rows(tile) -> tuple:
    """Rows of the q, k, v and out boxes: one consumer's HALF query rows, one stage's block_n keys."""
    return HALF.value, tile.block_n, tile.block_n, HALF.value


def descriptors(q, k, v, out, tile, block_d: int) -> tuple:
    """Host-made TMA descriptors of q, k, v, out ([b, s, h, d] with their own strides), boxes of one head's
    box_rows by block_d, zero-filled past each dimension's end."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dtype = {"torch.bfloat16": gl.bfloat16, "torch.float16": gl.float16}[str(q.dtype)]
    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, 1, block_d],
                                  box_layout(rows, block_d, dtype))
                 for t, rows in zip((q, k, v, out), box_rows(tile)))


def grid(tile, seqlen_q: int, n_bh: int, programs: int | None) -> tuple:
    """One program per query block (programs None), or at most `programs`, each over every programs-th
    block of the schedule (persistent). On the H200 one per block was as fast without a mask and 3-13%
    faster with the causal one, whose blocks differ in length: the hardware hands out the next block to
    the SM that is free, a persistent program takes its share in advance (devtools/triton_fwd_sweep.py at
    cb1e2b9, 2026-11-30; docs/measurements.md, "Forward")."""
    blocks = -(-seqlen_q // tile.block_m) * n_bh
    return (blocks if programs is None else min(blocks, programs),)


@gluon.constexpr_function
def _smem_layout(rows, cols, dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


@gluon.constexpr_function
def box_layout(rows, block_d, dtype):
    """The shared layout of a [1, rows, 1, block_d] box of a [b, s, h, d] tensor (gl dtype): the kernel's
    view of its tiles, and the host's descriptors' (descriptors, build/aot.py)."""
    return gl.NVMMASharedLayout.get_default_for([1, rows, 1, block_d], dtype)


@gluon.constexpr_function
def _mma_layout(n, dtype):
    """The accumulator layout of a 64 x n wgmma over one warpgroup (4 warps along the rows)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, n, 256 // dtype.primitive_bitwidth])


@gluon.jit
def _box(smem, BLOCK: gl.constexpr, BLOCK_D: gl.constexpr):
    """A [BLOCK, BLOCK_D] shared tile seen as the [1, BLOCK, 1, BLOCK_D] box of a [b, s, h, d] descriptor:
    the same bytes (the swizzle is the innermost dims')."""
    return smem._reinterpret(smem.dtype, [1, BLOCK, 1, BLOCK_D],
                             box_layout(BLOCK, BLOCK_D, smem.dtype))


@gluon.jit
def tanh_approx(x):
    """tanh by the special-function unit's tanh.approx.f32: one instruction a logit, beside softmax's exp2,
    where 1 - 2 / (1 + e^2x) takes an exp2, a division and a few more (1.80 of dense's time against 1.20 at
    d128 on the H200). Its relative error is under 2^-10.99 at every x (PTX ISA; its GPU test), near 0 too,
    where a one-key row's lse is its capped logit: well under bf16's unit roundoff (2^-8) and about fp16's
    (2^-11), as large as the rounding of the logits in the same-dtype attention the verdict allows twice.
    Saturates to +-1; a NaN stays NaN."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _schedule(t, n_m, n_bh, GROUP: gl.constexpr, CAUSAL: gl.constexpr):
    """Tile t of the launch -> (query block, batch * head). Heads go in groups of GROUP, so the programs
    running at once share the key/value tiles of a few heads in L2; within a group, causal blocks run
    longest first (the blocks further down see more keys), so each program's tiles, taken round-robin,
    add up to about the same work."""
    per_group = GROUP * n_m
    first = (t // per_group) * GROUP
    size = gl.minimum(GROUP, n_bh - first)
    within = t % per_group
    rank = within // size
    if CAUSAL:
        rank = n_m - 1 - rank
    return rank, first + within % size


@builtin
def reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared tile src into the global box of tensor_desc at coord, elementwise, by the copy engine:
    cp.reduce.async.bulk.tensor .add, committed to the bulk group that tma.store_wait waits on (its read
    of src, as for a TMA store). Gluon 3.6 builds the op (ttng.async_tma_reduce) but wraps it in no
    function of its language; this is that wrapper, the shape of tma.async_copy_shared_to_global's."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)
