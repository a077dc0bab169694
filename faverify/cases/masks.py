"""A case's mask, bias and score_mod, drawn from its seed (docs/design.md, "Masks and biases").

A mask pattern is one function of the FlexAttention mask_mod signature, keep(b, h, q_idx, kv_idx) -> bool
(True: the row sees the key), over small tensors drawn from the seed (lengths, document ids, a block or
element pattern). The same function is what a Flex-like subject compiles, what the boolean attn_mask
given to a dense subject is evaluated from (at the mask's shape, SDPA's heads-first [b|1, h|1, sq|1, sk]),
and what the FP64 reference applies: one definition, three consumers.

Draws come from their own generator (the seed's MASK_STREAM), so the q, k, v of a case are the same with
or without a mask.
"""
from __future__ import annotations

from typing import Callable

import torch

from faverify.cases.case import Case
from faverify.cases.mods import score_mod
from faverify.dtypes import TORCH

MASK_STREAM = 0x6D61736B  # xor'ed into the seed: the masks' own generator
BIAS_LARGE = 30.0  # "large": a bias of this spread dominates the logits (near one-hot rows)
MIN_RATE, MIN_ROW_RATE = 0.25, 0.125  # "min": positions, and whole rows, set to finfo.min


def mask_shape(case: Case, which: str = "mask") -> tuple:
    """[B, H, SQ, SK] of the mask (or the bias), 1 where it broadcasts."""
    b, h, sq, sk = case.batch, case.nheads, case.seqlen_q, case.seqlen_k
    kind = case.mask.shape if which == "mask" else case.bias.shape
    return {"full": (b, h, sq, sk), "batch": (1, h, sq, sk), "heads": (b, 1, sq, sk), "shared": (1, 1, sq, sk),
            "keys": (b, 1, 1, sk)}[kind]


def generator(case: Case, device) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(case.seed ^ MASK_STREAM)
    return g


