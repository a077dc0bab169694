"""Launchers and autograd of the variant kernels (variant/forward.py, variant/backward.py), and the public
flash_attn_varlen_func and flash_attn_with_kvcache; flash_attn_func (interface.py) comes here when a case
uses a variant."""
from __future__ import annotations

import dataclasses

import torch
import triton

from faverify.kernels.triton import configs
from faverify.kernels.triton.build.target import capability
from faverify.kernels.triton.common import INTERPRET, aligned, block_d, quiet, with_dlse
from faverify.kernels.triton.common import LAUNCHED as _LAUNCHED
from faverify.kernels.triton.common import seq_strides as _qstrides
from faverify.kernels.triton.launch import DEFAULT, Launch
from faverify.kernels.triton.variant import backward as _vbwd
from faverify.kernels.triton.variant import decode as _vdec
from faverify.kernels.triton.variant import forward as _vfwd
from faverify.kernels.triton.variant.args import (  # noqa: F401  (_var.KernelVariant)
    KernelVariant,
    MaskArgs,
    broadcast_strides,
)

# Split-KV cuts the keys into whole blocks of this many (case.split_ranges' block): a multiple of every
# key tile the forward takes, so that a split boundary is a tile boundary. Under the interpreter the tiles
# and the CPU's caches are small, and blocks of 32 give the splits of a cache of a few hundred keys
# several blocks each.
SPLIT_BLOCK = 32 if INTERPRET else 64
COMBINE_SPLITS = 16  # the split partials the combine reads at once (variant.forward._combine)
# A paged cache's few query rows (seqlen_q <= DECODE_ROWS) run the decode kernel (variant.decode._decode),
# which packs the query heads of a kv head into one tile and reads each key tile once for them all.
# Launch(packed_decode=False) sends them to the per-head forward instead (an A/B switch for bench and tests).
DECODE_ROWS = 16


def packs_decode(seqlen_q: int, launch: Launch = DEFAULT) -> bool:
    """Whether a paged forward of seqlen_q query rows (no bias, no row statistics) runs the decode kernel."""
    return launch.packed_decode is not False and seqlen_q <= DECODE_ROWS



# Compiled, q/k and v share one padded head dim, the larger one's: a padding of each would make a build per
# pair of paddings, 25 where the fuzz meets them all, each compiled in every GPU worker that meets it first
# (the variant fuzz ran at about 2 cases/s on the H200 after its warm-up); the masked padding adds exact
# zeros to q k^T and columns no store writes to p v, so the result is the same. The interpreter compiles
# nothing, and its NumPy time grows with the padding (a d32 case with v's 256 took 1.7x as long): there
# each takes its own.
SHARED_PADDING = not INTERPRET


def padding(d: int, dv: int) -> tuple:
    """(BLOCK_D, BLOCK_DV) of head dims d and dv (SHARED_PADDING says which rule)."""
    if SHARED_PADDING:
        return (max(block_d(d), block_d(dv)),) * 2
    return block_d(d), block_d(dv)


def fast_build(var: KernelVariant, q, v, *tensors) -> bool:
    """Whether a launch takes the kernels' fast build (common.streamed_args): head dims that fill their
    padding (q/k's and v's: EVEN_D, no head-dim mask), the streamed tensors aligned, and no bias or block
    mask (whose builds keep small tiles of their own, configs._MASKED). Anything else takes the generic
    build, which masks the head dims whatever they are: one build then serves every head dim of a padding
    and every layout."""
    bd, bdv = padding(q.shape[-1], v.shape[-1])
    return not var.masked and q.shape[-1] == bd and v.shape[-1] == bdv and aligned(q, v, *tensors)


def _tile(kind: str, q, dv: int, varlen: bool = False, masked: bool = False, fast: bool = False) -> configs.Tile:
    major = capability(q.device)[0]
    return configs.variant(kind, max(block_d(q.shape[-1]), block_d(dv)), q.element_size(), varlen, masked, fast,
                           major)


