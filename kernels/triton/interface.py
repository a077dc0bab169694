"""Launchers, autograd, and the public flash_attn_func of the Triton kernels."""
from __future__ import annotations

import contextlib
import functools

import torch
import triton

from faverify.kernels.autograd import max_logits, row_stats_function
from faverify.kernels.constants import INIT_VALUE, MAX_SPLITS
from faverify.kernels.triton import configs
from faverify.kernels.triton import sparse as _sparse
from faverify.kernels.triton.build import target as _target
from faverify.kernels.triton.common import (
    INTERPRET,
    LOG2E,
    block_d,
    quiet,
    settle_keys,
    take_paths,  # noqa: F401  (the subject's Subject.paths)
    with_dlse,
)
from faverify.kernels.triton.common import LAUNCHED as _LAUNCHED
from faverify.kernels.triton.common import aligned as _aligned
from faverify.kernels.triton.common import seq_strides as _strides
from faverify.kernels.triton.dense import backward as _bwd
from faverify.kernels.triton.dense import forward as _fwd
from faverify.kernels.triton.hopper import backward as _bwd_hopper
from faverify.kernels.triton.hopper import backward_fused as _bwd_fused
from faverify.kernels.triton.hopper import forward as _fwd_hopper
from faverify.kernels.triton.hopper import layouts as _layouts
from faverify.kernels.triton.launch import DEFAULT, Launch
from faverify.kernels.triton.variant import interface as _var
from faverify.kernels.validate import check_inputs, check_kvcache, check_masks, check_variant, check_varlen

# The code paths a launch can take (common.LAUNCHED logs them, take_paths hands them over)
PATHS = ("fwd hopper", "fwd hopper variant", "fwd triton-tma", "fwd triton", "fwd triton generic", "fwd none (empty)",
         "bwd triton", "bwd triton generic", "bwd triton alibi", "bwd triton generic alibi", "bwd hopper",
         "bwd hopper fused-dq", "bwd fused hopper", "fwd sparse", "bwd sparse", "bwd none (empty)",
         "fwd variant none (empty)", "bwd variant none (empty)") + tuple(
    # the variant kernels' fast and generic builds (variant.interface.fast_build)
    path + build for path in ("fwd variant", "fwd variant varlen", "fwd variant paged", "fwd variant paged split",
                              "fwd variant decode", "fwd variant decode split", "bwd variant", "bwd variant varlen")
    for build in ("", " generic"))


# every kernel keyed alike in every process, before any launch (common.settle_keys says why)
settle_keys(_fwd, _bwd, _fwd_hopper, _bwd_hopper, _sparse, _var._vfwd, _var._vbwd, _var._vdec)


def _build(name: str, *tensors):
    """The fast build of kernel `name` when the tensors allow it, else the generic one (common.generic_args)."""
    module = _fwd if name == "_fwd_kernel" else _bwd
    return getattr(module, name if INTERPRET or _aligned(*tensors) else name + "_generic")


def _scratch(size: int, alignment: int, stream):
    """Global memory for descriptors made on the device (128 bytes each, per program), on the current
    device: the launchers make it the tensors' (_on_their_device)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _on_their_device(launcher):
    """Run a launcher with the current CUDA device set to its first tensor's: Triton launches on the current
    device, not on the tensors', so tensors on cuda:1 would otherwise be read from a kernel on cuda:0."""
    @functools.wraps(launcher)
    def run(first, *args, **kwargs):
        with torch.cuda.device(first.device) if first.is_cuda else contextlib.nullcontext():
            return launcher(first, *args, **kwargs)
    return run


def _use_tma(*tensors, launch: Launch = DEFAULT) -> bool:
    """TMA wants 16-byte aligned bases and strides: only where the fast build applies (_aligned)."""
    if not _aligned(*tensors):
        return False
    if launch.tma is not None:
        return launch.tma
    q = tensors[0]
    return not INTERPRET and configs.tma_forward(q.element_size(), _target.capability(q.device)[0])


