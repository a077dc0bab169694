"""Input validation for every bundled kernel, in one place. Each message names the rule it enforces.

Conventions (docs/design.md): q [batch, seqlen_q, nheads, head_dim], k and v [batch, seqlen_k, nheads_k,
head_dim] with nheads_k dividing nheads; the last dimension contiguous; dtype fp16, bf16 or fp32.
"""
from __future__ import annotations

import math

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INITS = ("-inf", "-1e30")


def _check_tensor(name, t, ndim: int, layout: str, dtypes, allow_cpu: bool, device_hint: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in dtypes)}")
    if t.device.type != "cuda" and not (allow_cpu and t.device.type == "cpu"):
        raise ValueError(f"{name} is on {t.device}; these kernels take {device_hint}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")


def check_inputs(q, k, v, *, causal, softmax_scale, init, max_head_dim: int = 256, min_head_dim: int = 1,
                 dtypes: tuple = DTYPES, allow_cpu: bool = False, device_hint: str = "CUDA tensors",
                 head_dim_v: bool = False, ndim: int = 4, same_batch: bool = True) -> float:
    """Raise ValueError naming the rule a bad input breaks; return the softmax scale to use.
    head_dim_v: v may have a head dim of its own (k and v then agree in every other dimension); ndim 3:
    varlen's packed [total, nheads, head_dim]; same_batch False: k and v are a paged cache's pools."""
    layout = "[batch, seqlen, nheads, head_dim]" if ndim == 4 else "[total_tokens, nheads, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, ndim, layout, dtypes, allow_cpu, device_hint)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on the same device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:-1] != v.shape[:-1] or (not head_dim_v and k.shape != v.shape):
        rule = "agree in every dimension but the head dim" if head_dim_v else "have the same shape"
        raise ValueError(f"k and v must {rule}, got {tuple(k.shape)} and {tuple(v.shape)}")
    if same_batch and ndim == 4 and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"Number of heads in key/value ({k.shape[-2]}) must divide number of heads in query "
                         f"({q.shape[-2]})")
    d = q.shape[-1]
    for name, value in (("head_dim", d), ("head_dim_v", v.shape[-1])):
        if not min_head_dim <= value <= max_head_dim:
            raise ValueError(f"{name} must be in {min_head_dim}..{max_head_dim}, got {value}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    if softmax_scale is None:
        return d ** -0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a finite number > 0 or None, got {softmax_scale!r}")
    return float(softmax_scale)


def check_variant(q, *, window_size, softcap, alibi_slopes, sinks, batch: int) -> None:
    """The variant keywords (flash-attn's): window_size (left, right), each -1 (no bound) or >= 0; softcap
    a finite number >= 0 (0: off); alibi_slopes fp32 [nheads] or [batch, nheads]; sinks fp32 [nheads]."""
    h = q.shape[-2]
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be (left, right), each an int >= -1 (-1: no bound), got {window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
            or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    for name, t, shapes in (("alibi_slopes", alibi_slopes, ((h,), (batch, h))), ("sinks", sinks, ((h,),))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) not in shapes:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            want = " or ".join(str(list(s)) for s in shapes)
            raise ValueError(f"{name} must be a float32 tensor of shape {want}, got {got}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")


def check_masks(q, k, *, attn_mask, block_mask, block_size) -> None:
    """attn_mask (SDPA's): bool or float, [b|1, h|1, sq|1, sk] on q's device; block_mask: bool [b|1, h|1,
    ceil(sq / n), ceil(sk / n)] with block_size n >= 1."""
    b, sq, h = q.shape[0], q.shape[1], q.shape[2]
    sk = k.shape[1]
    if attn_mask is not None:
        _check_4d("attn_mask", attn_mask, q, (b, h, sq, sk), allow_float=True)
    if block_mask is None:
        if block_size is not None:
            raise ValueError(f"block_size is for a block_mask, and block_mask is None (block_size={block_size!r})")
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1 with a block_mask, got {block_size!r}")
    n = block_size
    _check_4d("block_mask", block_mask, q, (b, h, -(-sq // n), -(-sk // n)), allow_float=False)


def _check_4d(name: str, t, q, full: tuple, allow_float: bool) -> None:
    kinds = "bool or floating" if allow_float else "bool"
    if not isinstance(t, torch.Tensor) or not (t.dtype == torch.bool or allow_float and t.dtype.is_floating_point):
        raise ValueError(f"{name} must be a {kinds} tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
    # the last dimension never broadcasts (SDPA's attn_mask does; a kernel reading keys by stride 0 would not)
    allowed = [(n, 1) for n in full[:3]] + [(full[3],)]
    if t.dim() != 4 or any(got not in ok for got, ok in zip(t.shape, allowed)):
        want = ", ".join(f"{n}|1" for n in full[:3]) + f", {full[3]}"
        raise ValueError(f"{name} must have shape [{want}], got {list(t.shape)}")


def _int32_vector(name: str, t, device, length: int | None = None) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a 1-dimensional int32 tensor, got {got}")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {t.device}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {t.shape[0]}")


def check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    """cu_seqlens_q/k: int32 [batch + 1], non-decreasing from >= 0, ending within q's / k's tokens;
    max_seqlen_q/k at least every sequence's length (the launch grid is cut by them: a smaller one would
    leave tokens uncomputed). Costs one copy of the offsets to the host."""
    _int32_vector("cu_seqlens_q", cu_seqlens_q, q.device)
    _int32_vector("cu_seqlens_k", cu_seqlens_k, q.device, cu_seqlens_q.shape[0])
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have batch + 1 >= 1 entries, got 0")
    for name, cu, t, max_name, given in (("cu_seqlens_q", cu_seqlens_q, q, "max_seqlen_q", max_seqlen_q),
                                         ("cu_seqlens_k", cu_seqlens_k, k, "max_seqlen_k", max_seqlen_k)):
        offsets = cu.tolist()
        if offsets[0] < 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError(f"{name} must be non-decreasing from >= 0, got {offsets}")
        if offsets[-1] > t.shape[0]:
            raise ValueError(f"{name} ends at {offsets[-1]}, past the {t.shape[0]} tokens of its tensor")
        longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
        if isinstance(given, bool) or not isinstance(given, int) or given < longest:
            raise ValueError(f"{max_name} must be an int >= the longest sequence ({longest}), got {given!r}")


def check_kvcache(q, k_cache, cache_seqlens, block_table, num_splits) -> None:
    """cache_seqlens int32 [batch]; block_table int32 [batch, max_pages] with every entry a page of the
    pool and enough pages for each sequence; num_splits an int >= 0 (0: chosen by the launcher).

    The entries are checked on the device, and one bool comes back to the host (a decode step's cache read
    takes well under a millisecond: a host copy and a Python loop over the table took longer than the
    kernel). Inside a CUDA graph capture nothing can come back: there the entries go unchecked, as in
    flash-attn's launcher, and the calls made before the capture are what checks them."""
    batch, pages, page_size = q.shape[0], k_cache.shape[0], k_cache.shape[1]
    _int32_vector("cache_seqlens", cache_seqlens, q.device, batch)
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != batch:
        got = f"{block_table.dtype} {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor) else \
            type(block_table).__name__
        raise ValueError(f"block_table must be an int32 tensor [batch={batch}, max_pages], got {got}")
    if block_table.device != q.device:
        raise ValueError(f"block_table must be on q's device ({q.device}), got {block_table.device}")
    if block_table.stride(-1) != 1:
        raise ValueError(f"block_table must be contiguous in its last dimension (stride {block_table.stride(-1)})")
    if page_size < 1:
        raise ValueError(f"k_cache must have page_size >= 1, got shape {tuple(k_cache.shape)}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: chosen by the launcher), got {num_splits!r}")
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    max_pages = block_table.shape[1]
    need = torch.div(cache_seqlens.to(torch.int64) + page_size - 1, page_size, rounding_mode="floor")
    used = torch.arange(max_pages, device=q.device)[None, :] < need[:, None]
    bad = ((cache_seqlens < 0) | (need > max_pages)).any() | (used & ((block_table < 0) | (block_table >= pages))).any()
    if bool(bad):
        _kvcache_error(cache_seqlens.tolist(), block_table.tolist(), max_pages, page_size, pages)


def _kvcache_error(lengths: list, table: list, max_pages: int, page_size: int, pages: int) -> None:
    """The first bad entry, named (check_kvcache found one)."""
    for b, n in enumerate(lengths):
        need = -(-n // page_size)
        if n < 0 or need > max_pages:
            raise ValueError(f"cache_seqlens[{b}] = {n} must be in 0..{max_pages * page_size} "
                             f"(max_pages {max_pages} x page_size {page_size})")
        bad = [p for p in table[b][:need] if not 0 <= p < pages]
        if bad:
            raise ValueError(f"block_table[{b}] names page {bad[0]}, outside the pool's {pages} pages")