def _dims(d: int, dv: int, q, launch: Launch, fast: bool) -> dict:
    """The head-dim constants: the head dims unmasked in the fast build (fast_build), masked in the generic."""
    bd, bdv = padding(d, dv)
    return dict(BLOCK_D=bd, BLOCK_DV=bdv, EVEN_D=fast, EVEN_DV=fast,
                INTERPRETED=INTERPRET if launch.emulate is None else launch.emulate, IEEE=q.dtype == torch.float32)


def _build(module, name: str, fast: bool):
    return getattr(module, name + "_fast" if fast else name)


def _lse_strides(lse: torch.Tensor, varlen: bool) -> tuple:
    """(batch, head) strides of the row statistics: [b, h, s], or varlen's [h, total] (no batch stride)."""
    return (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))


def forward(q, k, v, var: KernelVariant, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
            block_table=None, cache_seqlens=None, num_splits: int = 0, stats: bool = True,
            launch: Launch = DEFAULT):
    """out, lse, (rowmax, log2l) or None, and (out_splits, lse_splits) when split (num_splits > 0).
    Dense q [b, sq, h, d]; varlen packed [total, h, d] with cu_seqlens; paged q [b, sq, h, d] against k, v
    pools [pages, page_size, hk, d] through block_table and cache_seqlens."""
    varlen, paged = cu_seqlens_q is not None, block_table is not None
    h, d, dv = q.shape[-2], q.shape[-1], v.shape[-1]
    hk = k.shape[-2]
    if varlen:
        batch, sq, sk = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
        out = torch.zeros((q.shape[0], h, dv), dtype=q.dtype, device=q.device)  # the tail stays 0
        lse = torch.full((h, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    else:
        batch, sq = q.shape[0], q.shape[1]
        sk = 0 if paged else k.shape[1]
        out = torch.empty((batch, sq, h, dv), dtype=q.dtype, device=q.device)
        lse = torch.empty((batch, h, sq), dtype=torch.float32, device=q.device)
    rows = (torch.empty_like(lse), torch.empty_like(lse)) if stats else None
    split = num_splits > 0
    decode = paged and packs_decode(sq, launch) and not var.masked and rows is None
    splits = None
    if split:
        shapes = ((num_splits, batch, sq, h, dv), (num_splits, batch, h, sq))
        if decode:  # the decode kernel writes every partial: a split that sees no key 0 and -inf
            splits = tuple(torch.empty(shape, dtype=torch.float32, device=q.device) for shape in shapes)
        else:  # _fwd writes each sequence's rows only, and the combine reads them all
            splits = (torch.zeros(shapes[0], dtype=torch.float32, device=q.device),
                      torch.full(shapes[1], float("-inf"), dtype=torch.float32, device=q.device))
    if q.numel() == 0 or batch == 0 or sq == 0:
        _LAUNCHED.append("fwd variant none (empty)")
        if rows is not None:
            rows[0].zero_(), rows[1].fill_(float("inf"))
        if splits is not None:
            splits[0].zero_(), splits[1].fill_(float("-inf"))
        return out.zero_(), lse.fill_(float("-inf")), rows, splits
    target_out, target_lse = splits if split else (out, lse)
    fast = fast_build(var, q, v, k, target_out)
    if split:  # (batch, seq, head, split) strides of the partials, (batch, head, split) of their lse
        o_strides = (target_out.stride(1), target_out.stride(2), target_out.stride(3), target_out.stride(0))
        l_strides = (target_lse.stride(1), target_lse.stride(2), target_lse.stride(0))
    else:
        o_strides = _qstrides(out, varlen) + (0,)
        l_strides = _lse_strides(lse, varlen) + (0,)
    if decode:
        _decode(q, k, v, var, block_table, cache_seqlens, target_out, target_lse, o_strides + l_strides,
                num_splits, fast, launch)
        if split:
            combine(*splits, out, lse, launch=launch)
        return out, lse, rows, splits
    tile = _tile("fwd", q, dv, varlen, var.masked, fast)
    # decode (a paged cache's few query rows) takes tiles of 16 rows; anything else the tile's, so that a
    # fuzz's many small seqlen_q compile no build of their own
    block_m = configs.DECODE_TILE if paged and sq <= DECODE_ROWS else tile.block_m
    dims = _dims(d, dv, q, launch, fast)
    dummy = torch.empty(0, dtype=torch.int32, device=q.device)
    f32 = torch.empty(0, dtype=torch.float32, device=q.device)
    alibi, stride_ab, sinks = var.tensors(q)
    masks, switches = var.masks(q)
    # paged pools are [pages, page_size, hk, d]: their page stride takes the batch stride's place
    k_strides, v_strides = _qstrides(k, varlen), _qstrides(v, varlen)
    _LAUNCHED.append("fwd variant" + (" varlen" if varlen else " paged" if paged else "") + (" split" if split else "")
                     + ("" if fast else " generic"))
    grid = (triton.cdiv(sq, block_m), batch * h, max(1, num_splits))
    with quiet():
        _build(_vfwd, "_fwd_kernel", fast)[grid](
            q, k, v, target_out, target_lse, *(rows if rows is not None else (f32, f32)),
            cu_seqlens_q if varlen else dummy, cu_seqlens_k if varlen else dummy,
            block_table if paged else dummy, cache_seqlens if paged else dummy, alibi, sinks, *masks.pointers,
            *_qstrides(q, varlen), *k_strides, *v_strides, *o_strides, *l_strides,
            stride_ab, block_table.stride(0) if paged else 0, *masks.scalars,
            h, h // hk, sq, sk, d, dv, k.shape[1] if paged else 1, max(1, num_splits),
            var.qk_scale, var.init_value, **var.runtime(), **var.switches(),
            VARLEN=varlen, PAGED=paged, SPLIT_BLOCK=SPLIT_BLOCK if split else 0,
            STATS=stats, **switches, BLOCK_M=block_m, BLOCK_N=tile.block_n, num_warps=tile.num_warps,
            num_stages=tile.num_stages, **dims)
    if split:
        combine(*splits, out, lse, launch=launch)
    return out, lse, rows, splits


def _decode(q, k, v, var: KernelVariant, block_table, cache_seqlens, out, lse, strides: tuple, num_splits: int,
            fast: bool, launch: Launch) -> None:
    """Launch variant.decode._decode: q [b, sq, h, d] against pools [pages, page_size, hk, d]; out and lse
    are the outputs' (num_splits 0) or the split partials' ([splits, b, sq, h, dv], [splits, b, h, sq]),
    strides theirs as forward() passes them to _fwd."""
    batch, sq, h, d = q.shape
    hk, dv = k.shape[2], v.shape[3]
    split = num_splits > 0
    alibi, stride_ab, sinks = var.tensors(q)
    tile = launch.decode_tile or configs.decode(q.element_size(), fast)
    _LAUNCHED.append("fwd variant decode" + (" split" if split else "") + ("" if fast else " generic"))
    grid = (triton.cdiv(sq * (h // hk), tile.block_m), batch * hk, max(1, num_splits))
    with quiet():
        _build(_vdec, "_decode_kernel", fast)[grid](
            q, k, v, out, lse, block_table, cache_seqlens, alibi, sinks,
            q.stride(0), q.stride(1), q.stride(2), *_qstrides(k, False), *_qstrides(v, False), *strides,
            stride_ab, block_table.stride(0), hk, h // hk, sq, d, dv, k.shape[1], max(1, num_splits),
            var.qk_scale, var.init_value, **var.runtime(), **var.switches(), SPLIT_BLOCK=SPLIT_BLOCK if split else 0,
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, num_warps=tile.num_warps, num_stages=tile.num_stages,
            **_dims(d, dv, q, launch, fast))


def combine(out_splits, lse_splits, out, lse, launch: Launch = DEFAULT) -> None:
    """Merge split partials (out_splits [splits, b, s, h, dv] fp32, lse_splits [splits, b, h, s]) into out
    [b, s, h, dv] and lse [b, h, s]."""
    s, b, sq, h, dv = out_splits.shape
    if out_splits.numel() == 0:
        return
    with quiet():
        _vfwd._combine_kernel[(sq, b * h)](
            out_splits, lse_splits, out, lse, *(out_splits.stride(i) for i in range(4)),
            *(lse_splits.stride(i) for i in range(3)), out.stride(0), out.stride(1), out.stride(2),
            lse.stride(0), lse.stride(1), h, sq, dv, s, BLOCK_S=COMBINE_SPLITS, BLOCK_DV=block_d(dv),
            INTERPRETED=INTERPRET if launch.emulate is None else launch.emulate)


def backward(dout, q, k, v, out, lse, rows, var: KernelVariant, *, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=None, max_seqlen_k=None, sinks_grad: bool = False, bias_grad: bool = False,
             launch: Launch = DEFAULT, dense_backward=None, dlse=None):
    """dq, dk, dv, dsinks (None unless sinks_grad) and dbias (None unless bias_grad). dlse: a loss's gradient
    on lse, lse's shape, or None (interface.with_dlse). dense_backward: the
    dense kernels' (dout, q, k, v, out, rows, scale, causal, alibi=(slopes, batch stride)) -> (dq, dk, dv),
    interface.backward, for a variant whose backward is dense attention's (KernelVariant.backward_is_dense); None:
    these kernels always."""
    varlen = cu_seqlens_q is not None
    rowmax, log2l = rows
    h, d, dv = q.shape[-2], q.shape[-1], v.shape[-1]
    hk = k.shape[-2]
    if varlen:
        batch, sq, sk = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
        packed = int(cu_seqlens_q[-1])
        # D = rowsum(dO * O), [h, total] like lse; the tail's rows are never read
        delta = (dout.float() * out.float()).sum(-1).transpose(0, 1).contiguous()
    else:
        batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        packed = None
        delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    with_dlse(delta, dlse)
    dsinks = None
    if sinks_grad:
        # d z_h = -sum_i p_sink_i D_i, p_sink_i = e^(z_h - lse_i) <= 1, over every row of every sequence.
        # The clamp is that bound: at logits near 1e10 lse's fp32 rounding (hundreds) would make e^(z - lse)
        # inf, and inf * D NaN (D = 0 on a row that sees no key)
        rows_lse, rows_d, z = ((lse[:, :packed], delta[:, :packed], var.sinks[:, None]) if varlen
                               else (lse.transpose(0, 1).flatten(1), delta.transpose(0, 1).flatten(1), var.sinks[:,
                                                                                                                 None]))
        p_sink = torch.exp((z - rows_lse).clamp(max=0.0))
        dsinks = -(p_sink * rows_d).sum(1)  # [mutant site: dsinks-sign]
    # dS of every (batch, head, row, key), summed below over the dimensions the bias broadcasts over
    ds_full = torch.zeros((batch, h, sq, sk) if bias_grad else (0,), dtype=torch.float32, device=q.device)
    if batch == 0 or sq == 0 or sk == 0 or q.numel() == 0:
        _LAUNCHED.append("bwd variant none (empty)")
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dsinks,
                _dbias(ds_full, var.bias) if bias_grad else None)
    if dense_backward is not None and var.backward_is_dense and not varlen and dv == d:
        # the variant kernels' runtime bounds, switches and tiles cost them 15-19% of the dense kernels' speed
        # at d128 seqlen 16384 on the H200 (docs/measurements.md, "Variants"), and sinks and ALiBi need
        # none of them
        alibi = var.tensors(q)[:2] if var.alibi is not None else None  # (slopes, their batch stride)
        dq, dk, dvv = dense_backward(dout, q, k, v, out, (rowmax.contiguous(), log2l.contiguous()), var.scale,
                                     var.right == 0, alibi=alibi, dlse=dlse)
        return dq, dk, dvv, dsinks, None
    dq, dk, dvv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    fast = fast_build(var, q, v, k, dout, dq, dk, dvv)
    dims = _dims(d, dv, q, launch, fast)
    dummy = torch.empty(0, dtype=torch.int32, device=q.device)
    alibi, ab, _ = var.tensors(q)
    masks, switches = var.masks(q)
    cu = (cu_seqlens_q, cu_seqlens_k) if varlen else (dummy, dummy)
    common = dict(**var.runtime(), **var.switches(), VARLEN=varlen, **switches, **dims)
    lse_strides = _lse_strides(lse, varlen)
    _LAUNCHED.append("bwd variant" + (" varlen" if varlen else "") + ("" if fast else " generic"))
    with quiet():
        t = _tile("dkdv", q, dv, varlen, var.masked, fast)
        _build(_vbwd, "_dkdv_kernel", fast)[(triton.cdiv(sk, t.block_n), batch * hk)](
            q, k, v, dout, rowmax, log2l, delta, dk, dvv, *cu, alibi, *masks.pointers,
            *_qstrides(q, varlen), *_qstrides(k, varlen), *_qstrides(v, varlen), *_qstrides(dout, varlen),
            *_qstrides(dk, varlen), *_qstrides(dvv, varlen), *lse_strides, ab, *masks.scalars,
            hk, h // hk, sq, sk, d, dv, var.scale, var.qk_scale, **common,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
        t = _tile("dq", q, dv, varlen, var.masked, fast)
        _build(_vbwd, "_dq_kernel", fast)[(triton.cdiv(sq, t.block_m), batch * h)](
            q, k, v, dout, rowmax, log2l, delta, dq, *cu, alibi, *masks.pointers, ds_full,
            *_qstrides(q, varlen), *_qstrides(k, varlen), *_qstrides(v, varlen), *_qstrides(dout, varlen),
            *_qstrides(dq, varlen), *lse_strides, ab, *masks.scalars,
            *(ds_full.stride()[:3] if bias_grad else (0, 0, 0)),
            h, h // hk, sq, sk, d, dv, var.scale, var.qk_scale, **common, DBIAS=bias_grad,
            BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
    return dq, dk, dvv, dsinks, _dbias(ds_full, var.bias) if bias_grad else None


def _dbias(ds_full: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """dbias: dS [b, h, sq, sk] summed over the dimensions the bias broadcasts over, in the bias's dtype."""
    dims = tuple(i for i, n in enumerate(bias.shape) if n == 1 and ds_full.shape[i] != 1)
    summed = ds_full.sum(dim=dims, keepdim=True) if dims else ds_full  # [mutant site: dbias-sum]
    return summed.reshape(bias.shape).to(bias.dtype)


class VariantFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, var, ragged, launch, launcher, dense_backward):
        result = launcher(q, k, v, var) if launcher is not None else None
        out, lse, rows = result if result is not None else forward(q, k, v, var, **ragged, launch=launch)[:3]
        ctx.save_for_backward(q, k, v, out, lse, *rows)
        ctx.var, ctx.ragged, ctx.launch, ctx.dense_backward = var, ragged, launch, dense_backward
        ctx.mark_non_differentiable(*rows)
        if ragged:  # a loss on a varlen or paged lse is not checked (lse_grad takes dense cases): it raises
            ctx.mark_non_differentiable(lse)
        return out, lse, *rows

    @staticmethod
    def backward(ctx, dout, dlse, _drowmax, _dlog2l):
        q, k, v, out, lse, rowmax, log2l = ctx.saved_tensors
        sinks_grad = ctx.var.sinks is not None and ctx.needs_input_grad[3]
        bias_grad = ctx.var.bias is not None and ctx.needs_input_grad[4]
        dq, dk, dv, dsinks, dbias = backward(dout, q, k, v, out, lse, (rowmax, log2l), ctx.var, **ctx.ragged,
                                             sinks_grad=sinks_grad, bias_grad=bias_grad, launch=ctx.launch,
                                             dense_backward=ctx.dense_backward, dlse=dlse)
        return dq, dk, dv, dsinks, dbias, None, None, None, None, None


def attention(q, k, v, var: KernelVariant, ragged: dict | None = None, launch: Launch = DEFAULT, launcher=None,
              dense_backward=None):
    """out, lse through autograd (the sinks a leaf of their own when they require grad), and the rows' statistics
    (row max, log2 l; no gradient). launcher: a forward
    (q, k, v, var) -> (out, lse, (row max, log2 l)) or None, tried first (interface._hopper_variant: the
    Hopper forward where it runs the case); the backward is this module's either way, on the same row
    statistics, but where dense_backward takes it (backward says when)."""
    sinks, bias = var.sinks, var.bias
    plain = dataclasses.replace(var, sinks=sinks.detach().float().contiguous() if sinks is not None else None,
                                bias=bias.detach() if bias is not None else None)
    return VariantFunction.apply(q, k, v, sinks, bias, plain, ragged or {}, launch, launcher, dense_backward)