def _use_hopper_backward(q, k, v, dout, alibi, launch: Launch = DEFAULT) -> bool:
    """The Hopper dK/dV (hopper/backward.py) or the fused Hopper backward (hopper/backward_fused.py): asked
    for (Launch.hopper_backward, Launch.fused_backward), dense attention without ALiBi, 16-bit on sm_90 with
    padded head dim 64 or 128, and q, k, v and dO TMA-aligned."""
    asked = launch.hopper_backward or launch.fused_backward
    if not asked or INTERPRET or alibi is not None or not _aligned(q, k, v, dout):
        return False
    return configs.hopper_forward(q.element_size(), _target.capability(q.device)[0],
                                  block_d(q.shape[3]))


def _use_hopper(q, tma: bool, launch: Launch = DEFAULT) -> bool:
    if not tma or INTERPRET or launch.hopper is False:
        return False
    return configs.hopper_forward(q.element_size(), _target.capability(q.device)[0],
                                  block_d(q.shape[3]))


def _common(q, launch: Launch):
    d = q.shape[3]
    bd = block_d(d)
    emulate = INTERPRET if launch.emulate is None else launch.emulate
    return dict(BLOCK_D=bd, EVEN_D=d == bd, INTERPRETED=emulate, IEEE=q.dtype == torch.float32)


@_on_their_device
def forward(q, k, v, scale: float, causal: bool, init: str, tile: configs.Tile | None = None,
            launch: Launch = DEFAULT):
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    # the backward's P comes from the row max and log2 l (dense/backward.py says why), kept per row
    rowmax, log2l = torch.empty_like(lse), torch.empty_like(lse)
    if sq == 0:
        _LAUNCHED.append("fwd none (empty)")
        return out, lse, (rowmax, log2l)
    if sk == 0:  # no key at all: every row follows the convention for rows that see none
        _LAUNCHED.append("fwd none (empty)")
        return out.zero_(), lse.fill_(float("-inf")), (rowmax.zero_(), log2l.fill_(float("inf")))
    c = _common(q, launch)
    tma = _use_tma(q, k, v, out, launch=launch)
    hopper = _use_hopper(q, tma, launch)
    tile = tile or configs.select("fwd", c["BLOCK_D"], q.element_size(), causal, max(sq, sk), tma, hopper)
    if tile.hopper and not hopper:  # a tuned choice recorded where the Hopper forward ran; not here
        tile = configs.default("fwd", c["BLOCK_D"], q.element_size(), causal, tma)
    if tile.hopper:
        _LAUNCHED.append("fwd hopper")
        dense = _var.KernelVariant.of(scale, causal, (-1, -1), 0.0, None, None, init)
        _hopper(q, k, v, out, lse, (rowmax, log2l), tile, dense, launch)
        return out, lse, (rowmax, log2l)
    if tma and not INTERPRET:
        triton.set_allocator(_scratch)  # a context variable: set on the launching thread, every launch
    kernel = _build("_fwd_kernel", q, k, v, out)
    _LAUNCHED.append("fwd triton-tma" if tma else "fwd triton" + ("" if kernel is _fwd._fwd_kernel else " generic"))
    kernel[(triton.cdiv(sq, tile.block_m), b * h)](
        q, k, v, out, lse, rowmax, log2l, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        h, h // hk, sq, sk, d, scale * LOG2E, INIT_VALUE[init],
        CAUSAL=causal, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, num_warps=tile.num_warps,
        num_stages=tile.num_stages, TMA=tma, **c)
    return out, lse, (rowmax, log2l)


