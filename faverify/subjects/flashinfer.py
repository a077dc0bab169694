"""FlashInfer as a subject (JIT-compiled with the machine's nvcc): present where the package imports, an
EnvironmentProblem naming the import error elsewhere (`faverify kernels` lists it as unavailable, with
that reason).

Each kind of case runs the API a serving engine would call for it:
- a dense batch: `single_prefill_with_kv_cache`, one request at a time (the kernel takes one);
- a varlen batch: `BatchPrefillWithRaggedKVCacheWrapper`, cu_seqlens as its qo_indptr and kv_indptr;
- a paged cache: `BatchDecodeWithPagedKVCacheWrapper` when each request has one query token, else
  `BatchPrefillWithPagedKVCacheWrapper`; flash-attn's block table as FlashInfer's CSR page table
  (translate.flashinfer_paged), the pools in layout NHD.
Its vocabulary, translated here: layout NHD ([tokens, heads, d]), `sm_scale`, `logits_soft_cap`, a window
as `window_left` only (translate.flashinfer_window: a right bound it can express only as causal's); lse
comes back in base 2 as [tokens, heads], transposed here to faverify's layout, and the conventions preset
"flashinfer" declares the base, so the verdict compares it in base 2. Forward only (FlashInfer has no
backward). No ALiBi (its slopes are its own, not the case's) and no sinks (their units on these paths are
not yet checked on a GPU); head dims 64, 128 and 256, q/k's and v's alike.
"""
from __future__ import annotations

import functools

import torch

from faverify.errors import EnvironmentProblem, Unsupported
from faverify.subjects.base import Capabilities, Subject, drain
from faverify.subjects.translate import flashinfer_paged, flashinfer_window

HEAD_DIMS = (64, 128, 256)
WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's examples give a batch wrapper
_workspaces: dict = {}  # device -> workspace, shared by every wrapper made on it
LAUNCHED: list = []  # the API each call took, in order (Subject.paths)


def _library():
    try:
        import flashinfer
    except Exception as e:  # ImportError, or its JIT finding no CUDA toolkit
        raise EnvironmentProblem(f"flashinfer: the package does not import here ({type(e).__name__}: {e}); it is "
                                 "the flashinfer-python wheel, for CUDA GPUs") from e
    return flashinfer


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _workspaces:
        _workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def _check_head_dims(d: int, dv: int) -> None:
    if d != dv or d not in HEAD_DIMS:
        raise Unsupported(f"flashinfer: head dims {d} and {dv}; its kernels here take equal ones among "
                          f"{', '.join(map(str, HEAD_DIMS))}")


def _dense(flashinfer, q, k, v, scale, causal: bool, window_left: int, cap):
    """One single_prefill_with_kv_cache call per batch element: (out [b, sq, h, dv], lse [b, h, sq])."""
    LAUNCHED.append("single prefill")
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse = flashinfer.single_prefill_with_kv_cache(
            q[b], k[b], v[b], causal=causal, kv_layout="NHD", sm_scale=scale, window_left=window_left,
            logits_soft_cap=cap, return_lse=True)
        outs.append(out)
        lses.append(lse.transpose(0, 1))  # [sq, h] -> [h, sq]
    return torch.stack(outs), torch.stack(lses).float()


def _ragged(flashinfer, q, k, v, cu_q, cu_k, scale, causal: bool, window_left: int, cap):
    """q, k, v packed [tokens, heads, d]: (out [tokens, h, dv], lse [h, tokens]); the tokens past the
    last offset (the case's tail) are never given to the library: out 0 and lse -inf there."""
    LAUNCHED.append("batch prefill ragged")
    total = int(cu_q[-1])
    h, hk, d, dv = q.shape[1], k.shape[1], q.shape[2], v.shape[2]
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(q.device), kv_layout="NHD")
    wrapper.plan(cu_q.to(torch.int32), cu_k.to(torch.int32), h, hk, d, head_dim_vo=dv, causal=causal,
                 window_left=window_left, logits_soft_cap=cap, sm_scale=scale, q_data_type=q.dtype,
                 kv_data_type=k.dtype)
    out, lse = wrapper.run(q[:total], k, v, return_lse=True)
    tail = q.shape[0] - total
    out = torch.cat([out, out.new_zeros(tail, h, dv)])
    lse = torch.cat([lse.float(), lse.new_full((tail, h), float("-inf"), dtype=torch.float32)])
    return out, lse.transpose(0, 1)


def _paged(flashinfer, q, k_pool, v_pool, block_table, cache_seqlens, scale, causal: bool, window_left: int, cap):
    """q [b, sq, h, d] against pools [pages, page_size, hk, d]: (out [b, sq, h, dv], lse [b, h, sq])."""
    b, sq, h, d = q.shape
    page_size, hk, dv = k_pool.shape[1], k_pool.shape[2], v_pool.shape[3]
    indptr, indices, last = flashinfer_paged(block_table, cache_seqlens, page_size)
    common = dict(window_left=window_left, logits_soft_cap=cap, sm_scale=scale, q_data_type=q.dtype,
                  kv_data_type=k_pool.dtype)
    if sq == 1:  # one new token per request: the decode kernel, where causal changes nothing
        LAUNCHED.append("batch decode paged")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), kv_layout="NHD")
        wrapper.plan(indptr, indices, last, h, hk, d, page_size, pos_encoding_mode="NONE", **common)
        out, lse = wrapper.run(q[:, 0], (k_pool, v_pool), return_lse=True)
        return out.unsqueeze(1), lse.float().unsqueeze(2)
    LAUNCHED.append("batch prefill paged")
    qo_indptr = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(q.device), kv_layout="NHD")
    wrapper.plan(qo_indptr, indptr, indices, last, h, hk, d, page_size, head_dim_vo=dv, causal=causal, **common)
    out, lse = wrapper.run(q.reshape(b * sq, h, d), (k_pool, v_pool), return_lse=True)
    return out.reshape(b, sq, h, dv), lse.float().reshape(b, sq, h).transpose(1, 2)


def flashinfer_attention(q, k, v, *, causal: bool, softmax_scale=None, window_size=(-1, -1), softcap: float = 0.0,
                         cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                         block_table=None, cache_seqlens=None):
    """faverify's keywords (flash-attn's) -> the FlashInfer API for the case's kind; (out, lse)."""
    _check_head_dims(q.shape[-1], v.shape[-1])
    window_left = flashinfer_window(tuple(window_size), causal)
    cap = float(softcap) if softcap else None
    flashinfer = _library()
    if cu_seqlens_q is not None:
        return _ragged(flashinfer, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, cap)
    if block_table is not None:
        return _paged(flashinfer, q, k, v, block_table, cache_seqlens, softmax_scale, causal, window_left, cap)
    return _dense(flashinfer, q, k, v, softmax_scale, causal, window_left, cap)


def make() -> Subject:
    flashinfer = _library()
    caps = Capabilities.of(dtypes=("bf16", "fp16"), devices=("cuda",), min_head_dim=64, max_head_dim=256,
                           head_dims=HEAD_DIMS, lse=True,
                           backward=False, window=True, softcap=True, varlen=True, paged=True, conventions="flashinfer")
    return Subject(name="flashinfer", fn=flashinfer_attention, caps=caps, paths=functools.partial(drain, LAUNCHED),
                   description=f"FlashInfer {getattr(flashinfer, '__version__', '?')}: single prefill, batch "
                               "prefill (ragged and paged KV), batch decode (paged KV); forward only")
