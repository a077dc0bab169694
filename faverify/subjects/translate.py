"""A case's keywords (flash-attn's vocabulary, docs/design.md) in other libraries' vocabularies.

Pure functions of the case's tensors and values, so they are tested on any machine against hand-worked
cases; the adapters that call the libraries with them run where the libraries do (a GPU). A translation
the library cannot express raises Unsupported with the reason: the case is skipped, never run wrong.
"""
from __future__ import annotations

import torch

from faverify.errors import Unsupported


def flashinfer_paged(block_table: torch.Tensor, cache_seqlens: torch.Tensor, page_size: int) -> tuple:
    """flash-attn's paged cache (block_table [batch, max_pages] int32, cache_seqlens [batch]) as FlashInfer's
    CSR page table: (kv_indptr [batch + 1], kv_indices [pages used], kv_last_page_len [batch]), int32 on the
    table's device. Sequence b reads pages kv_indices[kv_indptr[b]:kv_indptr[b + 1]], the last of them
    holding kv_last_page_len[b] keys, which FlashInfer requires to be in 1..page_size: a sequence with no
    key cannot be written, and is Unsupported."""
    lengths = [int(n) for n in cache_seqlens.tolist()]
    if any(n == 0 for n in lengths):
        raise Unsupported("flashinfer: a sequence with an empty cache has no last page (kv_last_page_len must be "
                          "1..page_size)")
    pages = [-(-n // page_size) for n in lengths]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    dev = block_table.device
    indices = torch.cat([block_table[b, :n] for b, n in enumerate(pages)]) if pages else block_table.new_zeros(0)
    last = [n - (p - 1) * page_size for n, p in zip(lengths, pages)]
    as_int32 = dict(dtype=torch.int32, device=dev)
    return torch.tensor(indptr, **as_int32), indices.to(torch.int32), torch.tensor(last, **as_int32)


def flashinfer_window(window: tuple, causal: bool) -> int:
    """FlashInfer's window_left for flash-attn's (left, right) window (-1: no bound): FlashInfer bounds the
    left side only, so a right bound it can express only as causal's (right 0 under causal, which flash-attn
    forces too); -1 keeps every key on the left."""
    left, right = window
    if right >= 0 and not causal:
        raise Unsupported(f"flashinfer: a window's right bound ({right}) without causal (FlashInfer's window "
                          "has a left bound only)")
    return left


def flash_attn_4_window(window: tuple) -> tuple:
    """flash_attn.cute's window_size for flash-attn's (left, right): None where there is no bound (-1)."""
    return tuple(None if bound < 0 else bound for bound in window)