def _hopper(q, k, v, out, lse, rows, tile, var, launch: Launch) -> None:
    """Launch the Hopper forward (hopper/forward.py) on dense attention or on the variants it takes: a
    window (WINDOW: both bounds runtime values; causal alone keeps its own tile ranges) and softcap. With a
    window CAUSAL would only order the blocks (whose work a window evens out): it stays off, one build less
    for the warm-up (subject.hopper_variant_warmup_cases) to cover."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    bd = block_d(d)
    constants, options = _layouts.launch(tile, launch.head_group or _layouts.HEAD_GROUP)
    runtime = var.runtime()
    window = var.windowed
    alibi, stride_ab, sinks = var.tensors(q) if var.alibi is not None or var.sinks is not None else (lse, 0, lse)
    build = (launch.hopper_build or _fwd_hopper.kernel)(sq, sk)
    build[_layouts.grid(tile, sq, b * h, launch.programs)](
        *_layouts.descriptors(q, k, v, out, tile, bd), lse, *rows, alibi, sinks, b * h, h, h // hk, sq, sk,
        var.scale * LOG2E, INIT_VALUE[var.init], runtime["left"], runtime["right"], runtime["cap_scale"],
        runtime["inv_cap_scale"], stride_ab, runtime["bias_unit"], CAUSAL=var.right == 0 and not window, BLOCK_D=bd,
        WINDOW=window, SOFTCAP=var.softcap > 0, ALIBI=var.alibi is not None, SINKS=var.sinks is not None,
        **constants, **options)


def _hopper_variant(launch: Launch):
    """A forward for variant.interface.attention that runs a variant on the Hopper forward where it can:
    windows, softcap, ALiBi and sinks, no bias or block mask, v's head dim q's, 16-bit on sm_90 with
    TMA-aligned tensors (_use_hopper); it returns None elsewhere, and the variant forward runs."""
    @_on_their_device
    def run(q, k, v, var):
        if var.masked or v.shape[-1] != q.shape[-1] or 0 in q.shape[:2] or k.shape[1] == 0:
            return None
        b, sq, h, d = q.shape
        out = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
        if not _use_hopper(q, _use_tma(q, k, v, out, launch=launch), launch):
            return None
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
        rows = (torch.empty_like(lse), torch.empty_like(lse))
        _LAUNCHED.append("fwd hopper variant")
        tile = configs.hopper_tile(block_d(d), var.softcap > 0, var.windowed or var.alibi is not None)
        _hopper(q, k, v, out, lse, rows, tile, var, launch)
        return out, lse, rows
    return run


@_on_their_device
def backward(dout, q, k, v, out, rows: tuple, scale: float, causal: bool, tiles: dict | None = None,
             launch: Launch = DEFAULT, alibi: tuple | None = None, dlse=None):
    """rows: the forward's (row max, log2 l) per [b, h, seqlen_q] row. alibi: (fp32 slopes [h] or [b, h],
    their batch stride), the bias the forward added (variant.args.KernelVariant.backward_is_dense). dlse: a loss's
    gradient on lse [b, h, seqlen_q] or None."""
    rowmax, log2l = rows
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    dq = torch.empty((b, sq, h, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, sk, hk, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((b, sk, hk, d), dtype=v.dtype, device=v.device)
    if sq == 0 or sk == 0:
        _LAUNCHED.append("bwd none (empty)")
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:  # autograd may hand us an expanded gradient (stride 0): one copy of dO only
        dout = dout.contiguous()
    c = _common(q, launch)
    pick = {kind: (tiles or {}).get(kind) or configs.select(kind, c["BLOCK_D"], q.element_size(), causal, max(sq, sk))
            for kind in ("dkdv", "dq")}
    delta = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    pre_m = 64 if not INTERPRET else 32
    o = out  # D = rowsum(dO * O) is read from the forward's output  [mutant site: delta-input]
    _build("_bwd_preprocess", o, dout)[(triton.cdiv(sq, pre_m), b * h)](
        o, dout, delta, *_strides(o), *_strides(dout), h, sq, d, BLOCK_M=pre_m, BLOCK_D=c["BLOCK_D"],
        EVEN_D=c["EVEN_D"])
    with_dlse(delta, dlse)  # [mutant site: dlse]
    slopes, stride_ab = alibi if alibi is not None else (rowmax, 0)  # not read without ALiBi
    bias = (slopes, stride_ab, 1.0 / scale)
    t = pick["dkdv"]
    if _use_hopper_backward(q, k, v, dout, alibi, launch) and launch.fused_backward:
        _LAUNCHED.append("bwd fused hopper")
        return _bwd_fused.run(q, k, v, dout, dq, dk, dv, rows, delta, scale, causal, c["BLOCK_D"])
    if _use_hopper_backward(q, k, v, dout, alibi, launch):
        fused = launch.deterministic is False
        _LAUNCHED.append("bwd hopper" + (" fused-dq" if fused else ""))
        dq_sum = _bwd_hopper.dq_buffer(q, c["BLOCK_D"]) if fused else dk  # not read unfused
        _bwd_hopper.kernel[_bwd_hopper.grid(sk, b, hk)](
            *_bwd_hopper.descriptors(q, k, v, dout, c["BLOCK_D"]), dk, dv, dq_sum, rowmax, log2l, delta,
            *_strides(dk), sq, sk, hk, h // hk, d, scale, scale * LOG2E, CAUSAL=causal, BLOCK_D=c["BLOCK_D"],
            FUSED_DQ=fused, **_bwd_hopper.OPTIONS)
        if fused:
            return _bwd_hopper.finish_dq(dq_sum, dq, scale), dk, dv
    else:
        kernel = _build("_bwd_dkdv", q, k, v, dout, dk, dv)
        _LAUNCHED.append("bwd triton" + ("" if kernel is _bwd._bwd_dkdv else " generic") + (" alibi" if alibi else ""))
        kernel[(triton.cdiv(sk, t.block_n), b * hk)](
            q, k, v, dout, rowmax, log2l, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
            *_strides(dk), *_strides(dv), hk, h // hk, sq, sk, d, scale, scale * LOG2E, *bias,
            CAUSAL=causal, BLOCK_M=t.block_m, BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages,
            **c, ALIBI=alibi is not None)
    t = pick["dq"]
    _build("_bwd_dq", q, k, v, dout, dq)[(triton.cdiv(sq, t.block_m), b * h)](
        q, k, v, dout, rowmax, log2l, delta, dq, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
        *_strides(dq), h, h // hk, sq, sk, d, scale, scale * LOG2E, *bias, CAUSAL=causal, BLOCK_M=t.block_m,
        BLOCK_N=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages, **c, ALIBI=alibi is not None)
    return dq, dk, dv


def _quiet_forward(q, k, v, softmax_scale, causal, init, launch):
    with quiet():
        return forward(q, k, v, softmax_scale, causal, init, launch=launch)


def _quiet_backward(dout, q, k, v, out, rows, softmax_scale, causal, launch, dlse=None):
    with quiet():
        return backward(dout, q, k, v, out, rows, softmax_scale, causal, launch=launch, dlse=dlse)


FlashAttnFunction = row_stats_function("FlashAttnFunction", _quiet_forward, _quiet_backward, lse_grad=True)


DEVICE_HINT = "CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before import"


def flash_attn_func(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                    window_size: tuple = (-1, -1), softcap: float = 0.0, alibi_slopes=None, sinks=None,
                    init: str = "-inf", return_lse: bool = False, launch: Launch | None = None, attn_mask=None,
                    block_mask=None, block_size: int | None = None, return_max_logit: bool = False, indices=None):
    """FlashAttention forward (and backward through autograd) in Triton.

    q: [batch, seqlen_q, nheads, head_dim]; k, v: [batch, seqlen_k, nheads_k, head_dim], nheads_k dividing
    nheads (GQA/MQA), v's head dim may differ (head_dim_v); fp16, bf16 or fp32; head dims 1..256; any
    strides with a contiguous last dimension.
    causal: bottom-right aligned (query i sees key j iff j <= i + seqlen_k - seqlen_q).
    softmax_scale: defaults to head_dim ** -0.5.
    window_size: (left, right): query i sees keys i + d - left .. i + d + right (d = seqlen_k - seqlen_q),
        -1 no bound on that side; with causal, the intersection.
    softcap: > 0 caps the scaled logits to softcap * tanh(s / softcap) (0: off).
    alibi_slopes: fp32 [nheads] or [batch, nheads]: -slope * |i + d - j| added to the capped logits.
    sinks: fp32 [nheads], one logit per head in every row's softmax, with no value; its gradient when it
        requires grad.
    init: start of the running max, "-inf" (guarded) or "-1e30" (guarded at l == 0); same result either way.
    launch: how the kernels launch (Launch: a load path or kernel forced, for tests and tuning); None
        decides per launch.
    Returns out [batch, seqlen_q, nheads, head_dim_v] in the input dtype, and with return_lse also
    lse [batch, nheads, seqlen_q] float32 (natural log, of the capped logits and the sink; -inf for a row
    that sees no key, the sink's logit with sinks); with return_max_logit, last, the largest logit each row
    sees, float32 [batch, nheads, seqlen_q] (after scale, softcap, ALiBi and bias; never the sink's; -inf
    for a row that sees no key; no gradient).
    indices: int32 [batch, seqlen_q, nheads_k, topk], the keys each row of each kv head's group sees
    (sparse.py; an index < 0 or >= seqlen_k names none, a key listed twice weighs twice); v's own head dim
    goes with it, no other variant or mask.
    The dense case runs dense/forward.py and backward.py; any variant the variant kernels (variant/forward.py), but
    for the backward of sinks alone: dense/backward.py's, given the forward's rows (variant.interface.backward).
    """
    scale = check_inputs(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init,
                         allow_cpu=_target.cpu_tensors(), device_hint=DEVICE_HINT, head_dim_v=True)
    check_variant(q, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                  batch=q.shape[0])
    check_masks(q, k, attn_mask=attn_mask, block_mask=block_mask, block_size=block_size)
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # a bias of 0 and -inf, with no gradient
        attn_mask = torch.zeros(attn_mask.shape, dtype=torch.float32, device=q.device).masked_fill(~attn_mask,
                                                                                                   -torch.inf)
    launch = launch or DEFAULT
    if indices is not None:
        others = {"causal": causal, "window_size": tuple(window_size) != (-1, -1), "softcap": softcap,
                  "alibi_slopes": alibi_slopes is not None, "sinks": sinks is not None,
                  "attn_mask": attn_mask is not None, "block_mask": block_mask is not None}
        out, lse, rowmax, log2l = _sparse.attention(q, k, v, indices, scale, [n for n, on in others.items() if on])
        raw = scale
    elif tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None or sinks is not None \
            or v.shape[-1] != q.shape[-1] or attn_mask is not None or block_mask is not None:
        var = _var.KernelVariant.of(scale, causal, tuple(window_size), softcap, alibi_slopes, sinks, init, attn_mask,
                              block_mask, block_size or 0)
        out, lse, rowmax, log2l = _var.attention(q, k, v, var, launch=launch,
                                                 launcher=None if INTERPRET else _hopper_variant(launch),
                                                 dense_backward=functools.partial(backward, launch=launch))
        raw = var.raw
    else:
        out, lse, rowmax, log2l = FlashAttnFunction.apply(q, k, v, causal, scale, init, launch)  # [mutant site: apply]
        raw = scale
    result = (out, lse) if return_lse else (out,)
    if return_max_logit:
        result += (max_logits(rowmax, log2l, raw),)  # [mutant site: max-logit]
    return result if len(result) > 1 else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                           causal: bool = False, softmax_scale: float | None = None, window_size: tuple = (-1, -1),
                           softcap: float = 0.0, alibi_slopes=None, sinks=None, init: str = "-inf",
                           return_lse: bool = False, launch: Launch | None = None):
    """flash_attn_func on a packed batch: q [total_q, nheads, head_dim], k and v [total_k, nheads_k, head_dim
    (head_dim_v for v)]; sequence b is tokens cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q (int32 [batch + 1]),
    and of k and v by cu_seqlens_k, each its own attention problem (causal and windows aligned per
    sequence); max_seqlen_q/k at least the longest. Tokens past the last offset are never read; out's stay 0.
    Returns out [total_q, nheads, head_dim_v], with return_lse also lse [nheads, total_q] (flash-attn's)."""
    scale = check_inputs(q, k, v, causal=causal, softmax_scale=softmax_scale, init=init,
                         allow_cpu=_target.cpu_tensors(), device_hint=DEVICE_HINT, head_dim_v=True, ndim=3)
    batch = cu_seqlens_q.shape[0] - 1 if isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.dim() == 1 else 0
    check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    check_variant(q, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, batch=batch)
    var = _var.KernelVariant.of(scale, causal, tuple(window_size), softcap, alibi_slopes, sinks, init)
    ragged = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k)
    out, lse = _var.attention(q, k, v, var, ragged, launch=launch or DEFAULT)[:2]
    return (out, lse) if return_lse else out


def num_splits_for(batch: int, nheads: int, seqlen_q: int, max_cache: int, sms: int, nheads_k: int = 0,
                   launch: Launch = DEFAULT) -> int:
    """The split count flash_attn_with_kvcache chooses: split the keys only while the programs leave the GPU
    idle, into no more splits than the cache has blocks of SPLIT_BLOCK keys, nor MAX_SPLITS. A program is a
    (batch, head, tile of 64 queries), and the splits fill the SMs (at least one program each); or, where the
    decode kernel packs a GQA group into its rows (variant.interface.packs_decode; nheads_k given), a (batch,
    kv head, tile of configs.DECODE_TILE rows), and the splits fill the slots for them that the SMs hold
    together (configs.DECODE_PROGRAMS_PER_SM) once, with no second wave. On the H200 (132 SMs, bench
    --decode's caches of 4k to 128k keys at GQA 8) that count was the fastest of the counts timed around
    it (devtools/decode_sweep.py; docs/measurements.md, "Decode")."""
    blocks = max(1, -(-max_cache // _var.SPLIT_BLOCK))
    if nheads_k and _var.packs_decode(seqlen_q, launch):
        programs = batch * nheads_k * -(-max(seqlen_q, 1) * (nheads // nheads_k) // configs.DECODE_TILE)
        splits = sms * configs.DECODE_PROGRAMS_PER_SM // programs
    else:
        programs = batch * nheads * -(-max(seqlen_q, 1) // 64)
        splits = -(-sms // programs) if programs < sms else 1
    return max(1, min(splits, blocks, MAX_SPLITS))


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal: bool = False,
                            softmax_scale: float | None = None, window_size: tuple = (-1, -1), softcap: float = 0.0,
                            alibi_slopes=None, num_splits: int = 0, return_lse: bool = False,
                            return_splits: bool = False, launch: Launch | None = None):
    """Decode and chunked prefill against a paged KV cache, forward only. q [batch, seqlen_q, nheads,
    head_dim]; k_cache, v_cache [num_pages, page_size, nheads_k, head_dim (head_dim_v)]; block_table int32
    [batch, max_pages]: key t of sequence b is k_cache[block_table[b, t // page_size], t % page_size];
    cache_seqlens int32 [batch]. Causal and windows align the queries with the cache's end.
    num_splits: split-KV into this many key ranges of whole SPLIT_BLOCK blocks, computed apart and then
    combined (0: num_splits_for's rule from the cache length and the SMs; 1: no split).
    Returns out [batch, seqlen_q, nheads, head_dim_v]; with return_lse lse [batch, nheads, seqlen_q]; with
    return_splits also the partials, out_splits [num_splits, batch, seqlen_q, nheads, head_dim_v] and
    lse_splits [num_splits, batch, nheads, seqlen_q] (fp32)."""
    scale = check_inputs(q, k_cache, v_cache, causal=causal, softmax_scale=softmax_scale, init="-inf",
                         allow_cpu=_target.cpu_tensors(), device_hint=DEVICE_HINT, head_dim_v=True, same_batch=False)
    check_kvcache(q, k_cache, cache_seqlens, block_table, num_splits)
    check_variant(q, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, sinks=None,
                  batch=q.shape[0])
    if num_splits == 0:
        sms = _target.sm_count(q.device)
        # the longest cache the table can hold, not cache_seqlens' largest: known without reading the device
        # (a call stays free of host syncs, and capturable in a CUDA graph)
        num_splits = num_splits_for(q.shape[0], q.shape[2], q.shape[1], block_table.shape[1] * k_cache.shape[1],
                                    sms, k_cache.shape[2], launch or DEFAULT)
    var = _var.KernelVariant.of(scale, causal, tuple(window_size), softcap, alibi_slopes, None)
    with torch.no_grad():
        out, lse, _, splits = _var.forward(q, k_cache, v_cache, var, block_table=block_table,
                                           cache_seqlens=cache_seqlens, num_splits=num_splits, stats=False,
                                           launch=launch or DEFAULT)
    result = (out, lse) if return_lse or return_splits else (out,)
    if return_splits:
        result += splits
    return result if len(result) > 1 else out