def draw(case: Case, device) -> dict:
    """The case's mask, bias and score_mod by Inputs' field names, those it uses only: mask_mod (the
    pattern as a function), attn_mask (the same as a bool tensor of the mask's shape), block_mask (a
    "block" pattern's blocks), bias (a tensor), score_mod (mods.py). Drawn in that order."""
    g = generator(case, device)
    out = {}
    if case.mask is not None:
        blocks = block_keep(case, device, g) if case.mask.pattern == "block" else None
        keep = mask_mod(case, device, g, blocks)
        if blocks is not None:  # the documented shape: a key mask's one row of blocks for every query block
            blocks = blocks.expand(*blocks.shape[:2], -(-case.seqlen_q // case.mask.block), blocks.shape[3])
        out.update(mask_mod=keep, attn_mask=evaluate(keep, mask_shape(case), device), block_mask=blocks)
    out.update(bias=draw_bias(case, device, g), score_mod=score_mod(case, device, g))
    return {name: value for name, value in out.items() if value is not None}


def mask_mod(case: Case, device, g: torch.Generator, blocks: torch.Tensor | None = None) -> Callable:
    """The case's mask as keep(b, h, q_idx, kv_idx) on index tensors (broadcasting, or FlexAttention's
    scalars). Dimensions the mask's shape broadcasts over are read at index 0. blocks: a "block"
    pattern's (block_keep)."""
    B, H, SQ, SK = mask_shape(case)
    sq, sk, m = case.seqlen_q, case.seqlen_k, case.mask
    keys_only = m.shape == "keys"

    def at(index, n):  # index 0 where the mask broadcasts over the dimension
        return index if n > 1 else index * 0

    if m.pattern == "padding":
        # each its own tensor: a column of one [b, 2] tensor has stride 2, and inductor's CPU FlexAttention
        # fails to lower a mask_mod that reads a size-1 tensor of stride 2 (docs/torch-backends.md)
        q_len, k_len = (torch.tensor([p[side] for p in m.lengths], dtype=torch.int64, device=device)
                        for side in (0, 1))
        if keys_only:
            return lambda b, h, i, j: j < k_len[at(b, B)]
        return lambda b, h, i, j: (i < q_len[at(b, B)]) & (j < k_len[at(b, B)])
    if m.pattern == "document":
        doc_q, doc_k = (_document_ids(m.lengths, n, side, device) for n, side in ((sq, 0), (sk, 1)))
        return lambda b, h, i, j: doc_q[i] == doc_k[j]
    if m.pattern == "prefix":  # the prefix every row sees, then causal (bottom-right)
        prefix, offset = m.lengths[0][0], sk - sq
        return lambda b, h, i, j: (j < prefix) | (j <= i + offset)
    masked = m.rate / 100.0
    if m.pattern == "block":
        n = m.block
        return lambda b, h, i, j: blocks[at(b, B), at(h, H), at(i, SQ) // n, j // n]
    keep = torch.rand(B, H, SQ, SK, generator=g, device=device) >= masked  # "random"
    return lambda b, h, i, j: keep[at(b, B), at(h, H), at(i, SQ), j]


def block_keep(case: Case, device, g: torch.Generator) -> torch.Tensor:
    """The block pattern of a "block" mask: bool [B, H, ceil(SQ / n), ceil(SK / n)], the last blocks the
    tails. What a subject that takes block_mask is given, with block_size n."""
    B, H, SQ, SK = mask_shape(case)
    n = case.mask.block
    return torch.rand(B, H, -(-SQ // n), -(-SK // n), generator=g, device=device) >= case.mask.rate / 100.0


def evaluate(keep: Callable, shape: tuple, device) -> torch.Tensor:
    """A mask_mod as a bool tensor of `shape` [B, H, SQ, SK] (index grids broadcast)."""
    B, H, SQ, SK = shape
    grids = [torch.arange(n, device=device).reshape([-1 if k == d else 1 for k in range(4)])
             for d, n in enumerate(shape)]
    return keep(*grids).expand(B, H, SQ, SK).contiguous()


def _document_ids(lengths: tuple, n: int, side: int, device) -> torch.Tensor:
    """Each position's document along one side (0: queries, 1: keys); positions past the listed documents
    form one last document."""
    ids = torch.full((n,), len(lengths), dtype=torch.int64, device=device)
    start = 0
    for doc, pair in enumerate(lengths):
        ids[start:min(n, start + pair[side])] = doc
        start += pair[side]
    return ids


def draw_bias(case: Case, device, g: torch.Generator) -> torch.Tensor | None:
    """The additive bias [B, H, SQ, SK] in the input dtype or fp32 (case.bias.dtype), or None."""
    if case.bias is None:
        return None
    shape = mask_shape(case, "bias")
    dtype = torch.float32 if case.bias.dtype == "fp32" else TORCH[case.dtype]
    bias = torch.randn(shape, generator=g, device=device)
    if case.bias.values == "large":
        bias = bias * BIAS_LARGE
    elif case.bias.values == "min":
        low = torch.finfo(dtype).min
        spots = torch.rand(shape, generator=g, device=device) < MIN_RATE
        rows = torch.rand(*shape[:3], 1, generator=g, device=device) < MIN_ROW_RATE
        bias = torch.where(spots | rows, torch.full_like(bias, low), bias)
    return bias.to(dtype)


def window_keep(sq: int, sk: int, left: int | None, right: int | None, device) -> torch.Tensor:
    """bool [sq, sk]: the keys row i sees under a window aligned bottom-right, diag - left <= j <= diag +
    right with diag = i + sk - sq (None: no bound on that side; causal is right 0)."""
    rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right is not None:
        keep &= cols <= rows + right
    if left is not None:
        keep &= cols >= rows - left
    return keep


def dead_keys(case: Case, keep: torch.Tensor) -> torch.Tensor:
    """bool [b, sk, hk]: keys no row of any query head of their kv head may see (under the mask, causal
    and windows): where mask_nan puts NaN in k and v. Under the broadcast layout (one key store for every
    batch element and kv head) only keys dead in all of them."""
    b, h, hk, sq, sk = case.batch, case.nheads, case.nheads_k, case.seqlen_q, case.seqlen_k
    seen = keep.expand(b, h, sq, sk) & window_keep(sq, sk, *case.bounds, keep.device)
    dead = ~seen.reshape(b, hk, h // hk, sq, sk).any(dim=2).any(dim=2)  # [b, hk, sk]
    if case.layout == "broadcast":
        dead = dead.all(dim=0, keepdim=True).all(dim=1, keepdim=True).expand(b, hk, sk)
    return dead.transpose(1, 2)
