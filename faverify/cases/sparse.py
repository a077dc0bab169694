"""Token-level sparse attention by key indices (DeepSeek's sparse attention and its kin): each query row of
each kv head attends to the keys its `indices` list, [batch, seqlen_q, nheads_k, topk] int32.

An index that is negative (-1 marks an empty slot) or at or past seqlen_k is invalid: it names no key, as
FlashMLA reads it. A row whose every index is invalid sees no key. A key listed twice counts twice where a
kernel gathers the listed keys (FlashMLA's sparse kernels: conventions.sparse_duplicates "each") and once
where it masks the keys not listed ("once"). The reference takes the listed keys as a keep-mask and, for
"each", adds log(count) to a key's logit: softmax over a gathered list with a key twice weighs it
2 exp(s), which is exp(s + log 2).
"""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.cases.values import generator
from faverify.cases.vocabulary import MAX_SEED

STREAM = 0x5BA25E  # the indices' seed, offset from the case's: the other inputs are drawn as they were


def draw(case: Case, device) -> torch.Tensor:
    """The case's indices, drawn on the CPU from the seed (the same on every device)."""
    g = generator((case.seed + STREAM) % MAX_SEED, "cpu")
    b, sq, hk, k, sk = case.batch, case.seqlen_q, case.nheads_k, case.sparse.topk, case.seqlen_k
    holds = case.sparse.indices
    if holds == "duplicates" or sk == 0:
        idx = torch.randint(0, max(sk, 1), (b, sq, hk, k), generator=g)
    else:  # distinct keys per row: the first topk of a random permutation, -1 past seqlen_k
        order = torch.rand(b, sq, hk, max(sk, k), generator=g).argsort(dim=-1)[..., :k]
        idx = torch.where(order < sk, order, torch.full_like(order, -1))
    if sk == 0:
        idx = torch.full_like(idx, -1)
    if holds == "invalid":
        idx = torch.where(torch.rand(idx.shape, generator=g) < 0.3, torch.full_like(idx, -1), idx)
        whole = torch.rand(b, sq, hk, 1, generator=g) < 0.2  # rows with no valid index at all
        idx = torch.where(whole, torch.full_like(idx, -1), idx)
    elif holds == "out-of-range":
        past = sk + torch.randint(0, 1 << 20, idx.shape, generator=g)
        idx = torch.where(torch.rand(idx.shape, generator=g) < 0.3, past, idx)
    return idx.to(torch.int32).to(device)


def visibility(indices: torch.Tensor, seqlen_k: int, nheads: int, duplicates: str) -> tuple:
    """(keep-mask bool [b, h, sq, sk], bias [b, h, sq, sk] or None): the keys each row's indices name, and
    with duplicates "each" log(count) on each listed key's logit. Heads of a kv head's group share its row."""
    b, sq, hk, k = indices.shape
    sk, group = seqlen_k, nheads // hk
    valid = (indices >= 0) & (indices < sk)
    counts = torch.zeros(b, sq, hk, sk + 1, dtype=torch.float32, device=indices.device)
    slot = torch.where(valid, indices.long(), torch.full_like(indices.long(), sk))  # invalid ones: slot sk
    counts.scatter_add_(-1, slot, torch.ones_like(slot, dtype=torch.float32))
    counts = counts[..., :sk].permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # [b, h, sq, sk]
    keep = counts > 0
    if duplicates == "once" or not bool((counts > 1).any()):
        return keep, None
    return keep, torch.where(keep, counts.clamp(min=1).log(), torch.zeros_like(counts))

