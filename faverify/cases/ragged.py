"""Ragged batches in memory: a varlen batch packed along the token axis, a paged KV cache and its block
table (docs/design.md, "Ragged and paged"). inputs.py draws a ragged case's values as a padded dense batch
(sequence i's first lengths of row i), so every value regime works unchanged; this module places them.

- varlen: q [total_q + tail, h, d], k and v [total_k + tail, hk, d] in NaN margins, the tail NaN too, and
  cu_seqlens_q/k int32 [batch + 1].
- paged: k_cache, v_cache [pool, page_size, hk, d], NaN wherever no sequence's token lies (unused pages,
  the slots past each cache's length), block_table int32 [batch, max_pages] in the case's page order
  (entries past a sequence's pages point at an unused page), cache_seqlens int32 [batch]. Under "shared"
  the later sequences' first pages are the first sequence's, and so are their keys.
"""
from __future__ import annotations

import itertools

import torch

from faverify.cases.case import Case
from faverify.cases.margins import margined, poisoned

PAGE_SEED_SALT = 0x5DEECE66D  # the page order's generator is the case seed's, apart from the values'


def pack(case: Case, q, k, v, dout, requires_grad: bool) -> dict:
    """The varlen tensors from a padded [batch, s, heads, d] draw: q, k, v, dout and cu_seqlens_q/k."""
    seqs = case.varlen.seqlens

    def packed(t, side: int, leaf: bool):
        parts = [t[i, :n[side]] for i, n in enumerate(seqs)]
        parts.append(torch.full((case.varlen.tail, *t.shape[2:]), float("nan"), dtype=t.dtype, device=t.device))
        whole = torch.cat(parts)
        return margined(whole, requires_grad, token_dims=1) if leaf else whole

    cu = [torch.tensor(offsets(case, side), dtype=torch.int32, device=q.device) for side in (0, 1)]
    return dict(q=packed(q, 0, True), k=packed(k, 1, True), v=packed(v, 1, True), dout=packed(dout, 0, False),
                cu_seqlens_q=cu[0], cu_seqlens_k=cu[1])


def offsets(case: Case, side: int) -> list:
    """A varlen case's cu_seqlens of q (side 0) or of k and v (side 1), on the host: 0, then each
    sequence's end in the packed tokens."""
    return list(itertools.accumulate((n[side] for n in case.varlen.seqlens), initial=0))


def page_table(case: Case) -> tuple:
    """(block table as lists, pages in the pool, the unused page that entries past a sequence point at)."""
    paged = case.paged
    ps = paged.page_size
    own = [(b, p) for b, n in enumerate(paged.cache_seqlens) for p in range(case.shared_pages(b), -(-n // ps))]
    need = len(own)
    pool = paged.pool or (2 * need + 1 if paged.pages == "random" else need + 1)
    if paged.pages == "reverse":
        physical = [pool - 1 - i for i in range(need + 1)]
    elif paged.pages == "random":
        g = torch.Generator().manual_seed((case.seed ^ PAGE_SEED_SALT) % (1 << 63))
        physical = torch.randperm(pool, generator=g)[:need + 1].tolist()
    else:
        physical = list(range(need + 1))
    spare = physical[need]
    width = max(1, max(-(-n // ps) for n in paged.cache_seqlens))
    table = [[spare] * width for _ in paged.cache_seqlens]
    for (b, p), page in zip(own, physical):
        table[b][p] = page
    for b in range(1, len(table)):
        for p in range(case.shared_pages(b)):
            table[b][p] = table[0][p]
    return table, pool, spare


def page(case: Case, k, v) -> dict:
    """The paged tensors from a padded [batch, max cache, hk, d] draw of k and v: k_cache, v_cache,
    block_table, cache_seqlens, and the keys each sequence must read (k_logical, v_logical: the draw,
    with the shared pages' keys the first sequence's), which the reference uses."""
    table, pool, _ = page_table(case)
    ps, device = case.paged.page_size, k.device
    block_table = torch.tensor(table, dtype=torch.int32, device=device)
    k_log, v_log = k.clone(), v.clone()
    caches = []
    for t, logical in ((k, k_log), (v, v_log)):
        cache = poisoned((pool, ps, *t.shape[2:]), t.dtype, device, token_dims=2)
        for b, n in enumerate(case.paged.cache_seqlens):
            first = case.shared_pages(b) * ps  # the shared pages hold the first sequence's keys
            logical[b, :first] = logical[0, :first]
            tokens = torch.arange(first, n, device=device)
            if tokens.numel():
                cache[block_table[b, tokens // ps].long(), tokens % ps] = t[b, first:n]
        caches.append(cache)
    lengths = torch.tensor(case.paged.cache_seqlens, dtype=torch.int32, device=device)
    return dict(k=caches[0], v=caches[1], block_table=block_table, cache_seqlens=lengths,
                k_logical=k_log, v_logical=v_log)


def gather_pages(cache: torch.Tensor, block_table: torch.Tensor, length: int, b: int) -> torch.Tensor:
    """Sequence b's first `length` tokens of a paged cache, [1, length, hk, d], through its block table:
    what a paged kernel reads (the built-in subjects' paged path)."""
    ps = cache.shape[1]
    tokens = torch.arange(length, device=cache.device)
    return cache[block_table[b, tokens // ps].long(), tokens % ps].unsqueeze(0)


def unpack(t: torch.Tensor, ends: list, i: int) -> torch.Tensor:
    """Sequence i of a packed [total, ...] tensor, as [1, s_i, ...]; ends: offsets(), on the host (reading
    them from the device's cu_seqlens would make the host wait for it twice a sequence)."""
    return t[ends[i]:ends[i + 1]].unsqueeze(0)


# Capabilities.varlen_tail_grads: what a varlen subject's gradients must hold in the tail tokens past the
# last sequence. The loss does not depend on them, so their gradient is 0 ("zero"); a subject that declares
# it leaves them as it found them ("finite") must at least leave no NaN or Inf there.
TAIL_GRAD_RULES = ("zero", "finite")


def tail_gradients(case: Case, got: dict, rule: str = "zero") -> list:
    """(signature, reason) per gradient of a varlen case whose tail rows break the rule: dq's past total_q,
    dk's and dv's past total_k ("dq:tail", "7 rows past the last sequence: 896 elements not 0, 896 NaN")."""
    if case.varlen is None or not case.varlen.tail:
        return []
    tails, counts = [], []
    for name, start in (("dq", case.total_q), ("dk", case.total_k), ("dv", case.total_k)):
        t = got.get(name)
        if t is None:
            continue
        tail = t.detach()[start:]
        tails.append((name, tail.shape[0]))
        counts += [torch.isnan(tail).sum(), (~torch.isfinite(tail)).sum() if rule == "finite" else (tail != 0).sum()]
    counted = torch.stack(counts).tolist() if counts else []  # one transfer for every gradient's tail
    failing = []
    for (name, rows), nan, bad in zip(tails, counted[::2], counted[1::2]):
        if bad:
            want = "finite" if rule == "finite" else "0"
            failing.append((f"{name}:tail", f"{name}: {rows} rows past the last sequence (the tail, which "
                                            f"no sequence reads): {bad} elements not {want}, {nan} NaN"))
    return failing
